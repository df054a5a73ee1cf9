"""Every artifact of the runs side by side: which files pair across runs, which are left out, and how
each pair compares (identical, identical in content, differs, missing, unreadable, ignored).

Files pair by path, with times normalised: a TensorBoard event file's name carries the time, host
and pid, and log folders are often named by the time of the run (``logs/fit/20261124-101010/``,
Keras' TensorBoard callback in its tutorials; Hydra's ``outputs/2026-11-24/10-10-10/``), so the
n-th file of a normalised key in one run pairs with the n-th in the other.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from launcher.errors import LauncherError
from launcher.records import rundir
from launcher.records.manifest import Manifest
from launcher.verify.content import ContentDiff, compare_files, compare_savedmodel, savedmodel_root, unreadable
from launcher.verify.contentfigures import file_date_hint
from launcher.verify.contentlogs import ContentRecord
from launcher.verify.contenttf import SAVEDMODEL
from launcher.verify.differences import (
    DIFFERS,
    IDENTICAL,
    IDENTICAL_CONTENT,
    IGNORED,
    MISSING,
    REFERENCE,
    UNREADABLE,
    DifferingFile,
)
from launcher.verify.evidence import ROW_ALONE, RowOutcome, classify, matches
from launcher.verify.stepdiff import is_steps
from launcher.verify.stepevidence import FORMAT as STEPS_FORMAT
from launcher.verify.stepevidence import compare_steps
from launcher.workspace import Workspace

# Who left a file out of the comparison.
IGNORED_BY_LAUNCHER = "launcher"
IGNORED_BY_RECIPE = "recipe"
IGNORED_BY_OPTION = "--ignore"

# The files launcher itself never compares (the one list; README "Verify", docs/verify-json.md):
# its own records of times and of the environment, which the manifests compare instead, the
# recipe's console log, which carries times (each node's and each rank's of a run of several), and the
# checkpoints of `run --checkpoint-every`, which a run without them lacks (the final model is compared).
# Listed in the table, left out of the verdict.
# Everything else is compared, by content where the format is known (launcher.verify.content); the
# step fingerprints (launcher's weight digests) step by step (launcher.verify.stepevidence), even when
# their bytes agree, for what they prove.
VOLATILE = (
    "outputs/_launcher/*",
    "outputs/logs/train.log",
    "outputs/checkpoints/*",
    rundir.LAUNCH,
    # a run of several processes: the same for each other node (nodes/<k>/) and each other rank (ranks/<r>/)
    "outputs/nodes/*/_launcher/*",
    "outputs/nodes/*/logs/train.log",
    "outputs/ranks/*/_launcher/*",
    "outputs/ranks/*/logs/train.log",
    "outputs/ranks/*/checkpoints/*",
)
# Why each who leaves files out: said once per who, not once per file.
IGNORED_WHY = {
    IGNORED_BY_LAUNCHER: "launcher's own records of times and environment, compared through the manifests, "
                         "the console log, which carries times, and the checkpoints to resume from",
    IGNORED_BY_RECIPE: "declared volatile by the recipe (`volatile` in recipe.toml)",
    IGNORED_BY_OPTION: "left out with --ignore",
}
EVENTS_PREFIX = "events.out.tfevents."

# A time in a file or folder name: 20261124-101010, 2026-11-24[_10-10-10], 10-10-10 (Hydra's
# time folder), or a Unix time in seconds (2001 to 2033).
_TIME = re.compile(
    r"(?<![0-9])(?:\d{8}[-_T]?\d{6}(?:\.\d+)?"
    r"|\d{4}-\d{2}-\d{2}(?:[T_ -]\d{2}[-:.]\d{2}(?:[-:.]\d{2}(?:\.\d+)?)?)?"
    r"|\d{2}[-:.]\d{2}[-:.]\d{2}"
    r"|1\d{9}(?:\.\d+)?)(?![0-9])")


def is_volatile(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pat) for pat in VOLATILE)


def ignored_by(path: str, recipe_globs: Iterable[str] = (), option_globs: Iterable[str] = ()) -> str | None:
    """Why a file is listed but not compared: launcher's own list, the recipe's, --ignore; or None."""
    if is_volatile(path):
        return IGNORED_BY_LAUNCHER
    if matches(path, recipe_globs):
        return IGNORED_BY_RECIPE
    if matches(path, option_globs):
        return IGNORED_BY_OPTION
    return None


def recipe_volatile(ws: Workspace, m: Manifest) -> list[str]:
    """The run's declared volatile outputs: the manifest's ``recipe.volatile``, else the workspace recipe's."""
    recorded = m.recipe.get("volatile")
    if isinstance(recorded, list):
        return [g for g in recorded if isinstance(g, str)]
    from launcher.runtime.recipespec import SpecError, load_spec

    folder = ws.root / "recipes" / m.recipe_name
    if not (folder / "recipe.toml").is_file():
        return []
    try:
        return list(load_spec(folder).volatile)
    except SpecError:
        return []


def time_key(path: str) -> str:
    """The path with times in its names replaced, and an event file's name reduced to its kind."""
    folder, _, name = path.rpartition("/")
    if name.startswith(EVENTS_PREFIX):
        name = EVENTS_PREFIX + "*"
    return (_TIME.sub("<time>", folder) + "/" if folder else "") + _TIME.sub("<time>", name)


def ignore_glob(path: str) -> str:
    """The --ignore glob that leaves this file (and its time-named twins in other runs) out."""
    rel = path.removeprefix("outputs/")
    folder, _, name = rel.rpartition("/")
    if name.startswith(EVENTS_PREFIX):
        name = EVENTS_PREFIX + "*"
    glob = (_TIME.sub("*", folder) + "/" if folder else "") + _TIME.sub("*", name)
    return glob if matches(path, [glob]) else rel


def pairing_keys(m: Manifest) -> dict[str, str]:
    """Artifact path -> the key it is compared under (the n-th path of one time-normalised key: #n)."""
    keys: dict[str, str] = {}
    counters: dict[str, int] = {}
    for path in sorted(a.path for a in m.artifacts):
        key = time_key(path)
        n = counters.get(key, 0)
        counters[key] = n + 1
        keys[path] = key + (f"#{n}" if n else "")
    return keys


class Cell(TypedDict):
    """One run's file in an artifact row (``runs`` of an artifact in verify's JSON)."""

    status: str  # reference | identical | identical-content | differs | missing | unreadable | ignored
    sha256: str | None  # None: the run lacks the file
    content: NotRequired[ContentRecord]  # compared by content
    hint: NotRequired[str]  # compared by bytes: what the differing bytes look like (a date)
    path: NotRequired[str]  # the run's own path, where it pairs under another name (times in names)


class ArtifactRecord(TypedDict):
    """One artifact row as written in verify's JSON (``artifacts``)."""

    path: str
    kind: str
    checked: bool
    ignored_by: str | None
    reference_sha256: str | None
    runs: dict[str, Cell]  # run id -> its cell


class BytesOnlyGroup(TypedDict):
    """Files identical in content whose bytes differ, of one format (``bytes_only`` in verify's JSON)."""

    format: str
    volatile: list[str]  # what differs in their bytes
    paths: list[str]


class IgnoredGroup(TypedDict):
    """Files left out of the comparison by one who (``ignored`` in verify's JSON)."""

    by: str
    why: str
    paths: list[str]
    differ: list[str]  # those whose bytes differ in some run


@dataclass
class ArtifactRow:
    path: str
    checked: bool
    reference_sha256: str | None
    # run id -> its Cell; held as plain dicts because launcher.workflows.reproduce reads them as such
    cells: dict[str, dict[str, Any]]
    ignored_by: str | None = None
    kind: str = "other"

    def to_dict(self) -> ArtifactRecord:
        return {"path": self.path, "kind": self.kind, "checked": self.checked, "ignored_by": self.ignored_by,
                "reference_sha256": self.reference_sha256, "runs": cast(dict[str, Cell], self.cells)}

    def outcome(self, reference: str, alone: bool = False) -> RowOutcome:
        """The row as evidence: compared identical, differs, unreadable (why, fix), ignored, or held alone."""
        if not self.checked:
            return RowOutcome(self.path, self.kind, IGNORED, IGNORED_WHY.get(self.ignored_by or "", "left out"))
        if alone:
            return RowOutcome(self.path, self.kind, ROW_ALONE)
        others = [c for rid, c in self.cells.items() if rid != reference]
        if any(c["status"] in (DIFFERS, MISSING) for c in others):
            return RowOutcome(self.path, self.kind, DIFFERS)
        bad = next((c for c in others if c["status"] == UNREADABLE), None)
        if bad is not None:
            content = bad.get("content") or {}
            return RowOutcome(self.path, self.kind, UNREADABLE, content.get("unreadable"), content.get("fix"))
        proves = [(c.get("content") or {}).get("evidence") for c in others]
        return RowOutcome(self.path, self.kind, IDENTICAL,
                          proves=str(proves[0]) if proves and all(proves) else None)


def _content(ref: Manifest, run: Manifest, ref_path: str, run_path: str,
             savedmodels: dict[tuple[Path, Path], ContentDiff]) -> ContentDiff | None:
    a, b = ref.file(ref_path), run.file(run_path)
    if is_steps(ref_path):
        try:
            return compare_steps(a, b)
        except (OSError, ValueError) as exc:
            return unreadable(STEPS_FORMAT, exc)
    root_a = savedmodel_root(a, ref.run_dir)
    root_b = savedmodel_root(b, run.run_dir)
    if root_a is not None and root_b is not None:
        if (root_a, root_b) not in savedmodels:
            try:
                savedmodels[(root_a, root_b)] = compare_savedmodel(root_a, root_b)
            except (LauncherError, OSError, ValueError) as exc:
                savedmodels[(root_a, root_b)] = unreadable(SAVEDMODEL, exc)
        return savedmodels[(root_a, root_b)]
    return compare_files(a, b, ref_path)


def _bytes_hint(a: Path, b: Path) -> str | None:
    """For two files compared by bytes: a hint when the bytes where they first differ look like a date."""
    try:
        return file_date_hint(a, b)
    except OSError:
        return None


def _cell(ref: Manifest, m: Manifest, ref_path: str | None, run_path: str | None, why: str | None,
          savedmodels: dict[tuple[Path, Path], ContentDiff]) -> Cell:
    ra = ref.artifact(ref_path) if ref_path else None
    a = m.artifact(run_path) if run_path else None
    cell: Cell = {"status": MISSING, "sha256": a.sha256 if a else None}
    if a is None or ra is None or ref_path is None or run_path is None:
        return cell
    if a.sha256 == ra.sha256:
        cell["status"] = IDENTICAL
        if is_steps(ref_path) and why is None:  # what identical digests prove (the step, the module), or nothing
            content = _content(ref, m, ref_path, run_path, savedmodels)
            if content is not None and content.unreadable is None:
                cell["content"] = content.to_dict()
    elif why is not None:
        cell["status"] = IGNORED
    else:
        content = _content(ref, m, ref_path, run_path, savedmodels)
        if content is None:
            cell["status"] = DIFFERS
            hint = _bytes_hint(ref.file(ref_path), m.file(run_path))
            if hint:
                cell["hint"] = hint
        else:
            if content.unreadable is not None and content.fix is None:
                content.fix = (f"check that it opens as {content.format} (it may be truncated, or another format "
                               f"despite its name); to leave it out: --ignore '{ignore_glob(ref_path)}'")
            cell["status"] = (UNREADABLE if content.unreadable is not None
                              else IDENTICAL_CONTENT if content.same else DIFFERS)
            cell["content"] = content.to_dict()
    return cell


_RANK_RECORD = re.compile(r"outputs/ranks/(\d+)/")


def world_size(m: Manifest) -> int:
    """The run's number of ranks (1 for a run of one process)."""
    topology = m.data.get("topology")
    size = topology.get("world_size") if isinstance(topology, dict) else None
    return size if isinstance(size, int) and size > 0 else 1


def _rank_of_the_larger_world(path: str, ref: Manifest, m: Manifest, in_ref: bool) -> bool:
    """Whether path, in one of the two runs only (the reference's when in_ref), is a record of a rank that only that
    run had: a rank its own topology counts and the other run's does not (a comparison across world sizes, whose
    topology the environment names). A file under a rank that neither run's world has is an output like any other."""
    found = _RANK_RECORD.match(path)
    if found is None:
        return False
    rank = int(found.group(1))
    holder, other = (ref, m) if in_ref else (m, ref)
    return world_size(other) <= rank < world_size(holder)


def compare_artifacts(ref: Manifest, runs: list[Manifest], recipe_globs: list[str], ignore: list[str],
                      evidence: Iterable[str] = ()) -> tuple[list[ArtifactRow], dict[str, bool]]:
    """One row per paired artifact, reference first; and, per other run, whether a compared file differs."""
    keyed = {m.run_id: {k: p for p, k in pairing_keys(m).items()} for m in runs}
    keys: list[str] = list(keyed[ref.run_id])
    for m in runs[1:]:
        keys += [k for k in keyed[m.run_id] if k not in keys]
    kinds: dict[str, str] = {}
    for m in runs:
        kinds.update(classify([a.path for a in m.artifacts], evidence))
    differs: dict[str, bool] = {m.run_id: False for m in runs[1:]}
    savedmodels: dict[tuple[Path, Path], ContentDiff] = {}
    rows: list[ArtifactRow] = []
    for key in keys:
        ref_path = keyed[ref.run_id].get(key)
        ra = ref.artifact(ref_path) if ref_path else None
        path = ref_path or next(keyed[m.run_id][key] for m in runs if key in keyed[m.run_id])
        why = ignored_by(path, recipe_globs, ignore)
        first: Cell = {"status": REFERENCE if ra else MISSING, "sha256": ra.sha256 if ra else None}
        cells: dict[str, dict[str, Any]] = {ref.run_id: dict(first)}
        for m in runs[1:]:
            run_path = keyed[m.run_id].get(key)
            cells[m.run_id] = dict(_cell(ref, m, ref_path, run_path, why, savedmodels))
            if cells[m.run_id]["status"] == MISSING and _rank_of_the_larger_world(path, ref, m, ra is not None):
                cells[m.run_id]["status"] = IGNORED  # a rank only the run with more ranks had
            if run_path is not None and run_path != path:
                cells[m.run_id]["path"] = run_path
            if why is None and cells[m.run_id]["status"] in (DIFFERS, MISSING):
                differs[m.run_id] = True
        rows.append(ArtifactRow(path, why is None, ra.sha256 if ra else None, cells, why, kinds.get(path, "other")))
    return rows, differs


# ---------------------------------------------------------------- one explanation per kind


def bytes_only_groups(files: Iterable[DifferingFile]) -> list[BytesOnlyGroup]:
    """Files identical in content, grouped by format: what differs in their bytes, said once per format."""
    groups: dict[str, BytesOnlyGroup] = {}
    for f in files:
        content = f.get("content")
        fmt = str((content["format"] if content else None) or "bytes")
        group = groups.setdefault(fmt, {"format": fmt, "volatile": [], "paths": []})
        group["volatile"] += [v for v in (content["volatile"] if content else None) or []
                              if v not in group["volatile"]]
        if f["path"] not in group["paths"]:
            group["paths"].append(f["path"])
    return list(groups.values())


def bytes_only_phrases(files: Iterable[DifferingFile], limit: int = 3) -> list[str]:
    """One phrase per format, e.g. ``model.keras, ckpt/e1.keras and 2 more (zip entry dates, ...)``."""
    out = []
    for g in bytes_only_groups(files):
        names = [str(p).removeprefix("outputs/") for p in g["paths"]]
        shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
        out.append(f"{shown} ({', '.join(g['volatile']) or 'bytes'})")
    return out


def ignored_groups(rows: Iterable[ArtifactRow]) -> list[IgnoredGroup]:
    """Files left out of the comparison, grouped by who left them out, with why said once per group."""
    groups: dict[str, IgnoredGroup] = {}
    for row in rows:
        if row.checked or row.ignored_by is None:
            continue
        group = groups.setdefault(row.ignored_by, {"by": row.ignored_by, "why": IGNORED_WHY.get(row.ignored_by, ""),
                                                   "paths": [], "differ": []})
        group["paths"].append(row.path)
        if any(c["status"] not in (REFERENCE, IDENTICAL) for c in row.cells.values()):
            group["differ"].append(row.path)
    return list(groups.values())
