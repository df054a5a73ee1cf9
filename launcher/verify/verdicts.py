"""Checksum verdicts across runs, and the explanations when they differ.

``verify_checksums`` re-hashes every run's files against its own manifest (a file damaged
after the pull is Corrupt, not a difference) and checks each run against itself (its canonical
weights against its per-layer digests and its native save: a file altered after training is
Corrupt too). It then compares each artifact's sha256 with the reference run; a file whose
bytes differ is compared by its content (:mod:`launcher.verify.content`: a .keras save, an event
file, a log with times), and for every run whose content differs it explains where (model
arrays, initial weights, dataset and batch fingerprints, metrics, other outputs) and why (the
environment diff of the two manifests, reduced to a one-line classification).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import Corrupt, ExitCode, LauncherError
from launcher.hashing import sha256_file
from launcher.progress import NullReporter, Reporter
from launcher.runs.manifest import Manifest, describe_code
from launcher.runs.store import Selection, group_runs, latest_group, resolve_run, select_runs, skipped_in_group
from launcher.verify.content import ContentDiff, compare_files, compare_savedmodel, file_format, savedmodel_root
from launcher.verify.differences import (  # explain: where and why two runs differ, and what it does
    BATCHES,
    CANONICAL_MODEL,
    CLASS_ENVIRONMENT,
    CLASS_IDENTICAL,
    CLASS_INPUT,
    CLASS_NONDETERMINISM,
    CLASS_OUTPUTS,
    DATASET,
    DIFFERS,
    IDENTICAL,
    IDENTICAL_CONTENT,
    INITIAL_WEIGHTS,
    LAYERS,
    METRICS,
    MISSING,
    NATIVE_MODELS,
    REFERENCE,
    categorize,
    check_consistency,
    explain,
    read_metrics,
    repull_hint,
)
from launcher.verify.impact import Tolerances
from launcher.workspace import Workspace

# The classifications, artifact paths, explanations and the run store lived in this module once
# (now launcher.verify.differences and launcher.runs.store); callers still import them from here.
__all__ = [
    "BATCHES",
    "CANONICAL_MODEL",
    "CLASS_ENVIRONMENT",
    "CLASS_IDENTICAL",
    "CLASS_INPUT",
    "CLASS_NONDETERMINISM",
    "CLASS_OUTPUTS",
    "CONSISTENT",
    "DATASET",
    "DIFFERS",
    "IDENTICAL",
    "IDENTICAL_CONTENT",
    "INITIAL_WEIGHTS",
    "LAYERS",
    "METRICS",
    "MISSING",
    "NATIVE_MODELS",
    "REFERENCE",
    "SCHEMA",
    "VOLATILE",
    "ArtifactRow",
    "IntegrityStats",
    "RunVerdict",
    "Selection",
    "VerifyReport",
    "categorize",
    "check_integrity",
    "explain",
    "group_runs",
    "ignored_by",
    "is_volatile",
    "latest_group",
    "read_metrics",
    "recipe_volatile",
    "resolve_run",
    "verify_checksums",
]

SCHEMA = "launcher.verify.verdicts/v1"

CONSISTENT = "consistent"  # the verdict on one run checked alone

# Who left a file out of the comparison.
IGNORED_BY_LAUNCHER = "launcher"
IGNORED_BY_RECIPE = "recipe"
IGNORED_BY_OPTION = "--ignore"

# The files launcher itself never compares (the one list; README "Verify", docs/verify-json.md):
# its own records of times and of the environment, which the manifests compare instead, and
# the recipe's console log, which carries times. Listed in the table, left out of the verdict.
# Everything else is compared, by content where the format is known (launcher.verify.content).
VOLATILE = (
    "outputs/_launcher/*",
    "outputs/logs/train.log",
    "launch.json",
)

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
                              repull_hint(m))
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
                              repull_hint(m))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on a mismatch, hash nothing more
        task.close()
    return IntegrityStats(files=len(jobs), bytes=total)



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
        for key, what in (("tree_digest", "code"), ("lib_digest", "recipe library")):
            ref_code = self.reference.recipe.get(key)
            by_code: dict[str, list[str]] = {}
            for r in self.runs:
                if r.manifest.recipe.get(key) != ref_code:
                    by_code.setdefault(str(r.manifest.recipe.get(key)), []).append(r.manifest.run_id)
            if by_code:  # the results may agree, but the runs did not run the same code
                where = [f"{c.removeprefix('sha256:')[:12]} in " + (ids[0] if len(ids) == 1 else f"{len(ids)} runs")
                         for c, ids in sorted(by_code.items())[:3]]
                tail += (f"; the {what} differs ({str(ref_code).removeprefix('sha256:')[:12]} in {ref}, "
                         + ", ".join(where) + ")")
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
        paths = {a.path for a in self.reference.artifacts}  # a byte-identical run proves only what was recorded
        recorded = {"model": any(file_format(p) in MODEL_FORMATS for p in paths), "initial_weights":
                    INITIAL_WEIGHTS in paths, "data": DATASET in paths, "batches": BATCHES in paths,
                    "metrics": METRICS in paths}
        for name, key in (("models", "model"), ("initial_weights", "initial_weights"),
                          ("data", "data"), ("batches", "batches"), ("metrics", "metrics")):
            checked, differing = 0, []
            for r in others:
                exp = r.explanation.get(key)
                if r.status == IDENTICAL:
                    checked += recorded[key]
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



MODEL_FORMATS = frozenset({"keras", "hdf5", "torch", "safetensors", "npz", "npy"})


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
                     ignore: Iterable[str] = (), tolerances: Tolerances | None = None) -> VerifyReport:
    """Compare runs by content: the named runs (or the latest group) against the first or ``against``.

    One run (named alone, or the only run of its recipe) is checked alone: against its
    manifest and its own records. ``ignore``: globs of files listed but not compared.
    """
    sel = select_runs(ws, run_ids, against, group)
    ref, runs = sel.reference, sel.runs
    ignore = list(ignore)
    skipped = [] if run_ids else skipped_in_group(ws, runs[-1].group if group is None else group)
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
            verdicts.append(RunVerdict(m, DIFFERS, explainer(ref, m, files=files, tolerances=tolerances)))
        else:
            verdicts.append(RunVerdict(m, IDENTICAL, content_only=_run_files(rows, m.run_id, (IDENTICAL_CONTENT,))))
    return VerifyReport(reference=ref, runs=verdicts, artifacts=rows, integrity=stats, skipped=skipped,
                        mode="alone" if sel.alone else "compare", selection=sel.note, consistency=consistency,
                        ignore=ignore)
