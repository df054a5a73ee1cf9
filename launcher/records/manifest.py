"""The run manifest (``runs/<id>/manifest.json``, schema version 1): the one reader and writer.

A run directory is complete only once its manifest exists; every other module reads
manifests through :func:`load_manifest` so that schema checks live in one place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, cast

from launcher.errors import Corrupt, NotFound, SchemaTooNew
from launcher.hashing import atomic_write_json
from launcher.records.records import (
    BAKED,
    CANCELLED,
    FAILED,
    MOUNTED,
    SUCCEEDED,
    ArtifactEntry,
    CodeRecord,
    DeterminismRecord,
    ExitRecord,
    ImageRecord,
    LaunchRecord,
    ManifestData,
    ManifestHost,
    ManifestPlacement,
    ManifestRecipe,
    PulledFile,
    Segment,
    placement_kind,
)
from launcher.records.rundir import CODE_RECORD, EXIT_RECORD, OUTPUTS, RUNTIME_RECORD, RunDir
from launcher.runtime.recipespec import ParamValue

if TYPE_CHECKING:
    from launcher.records.records import RunState
    from launcher.runtime.records import RuntimeDocument

SCHEMA_VERSION = 1
STATUSES = (SUCCEEDED, FAILED, CANCELLED)

# field -> accepted types; only what readers rely on is required, the rest is passed through.
_REQUIRED: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "run_id": (str,),
    "group": (str,),
    "recipe": (dict,),
    "seed": (int, type(None)),
    "determinism": (dict,),
    "image": (dict,),
    "host": (dict,),
    "started_at": (str,),
    "status": (str,),
    "artifacts": (list,),
}


class ManifestMissing(NotFound):
    """A run directory without manifest.json: the run is still going, or its pull did not finish."""


@dataclass(frozen=True)
class Artifact:
    path: str  # relative to the run directory, posix, e.g. "outputs/model/canonical.npz"
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    run_dir: Path
    data: ManifestData
    artifacts: tuple[Artifact, ...]

    @property
    def run_id(self) -> str:
        return str(self.data["run_id"])

    @property
    def group(self) -> str:
        return str(self.data["group"])

    @property
    def replicate(self) -> int:
        value = self.data.get("replicate", 0)
        return value if isinstance(value, int) else 0

    @property
    def recipe(self) -> ManifestRecipe:
        return self.data["recipe"]

    @property
    def recipe_name(self) -> str:
        return str(self.recipe.get("name", ""))

    @property
    def code_name(self) -> str:
        """The code a run executed, as people name it: a recipe's name, or a plain script's project
        and path inside it (``myproj/train.py``); older manifests without it give the recipe name."""
        return str(self.recipe.get("identity") or self.recipe_name)

    @property
    def code_key(self) -> tuple[str, str | None, str | None]:
        """What makes two runs runs of the same code: the name above, the code digest the runtime
        computed in the container, and the shared recipe library's digest where one was used."""
        lib = self.recipe.get("lib_digest")
        digest = self.recipe.get("tree_digest")
        return self.code_name, str(digest) if digest else None, str(lib) if lib else None

    @property
    def seed(self) -> int | None:
        return self.data["seed"]

    @property
    def params(self) -> dict[str, ParamValue]:
        value = self.data.get("params")
        return value if isinstance(value, dict) else {}

    @property
    def determinism(self) -> DeterminismRecord:
        return self.data["determinism"]

    @property
    def image(self) -> ImageRecord:
        return self.data["image"]

    @property
    def host(self) -> ManifestHost:  # Host.describe() and the host's facts (launcher.hosts)
        return self.data["host"]

    @property
    def runtime(self) -> RuntimeDocument:  # what the runtime in the container wrote ({} where nothing)
        value = self.data.get("runtime")
        return value if isinstance(value, dict) else {}

    @property
    def started_at(self) -> str:
        return str(self.data["started_at"])

    @property
    def status(self) -> str:
        return str(self.data["status"])

    @property
    def path(self) -> Path:
        return RunDir(self.run_dir).manifest_file

    def artifact(self, rel: str) -> Artifact | None:
        return next((a for a in self.artifacts if a.path == rel), None)

    def file(self, rel: str) -> Path:
        return self.run_dir / rel


def manifest_path(run_dir: Path) -> Path:
    return RunDir(run_dir).manifest_file


def _safe_rel(rel: str) -> bool:
    p = PurePosixPath(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel


def validate(data: Any, source: Path) -> tuple[Artifact, ...]:
    """Check a parsed manifest against schema 1; return its artifacts. Raises Corrupt or SchemaTooNew."""
    if not isinstance(data, dict):
        raise Corrupt(f"{source} is not a JSON object", "re-pull the run (`launcher pull RUN`)")
    version = data.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{source} has manifest schema version {version}; this launcher reads up to {SCHEMA_VERSION}",
            "upgrade launcher (`pip install -U launcher`) to read runs written by a newer one",
        )
    for key, types in _REQUIRED.items():
        if key not in data:
            raise Corrupt(f"{source} lacks the field {key!r}", "re-pull the run (`launcher pull RUN`)")
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise Corrupt(f"{source}: field {key!r} has the wrong type ({type(value).__name__})",
                          "re-pull the run (`launcher pull RUN`)")
    if data["schema_version"] != SCHEMA_VERSION:
        raise Corrupt(f"{source} has an unknown schema version {data['schema_version']!r}",
                      "re-pull the run (`launcher pull RUN`)")
    if data["status"] not in STATUSES:
        raise Corrupt(f"{source}: status {data['status']!r} is not one of {', '.join(STATUSES)}",
                      "re-pull the run (`launcher pull RUN`)")
    arts: list[Artifact] = []
    seen: set[str] = set()
    for i, entry in enumerate(data["artifacts"]):
        ok = (isinstance(entry, dict) and isinstance(entry.get("path"), str)
              and isinstance(entry.get("size"), int) and not isinstance(entry.get("size"), bool)
              and isinstance(entry.get("sha256"), str) and entry["sha256"].startswith("sha256:"))
        if not ok:
            raise Corrupt(f"{source}: artifacts[{i}] needs path, size and a sha256:<hex> digest",
                          "re-pull the run (`launcher pull RUN`)")
        if not _safe_rel(entry["path"]) or entry["path"] in seen:
            raise Corrupt(f"{source}: artifacts[{i}] has a bad or repeated path {entry['path']!r}",
                          "re-pull the run (`launcher pull RUN`)")
        seen.add(entry["path"])
        arts.append(Artifact(entry["path"], entry["size"], entry["sha256"]))
    return tuple(arts)


def load_manifest(run_dir: Path) -> Manifest:
    """Read and validate ``run_dir/manifest.json``.

    Raises NotFound (no such directory), ManifestMissing (an incomplete run), SchemaTooNew,
    or Corrupt (unparsable or not schema 1).
    """
    if not run_dir.is_dir():
        raise NotFound(f"no run directory {run_dir}", "list runs with `launcher ps`")
    path = manifest_path(run_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestMissing(
            f"run {run_dir.name} has no manifest.json: it is not complete "
            "(still running, or its pull failed)",
            f"pull it again with `launcher pull {run_dir.name}`, or verify other runs",
        ) from None
    except UnicodeDecodeError as exc:
        raise Corrupt(f"{path} is not UTF-8 text", "re-pull the run (`launcher pull RUN`)") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise Corrupt(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})",
                      "re-pull the run (`launcher pull RUN`)") from exc
    artifacts = validate(data, path)
    return Manifest(run_dir=run_dir, data=cast(ManifestData, data), artifacts=artifacts)


def write_manifest(run_dir: Path, data: ManifestData) -> Manifest:
    """Validate and atomically write ``run_dir/manifest.json`` (the last step of a pull)."""
    record = data.copy()
    record.setdefault("schema_version", SCHEMA_VERSION)
    path = manifest_path(run_dir)
    artifacts = validate(record, path)
    atomic_write_json(path, record)
    return Manifest(run_dir=run_dir, data=record, artifacts=artifacts)


def read_quiet(run_dir: Path) -> dict[str, Any]:
    """The run's manifest as it is on disk, unchecked, or {} when there is none or it is unreadable (listings)."""
    return read_json_object(manifest_path(run_dir))


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from path, or {} where it is missing, unreadable or not an object. Free-form: what
    the runtime in the container wrote (each field is checked where it is read)."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def read_runtime_record(outputs: Path) -> RuntimeDocument:
    """``_launcher/runtime.json`` under outputs as the runtime wrote it ({} where there is none); its fields
    are checked where they are read (launcher.verify.evidence)."""
    return cast("RuntimeDocument", read_json_object(outputs / RUNTIME_RECORD))


def read_exit_record(outputs: Path) -> ExitRecord:
    """``_launcher/exit.json`` under outputs: its fields of the right type ({} where there is none)."""
    doc = read_json_object(outputs / EXIT_RECORD)
    rec: ExitRecord = {}
    if isinstance(doc.get("exit_code"), int):
        rec["exit_code"] = doc["exit_code"]
    if doc.get("started_at"):
        rec["started_at"] = str(doc["started_at"])
    if doc.get("ended_at"):
        rec["ended_at"] = str(doc["ended_at"])
    return rec


def read_code_record(outputs: Path) -> CodeRecord:
    """``_launcher/code.json`` under outputs: its parts that are JSON objects ({} where there is none)."""
    doc = read_json_object(outputs / CODE_RECORD)
    rec: CodeRecord = {}
    parts = {key: doc[key] for key in ("recipe", "lib", "runtime", "packages") if isinstance(doc.get(key), dict)}
    if "recipe" in parts:
        rec["recipe"] = parts["recipe"]
    if "lib" in parts:
        rec["lib"] = parts["lib"]
    if "runtime" in parts:
        rec["runtime"] = parts["runtime"]
    if "packages" in parts:
        rec["packages"] = parts["packages"]
    if doc.get("lock_sha256"):
        rec["lock_sha256"] = str(doc["lock_sha256"])
    return rec


def _exit_code(exit_rec: ExitRecord, state: RunState | None) -> int:
    """The script's exit status as the runtime recorded it, else as the target saw it, else -1."""
    code = exit_rec.get("exit_code")
    if isinstance(code, int):
        return code
    return state.exit_code if state and state.exit_code is not None else -1


def _recipe_ran(launch: LaunchRecord, code: CodeRecord) -> ManifestRecipe:
    """The manifest's recipe: what the launch record expected, with what the runtime computed in its place."""
    ran = code.get("recipe", {})
    lrec = launch["recipe"]
    recipe: ManifestRecipe = {
        "name": lrec["name"],
        "tree_digest": ran.get("digest"),
        "framework": lrec["framework"],
        "entry": ran.get("entry") or lrec.get("entry"),
        "code_source": ran.get("source") or lrec.get("code_source"),
        "files": ran.get("files"),
        "args": list(lrec.get("args") or []),
        "git": lrec.get("git") or {},
    }
    lib_digest = code.get("lib", {}).get("digest")
    if lib_digest:  # the shared recipe library the recipe ran with (recipes/_lib)
        recipe["lib_digest"] = lib_digest
    if lrec.get("volatile"):
        recipe["volatile"] = list(lrec["volatile"])
    if lrec.get("identity"):  # a plain script's project/path (launcher.specs.identity)
        recipe["identity"] = lrec["identity"]
    return recipe


def _image_ran(launch: LaunchRecord, code: CodeRecord) -> ImageRecord:
    """The manifest's image: the launch record's, with the image ID it started from and the digests
    the runtime computed."""
    image = launch["image"].copy()
    image["id"] = launch.get("image_ran") or image.get("id")
    image["runtime_digest"] = code.get("runtime", {}).get("digest")
    if code.get("lock_sha256"):
        image["lock_sha256"] = code["lock_sha256"]
    image["packages_digest"] = code.get("packages", {}).get("digest")
    return image


def assemble(launch: LaunchRecord, outputs: Path, files: Mapping[str, PulledFile],
             state: RunState | None, now: str) -> ManifestData:
    """The manifest of a finished run, from its launch record, its pulled outputs (files: the
    verified ones, by path under outputs/) and its last state where it was placed.

    What ran is read from what ran: the code digest, the runtime's digest and the lock are the
    ones the runtime computed inside the container (``_launcher/code.json``), the image ID the
    one the container was started from. The host's own idea of them is never substituted; where
    the runtime recorded nothing (it did not get that far) the digest is null.
    """
    exit_rec = read_exit_record(outputs)
    exit_code = _exit_code(exit_rec, state)
    code = read_code_record(outputs)
    segments: list[Segment] = []
    if launch.get("checkpoint"):
        segments = run_segments(launch, state)
        first = segments[0].get("started_at")
        if first and len(segments) > 1:  # the run started with its first container
            exit_rec["started_at"] = first
    placement: ManifestPlacement = {"kind": str(placement_kind(launch))}
    if state is not None and state.info is not None:
        placement.update(cast(ManifestPlacement, state.info))  # its keys after "kind", as the target gave them
    data: ManifestData = {
        "schema_version": SCHEMA_VERSION,
        "run_id": launch["run_id"],
        "group": launch["group"],
        "replicate": launch.get("replicate", 0),
        "recipe": _recipe_ran(launch, code),
        "params": launch.get("params", {}),
        "env": dict(launch.get("env") or {}),  # the user's --env/--secret-env: {NAME: {value} | {sha256}}
        "probes": launch.get("probes"),
        "trace": launch.get("trace"),
        "seed": launch.get("seed"),
        "determinism": launch["determinism"],
        "image": _image_ran(launch, code),
        "host": {**launch["host"], "facts": launch["facts"] if "facts" in launch else {}},
        "placement": placement,
        "runtime": read_runtime_record(outputs),
        "started_at": str(exit_rec.get("started_at") or (state.started_at if state else None) or launch["launched_at"]),
        "ended_at": str(exit_rec.get("ended_at") or (state.finished_at if state else None) or now),
        "exit_code": exit_code,
        "status": CANCELLED if state and state.status == CANCELLED else SUCCEEDED if exit_code == 0 else FAILED,
        "data": launch.get("data"),
        "data_source": launch.get("data_source"),
        "artifacts": [{"path": f"{OUTPUTS}/{rel}", "size": rec["size"], "sha256": rec["sha256"]}
                      for rel, rec in sorted(files.items())],
    }
    if launch.get("checkpoint"):
        data["checkpoint"] = launch["checkpoint"]
        data["segments"] = segments
    if launch.get("topology"):
        from launcher.records import ranks

        data["topology"] = topology = ranks.completed(launch["topology"], outputs, outputs.parent)
        failed = topology.get("failed")
        if failed is not None:  # the run's exit code is the rank's that failed first, not a node's stopped for it
            data["exit_code"] = failed["exit_code"]
            if data["status"] != CANCELLED:
                data["status"] = FAILED
    return data


def run_segments(launch: LaunchRecord, state: RunState | None) -> list[Segment]:
    """A resumable run's containers (``launcher resume``), first to last: each one's start, end, exit
    code and the checkpoint it resumed from; the last one completed from its state."""
    first: Segment = {"segment": 0, "container": launch.get("container"), "resumed_from": None}
    done = [s.copy() for s in launch.get("segments") or [first]]
    last = done[-1]
    if state is not None:
        last.update({"started_at": state.started_at or last.get("started_at"),
                     "ended_at": state.finished_at if state.ended else None,
                     "exit_code": state.exit_code if state.ended else None})
    return done


def describe_code(recipe: Mapping[str, object]) -> str:  # a manifest's or a launch record's recipe
    """One phrase for the code a run executed: its digest, where it came from, and whether it
    was a committed, clean git state (e.g. "f376cf9a9ad6 (baked in the image; git 1a2b3c4, clean)")."""
    digest = str(recipe.get("tree_digest") or "")
    short = digest.removeprefix("sha256:")[:12] or "unknown"
    source = {BAKED: "baked in the image", MOUNTED: "mounted"}.get(str(recipe.get("code_source")), "")
    git = recipe.get("git") or {}
    if isinstance(git, dict) and git.get("commit"):
        state = f"git {str(git['commit'])[:7]}, " + ("uncommitted changes" if git.get("dirty") else "clean")
    elif "git" in recipe:
        state = "not in git"
    else:
        state = ""
    detail = "; ".join(x for x in (source, state) if x)
    return f"{short} ({detail})" if detail else short


def artifact_entries(run_dir: Path, rel_paths: list[str], digests: Mapping[str, str]) -> list[ArtifactEntry]:
    """Manifest ``artifacts`` entries for files already verified (digest per relative path), sorted."""
    return [
        {"path": rel, "size": (run_dir / rel).stat().st_size, "sha256": digests[rel]}
        for rel in sorted(rel_paths)
    ]
