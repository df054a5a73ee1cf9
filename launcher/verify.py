"""Checksum verdicts across runs, and the explanations when they differ.

``verify_checksums`` re-hashes every run's files against its own manifest (a file damaged
after the pull is Corrupt, not a difference) and checks each run against itself (its canonical
weights against its per-layer digests and its native save: a file altered after training is
Corrupt too). It then compares each artifact's sha256 with the reference run; a file whose
bytes differ is compared by its content (:mod:`launcher.contentdiff`: a .keras save, an event
file, a log with times), and for every run whose content differs it explains where (model
arrays, initial weights, dataset and batch fingerprints, metrics, other outputs) and why (the
environment diff of the two manifests, reduced to a one-line classification).
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.contentdiff import ContentDiff, compare_files, compare_savedmodel, savedmodel_root
from launcher.errors import Corrupt, ExitCode, Incompatible, LauncherError, NotFound, UsageError
from launcher.hashing import sha256_file
from launcher.manifest import Manifest, describe_code, load_manifest
from launcher.modeldiff import ModelDiff, Weights, diff_models, load_canonical, load_weights
from launcher.progress import NullReporter, Reporter
from launcher.workspace import Workspace

SCHEMA = "launcher.verify/v1"

IDENTICAL = "identical"
IDENTICAL_CONTENT = "identical-content"  # other bytes, the same content (zip dates, wall times...)
DIFFERS = "differs"
MISSING = "missing"
REFERENCE = "reference"
CONSISTENT = "consistent"  # the verdict on one run checked alone

# Who left a file out of the comparison.
IGNORED_BY_LAUNCHER = "launcher"
IGNORED_BY_RECIPE = "recipe"
IGNORED_BY_OPTION = "--ignore"

# Classifications of a run compared with the reference.
CLASS_IDENTICAL = "identical"
CLASS_NONDETERMINISM = "nondeterminism"
CLASS_ENVIRONMENT = "environment"
CLASS_INPUT = "input-change"
CLASS_OUTPUTS = "outputs"  # training identical; some other output differs

# The files launcher itself never compares (the one list; README "Verify", docs/verify-json.md):
# its own records of times and of the environment, which the manifests compare instead, and
# the recipe's console log, which carries times. Listed in the table, left out of the verdict.
# Everything else is compared, by content where the format is known (launcher.contentdiff).
VOLATILE = (
    "outputs/_launcher/*",
    "outputs/logs/train.log",
    "launch.json",
)

CANONICAL_MODEL = "outputs/model/canonical.npz"
LAYERS = "outputs/weights/layers.json"
NATIVE_MODELS = ("outputs/model/model.weights.h5", "outputs/model/model.pt", "outputs/model/model.keras")
DATASET = "outputs/fingerprints/dataset.json"
INITIAL_WEIGHTS = "outputs/fingerprints/initial_weights.json"
BATCHES = "outputs/fingerprints/batches.jsonl"
METRICS = "outputs/metrics.jsonl"

HASH_WORKERS = max(2, min(4, os.cpu_count() or 2))


def is_volatile(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pat) for pat in VOLATILE)


def _matches(path: str, globs: Iterable[str]) -> bool:
    """A glob matches the path from the run directory or from its outputs/ (``*`` crosses ``/``)."""
    rel = path.removeprefix("outputs/")
    return any(fnmatch.fnmatchcase(path, g) or fnmatch.fnmatchcase(rel, g) for g in globs)


def ignored_by(path: str, recipe_globs: Iterable[str] = (), option_globs: Iterable[str] = ()) -> str | None:
    """Why a file is listed but not compared: launcher's own list, the recipe's, --ignore; or None."""
    if is_volatile(path):
        return IGNORED_BY_LAUNCHER
    if _matches(path, recipe_globs):
        return IGNORED_BY_RECIPE
    if _matches(path, option_globs):
        return IGNORED_BY_OPTION
    return None


def recipe_volatile(ws: Workspace, m: Manifest) -> list[str]:
    """The run's declared volatile outputs: the manifest's ``recipe.volatile``, else the workspace recipe's."""
    recorded = m.recipe.get("volatile")
    if isinstance(recorded, list):
        return [g for g in recorded if isinstance(g, str)]
    from launcher.runtime.spec import SpecError, load_spec

    folder = ws.root / "recipes" / m.recipe_name
    if not (folder / "recipe.toml").is_file():
        return []
    try:
        return list(load_spec(folder).volatile)
    except SpecError:
        return []


# ---------------------------------------------------------------- finding runs


def _completed_manifests(ws: Workspace) -> list[Manifest]:
    out: list[Manifest] = []
    if not ws.runs.is_dir():
        return out
    for d in sorted(ws.runs.iterdir()):
        if d.is_dir() and (d / "manifest.json").is_file():
            try:
                out.append(load_manifest(d))
            except LauncherError:
                continue  # a broken run elsewhere must not stop verifying the others; named runs still raise
    return out


def resolve_run(ws: Workspace, ref: str) -> Path:
    """A run id under runs/, or a path to a run directory."""
    candidate = ws.runs / ref
    if "/" not in ref and candidate.is_dir():
        return candidate
    as_path = Path(ref)
    if as_path.is_dir():
        return as_path.resolve()
    matches: list[Path] = []
    if ws.runs.is_dir() and "/" not in ref:
        matches = sorted(p for p in ws.runs.glob(f"{ref}*") if p.is_dir())
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise UsageError(f"run {ref!r} is ambiguous: {', '.join(p.name for p in matches[:5])}",
                         "give more of the run id")
    raise NotFound(f"no run {ref!r} under {ws.runs}", "list runs with `launcher ps`")


def skipped_in_group(ws: Workspace, group: str) -> list[dict[str, str]]:
    """Runs of the group (by their launch.json) that verify leaves out: no manifest yet, or unreadable."""
    out: list[dict[str, str]] = []
    if not ws.runs.is_dir():
        return out
    for d in sorted(ws.runs.iterdir()):
        launch = _read_json_quiet(d / "launch.json")
        if not isinstance(launch, dict) or launch.get("group") != group:
            continue
        try:
            load_manifest(d)
        except LauncherError as exc:
            out.append({"run_id": d.name, "reason": exc.one_line()})
    return out


def _read_json_quiet(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def group_runs(ws: Workspace, group: str) -> list[Manifest]:
    runs = [m for m in _completed_manifests(ws) if m.group == group]
    return sorted(runs, key=lambda m: (m.replicate, m.started_at, m.run_id))


def latest_group(ws: Workspace) -> str:
    runs = _completed_manifests(ws)
    if not runs:
        raise NotFound(f"no completed runs under {ws.runs}",
                       "start some with `launcher run RECIPE` or `launcher experiment RECIPE --runs 2`")
    return max(runs, key=lambda m: (m.started_at, m.run_id)).group


# ---------------------------------------------------------------- integrity


@dataclass(frozen=True)
class IntegrityStats:
    files: int
    bytes: int


def check_integrity(manifests: Iterable[Manifest], reporter: Reporter | None = None,
                    workers: int = HASH_WORKERS) -> IntegrityStats:
    """Re-hash every artifact of every run against its manifest, files hashed concurrently."""
    jobs: list[tuple[Manifest, str, int, str]] = []
    for m in manifests:
        for art in m.artifacts:
            p = m.file(art.path)
            try:
                size = p.stat().st_size
            except FileNotFoundError:
                raise Corrupt(f"run {m.run_id}: {art.path} is in its manifest but not in the run directory",
                              f"re-pull the run (`launcher pull {m.run_id}`)") from None
            if size != art.size:
                raise Corrupt(f"run {m.run_id}: {art.path} is {size} bytes, its manifest says {art.size}",
                              _repull(m))
            jobs.append((m, art.path, art.size, art.sha256))
    total = sum(j[2] for j in jobs)
    task = (reporter or NullReporter()).task("checking files against their manifests", total=total, unit="B")

    def one(job: tuple[Manifest, str, int, str]) -> tuple[Manifest, str, str, str]:
        m, rel, size, want = job
        got = sha256_file(m.file(rel))
        task.advance(size)
        return m, rel, want, got

    # Largest first, so the pool is not left waiting on one big file at the end.
    ordered = sorted(jobs, key=lambda j: -j[2])
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        for m, rel, want, got in pool.map(one, ordered):
            if got != want:
                raise Corrupt(f"run {m.run_id}: {rel} does not match its manifest "
                              f"(sha256 {got[7:19]}…, recorded {want[7:19]}…)",
                              _repull(m))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on a mismatch, hash nothing more
        task.close()
    return IntegrityStats(files=len(jobs), bytes=total)


# ---------------------------------------------------------------- explanations


def _repull(m: Manifest) -> str:
    return f"the file changed after the pull; re-pull the run (`launcher pull {m.run_id}`)"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Corrupt(f"{path} is not valid JSON ({exc})", "re-pull the run (`launcher pull RUN`)") from exc


def _read_jsonl(path: Path) -> list[dict[str, Any]] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise Corrupt(f"{path}: line {n} is not valid JSON ({exc.msg})",
                          "re-pull the run (`launcher pull RUN`)") from exc
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_metrics(m: Manifest) -> list[dict[str, Any]] | None:
    return _read_jsonl(m.file(METRICS))


def explain_model(ref: Manifest, run: Manifest) -> dict[str, Any] | None:
    for rel in (CANONICAL_MODEL, *NATIVE_MODELS):
        if ref.artifact(rel) and run.artifact(rel):
            try:
                diff: ModelDiff = diff_models(ref.file(rel), run.file(rel))
            except LauncherError as exc:
                return {"source": rel, "error": exc.one_line()}
            out = diff.to_dict()
            out.pop("reference")
            out.pop("other")
            return {"source": rel, **out}
    return None


def explain_initial_weights(ref: Manifest, run: Manifest) -> dict[str, Any] | None:
    a, b = _read_json(ref.file(INITIAL_WEIGHTS)), _read_json(run.file(INITIAL_WEIGHTS))
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    arrays_a = a.get("arrays") or {}
    arrays_b = b.get("arrays") or {}
    differing = [k for k in arrays_a if arrays_a.get(k) != arrays_b.get(k)]
    differing += [k for k in arrays_b if k not in arrays_a]
    same = a.get("digest") == b.get("digest") and not differing
    first = differing[0] if differing else None
    layer, _, array = first.rpartition("/") if first else ("", "", "")
    return {
        "same": same,
        "reference_digest": a.get("digest"), "digest": b.get("digest"),
        "arrays_differing": len(differing),
        "first_difference": {"layer": layer, "array": array} if first else None,
    }


def explain_data(ref: Manifest, run: Manifest) -> dict[str, Any] | None:
    a, b = _read_json(ref.file(DATASET)), _read_json(run.file(DATASET))
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    ea, eb = a.get("entries") or {}, b.get("entries") or {}
    differing = sorted(k for k in set(ea) | set(eb) if ea.get(k) != eb.get(k)) if isinstance(ea, dict) \
        and isinstance(eb, dict) else []
    return {
        "same": a.get("digest") == b.get("digest"),
        "reference_digest": a.get("digest"), "digest": b.get("digest"),
        "kind": a.get("kind"),
        "entries_differing": differing[:20],
    }


def _by_epoch(rows: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    """Rows keyed by (fit, epoch): a recipe that calls fit() twice numbers its epochs from 0 again."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for row in rows:
        e, fit = row.get("epoch"), row.get("fit", 0)
        if isinstance(e, int) and isinstance(fit, int):
            out[(fit, e)] = row
    return out


def _where(key: tuple[int, int], **extra: Any) -> dict[str, Any]:
    fit, epoch = key
    return {"epoch": epoch, **({"fit": fit} if fit else {}), **extra}


def explain_batches(ref: Manifest, run: Manifest) -> dict[str, Any] | None:
    a, b = _read_jsonl(ref.file(BATCHES)), _read_jsonl(run.file(BATCHES))
    if a is None or b is None:
        return None
    by_a, by_b = _by_epoch(a), _by_epoch(b)
    differing: list[int] = []
    unrecorded: list[str] = []
    compared = 0
    first: dict[str, Any] | None = None
    for key in sorted(set(by_a) | set(by_b)):
        ra, rb = by_a.get(key), by_b.get(key)
        if (ra and "unrecorded" in ra) or (rb and "unrecorded" in rb):
            unrecorded.append(str((ra or {}).get("unrecorded") or (rb or {}).get("unrecorded")))
            continue
        compared += 1
        if ra is not None and rb is not None and ra.get("digest") == rb.get("digest") \
                and ra.get("batches") == rb.get("batches"):
            continue
        differing.append(key[1])
        if first is None:
            ba = (ra or {}).get("batches") or []
            bb = (rb or {}).get("batches") or []
            pairs = enumerate(zip(ba, bb, strict=False))
            idx = next((i for i, (x, y) in pairs if x != y), min(len(ba), len(bb)))
            first = _where(key, batch=idx)
    out: dict[str, Any] = {
        # None: the batch order could not be recorded (e.g. a tf.data pipeline), so nothing is known.
        "same": (not differing) if compared else None,
        "epochs_compared": compared,
        "epochs_differing": differing,
        "first_divergence": first,
    }
    if unrecorded:
        out["unrecorded"] = sorted(set(unrecorded))
    return out


def _metric_names(rows: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for row in rows:
        for k, v in row.items():
            if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool) and k not in names:
                names.append(k)
    return names


def explain_metrics(ref: Manifest, run: Manifest) -> dict[str, Any] | None:
    a, b = read_metrics(ref), read_metrics(run)
    if a is None or b is None:
        return None
    by_a, by_b = _by_epoch(a), _by_epoch(b)
    epochs = sorted(set(by_a) & set(by_b))
    names = _metric_names(a)
    first: dict[str, Any] | None = None
    for key in epochs:
        deltas = {k: _delta(by_a[key].get(k), by_b[key].get(k)) for k in names}
        deltas = {k: v for k, v in deltas.items() if v is not None}
        if deltas:
            first = _where(key, metrics=deltas)
            break
    final = None
    if epochs:
        last = epochs[-1]
        deltas = {k: _delta(by_a[last].get(k), by_b[last].get(k)) for k in names}
        final = _where(last, metrics={k: v for k, v in deltas.items() if v is not None})
    return {
        "same": first is None and len(a) == len(b),
        "epochs_compared": len(epochs),
        "epochs": {"reference": len(a), "run": len(b)},
        "first_divergence": first,
        "final": final,
    }


def _delta(x: Any, y: Any) -> dict[str, Any] | None:
    if x == y:
        return None
    out: dict[str, Any] = {"reference": x, "run": y}
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        out["abs_diff"] = abs(float(y) - float(x))
    return out


# ---------------------------------------------------------------- environment diff

# Flattened manifest keys -> category. Categories "code", "data", "seed" and "params" are
# inputs; "hardware" and "software" are the environment; "info" never explains a difference.
_EXACT_CATEGORY = {
    # The code digest is computed inside the container from what ran: it is the code's identity.
    # How the code got there (baked or mounted) and the git state around it are context.
    "recipe.tree_digest": "code", "recipe.entry": "code", "recipe.framework": "software",
    "recipe.code_source": "info", "recipe.files": "info", "recipe.args": "params", "recipe.volatile": "info",
    "image.git_commit": "info", "image.git_dirty": "info", "image.runtime_digest": "software",
    "image.packages_digest": "software",
    "seed": "seed",
    "image.id": "software", "image.base_digest": "software", "image.lock_sha256": "software",
    "image.variant": "hardware", "image.launcher_version": "software", "image.tag": "info",
    "determinism.profile": "software", "determinism.threads": "software",
    "host.name": "info", "host.kind": "info",
}
_SEED_ENV = ("LAUNCHER_SEED", "PYTHONHASHSEED")
_HARDWARE_WORDS = ("cpu", "gpu", "driver", "cuda", "cudnn", "device", "arch", "machine", "cores", "nproc",
                   "isa")
# Host facts that describe access and capacity, not what computes the bits.
_INFO_FACTS = ("user", "is_root", "sudo", "docker", "ram_bytes", "disk", "root_dir", "container_toolkit",
               "nvidia.smi")
_VOLATILE_WORDS = ("time", "_at", "date", "uptime", "free", "avail", "load", "pid", "hostname", "boot",
                   "container", "run_id", "elapsed", "duration")


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for k in sorted(value):
            _flatten(f"{prefix}.{k}" if prefix else str(k), value[k], out)
    else:
        out[prefix] = value


def environment_view(m: Manifest) -> dict[str, Any]:
    """The manifest fields that can explain a difference, flattened to dotted keys."""
    flat: dict[str, Any] = {}
    for key in ("recipe", "image", "determinism", "host", "runtime", "params"):
        if key in m.data:
            _flatten(key, m.data[key], flat)
    flat["seed"] = m.seed
    flat.pop("recipe.name", None)
    return {k: v for k, v in flat.items() if not _is_volatile_key(k)}


def _is_volatile_key(key: str) -> bool:
    leaf = key.rsplit(".", 1)[-1].lower()
    return any(w in leaf for w in _VOLATILE_WORDS)


def categorize(key: str) -> str:
    if key in _EXACT_CATEGORY:
        return _EXACT_CATEGORY[key]
    if key.startswith("params."):
        return "params"
    if key.startswith("recipe.git."):
        return "info"
    if key.startswith(("determinism.env.", "runtime.env.")):
        return "seed" if key.rsplit(".", 1)[-1] in _SEED_ENV else "software"
    if key == "runtime.seed":
        return "seed"
    if key.startswith("host.") and not key.startswith("host.facts."):
        return "info"
    lower = key.lower()
    if key.startswith("host.facts.") and any(w in lower for w in _INFO_FACTS):
        return "info"
    if key.startswith(("host.facts.", "runtime.")) and any(w in lower for w in _HARDWARE_WORDS):
        return "hardware"
    return "software"


def environment_diff(ref: Manifest, run: Manifest) -> list[dict[str, Any]]:
    a, b = environment_view(ref), environment_view(run)
    rows = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            rows.append({"key": key, "category": categorize(key), "reference": a.get(key), "run": b.get(key)})
    return rows


INPUT_CATEGORIES = ("code", "data", "seed", "params")


def training_identical(model: Mapping[str, Any] | None, initial: Mapping[str, Any] | None,
                       data: Mapping[str, Any] | None, batches: Mapping[str, Any] | None,
                       metrics: Mapping[str, Any] | None) -> bool:
    """Every model array, fingerprint and metric recorded in both runs is identical (and some were)."""
    if model is None and metrics is None:
        return False
    if model is not None and model.get("identical") is not True:
        return False
    return all(part is None or part.get("same") is not False for part in (initial, data, batches, metrics))


def classify(identical: bool, env: list[dict[str, Any]], data: Mapping[str, Any] | None,
             model: Mapping[str, Any] | None, initial: Mapping[str, Any] | None,
             batches: Mapping[str, Any] | None, seeded: bool = True,
             metrics: Mapping[str, Any] | None = None,
             files: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """One line: identical; only other outputs differ; nondeterminism in training;
    environment-dependent; or an input change. Never nondeterminism when training was identical."""
    if identical:
        return {"kind": CLASS_IDENTICAL, "causes": [], "line": "identical"}
    if files is not None and training_identical(model, initial, data, batches, metrics):
        named = [_file_phrase(f) for f in files[:3]] + ([f"and {len(files) - 3} more"] if len(files) > 3 else [])
        return {"kind": CLASS_OUTPUTS, "causes": ["outputs"],
                "line": "training identical (every model array, fingerprint and metric); differs only in "
                        f"other outputs: {', '.join(named) or 'none named'}"}
    by_cat: dict[str, list[str]] = {}
    for row in env:
        by_cat.setdefault(row["category"], []).append(row["key"])
    if data is not None and not data.get("same", True):
        by_cat.setdefault("data", []).insert(0, "dataset fingerprint")
    inputs = [c for c in INPUT_CATEGORIES if c in by_cat]
    if inputs:
        parts = []
        for c in inputs:
            if c == "seed":
                seed = next((r for r in env if r["key"] == "seed"), None)
                parts.append(f"seed ({seed['reference']} -> {seed['run']})" if seed else "seed")
            elif c == "data":
                parts.append("data (" + ", ".join(by_cat["data"]) + ")")
            elif c == "code":
                parts.append("code (" + ", ".join(by_cat["code"]) + ")")
            else:
                names = ", ".join("script arguments" if k == "recipe.args" else k.removeprefix("params.")
                                  for k in by_cat["params"])
                parts.append(f"params ({names})")
        return {"kind": CLASS_INPUT, "causes": inputs,
                "line": "differs in " + ", ".join(parts) + ": an input change"}
    if "hardware" in by_cat:
        keys = by_cat["hardware"][:3]
        causes = ["hardware", "software"] if "software" in by_cat else ["hardware"]
        return {"kind": CLASS_ENVIRONMENT, "causes": causes,
                "line": f"differs on different hardware ({', '.join(keys)}): environment-dependent"}
    if "software" in by_cat:
        keys = by_cat["software"][:3]
        return {"kind": CLASS_ENVIRONMENT, "causes": ["software"],
                "line": f"differs in the software environment ({', '.join(keys)}): environment-dependent"}
    where = []
    if initial is not None:
        where.append("initial weights " + ("identical" if initial.get("same") else "already differ"))
    if batches is not None and batches.get("same") is not None:
        where.append("batches " + ("identical" if batches["same"] else "differ"))
    first = (model or {}).get("first_difference")
    if first:
        where.append(f"first differing layer {first['layer']} array {first['array']}")
    detail = f" ({'; '.join(where)})" if where else ""
    return {"kind": CLASS_NONDETERMINISM, "causes": ["training"],
            "line": ("differs with the same environment and seed: nondeterminism in training" if seeded
                     else "differs with the same environment and no fixed seed (profile off?): "
                     "nondeterminism expected") + detail}


def _file_phrase(f: Mapping[str, Any]) -> str:
    name = str(f["path"]).removeprefix("outputs/")
    content = f.get("content")
    if f.get("status") == MISSING:
        return f"{name} (in one run only)"
    if content and content.get("difference"):
        return f"{name} ({content['difference']})"
    return f"{name} (bytes; format not compared by content)"


# ---------------------------------------------------------------- one run against itself


def _digest_arrays(weights: Weights) -> list[tuple[str, str, str]]:
    from launcher.runtime.fingerprints import array_digest

    return [(a.layer, a.array, array_digest(a.value)) for a in weights]


def check_consistency(m: Manifest) -> dict[str, Any]:
    """Cross-check one run's records of its final weights against each other.

    ``model/canonical.npz`` against ``weights/layers.json`` (the per-layer sha256 the runtime
    wrote at the end of training) and against the native save where it can be read. A
    mismatch means a file was altered after training: Corrupt (exit 13), naming the array.
    """
    out: dict[str, Any] = {"layers": None, "native": None}
    if not m.artifact(CANONICAL_MODEL):
        return out
    canonical = _digest_arrays(load_canonical(m.file(CANONICAL_MODEL)))
    hint = ("the run's files were altered after training; re-pull the run (`launcher pull "
            f"{m.run_id}`) if the host's copy is intact, or run it again")
    doc = _read_json(m.file(LAYERS)) if m.artifact(LAYERS) else None
    if isinstance(doc, dict) and isinstance(doc.get("layers"), list):
        recorded = [(str(layer.get("name")), str(arr.get("index")), str(arr.get("sha256")))
                    for layer in doc["layers"] if isinstance(layer, dict)
                    for arr in layer.get("arrays") or [] if isinstance(arr, dict)]
        for (layer, array, got), rec in zip(canonical, recorded, strict=False):
            if (layer, array, got) != rec:
                raise Corrupt(f"run {m.run_id} is inconsistent: {CANONICAL_MODEL.removeprefix('outputs/')} layer "
                              f"{layer} array {array} (sha256 {got[7:19]}…) does not match its per-layer digest in "
                              f"weights/layers.json ({rec[0]}/{rec[1]} {rec[2][7:19]}…)", hint)
        if len(canonical) != len(recorded):
            raise Corrupt(f"run {m.run_id} is inconsistent: {len(canonical)} arrays in canonical.npz, "
                          f"{len(recorded)} in weights/layers.json", hint)
        out["layers"] = {"arrays": len(canonical), "ok": True}
    for rel in NATIVE_MODELS:
        if not m.artifact(rel):
            continue
        try:
            native = load_weights(m.file(rel))
        except LauncherError as exc:
            out["native"] = {"source": rel, "ok": None, "skipped": exc.one_line()}
            continue
        found = {d for _, _, d in _digest_arrays(native)}
        shapes = {(a.value.shape, a.value.dtype.str) for a in native}
        by_key = {(a.layer, a.array): a for a in native}
        canonical_weights = load_canonical(m.file(CANONICAL_MODEL)) if len(canonical) else None
        for (layer, array, digest), wa in zip(canonical, canonical_weights or [], strict=False):
            if digest in found:
                continue
            twin = by_key.get((layer, array))
            comparable = twin is not None or (wa.value.shape, wa.value.dtype.str) in shapes
            if comparable:
                raise Corrupt(f"run {m.run_id} is inconsistent: canonical.npz layer {layer} array {array} is not "
                              f"in its native save {rel.removeprefix('outputs/')}", hint)
        out["native"] = {"source": rel, "ok": True}
        break
    return out


# ---------------------------------------------------------------- the report


@dataclass
class RunVerdict:
    manifest: Manifest
    status: str  # reference | identical | differs
    explanation: dict[str, Any] = field(default_factory=dict)
    content_only: list[dict[str, Any]] = field(default_factory=list)  # files identical in content only

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        cls = self.explanation.get("classification") or {"kind": CLASS_IDENTICAL, "line": _identical_line(self)}
        model = self.explanation.get("model") or {}
        return {
            "run_id": m.run_id, "group": m.group, "replicate": m.replicate, "seed": m.seed,
            "recipe": m.recipe_name, "run_status": m.status, "status": self.status,
            "classification": cls.get("kind") if self.status != REFERENCE else None,
            "line": cls.get("line") if self.status != REFERENCE else "reference",
            "first_difference": model.get("first_difference"),
            "identical_in_content": [f["path"] for f in self.content_only],
            "code": describe_code(m.recipe),
        }


def _identical_line(v: RunVerdict) -> str:
    if not v.content_only:
        return "identical"
    return "identical in content; bytes differ only in " + "; ".join(_volatile_phrase(f) for f in v.content_only[:3])


def _volatile_phrase(f: Mapping[str, Any]) -> str:
    what = ", ".join((f.get("content") or {}).get("volatile") or []) or "bytes"
    return f"{str(f['path']).removeprefix('outputs/')} ({what})"


@dataclass
class ArtifactRow:
    path: str
    checked: bool
    reference_sha256: str | None
    cells: dict[str, dict[str, Any]]  # run id -> {"status", "sha256"[, "path", "content"]}
    ignored_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "checked": self.checked, "ignored_by": self.ignored_by,
                "reference_sha256": self.reference_sha256, "runs": self.cells}


@dataclass
class VerifyReport:
    reference: Manifest
    runs: list[RunVerdict]
    artifacts: list[ArtifactRow]
    integrity: IntegrityStats
    skipped: list[dict[str, str]] = field(default_factory=list)
    mode: str = "compare"  # compare | alone
    selection: str | None = None  # how the runs were chosen, when not named
    consistency: dict[str, dict[str, Any]] = field(default_factory=dict)
    ignore: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return all(r.status in (REFERENCE, IDENTICAL) for r in self.runs)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.identical else ExitCode.NOT_REPRODUCIBLE

    @property
    def differing(self) -> list[RunVerdict]:
        return [r for r in self.runs if r.status == DIFFERS]

    @property
    def verdict(self) -> str:
        if self.mode == "alone":
            return CONSISTENT
        return IDENTICAL if self.identical else DIFFERS

    def _not_compared(self) -> list[str]:
        return [a.path for a in self.artifacts if not a.checked
                and any(c["status"] not in (REFERENCE, IDENTICAL) for c in a.cells.values())]

    def summary_line(self) -> str:
        n = len(self.runs)
        ref = self.reference.run_id
        prefix = f"{self.selection}: " if self.selection else ""
        if self.mode == "alone":
            cons = self.consistency.get(ref) or {}
            parts = [f"{self.integrity.files} files match its manifest"]
            if cons.get("layers"):
                parts.append("canonical weights match weights/layers.json")
            native = cons.get("native") or {}
            if native.get("ok"):
                parts.append(f"and its native save {str(native['source']).removeprefix('outputs/')}")
            return f"{prefix}consistent: run {ref} checked alone: " + ", ".join(parts)
        skipped = self._not_compared()
        tail = f"; {len(skipped)} volatile files differ, not compared" if skipped else ""
        ref_code = self.reference.recipe.get("tree_digest")
        other_code = sorted({str(r.manifest.recipe.get("tree_digest")) for r in self.runs
                             if r.manifest.recipe.get("tree_digest") != ref_code})
        if other_code:  # the results may agree, but the runs did not run the same code
            tail += (f"; the code differs ({str(ref_code).removeprefix('sha256:')[:12]} in {ref}, "
                     + ", ".join(c.removeprefix("sha256:")[:12] for c in other_code[:3]) + " in others)")
        if self.identical:
            content = {f["path"]: f for r in self.runs for f in r.content_only}
            if not content:
                return f"{prefix}identical: all {n} runs are bit-identical to {ref}{tail}"
            return (f"{prefix}identical in content: all {n} runs match {ref}; bytes differ only in volatile parts: "
                    + "; ".join(_volatile_phrase(f) for f in list(content.values())[:4])
                    + (f" and {len(content) - 4} more" if len(content) > 4 else "") + tail)
        kinds = sorted({r.explanation["classification"]["kind"] for r in self.differing})
        files = sorted({str(f["path"]).removeprefix("outputs/") for r in self.differing
                        for f in r.explanation.get("files") or []})
        named = ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
        return (f"{prefix}{len(self.differing)} of {n - 1} runs differ from {ref} ({', '.join(kinds)}): "
                f"content differs in {named}{tail}")

    def checks(self) -> dict[str, Any]:
        """Models, initial weights, training data, batches, metrics: all the same as the reference?"""
        others = [r for r in self.runs if r.status != REFERENCE]
        out: dict[str, Any] = {}
        for name, key in (("models", "model"), ("initial_weights", "initial_weights"),
                          ("data", "data"), ("batches", "batches"), ("metrics", "metrics")):
            checked, differing = 0, []
            for r in others:
                exp = r.explanation.get(key)
                if r.status == IDENTICAL:
                    checked += 1
                    continue
                same = None if exp is None else exp.get("identical") if key == "model" else exp.get("same")
                if same is None:  # not recorded, or could not be read
                    continue
                checked += 1
                if not same:
                    differing.append(r.manifest.run_id)
            # all_same is None when no run besides the reference could be checked.
            out[name] = {"all_same": (not differing) if checked else None, "checked": checked + 1,
                         "of": len(self.runs), "differing": differing}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "mode": self.mode,
            "selection": self.selection,
            "reference": self.reference.run_id,
            "recipe": self.reference.recipe_name,
            "summary": self.summary_line(),
            "integrity": {"files": self.integrity.files, "bytes": self.integrity.bytes, "ok": True},
            "consistency": self.consistency,
            "checks": self.checks(),
            "runs": [r.to_dict() for r in self.runs],
            "artifacts": [a.to_dict() for a in self.artifacts],
            "explanations": {r.manifest.run_id: r.explanation for r in self.runs if r.status == DIFFERS},
            "not_compared": {"launcher": list(VOLATILE), "ignore": list(self.ignore)},
            "skipped": self.skipped,
        }


def _load_named(ws: Workspace, refs: Iterable[str]) -> list[Manifest]:
    out: list[Manifest] = []
    seen: set[Path] = set()
    for ref in refs:
        d = resolve_run(ws, ref)
        if d in seen:
            continue
        seen.add(d)
        out.append(load_manifest(d))
    return out


@dataclass(frozen=True)
class Selection:
    reference: Manifest
    runs: list[Manifest]  # reference first
    note: str | None = None  # how the runs were chosen, when it is not obvious

    @property
    def alone(self) -> bool:
        return len(self.runs) == 1


def _previous_of_recipe(ws: Workspace, latest: Manifest) -> Manifest | None:
    key = (latest.started_at, latest.run_id)
    earlier = [m for m in _completed_manifests(ws) if m.recipe_name == latest.recipe_name
               and (m.started_at, m.run_id) < key and m.run_dir.resolve() != latest.run_dir.resolve()]
    return max(earlier, key=lambda m: (m.started_at, m.run_id), default=None)


def select_runs(ws: Workspace, run_ids: list[str] | None, against: str | None,
                group: str | None = None) -> Selection:
    """The runs to verify, reference first.

    Named runs, a group, or (neither) the latest group; when that group holds one run, the
    latest run is compared with the previous run of its recipe. One run with nothing to compare
    it with is checked alone.
    """
    if run_ids and group:
        raise UsageError("name runs or a group, not both", "drop the run ids or --group")
    note = None
    if run_ids:
        runs = _load_named(ws, run_ids)
    elif group is not None:
        runs = group_runs(ws, group)
        if not runs:
            raise NotFound(f"no completed runs in group {group!r} under {ws.runs}",
                           "check the group name in a run's manifest.json")
    else:
        runs = group_runs(ws, latest_group(ws))
        if len(runs) == 1 and against is None:
            previous = _previous_of_recipe(ws, runs[0])
            if previous is not None:
                note = (f"the latest run {runs[0].run_id} against the previous run of {runs[0].recipe_name}, "
                        f"{previous.run_id}")
                runs = [previous, runs[0]]
            else:
                note = f"the only run of {runs[0].recipe_name}"
    if against is not None:
        ref = _load_named(ws, [against])[0]
        runs = [ref, *(m for m in runs if m.run_dir.resolve() != ref.run_dir.resolve())]
    ref = runs[0]
    recipes = {m.recipe_name for m in runs}
    if len(recipes) > 1:
        other = next(m for m in runs if m.recipe_name != ref.recipe_name)
        raise Incompatible(
            f"runs of different recipes cannot be compared: {ref.run_id} ran {ref.recipe_name!r}, "
            f"{other.run_id} ran {other.recipe_name!r}",
            "verify runs of one recipe (a group from `launcher experiment`, or runs named one by one)",
        )
    return Selection(ref, runs, note)


def _pairing_keys(m: Manifest) -> dict[str, str]:
    """Artifact path -> the key it is compared under: TensorBoard event files, whose names carry
    the time, host and pid, pair by directory (the n-th event file of a directory, by name)."""
    keys: dict[str, str] = {}
    counters: dict[str, int] = {}
    for path in sorted(a.path for a in m.artifacts):
        folder, _, name = path.rpartition("/")
        if name.startswith("events.out.tfevents."):
            n = counters.get(folder, 0)
            counters[folder] = n + 1
            keys[path] = f"{folder}/events.out.tfevents.*" + (f"#{n}" if n else "")
        else:
            keys[path] = path
    return keys


def _content(ref: Manifest, run: Manifest, ref_path: str, run_path: str,
             savedmodels: dict[tuple[Path, Path], ContentDiff]) -> ContentDiff | None:
    a, b = ref.file(ref_path), run.file(run_path)
    root_a = savedmodel_root(a, ref.run_dir)
    root_b = savedmodel_root(b, run.run_dir)
    if root_a is not None and root_b is not None:
        if (root_a, root_b) not in savedmodels:
            try:
                savedmodels[(root_a, root_b)] = compare_savedmodel(root_a, root_b)
            except (LauncherError, OSError, ValueError) as exc:
                why = exc.one_line() if isinstance(exc, LauncherError) else str(exc)
                savedmodels[(root_a, root_b)] = ContentDiff("savedmodel", False, [],
                                                            f"cannot be read as a SavedModel: {why}")
        return savedmodels[(root_a, root_b)]
    return compare_files(a, b, ref_path)


def _compare_artifacts(ref: Manifest, runs: list[Manifest], recipe_globs: list[str], ignore: list[str]
                       ) -> tuple[list[ArtifactRow], dict[str, bool]]:
    keyed = {m.run_id: {k: p for p, k in _pairing_keys(m).items()} for m in runs}
    keys: list[str] = list(keyed[ref.run_id])
    for m in runs[1:]:
        keys += [k for k in keyed[m.run_id] if k not in keys]
    differs: dict[str, bool] = {m.run_id: False for m in runs[1:]}
    savedmodels: dict[tuple[Path, Path], ContentDiff] = {}
    rows: list[ArtifactRow] = []
    for key in keys:
        ref_path = keyed[ref.run_id].get(key)
        ra = ref.artifact(ref_path) if ref_path else None
        path = ref_path or next(keyed[m.run_id][key] for m in runs if key in keyed[m.run_id])
        why = ignored_by(path, recipe_globs, ignore)
        cells: dict[str, dict[str, Any]] = {ref.run_id: {"status": REFERENCE if ra else MISSING,
                                                         "sha256": ra.sha256 if ra else None}}
        for m in runs[1:]:
            run_path = keyed[m.run_id].get(key)
            a = m.artifact(run_path) if run_path else None
            cell: dict[str, Any] = {}
            if a is None or ra is None or ref_path is None or run_path is None:
                status = MISSING
            elif a.sha256 == ra.sha256:
                status = IDENTICAL
            elif why is not None:
                status = DIFFERS
            else:
                content = _content(ref, m, ref_path, run_path, savedmodels)
                status = DIFFERS if content is None or not content.same else IDENTICAL_CONTENT
                if content is not None:
                    cell["content"] = content.to_dict()
            cells[m.run_id] = {"status": status, "sha256": a.sha256 if a else None, **cell}
            if run_path is not None and run_path != path:
                cells[m.run_id]["path"] = run_path
            if why is None and status in (DIFFERS, MISSING):
                differs[m.run_id] = True
        rows.append(ArtifactRow(path, why is None, ra.sha256 if ra else None, cells, why))
    return rows, differs


def explain(ref: Manifest, run: Manifest, files: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    model = explain_model(ref, run)
    initial = explain_initial_weights(ref, run)
    data = explain_data(ref, run)
    batches = explain_batches(ref, run)
    metrics = explain_metrics(ref, run)
    env = environment_diff(ref, run)
    return {
        "classification": classify(False, env, data, model, initial, batches, seeded=ref.seed is not None,
                                   metrics=metrics, files=files),
        "model": model, "initial_weights": initial, "data": data, "batches": batches,
        "metrics": metrics, "environment": env, "files": files or [],
    }


def _run_files(rows: list[ArtifactRow], run_id: str, statuses: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        cell = row.cells.get(run_id) or {}
        if row.checked and cell.get("status") in statuses:
            out.append({"path": row.path, "status": cell["status"], "content": cell.get("content")})
    return out


def verify_checksums(ws: Workspace, run_ids: list[str] | None = None, against: str | None = None,
                     group: str | None = None, reporter: Reporter | None = None,
                     explainer: Callable[..., dict[str, Any]] = explain,
                     ignore: Iterable[str] = ()) -> VerifyReport:
    """Compare runs by content: the named runs (or the latest group) against the first or ``against``.

    One run (named alone, or the only run of its recipe) is checked alone: against its
    manifest and its own records. ``ignore``: globs of files listed but not compared.
    """
    sel = select_runs(ws, run_ids, against, group)
    ref, runs = sel.reference, sel.runs
    ignore = list(ignore)
    skipped = [] if run_ids or len(runs) < 2 else skipped_in_group(ws, runs[-1].group if group is None else group)
    stats = check_integrity(runs, reporter)
    consistency = {m.run_id: check_consistency(m) for m in runs}
    recipe_globs = sorted({g for m in runs for g in recipe_volatile(ws, m)})
    rows, differs = _compare_artifacts(ref, runs, recipe_globs, ignore)
    verdicts = [RunVerdict(ref, REFERENCE)]
    for m in runs[1:]:
        if differs[m.run_id]:
            if reporter is not None:
                reporter.note(f"{m.run_id} differs from {ref.run_id}: explaining")
            files = _run_files(rows, m.run_id, (DIFFERS, MISSING))
            verdicts.append(RunVerdict(m, DIFFERS, explainer(ref, m, files=files)))
        else:
            verdicts.append(RunVerdict(m, IDENTICAL, content_only=_run_files(rows, m.run_id, (IDENTICAL_CONTENT,))))
    return VerifyReport(reference=ref, runs=verdicts, artifacts=rows, integrity=stats, skipped=skipped,
                        mode="alone" if sel.alone else "compare", selection=sel.note, consistency=consistency,
                        ignore=ignore)
