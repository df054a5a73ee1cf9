"""A run of several nodes, one node per host (`launcher run SCRIPT --host A --host B --nodes 2`): node k's container
on host k's Docker engine, every container on its host's network, all from the same image ID, node 0's host
holding the rendezvous.

Each host is a :class:`~launcher.targets.placement.DirectPlacement` for what every node needs (the engine's checks,
the image, the data and the code, the run's directory): they go to every host. The run is one run: node 0's
container is its container and its log the console; the first node to fail stops the others (as on one engine,
:mod:`launcher.targets.nodes`); the outputs come back from every host into the one run folder, node k's own records
under ``nodes/<k>/`` and its ranks' under ``ranks/<r>/``, as a run of several nodes on one engine lays them out.

Before anything is sent, every host is asked the address it was reached at over SSH and whether it reaches every
other host there: a node that cannot reach node 0 would otherwise wait in the rendezvous until its timeout.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from launcher.errors import CommandFailed, HostNotReady, HostUnreachable, NotFound, UsageError
from launcher.hosts.base import Host
from launcher.hosts.containerspec import SpecRecord
from launcher.hosts.engine import Engine
from launcher.hosts.hostspec import HostSpec
from launcher.progress import Reporter
from launcher.records.records import (
    CodePlan,
    DataSource,
    ImageRecord,
    LaunchRecord,
    PlacementRecord,
    RunState,
    StartedRecord,
)
from launcher.runtime.distributed import RANKS
from launcher.specs.container import NODES, ContainerJob, container_spec, node_outputs
from launcher.specs.topology import HOST, Topology
from launcher.targets import nodes
from launcher.targets.placement import IMAGE_ID, POLL_NODES_S, DirectPlacement, ListedRun, Placement, remote_outputs
from launcher.transfers.ship import ShipResult

KIND = "hosts"
SHARED_MARK = "nodes.mark"  # in the run's directory on node 0's host: seen by a host that shares it
HOST_NETWORK = "host"  # docker run --network host: the node's ranks listen on its host's addresses
# Run on each host with its own python3: which of the addresses given (ADDR:PORT ...) it cannot open a TCP
# connection to, one "ADDR:PORT reason" line each.
REACH_SCRIPT = """\
import socket, sys
for peer in sys.argv[1:]:
    addr, _, port = peer.rpartition(":")
    try:
        socket.create_connection((addr, int(port)), timeout=5).close()
    except OSError as exc:
        print(peer, exc.strerror or exc)
"""


class HostsPlacement(Placement):
    """Node k of a run on hosts[k]'s Docker engine; ``host`` (where the run is recorded as placed, and its outputs
    and log come from first) is node 0's."""

    kind = KIND

    def __init__(self, hosts: Sequence[Host], specs: Sequence[HostSpec]) -> None:
        if len(hosts) != len(specs) or len(hosts) < 2:
            raise ValueError("a placement on hosts needs two hosts or more, each with its spec")
        super().__init__(hosts[0], specs[0])
        self.parts = [DirectPlacement(h, s) for h, s in zip(hosts, specs, strict=True)]
        self._placed: dict[str, list[str]] = {}  # a path on node 0's host -> that content's path on each host
        self._dirs: dict[str, list[str]] = {}  # run id -> its directory on each host
        self._addresses: list[str] | None = None
        self._ended: dict[str, RunState] = {}

    @property
    def engines(self) -> list[Engine]:
        return [p.engine for p in self.parts]

    def node_names(self, count: int) -> list[str]:
        return [p.name for p in self.parts]

    def record(self) -> PlacementRecord:
        return {"kind": self.kind, "hosts": [p.host_spec.to_record() for p in self.parts]}

    @classmethod
    def reopen(cls, host: Host, host_spec: HostSpec, record: PlacementRecord) -> Placement:
        listed = record.get("hosts")
        if not isinstance(listed, list) or len(listed) < 2:
            raise UsageError("the launch record names a run on several hosts without its hosts",
                             "the run's launch.json was changed by hand")
        specs = [host_spec, *(HostSpec.from_record(r) for r in listed[1:])]
        opened = [host]
        try:
            opened += [spec.open() for spec in specs[1:]]
        except BaseException:
            for h in opened[1:]:
                h.close()
            raise
        return cls(opened, specs)

    def topology_for(self, topology: Topology | None) -> Topology:
        n = len(self.parts)
        if topology is None or topology.nodes != n:
            given = 1 if topology is None else topology.nodes
            raise UsageError(f"{n} hosts given (--host) for a run of {given} node{'s' if given != 1 else ''}: "
                             "launcher places one node on each host",
                             f"give --nodes {n}, or as many --host as --nodes")
        return replace(topology, network=HOST)

    # -- every host can run it, and every host reaches the others
    def prepare(self, gpu: bool) -> None:
        local = [p.name for p in self.parts if p.host.kind == "local"]
        if local:
            raise UsageError("the local engine cannot be one of several nodes: the nodes reach each other by their "
                             "hosts' addresses", "give every node as an SSH host (--host HOST for each)")
        seen: dict[str, int] = {}
        for k, p in enumerate(self.parts):
            if p.name in seen:
                raise UsageError(f"--host {p.name} is given twice (nodes {seen[p.name]} and {k}): the nodes of a run "
                                 "on several hosts listen on their hosts' ports", "give each host once")
            seen[p.name] = k
        for p in self.parts:
            p.prepare(gpu)
        self._addresses = self._reachable()

    def _reachable(self) -> list[str]:
        """Each host's address as SSH reached it; every host checked to open a connection to every other there."""
        found: list[tuple[str, str]] = []
        for k, p in enumerate(self.parts):
            said = p.host.run(["sh", "-c", 'echo "$SSH_CONNECTION"'], check=False).out.split()
            if len(said) < 4:
                raise HostNotReady(f"{p.name} (node {k}) does not say the address SSH reached it at "
                                   "($SSH_CONNECTION is empty)", "check that sshd on the host sets SSH_CONNECTION")
            found.append((said[2], said[3]))
        for k, p in enumerate(self.parts):
            others = [f"{a}:{port}" for j, (a, port) in enumerate(found) if j != k]
            done = p.host.run([p.host.python, "-c", REACH_SCRIPT, *others], check=False)
            bad = [line for line in done.out.splitlines() if line.strip()]
            if done.returncode != 0 or bad:
                first = bad[0] if bad else done.last_error_line()
                raise HostUnreachable(
                    f"node {k} ({p.name}) cannot reach another node's host: {first}",
                    "give hosts on one network, each reaching the others (the rendezvous listens on node 0's host)")
        return [addr for addr, _ in found]

    # -- what every node needs, on every host
    def send_data(self, local: Path, reporter: Reporter | None) -> tuple[str, DataSource]:
        sent = [p.send_data(local, reporter) for p in self.parts]
        self._placed[sent[0][0]] = [path for path, _ in sent]
        return sent[0]

    def send_code(self, plan: CodePlan, reporter: Reporter | None) -> CodePlan:
        sent = [p.send_code(plan, reporter) for p in self.parts]
        self._placed[str(sent[0]["host_path"])] = [str(s["host_path"]) for s in sent]
        return {**sent[0], "sent": any(s.get("sent") for s in sent)}

    def ship(self, image: ImageRecord, *, via: str | None, reporter: Reporter | None,
             cache_dir: Path) -> ShipResult:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(self.parts)) as pool:  # every host loads its own engine at once
            sent = [pool.submit(p.ship, image, via=via, reporter=reporter, cache_dir=cache_dir) for p in self.parts]
            done = [f.result() for f in sent]
        return ShipResult(image_id=done[0].image_id, skipped=all(d.skipped for d in done),
                          bytes_sent=sum(d.bytes_sent for d in done), layers_sent=sum(d.layers_sent for d in done),
                          layers_skipped=sum(d.layers_skipped for d in done), seconds=max(d.seconds for d in done))

    def _on(self, path: str | None, k: int) -> str | None:
        """A path on node 0's host as it is on host k: where the same content was placed there, else the same."""
        if path is None:
            return None
        return self._placed.get(path, [path] * len(self.parts))[k]

    def run_dir(self, run_id: str, data: str | None) -> str:
        self._dirs[run_id] = [p.run_dir(run_id, self._on(data, k)) for k, p in enumerate(self.parts)]
        return self._dirs[run_id][0]

    def _shared(self, dirs: list[str]) -> list[bool]:
        """Which hosts see node 0's run directory as their own (a shared home, as on a cluster): their nodes'
        outputs are in node 0's already, and come back with them."""
        token = secrets.token_hex(8)
        self.host.write_atomic(f"{dirs[0]}/{SHARED_MARK}", token.encode())
        return [k == 0 or (p.host.read_text(f"{dirs[k]}/{SHARED_MARK}") or "").strip() == token
                for k, p in enumerate(self.parts)]

    # -- the run
    def start(self, job: ContainerJob) -> StartedRecord:
        if job.topology is None or job.topology.nodes != len(self.parts):
            raise UsageError(f"run {job.run_id} is not a run of {len(self.parts)} nodes", "give --nodes with --host")
        addresses = self._addresses if self._addresses is not None else self._reachable()
        dirs = self._dirs.get(job.run_id) or [job.run_dir] * len(self.parts)
        names: list[str] = []
        specs: list[SpecRecord] = []
        record: StartedRecord | None = None
        try:
            for k, p in enumerate(self.parts):
                one = replace(job, node=k, network=HOST_NETWORK, peers=tuple(addresses),
                              host_out=remote_outputs(dirs[k]), data=self._on(job.data, k),
                              host_code=self._on(job.host_code, k), owner=p.output_owner())
                p.host.makedirs(node_outputs(one.host_out, k))
                p.host.makedirs(f"{one.host_out}/{RANKS}")
                one = p.write_secrets(one)
                spec = container_spec(one)
                names.append(one.name)
                specs.append(spec.to_record())
                try:
                    started = p.engine.run(spec)
                finally:
                    p.remove_secrets(one)
                if started.returncode != 0:
                    raise CommandFailed(f"node {k}'s container for {job.run_id} did not start on {p.name}: "
                                        f"{started.last_error_line()}", "check the image and Docker on that host")
                if k == 0:
                    record = {"container": one.name, "container_spec": spec.to_record()}
                    if IMAGE_ID.fullmatch(job.image_id):  # started by its full ID: that very image ran
                        record["image_ran"] = job.image_id
        except BaseException:
            for name, p in zip(names, self.parts, strict=False):
                p.engine.stop(name, timeout_s=1)
                p.engine.rm(name)
            raise
        assert record is not None
        record["node_containers"] = names
        record["network"] = HOST_NETWORK
        record["node_specs"] = specs
        shared = self._shared(dirs)  # node k's outputs are pulled from host k, unless they are in node 0's folder
        record["node_dirs"] = [None if k and shared[k] else d for k, d in enumerate(dirs)]
        return record

    def restart(self, launch: LaunchRecord, env: Mapping[str, str]) -> StartedRecord:
        """Every node's container started again on its host as it was, with env added (``launcher resume``)."""
        specs = [s.with_env(env) for s in nodes.node_specs(launch)]
        engines = self._node_engines(launch)
        names = nodes.containers(launch)
        self._ended.pop(str(launch.get("container")), None)
        for name, engine in zip(names, engines, strict=True):
            engine.stop(name, timeout_s=1)
            engine.rm(name)
        started_on: list[int] = []
        try:
            for k, (spec, p) in enumerate(zip(specs, self.parts, strict=True)):
                started = p.engine.run(spec)
                if started.returncode != 0:
                    raise CommandFailed(f"node {k}'s container for {launch['run_id']} did not start again on "
                                        f"{p.name}: {started.last_error_line()}", "check the image and Docker there")
                started_on.append(k)
        except BaseException:
            for k in started_on:
                engines[k].stop(names[k], timeout_s=1)
                engines[k].rm(names[k])
            raise
        record: StartedRecord = {"container": names[0], "container_spec": specs[0].to_record()}
        ran = engines[0].container_image(names[0])
        if ran is not None:
            record["image_ran"] = ran
        return record

    def rank_outputs(self, launch: LaunchRecord) -> list[tuple[int, Host, str]]:
        """Rank r's folder on the host of its node (node 0's, where that host shares node 0's folder)."""
        topology = launch.get("topology")
        per_node = topology.get("procs_per_node") if isinstance(topology, dict) else None
        dirs = launch.get("node_dirs")
        if not isinstance(per_node, int) or per_node < 1 or not isinstance(dirs, list) or len(dirs) != len(self.parts):
            raise UsageError(f"run {launch.get('run_id')}'s launch record lacks its layout or its directory on each "
                             "host", "the run's launch.json was changed by hand")
        found: list[tuple[int, Host, str]] = []
        for rank, host, folder in super().rank_outputs(launch):
            node = rank // per_node
            if rank and dirs[node] is not None:
                host, folder = self.parts[node].host, f"{remote_outputs(str(dirs[node]))}/{RANKS}/{rank}"
            found.append((rank, host, folder))
        return found

    def state(self, launch: LaunchRecord) -> RunState | None:
        name = str(launch.get("container"))
        if name in self._ended:
            return self._ended[name]
        state = nodes.state(self._node_engines(launch), launch)
        if state is not None and state.ended:
            self._ended[name] = state
        return state

    def _node_engines(self, launch: LaunchRecord) -> list[Engine]:
        count = len(nodes.containers(launch))
        if count != len(self.parts):
            raise UsageError(f"run {launch.get('run_id')} names {count} node containers for {len(self.parts)} hosts",
                             "the run's launch.json was changed by hand")
        return self.engines

    def until_ended(self, launch: LaunchRecord) -> None:
        while (state := self.state(launch)) is not None and not state.ended:
            time.sleep(POLL_NODES_S)

    def logs(self, launch: LaunchRecord, *, follow: bool = False) -> Iterator[str]:
        if follow:  # node 0's log ends with node 0: a failed node elsewhere must stop it
            threading.Thread(target=self.until_ended, args=(launch,), daemon=True).start()
        return self.parts[0].engine.logs(str(launch.get("container")), follow=follow)

    def stop(self, launch: LaunchRecord) -> RunState | None:
        if not nodes.stop(self._node_engines(launch), launch, timeout_s=10):
            raise NotFound(f"run {launch['run_id']} has no node containers on its hosts",
                           "it may have finished already: `launcher pull RUN`")
        return self.state(launch)

    def release(self, launch: LaunchRecord) -> None:
        self._ended.pop(str(launch.get("container")), None)
        for name, engine in zip(nodes.containers(launch), self._node_engines(launch), strict=True):
            engine.rm(name)

    def listed(self) -> list[ListedRun]:
        return self.parts[0].listed()

    def more_outputs(self, launch: LaunchRecord) -> list[tuple[Host, str, str]]:
        """Node k's own records and its ranks' (k >= 1), from host k: (host, folder there, folder in outputs)."""
        dirs = launch.get("node_dirs")
        if not isinstance(dirs, list) or len(dirs) != len(self.parts):
            raise UsageError(f"run {launch.get('run_id')}'s launch record lacks its directory on each host",
                             "the run's launch.json was changed by hand")
        out: list[tuple[Host, str, str]] = []
        for k, (p, remote) in enumerate(zip(self.parts, dirs, strict=True)):
            if k and remote is not None:  # None: host k shares node 0's folder
                there = remote_outputs(str(remote))
                out += [(p.host, node_outputs(there, k), f"{NODES}/{k}"), (p.host, f"{there}/{RANKS}", RANKS)]
        return out

    def close(self) -> None:
        for p in self.parts:
            p.close()


def _register() -> None:
    from launcher.targets.registry import Target, register

    register(Target(HostsPlacement, scheduled=False))


_register()
