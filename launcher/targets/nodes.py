"""A run of several nodes on one Docker engine: one container per node, all from the same image ID, on a private
network launcher creates for the run and removes with it; the run is one run (node 0's container is its
container, its log the console), and the first node to fail stops the others, so a dead rank never leaves the
rest waiting in a collective.

Used by :class:`launcher.targets.placement.DirectPlacement` for a job with a topology of more than one node;
the nodes' containers and the network are named in the launch record (``node_containers``, ``network``), and
each node's container as it was started (``node_specs``), so that ``launcher resume`` starts them all again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import cast

from launcher.errors import CommandFailed, NotResumable
from launcher.hosts.containerspec import ContainerSpec, SpecRecord
from launcher.hosts.engine import ContainerState, Engine
from launcher.records.records import LaunchRecord, RunState, StartedRecord
from launcher.runtime.distributed import RANKS
from launcher.specs.container import RUN_LABEL, ContainerJob, container_spec, network_name, node_outputs

STOP_S = 5  # how long a node stopped because another failed gets to end its ranks


def start(engine: Engine, job: ContainerJob, where: str) -> StartedRecord:
    """Every node's container started on the run's private network, node 0 first (it holds the rendezvous);
    if one cannot start, those started and the network are removed and CommandFailed raised."""
    assert job.topology is not None
    host = engine.host
    net = network_name(job.run_id)
    made = engine.network_create(net, {RUN_LABEL + ".network": job.run_id})
    if made.returncode != 0:
        raise CommandFailed(f"the network for {job.run_id}'s nodes could not be made on {where}: "
                            f"{made.last_error_line()}", "check Docker on the host (`docker network ls`)")
    names: list[str] = []
    specs: list[SpecRecord] = []
    record: StartedRecord | None = None
    host.makedirs(f"{job.host_out}/{RANKS}")
    try:
        for node in range(job.topology.nodes):
            one = replace(job, node=node, network=net)
            host.makedirs(node_outputs(job.host_out, node))
            spec = container_spec(one)
            names.append(one.name)
            specs.append(spec.to_record())
            started = engine.run(spec)
            if started.returncode != 0:
                raise CommandFailed(f"node {node}'s container for {job.run_id} did not start on {where}: "
                                    f"{started.last_error_line()}", "check the image and Docker on the host")
            if node == 0:
                record = {"container": one.name, "container_spec": spec.to_record()}
    except BaseException:
        remove(engine, names, net, force=True)
        raise
    assert record is not None
    record["node_containers"] = names
    record["network"] = net
    record["node_specs"] = specs
    return record


def node_specs(launch: LaunchRecord) -> list[ContainerSpec]:
    """Each node's container as it was started; NotResumable for a record without them (or changed by hand)."""
    names = containers(launch)
    specs = launch.get("node_specs")
    if not isinstance(specs, list) or len(specs) != len(names) or not all(isinstance(s, dict) for s in specs):
        raise NotResumable(f"the launch record of {launch['run_id']} does not hold each node's container (a run "
                           "started before launcher recorded them, or a record changed by hand)",
                           "start it again with `launcher run`")
    return [ContainerSpec.from_record(s) for s in specs]


def restart(engine: Engine, launch: LaunchRecord, env: Mapping[str, str], where: str) -> StartedRecord:
    """Every node's container started again as it was, with env added, on a network made again (``launcher
    resume``): those left from before removed first; if one cannot start, those started are removed and
    CommandFailed raised."""
    specs = [s.with_env(env) for s in node_specs(launch)]
    names = containers(launch)
    net = str(launch.get("network") or network_name(str(launch["run_id"])))
    remove(engine, names, net, force=True)
    made = engine.network_create(net, {RUN_LABEL + ".network": str(launch["run_id"])})
    if made.returncode != 0:
        raise CommandFailed(f"the network for {launch['run_id']}'s nodes could not be made again on {where}: "
                            f"{made.last_error_line()}", "check Docker on the host (`docker network ls`)")
    try:
        for node, spec in enumerate(specs):
            started = engine.run(spec)
            if started.returncode != 0:
                raise CommandFailed(f"node {node}'s container for {launch['run_id']} did not start again on {where}: "
                                    f"{started.last_error_line()}", "check the image and Docker on the host")
    except BaseException:
        remove(engine, names, net, force=True)
        raise
    record: StartedRecord = {"container": names[0], "container_spec": specs[0].to_record(),
                             "node_containers": names, "network": net}
    ran = engine.container_image(names[0])
    if ran is not None:
        record["image_ran"] = ran
    return record


def containers(launch: LaunchRecord) -> list[str]:
    return list(launch.get("node_containers") or [])


def state(engine: Engine | Sequence[Engine], launch: LaunchRecord) -> RunState | None:
    """The run as one: running while every node runs; once a node has failed, the others are stopped and the run
    has ended with the failed node's exit code; ended when every node has. None when no node is known.
    engine: the one engine of every node, or node k's engine at k (one node per host)."""
    names = containers(launch)
    engines = _per_node(engine, len(names))
    on = dict(zip(names, engines, strict=True))

    def states_now() -> dict[str, ContainerState]:
        found: dict[str, ContainerState] = {}
        for each in _distinct(engines):
            found.update(each.container_states([n for n in names if on[n] is each]))
        return found

    states = states_now()
    if not states:
        return None
    ended = {n: s for n, s in states.items() if _ended(s)}
    failed = sorted((s.get("FinishedAt", ""), n) for n, s in ended.items() if s.get("ExitCode"))
    running = [n for n in names if n in states and n not in ended]
    if failed and running:
        for name in running:  # a rank died: the others would wait in a collective until its timeout
            on[name].stop(name, timeout_s=STOP_S)
        states = states_now()
        ended = {n: s for n, s in states.items() if _ended(s)}
        running = [n for n in names if n in states and n not in ended]
    first = states.get(names[0]) or next(iter(states.values()))
    if running:
        return RunState(running=True, ended=False, started_at=first.get("StartedAt"))
    code = states[failed[0][1]].get("ExitCode") if failed else 0
    finished = max((s.get("FinishedAt", "") for s in states.values()), default="")
    return RunState(running=False, ended=True, exit_code=int(code) if isinstance(code, int) else None,
                    started_at=first.get("StartedAt"), finished_at=finished or None)


def _per_node(engine: Engine | Sequence[Engine], count: int) -> list[Engine]:
    """Node k's engine at k: the one engine of every node, or each node's own."""
    return list(engine) if isinstance(engine, (list, tuple)) else [cast(Engine, engine)] * count


def _distinct(engines: Sequence[Engine]) -> list[Engine]:
    out: list[Engine] = []
    for e in engines:
        if not any(e is seen for seen in out):
            out.append(e)
    return out


def _ended(s: ContainerState) -> bool:
    return not s.get("Running") and s.get("Status") in ("exited", "dead", "created")


def stop(engine: Engine | Sequence[Engine], launch: LaunchRecord, timeout_s: int) -> bool:
    """Every node stopped (Ctrl-C, `launcher stop`); False when none was there to stop."""
    names = containers(launch)
    engines = _per_node(engine, len(names))
    done = [e.stop(name, timeout_s=timeout_s) for name, e in zip(names, engines, strict=True)]
    return any(d.returncode == 0 for d in done)


def remove(engine: Engine, names: Sequence[str], network: str | None, *, force: bool = False) -> None:
    """The nodes' containers and their network removed (force: stopped first)."""
    for name in names:
        if force:
            engine.stop(name, timeout_s=1)
        engine.rm(name)
    if network:
        engine.network_rm(network)
