"""`launcher resume RUN`: a run started with ``--checkpoint-every N`` that stopped (stopped, killed, its
host rebooted) goes on from its latest checkpoint, in a new container started as the first was
(the same image, environment, code, data, arguments and outputs folder) with ``LAUNCHER_RESUME=1``;
the runtime restores the checkpoint (launcher.runtime.checkpoint) and the run ends with the bits an
uninterrupted run of the same seed ends with.

With ``--host`` naming another host than the one it ran on, the run moves: its outputs so far come
back here (from the old host, or the copy pulled before when that one does not answer) and go to the
new host with the image, the data sent with ``--data-from`` and mounted code; a ``--data`` path must
exist on the new host too.

Each container a run had is a segment in its launch record and manifest (``segments``): where and
when it ran, its exit code, and the checkpoint it resumed from.

A run of several processes (``--nodes``, ``--procs-per-node``) resumes every rank from the newest checkpoint that
every rank holds, read from each rank's folder on the host of its node (``Placement.rank_outputs``) and named to
the runtime (``LAUNCHER_RESUME_FROM``); each node's container is started again as it was (``node_specs``), on the
engine or host it ran on: such a run does not move to another host.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from launcher.errors import LauncherError, NotResumable
from launcher.hosts.base import Host
from launcher.hosts.containerspec import ContainerSpec
from launcher.hosts.hostspec import HostSpec
from launcher.progress import NullReporter, Reporter
from launcher.records.manifest import read_quiet, run_segments
from launcher.records.records import MOUNTED, SUCCEEDED, LaunchRecord, RunState, Segment, placement_kind
from launcher.records.rundir import RunDir
from launcher.records.store import resolve_run_id
from launcher.runs.collect import LogSink, pull_run, read_launch, wait_run
from launcher.runtime.checkpoint import ENV_RESUME, ENV_RESUME_FROM, LATEST
from launcher.runtime.checkpoint import NAME as CHECKPOINT_NAME
from launcher.specs.container import OWNER_ENV, launch_spec
from launcher.specs.userenv import is_secret
from launcher.targets.placement import DirectPlacement, Placement, output_owner, remote_outputs
from launcher.targets.registry import open_placement
from launcher.transfers.pull import pull_outputs
from launcher.workspace import Workspace

# Each folder given: its complete checkpoints, one "FOLDER<TAB>NAME" line each (checkpoint.checkpoint_names' rule)
LIST_CHECKPOINTS = ('for d in "$@"; do for c in "$d"/checkpoints/epoch-*; do '
                    '[ -f "$c/state.json" ] && printf "%s\\t%s\\n" "$d" "${c##*/}"; done; done; true')


def checkpoint_on_host(placement: Placement, launch: LaunchRecord) -> str:
    """The name of the checkpoint the run resumes from, where it ran: its latest; for a run of several processes
    the newest that every rank holds. NotResumable when there is none."""
    folders = placement.rank_outputs(launch)
    if len(folders) == 1:
        return _checkpoint_name(placement.host.read_text(f"{placement.outputs(launch)}/{LATEST}"), launch,
                                f"on {placement.name}")
    held: dict[int, set[str]] = {}
    by_host: dict[int, tuple[Host, list[tuple[int, str]]]] = {}
    for rank, host, folder in folders:
        by_host.setdefault(id(host), (host, []))[1].append((rank, folder))
    for host, listed in by_host.values():
        done = host.run(["sh", "-c", LIST_CHECKPOINTS, "sh", *(f for _, f in listed)], check=False)
        seen: dict[str, set[str]] = {}
        for line in done.out.splitlines():
            folder, _, name = line.partition("\t")
            if CHECKPOINT_NAME.fullmatch(name):  # a folder the run named otherwise is none of launcher's
                seen.setdefault(folder, set()).add(name)
        for rank, folder in listed:
            held[rank] = seen.get(folder, set())
    return common_checkpoint(held, launch)


def common_checkpoint(held: Mapping[int, set[str]], launch: LaunchRecord) -> str:
    """The newest checkpoint every rank holds (held: rank -> its checkpoints' names); NotResumable if none."""
    bare = sorted(rank for rank, names in held.items() if not names)
    if bare:
        raise NotResumable(f"run {launch['run_id']} has no checkpoint of rank {bare[0]}: it stopped before its first "
                           "one", "start it again with `launcher run`")
    common = set.intersection(*(set(names) for names in held.values())) if held else set()
    if not common:
        raise NotResumable(f"the ranks of run {launch['run_id']} hold no checkpoint in common (rank 0: "
                           f"{', '.join(sorted(held.get(0, set()))) or 'none'})", "start it again with `launcher run`")
    return max(common)


def _checkpoint_name(text: str | None, launch: LaunchRecord, where: str) -> str:
    try:
        return str(json.loads(text or "")["name"])
    except (ValueError, KeyError, TypeError):
        raise NotResumable(
            f"run {launch['run_id']} has no checkpoint {where} ({LATEST}): it stopped before its first one",
            "start it again with `launcher run`") from None


def _check(ws: Workspace, run_id: str, launch: LaunchRecord) -> None:
    """Refuse a run that cannot be resumed, before anything is touched."""
    checkpoint = launch.get("checkpoint")
    if not (checkpoint and checkpoint.get("every")):
        raise NotResumable(f"run {run_id} was started without --checkpoint-every: it has no checkpoints",
                           "start it again with `launcher run ... --checkpoint-every N`")
    if read_quiet(RunDir.of(ws, run_id).path).get("status") == SUCCEEDED:
        raise NotResumable(f"run {run_id} finished (succeeded): there is nothing to resume",
                           "resume a run that was stopped or killed, or start a new one")
    if any(is_secret(v) for v in (launch.get("env") or {}).values()):
        raise NotResumable(f"run {run_id} was started with --secret-env, whose values launcher does not keep",
                           "start it again with `launcher run`")


def _not_finished(launch: LaunchRecord, state: RunState | None) -> None:
    """Refuse a run whose container ended well: it finished, its outputs wait to be pulled."""
    if state is not None and state.ended and state.exit_code == 0:
        raise NotResumable(f"run {launch['run_id']} finished (exit 0): there is nothing to resume",
                           f"pull it (`launcher pull {launch['run_id']}`)")


def _ended(launch: LaunchRecord, segments: list[Segment], local: RunDir) -> None:
    """The last segment completed from the manifest of a pull, when its container is gone."""
    seen = read_quiet(local.path)
    if seen:
        last = segments[-1]
        last["started_at"] = last.get("started_at") or seen.get("started_at")
        last["ended_at"] = last.get("ended_at") or seen.get("ended_at")
        last["exit_code"] = last.get("exit_code") or seen.get("exit_code")
    segments[-1].setdefault("host", launch["host"]["name"])


def resume_run(ws: Workspace, run_ref: str, reporter: Reporter | None = None, *, host: HostSpec | None = None,
               detach: bool = False, on_log: LogSink | None = None, poll_s: float = 1.0) -> dict[str, Any]:
    """Resume the run from its latest checkpoint, where it ran or on ``host``; wait for it and pull it (the
    manifest), or, detached, return its launch record once the container started (either as the CLI
    reads it, by key: pull_run's answer)."""
    run_id = resolve_run_id(ws, run_ref)
    launch = read_launch(ws, run_id)
    _check(ws, run_id, launch)
    local = RunDir.of(ws, run_id)
    moving = host is not None and host.name != HostSpec.from_record(launch.get("host_options")).name
    placement: Placement
    if moving:
        assert host is not None
        launch, segments, placement = _move(ws, launch, local, host, reporter)
    else:
        placement = open_placement(ws, launch)
    with placement:
        if not moving:
            state = placement.state(launch)
            if state is not None and not state.ended:
                raise NotResumable(f"run {run_id} is still running on {placement.name}",
                                   f"stop it first (`launcher stop {run_id}`), or wait for it "
                                   f"(`launcher attach {run_id}`)")
            _not_finished(launch, state)
            segments = run_segments(launch, state)
            _ended(launch, segments, local)
        name = checkpoint_on_host(placement, launch)
        record = placement.restart(launch, {ENV_RESUME: "1", ENV_RESUME_FROM: name})
        started = placement.state(launch)
        segments.append({"segment": len(segments), "host": placement.name, "resumed_from": name,
                         "container": record["container"], "started_at": started.started_at if started else None})
        launch = launch.copy()
        launch["segments"] = segments
        if record.get("image_ran"):
            launch["image_ran"] = record["image_ran"]
        local.write_launch(launch)
        local.forget_pulled()  # what was pulled of the earlier segments describes outputs the container rewrites
        if detach:
            return cast(dict[str, Any], launch)
        wait_run(ws, run_id, placement, on_log=on_log, poll_s=poll_s)
        return pull_run(ws, run_id, placement, reporter)


def _move(ws: Workspace, launch: LaunchRecord, local: RunDir, spec: HostSpec,
          reporter: Reporter | None) -> tuple[LaunchRecord, list[Segment], DirectPlacement]:
    """The run's outputs, image, data and code put on the host of spec; the launch record as it will
    start there, its segments so far, and the placement there."""
    from launcher.transfers import datasets

    rep = reporter or NullReporter()
    run_id = launch["run_id"]
    kind = placement_kind(launch, DirectPlacement.kind)
    if kind != DirectPlacement.kind:
        raise NotResumable(f"run {run_id} ran on a {kind} target: launcher moves runs "
                           "between Docker engines (local or over SSH) only", "start it again with `launcher run`")
    if launch.get("node_containers"):
        raise NotResumable(f"run {run_id} ran as several nodes: it resumes where it ran, not on another host",
                           f"resume it without --host (`launcher resume {run_id}`)")
    segments = _leave(ws, launch, local, rep)
    _ended(launch, segments, local)
    _checkpoint_name((local.outputs / LATEST).read_text() if (local.outputs / LATEST).is_file() else None,
                     launch, "in the outputs pulled here")
    new = DirectPlacement(spec.open(ws.root if spec.local else None), spec)
    try:
        container = launch_spec(launch)
        if container is None:
            raise NotResumable(f"the launch record of {run_id} lacks the container's command",
                               "start it again with `launcher run`")
        new.prepare(container.gpus is not None)
        new.ship(launch["image"], via=None, reporter=rep, cache_dir=ws.cache_dir)
        data, source = launch.get("data"), launch.get("data_source")
        if data and source and source.get("kind") == "sent":
            data, source = new.send_data(Path(source["local"]), rep)
        code = launch.get("code")
        if code and code.get("source") == MOUNTED:
            unplaced = code.copy()
            unplaced.pop("host_path", None)
            code = new.send_code(unplaced, rep)
        remote = new.run_dir(run_id, data)
        placed = datasets.place(new.host, local.outputs, rep, area="resume", name=run_id)
        new.host.run(["cp", "-a", f"{placed.path}/.", f"{remote}/out/"])
        if new.host.kind != "local":
            new.host.run(["rm", "-rf", placed.path], check=False)
        paths = {remote_outputs(launch["remote_dir"]): remote_outputs(remote)}
        if launch.get("data") and data:
            paths[str(launch["data"])] = str(data)
        old_code = launch.get("code")
        if old_code and old_code.get("host_path") and code and code.get("host_path"):
            paths[str(old_code["host_path"])] = str(code["host_path"])
        moved = launch.copy()
        moved.update({"host": new.host.describe(), "host_options": spec.to_record(), "placement": new.record(),
                      "remote_dir": remote, "data": data, "data_source": source,
                      "container_spec": moved_spec(container, paths, output_owner(new.host, new.engine)).to_record()})
        moved.pop("argv", None)
        if code is not None:
            moved["code"] = code
    except BaseException:
        new.close()
        raise
    return moved, segments, new


def _leave(ws: Workspace, launch: LaunchRecord, local: RunDir, rep: Reporter) -> list[Segment]:
    """The run's outputs pulled from the host it ran on and its container there released; its
    segments so far. A host that does not answer leaves what was pulled from it before."""
    run_id = launch["run_id"]
    try:
        with open_placement(ws, launch) as old:
            state = old.state(launch)
            if state is not None and not state.ended:
                raise NotResumable(f"run {run_id} is still running on {old.name}",
                                   f"stop it first (`launcher stop {run_id}`), or resume it there")
            _not_finished(launch, state)
            pull_outputs(old.host, old.outputs(launch), local.outputs, state_file=local.pulled_file,
                         reporter=rep)
            segments = run_segments(launch, state)
            if state is not None:
                old.release(launch)
    except NotResumable:
        raise
    except LauncherError as exc:  # the old host is gone: what was pulled from it before goes on
        rep.note(f"{launch['host']['name']} does not answer ({exc.one_line()}); resuming from the outputs "
                 "pulled from it before")
        segments = run_segments(launch, None)
    return segments


def moved_spec(spec: ContainerSpec, paths: Mapping[str, str], owner: str | None) -> ContainerSpec:
    """A run's container on one host made for another: its mounts' host paths mapped, the outputs' owner the new
    host's user; the image and its command unchanged."""
    spec = spec.with_sources(paths).without_env(OWNER_ENV)
    return spec.with_env({OWNER_ENV: owner}) if owner else spec
