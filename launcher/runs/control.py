"""Commands on runs that exist: list them (ps), their logs, attach to one, stop it, clean it off its host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from launcher.errors import CommandFailed, HostUnreachable, LauncherError, NotFound, UsageError
from launcher.hosts.base import Host
from launcher.progress import Reporter
from launcher.records.manifest import describe_code, read_quiet
from launcher.records.rundir import RunDir
from launcher.records.store import resolve_run_id, run_ids, short_ids
from launcher.runs.collect import LogSink, pull_run, read_launch, wait_run
from launcher.runs.lifecycle import run_dir
from launcher.targets.placement import Placement, placement_for
from launcher.targets.registry import open_placement
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.transfers.datasets import PruneRecord as DatasetPruneRecord


class PsRow(TypedDict):
    """A row of ``launcher ps``: a run here (from its launch record and manifest) or one only its target knows."""

    run_id: str
    short_id: NotRequired[str]
    recipe: NotRequired[str | None]
    code_name: NotRequired[str | None]
    code: NotRequired[str]
    group: NotRequired[str | None]
    host: str | None
    status: str
    launched_at: NotRequired[str | None]
    container: NotRequired[str]
    container_status: NotRequired[str]


class PsListing(TypedDict):
    """`ps`'s Result data."""

    runs: list[PsRow]


class StoppedRun(TypedDict):
    run_id: str
    status: str | None  # its manifest's, pulled once stopped
    exit_code: int | None


class StopRecord(TypedDict):
    """`stop`'s Result data: the run, and (for a job array) each replicate stopped with it."""

    run_id: str
    stopped: bool
    exit_code: int | None
    runs: NotRequired[list[StoppedRun]]


class CleanListing(TypedDict):
    """`clean`'s Result data: each run cleaned, and the datasets pruned on the host (with --datasets)."""

    runs: list[CleanRecord]
    datasets: NotRequired[DatasetPruneRecord]


class CleanRecord(TypedDict):
    """What ``launcher clean`` did to one run on its host."""

    run_id: str
    host: str
    remote_dir: str
    removed: bool
    container_removed: bool


def list_runs(ws: Workspace, target: Host | Placement | None = None) -> list[PsRow]:
    """Local run directories with their state; with a target, also the runs it knows (containers).
    Each row has the full ``run_id`` and ``short_id``, the shortest start of it unique in the workspace."""
    rows: dict[str, PsRow] = {}
    if ws.runs.is_dir():
        for d in sorted(ws.runs.iterdir()):
            launch = RunDir(d).read_launch_quiet()
            if not launch:
                continue
            manifest = read_quiet(d)
            recipe = launch.get("recipe") or {}
            rows[d.name] = {
                "run_id": d.name,
                "recipe": recipe.get("name"),
                "code_name": recipe.get("identity") or recipe.get("name"),  # Manifest.code_name, before the manifest
                "code": describe_code(manifest.get("recipe") or launch.get("recipe") or {}),
                "group": launch.get("group"),
                "host": launch.get("host", {}).get("name"),
                "status": manifest.get("status") or "incomplete",
                "launched_at": launch.get("launched_at"),
            }
    if target is not None:
        placement = placement_for(target)
        for listed in placement.listed():
            row = rows.setdefault(listed.run_id,
                                  {"run_id": listed.run_id, "host": placement.name, "status": "unknown here"})
            row["container"] = listed.state
            row["container_status"] = listed.status
    short = short_ids([*rows, *run_ids(ws)])  # unique among the workspace's runs and those the target lists
    for row in rows.values():
        row["short_id"] = short[row["run_id"]]
    return sorted(rows.values(), key=lambda r: r["run_id"])


def logs(ws: Workspace, run_id: str, sink: LogSink, *, follow: bool = False) -> None:
    """The recipe's output: from the container while it exists, else from the pulled train.log."""
    run_id = resolve_run_id(ws, run_id)
    launch = read_launch(ws, run_id)
    pulled = RunDir.of(ws, run_id).train_log
    placement: Placement | None
    try:
        placement = open_placement(ws, launch)
    except (HostUnreachable, LauncherError):
        if pulled.is_file():
            placement = None
        else:
            raise
    try:
        if placement is not None and placement.state(launch) is not None:
            for line in placement.logs(launch, follow=follow):
                sink(line.rstrip("\n"))
            return
        if pulled.is_file():
            with open(pulled, encoding="utf-8", errors="replace") as f:
                for line in f:
                    sink(line.rstrip("\n"))
            return
        raise NotFound(
            f"no logs for {run_id}: the container is gone and nothing was pulled", "run `launcher pull RUN`"
        )
    finally:
        if placement is not None:
            placement.close()


def attach(ws: Workspace, run_id: str, sink: LogSink, reporter: Reporter | None = None) -> dict[str, Any]:
    """Follow a detached run to its end, then pull it (pull_run's answer, which the CLI reads by key)."""
    run_id = resolve_run_id(ws, run_id)
    launch = read_launch(ws, run_id)
    with open_placement(ws, launch) as placement:
        if placement.state(launch) is not None:
            wait_run(ws, run_id, placement, on_log=sink)
        return pull_run(ws, run_id, placement, reporter)


def stop(ws: Workspace, run_id: str, reporter: Reporter | None = None) -> StopRecord:
    """Stop the run (and the job array it is part of): the CLI's Result data as it is rendered."""
    run_id = resolve_run_id(ws, run_id)
    launch = read_launch(ws, run_id)
    with open_placement(ws, launch) as placement:
        state = placement.stop(launch)
        out: StopRecord = {"run_id": run_id, "stopped": True, "exit_code": state.exit_code if state else None}
        together = placement.stopped_with(launch)
        if len(together) > 1 or placement.parallel:  # a job array: every replicate gets its manifest now
            stopped: list[StoppedRun] = []
            out["runs"] = stopped
            for rid in together:
                if RunDir.of(ws, rid).has_launch():
                    # the scheduler may still report a cancelled task as running for a moment: wait for it
                    m = pull_run(ws, rid, placement, reporter, watch=1.0)
                    stopped.append({"run_id": rid, "status": m.get("status"), "exit_code": m.get("exit_code")})
        return out


def clean(ws: Workspace, run_id: str, *, force: bool = False, reporter: Reporter | None = None) -> CleanRecord:
    """Delete a run's directory and container on its host, once the local copy is complete and
    still matches its manifest (force: without that check). The local run directory stays."""
    from launcher.records.integrity import check_integrity
    from launcher.records.manifest import load_manifest

    run_id = resolve_run_id(ws, run_id)
    launch = read_launch(ws, run_id)
    if not force:
        check_integrity([load_manifest(run_dir(ws, run_id))], reporter)
    with open_placement(ws, launch) as placement:
        host = placement.host
        remote = str(launch.get("remote_dir") or host.run_dir(run_id))
        if not remote.endswith(f"/{run_id}") or "/.launcher/" not in remote:
            raise UsageError(
                f"run {run_id} records {remote!r} as its directory on {host.name}, which is not a launcher run "
                "directory",
                "remove it by hand on the host",
            )
        state = placement.state(launch)
        if state and state.running:
            raise UsageError(
                f"run {run_id} is still running on {host.name}", f"stop it first: `launcher stop {run_id}`"
            )
        if state is not None:
            placement.release(launch)
        existed = host.exists(remote)
        if existed:
            done = host.run(["rm", "-rf", "--", remote], check=False)
            if host.exists(remote):
                raise CommandFailed(
                    f"could not remove {remote} on {host.name}: {done.last_error_line()}",
                    "its files may belong to root (runs from before outputs were handed to the host user): "
                    f"`sudo rm -rf {remote}` on the host",
                )
        return {"run_id": run_id, "host": host.name, "remote_dir": remote, "removed": existed,
                "container_removed": state is not None}
