"""A run's collection: wait for it (its log streamed), pull its outputs, finish its manifest; for runs
started together, collect each as it ends and stop the rest at the first failure.

The start of a run is :mod:`launcher.runs.lifecycle`'s; this module reads what it wrote (``launch.json``,
through :func:`read_launch`) and reaches the run only through its :class:`~launcher.targets.placement.Placement`.
``manifest.json`` is written last, once the outputs are pulled and verified, so a run directory without one
is never mistaken for a finished run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

from launcher.errors import ExitCode, LauncherError, NotFound, UnsafePath
from launcher.hosts.base import Host
from launcher.proc import Meanwhile
from launcher.progress import Reporter
from launcher.records.records import (
    CANCELLED,
    FAILED,
    RUNNING,
    LaunchRecord,
    ManifestData,
    PullStatus,
    RunRecord,
    RunState,
)
from launcher.records.rundir import RunDir
from launcher.targets.placement import Placement, placement_for
from launcher.targets.registry import open_placement
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.runs.replicates import Failure
    from launcher.transfers.pull import PullResult

LogSink = Callable[[str], None]


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RunOutcome:
    group: str
    runs: list[RunRecord]  # manifests, or launch records for detached runs
    detached: bool = False
    failure: Failure | None = None  # the first replicate that failed, and what it stopped
    notes: list[str] = field(default_factory=list)  # warnings about the group as a whole (for the CLI)

    @property
    def failed(self) -> list[RunRecord]:
        return [r for r in self.runs if dict(r).get("status") == FAILED]

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.RUN_FAILED if self.failure or self.failed else ExitCode.OK


def read_launch(ws: Workspace, run_id: str) -> LaunchRecord:
    """The run's launch record (RunDir, its owner, reads it)."""
    return RunDir.of(ws, run_id).read_launch()


def wait_run(
    ws: Workspace, run_id: str, target: Host | Placement, *, on_log: LogSink | None = None, poll_s: float = 1.0
) -> int:
    """Wait for the run to end (streaming its logs) and return its exit code."""
    launch = read_launch(ws, run_id)
    placement = placement_for(target)
    with Meanwhile(_import_collecting):
        try:
            if on_log is not None:  # the log ends with the run
                for line in placement.logs(launch, follow=True):
                    on_log(line.rstrip("\n"))
            else:
                placement.until_ended(launch)
        except KeyboardInterrupt:
            if launch.get("node_containers"):  # Ctrl-C: a node left running would wait for the others forever
                placement.stop(launch)
            raise
    while True:
        state = placement.state(launch)
        if state is None:
            raise NotFound(
                f"the container of {run_id} is gone from {placement.name}",
                "its outputs may still be there: `launcher pull RUN`",
            )
        if state.ended:
            return -1 if state.exit_code is None else state.exit_code
        time.sleep(poll_s)


def _import_collecting() -> None:
    """Import what pulling a run and judging a group need, on a thread while the run goes (the caller only
    waits for its log then): not before the start, nor after the end."""
    from launcher.records import manifest, store  # noqa: F401
    from launcher.runs import replicates  # noqa: F401
    from launcher.transfers import pull  # noqa: F401


def pull_run(
    ws: Workspace,
    run_id: str,
    target: Host | Placement | None = None,
    reporter: Reporter | None = None,
    *,
    watch: float | None = None,
    on_pass: Callable[[PullResult], None] | None = None,
    remove_container: bool = True,
) -> dict[str, Any]:
    """pull_record's answer as the CLI reads it: by key, whichever of the two records it is."""
    return cast(dict[str, Any], pull_record(ws, run_id, target, reporter, watch=watch, on_pass=on_pass,
                                            remove_container=remove_container))


def pull_record(
    ws: Workspace,
    run_id: str,
    target: Host | Placement | None = None,
    reporter: Reporter | None = None,
    *,
    watch: float | None = None,
    on_pass: Callable[[PullResult], None] | None = None,
    remove_container: bool = True,
) -> ManifestData | PullStatus:
    """Copy the run's outputs back (skipping files verified before); write the manifest once it ended.

    Returns the manifest, or, while the run still goes (and watch is None), a status record.
    run_id: the run's id, or any unique part of it (records.store.resolve_run_id).
    """
    from launcher.records.store import resolve_run_id

    run_id = resolve_run_id(ws, run_id)
    launch = read_launch(ws, run_id)
    own = target is None
    placement = open_placement(ws, launch) if target is None else placement_for(target)
    local = RunDir.of(ws, run_id)
    try:
        while True:
            state = placement.state(launch)
            running = bool(state and state.running)
            result = _pull_outputs(placement, launch, local, reporter)
            if on_pass is not None:
                on_pass(result)
            if result.refused:
                raise UnsafePath(
                    f"run {run_id}: refused {len(result.refused)} output entries: "
                    + "; ".join(result.refused[:3]),
                    "nothing was written outside runs/; inspect the outputs on the host",
                )
            if not running:
                break
            if watch is None:
                return {"run_id": run_id, "status": RUNNING, "pulled": result.to_dict()}
            time.sleep(watch)
        if state is None and not result.files:
            raise NotFound(
                f"run {run_id} has neither a container nor outputs on {placement.name}",
                "it may have been removed on the host",
            )
        manifest = _finish(ws, launch, result, state)
        if remove_container and state is not None:
            placement.release(launch)
        return manifest
    finally:
        if own:
            placement.close()


def _pull_outputs(placement: Placement, launch: LaunchRecord, local: RunDir, reporter: Reporter | None) -> PullResult:
    """The run's outputs from its host, and those its target holds elsewhere (nodes on other hosts) into their
    folders under the outputs; a file two places both send is refused, neither copy counted."""
    from launcher.transfers.pull import pull_outputs

    result = pull_outputs(placement.host, placement.outputs(launch), local.outputs, state_file=local.pulled_file,
                          reporter=reporter)
    for host, remote, part in placement.more_outputs(launch):
        more = pull_outputs(host, remote, local.outputs / part, state_file=local.pulled_file_of(part),
                            reporter=reporter)
        result.refused += [f"{part}/{why}" for why in more.refused]
        for rel, rec in more.files.items():
            path = f"{part}/{rel}"
            if path in result.files and result.files[path]["sha256"] != rec["sha256"]:
                result.refused.append(f"{path} (sent by {host.name} and by another node's host)")
                del result.files[path]
                continue
            result.files[path] = rec
        result.transferred += [f"{part}/{rel}" for rel in more.transferred]
        result.skipped += [f"{part}/{rel}" for rel in more.skipped]
        result.bytes += more.bytes
    return result


def _finish(ws: Workspace, launch: LaunchRecord, result: PullResult, state: RunState | None) -> ManifestData:
    from launcher.records.manifest import assemble, write_manifest

    local = RunDir.of(ws, launch["run_id"])
    if state is not None and state.image_ran:  # a target that learns the image only when the run starts
        launch = launch.copy()
        launch["image_ran"] = state.image_ran
    data = assemble(launch, local.outputs, result.files, state, utc_now())
    write_manifest(local.path, data)
    return data


def collect_together(ws: Workspace, placement: Placement, launches: Sequence[LaunchRecord],
                     reporter: Reporter | None, *, on_log: LogSink | None = None, poll_s: float = 1.0,
                     on_error: Callable[[str, LauncherError], None] | None = None) -> RunOutcome:
    """Wait for runs started together and pull each as it ends. At the first that failed, stop the others
    (on Slurm: cancel the job array) and pull them too: their manifests say cancelled. The first run's
    log is streamed to its end first, so a failure of another is acted on once that one has ended.
    on_error: given a run's id and the error that stopped its pull (the run is then left out of the
    outcome); without it the error is raised."""
    from launcher.runs.replicates import failure_of, is_failed

    if on_log is not None and launches:
        for line in placement.logs(launches[0], follow=True):
            on_log(line.rstrip("\n"))
    pulled: dict[str, ManifestData | PullStatus] = {}
    failure: Failure | None = None
    cancelled: list[str] = []
    pending = list(launches)
    while pending:
        for launch in list(pending):
            state = placement.state(launch)
            if state is not None and not state.ended:
                continue
            pending.remove(launch)
            try:
                manifest = pulled[launch["run_id"]] = pull_record(ws, launch["run_id"], placement, reporter)
            except LauncherError as exc:
                if on_error is None:
                    raise
                on_error(launch["run_id"], exc)
                continue
            if failure is None and is_failed(manifest):
                cancelled = _stop_all(placement, pending)
                failure = failure_of(ws, manifest, placement, cancelled=cancelled)
        if pending:
            time.sleep(poll_s)
    if failure is not None:  # those the stop reached before they ended on their own
        reached = [r for r in cancelled if r in pulled and pulled[r]["status"] == CANCELLED]
        failure = replace(failure, cancelled=reached)
    return RunOutcome(group=str(launches[0]["group"]) if launches else "",
                      runs=[pulled[launch["run_id"]] for launch in launches if launch["run_id"] in pulled],
                      failure=failure)


def _stop_all(placement: Placement, launches: Sequence[LaunchRecord]) -> list[str]:
    """Stop every run in launches (one stop may stop several: a Slurm job array); their ids."""
    done: set[str] = set()
    for launch in launches:
        if launch["run_id"] in done:
            continue
        try:
            placement.stop(launch)
        except LauncherError:  # it ended meanwhile, or its target forgot it: it is collected as it is
            pass
        done.update(placement.stopped_with(launch))
        done.add(str(launch["run_id"]))
    return [str(launch["run_id"]) for launch in launches if launch["run_id"] in done]
