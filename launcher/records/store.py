"""The run store: finding the completed runs of a workspace, by id, group or recipe, and
choosing which runs a verification compares (reference first)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import Incompatible, LauncherError, NotFound, RunFailed, UsageError
from launcher.records.manifest import Manifest, load_manifest
from launcher.records.records import SUCCEEDED
from launcher.records.rundir import RunDir
from launcher.workspace import Workspace


def _completed_manifests(ws: Workspace) -> list[Manifest]:
    out: list[Manifest] = []
    if not ws.runs.is_dir():
        return out
    for d in sorted(ws.runs.iterdir()):
        if RunDir(d).is_complete():
            try:
                out.append(load_manifest(d))
            except LauncherError:
                continue  # a broken run elsewhere must not stop verifying the others; named runs still raise
    return out


def run_ids(ws: Workspace) -> list[str]:
    """Every run of the workspace, finished or not (a directory under runs/ with a launch record or a
    manifest), oldest first."""
    if not ws.runs.is_dir():
        return []
    return sorted(d.name for d in ws.runs.iterdir() if RunDir(d).is_run())


def _token(run_id: str) -> str:
    """The random tail of a run id (``...-mnist_convnet-1a2b3c`` -> ``1a2b3c``), which verify prints as the
    run's short name."""
    return run_id.rsplit("-", 1)[-1]


def resolve_run_id(ws: Workspace, ref: str) -> str:
    """The run id ``ref`` names: the whole id, any start of it that only one run has (``launcher ps``
    prints the shortest), or the random tail verify prints (``1a2b3c``, or any start of it that is
    unique). Runs still going count (they have a launch record only). An ambiguous ref is a UsageError
    listing the candidates; none, NotFound."""
    if ref and "/" not in ref and ref not in (".", "..") and (ws.runs / ref).is_dir():
        return ref
    ids = run_ids(ws) if ref else []
    found = [r for r in ids if r.startswith(ref)] or [r for r in ids if _token(r).startswith(ref)]
    if len(found) == 1:
        return found[0]
    if found:
        shown = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
        raise UsageError(f"run {ref!r} is ambiguous: {len(found)} runs match ({shown})",
                         "give more of the run id (`launcher ps` shows the shortest unique one)")
    raise NotFound(f"no run {ref!r} under {ws.runs}", "list runs with `launcher ps`")


def resolve_run(ws: Workspace, ref: str) -> Path:
    """A run's directory: from its id or any unique part of it (resolve_run_id), or a path to a run
    directory (one with a ``/``, or an existing folder that is no run's id)."""
    if "/" in ref or ref.startswith("."):
        as_path = Path(ref)
        if as_path.is_dir():
            return as_path.resolve()
        raise NotFound(f"no run directory {ref}", "list runs with `launcher ps`")
    try:
        return ws.runs / resolve_run_id(ws, ref)
    except NotFound:
        if Path(ref).is_dir():
            return Path(ref).resolve()
        raise


def short_ids(ids: Iterable[str]) -> dict[str, str]:
    """For each run id, the shortest start of it that no other id has, but never shorter than its
    time and name (``20261124T101500-mnist_convnet``), so that it stays readable; resolve_run_id
    takes it back."""
    every = sorted(set(ids))

    def common(a: str, b: str) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    out: dict[str, str] = {}
    for i, rid in enumerate(every):  # sorted, so the ids sharing most of its start are its neighbours
        shared = max(common(rid, every[i - 1]) if i else 0, common(rid, every[i + 1]) if i + 1 < len(every) else 0)
        head = len(rid.rsplit("-", 1)[0])
        n = max(shared + 1, head)
        if head < n < head + 2:  # past the name: its "-" and a character at once
            n = head + 2
        out[rid] = rid[:n]
    return out


def skipped_in_group(ws: Workspace, group: str) -> list[dict[str, str]]:
    """Runs of the group (by their launch.json) that verify leaves out: no manifest yet, or unreadable."""
    out: list[dict[str, str]] = []
    if not ws.runs.is_dir():
        return out
    for d in sorted(ws.runs.iterdir()):
        launch = RunDir(d).read_launch_quiet()
        if launch is None or launch.get("group") != group:
            continue
        try:
            m = load_manifest(d)
        except LauncherError as exc:
            out.append({"run_id": d.name, "reason": exc.one_line()})
            continue
        if m.status != SUCCEEDED:
            placed = m.data.get("placement")
            error = placed.get("error") if placed else None
            out.append({"run_id": d.name, "reason": f"{m.status} (exit {m.data.get('exit_code')})"
                        + (f": {error}" if error else "") + "; not a result, so not compared"})
    return out


def group_runs(ws: Workspace, group: str, *, results_only: bool = True) -> list[Manifest]:
    """The group's finished runs, in replicate order; results_only: only those that succeeded (a failed or
    cancelled run is listed by skipped_in_group instead of being compared as if it were a result)."""
    runs = [m for m in _completed_manifests(ws) if m.group == group and (m.status == SUCCEEDED or not results_only)]
    return sorted(runs, key=lambda m: (m.replicate, m.started_at, m.run_id))


def latest_group(ws: Workspace) -> str:
    runs = _completed_manifests(ws)
    if not runs:
        raise NotFound(f"no completed runs under {ws.runs}",
                       "start some with `launcher run RECIPE` or `launcher experiment RECIPE --runs 2`")
    return max(runs, key=lambda m: (m.started_at, m.run_id)).group



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


def _previous_of_recipe(ws: Workspace, latest: Manifest) -> tuple[Manifest | None, Manifest | None]:
    """The latest earlier run of the same code (code_key), and the latest earlier run of the same
    code name that ran other code (edited since), where there is one."""
    key = (latest.started_at, latest.run_id)
    earlier = [m for m in _completed_manifests(ws) if m.code_name == latest.code_name
               and (m.started_at, m.run_id) < key and m.run_dir.resolve() != latest.run_dir.resolve()]
    newest = max(earlier, key=lambda m: (m.started_at, m.run_id), default=None)
    same = max((m for m in earlier if m.code_key == latest.code_key), key=lambda m: (m.started_at, m.run_id),
               default=None)
    return same, newest if newest is not None and newest.code_key != latest.code_key else None


def short_digest(value: object) -> str:
    return str(value).removeprefix("sha256:")[:12] if value else "unknown"


def code_differences(ref: Manifest, other: Manifest) -> list[str]:
    """How two runs' code differs, one phrase per part (name, code digest, recipe library digest)."""
    out = []
    (name_a, tree_a, lib_a), (name_b, tree_b, lib_b) = ref.code_key, other.code_key
    if name_a != name_b:
        out.append(f"{ref.run_id} ran {name_a!r}, {other.run_id} ran {name_b!r}")
    if tree_a != tree_b:
        out.append(f"code digest {short_digest(tree_a)} in {ref.run_id}, {short_digest(tree_b)} in {other.run_id}")
    if lib_a != lib_b:
        out.append(f"recipe library digest {short_digest(lib_a)} in {ref.run_id}, {short_digest(lib_b)} in "
                   f"{other.run_id}")
    return out


def _results_of(ws: Workspace, group: str) -> tuple[list[Manifest], int]:
    """The group's succeeded runs, and how many runs it finished in all (failed and cancelled too)."""
    finished = group_runs(ws, group, results_only=False)
    runs = [m for m in finished if m.status == SUCCEEDED]
    if runs:
        return runs, len(finished)
    if not finished:
        raise NotFound(f"no completed runs in group {group!r} under {ws.runs}",
                       "check the group name in a run's manifest.json")
    states = sorted({m.status for m in finished})
    raise RunFailed(f"every run of group {group!r} ended {' or '.join(states)} ({len(finished)} runs): "
                    "nothing to compare",
                    f"read their logs (`launcher logs {finished[0].run_id}`), fix the cause and run again")


def select_runs(ws: Workspace, run_ids: list[str] | None, against: str | None,
                group: str | None = None, across_code: bool = False) -> Selection:
    """The runs to verify, reference first.

    Named runs, a group, or (neither) the latest group; when that group holds one run, the
    latest run is compared with the previous run of the same code (Manifest.code_key). One run
    with nothing to compare it with is checked alone. Runs of different code are refused
    (Incompatible) unless ``across_code``.
    """
    if run_ids and group:
        raise UsageError("name runs or a group, not both", "drop the run ids or --group")
    note = None
    if run_ids:
        runs = _load_named(ws, run_ids)
    elif group is not None:
        runs, _ = _results_of(ws, group)
    else:
        runs, finished = _results_of(ws, latest_group(ws))
        if len(runs) == 1 and against is None and finished == 1:
            runs, note = _with_previous(ws, runs[0], across_code)
    if against is not None:
        ref = _load_named(ws, [against])[0]
        runs = [ref, *(m for m in runs if m.run_dir.resolve() != ref.run_dir.resolve())]
    ref = runs[0]
    other = next((m for m in runs if m.code_key != ref.code_key), None)
    if other is not None and not across_code:
        what = "different recipes or scripts" if other.code_name != ref.code_name else "different code"
        raise Incompatible(
            f"runs of {what} cannot be compared: " + "; ".join(code_differences(ref, other)),
            "verify runs of one code (a group from `launcher experiment`, or runs named one by one), or add "
            "--across-code to compare them anyway (the verdict then says the difference may come from the code)",
        )
    return Selection(ref, runs, note)


def _with_previous(ws: Workspace, latest: Manifest, across_code: bool) -> tuple[list[Manifest], str]:
    """The latest run with the previous run of its code; alone (saying why) when there is none."""
    same, edited = _previous_of_recipe(ws, latest)
    if across_code and edited is not None and (same is None or (edited.started_at, edited.run_id)
                                                > (same.started_at, same.run_id)):
        same = edited  # asked for: the previous run of this code name, whatever its code
    if same is not None:
        how = code_differences(same, latest)
        other = f" (other code: {'; '.join(how)})" if how else ""
        return [same, latest], (f"the latest run {latest.run_id} against the previous run of {latest.code_name}, "
                                f"{same.run_id}{other}")
    if edited is not None:
        return [latest], (f"the latest run {latest.run_id} checked alone: the previous run of {latest.code_name}, "
                          f"{edited.run_id}, ran other code ({'; '.join(code_differences(edited, latest))}); "
                          f"compare them with `launcher verify checksums {edited.run_id} {latest.run_id} "
                          "--across-code`")
    return [latest], f"the only run of {latest.code_name}"
