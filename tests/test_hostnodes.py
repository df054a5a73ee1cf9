"""One node on each host, without Docker or SSH: the options, each node's container on its host's network, the
hosts' reach checked by the script each host runs (here, on this machine), the nodes' state across engines, and
the outputs of nodes on other hosts pulled into the run folder, where a file two hosts send differently is refused
(tests/test_multinode_hosts.py runs it for real on two SSH hosts)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_topology import RUNNING, ScriptedEngine, _exited, _job
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, HostUnreachable, UsageError
from launcher.hosts.hostspec import HostSpec
from launcher.hosts.local import LocalHost
from launcher.proc import Completed
from launcher.records.records import LaunchRecord
from launcher.records.rundir import RunDir
from launcher.runs.collect import _pull_outputs
from launcher.specs import topology
from launcher.specs.container import container_spec, runtime_argv
from launcher.targets import nodes
from launcher.targets.hostnodes import HostsPlacement
from launcher.targets.placement import DirectPlacement
from launcher.workspace import Workspace


@pytest.mark.parametrize(("given", "says"), [
    (["--host", "a", "--host", "b", "--nodes", "3"], "2 hosts given (--host) for a run of 3 nodes"),
    (["--host", "a", "--host", "a"], "each host once"),
    (["--host", "a", "--host", "b", "--scheduler", "slurm"], "without --scheduler"),
])
def test_several_hosts_need_one_node_each_once_and_no_scheduler(tmp_path: Path, repo_workspace: Workspace,
                                                                given: list[str], says: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    res = CliRunner().invoke(app, ["-w", str(repo_workspace.root), "run", str(script), "--variant", "torch-cpu",
                                   *given])
    assert res.exit_code == ExitCode.USAGE, res.output
    assert says in " ".join(res.output.split()) and "Traceback" not in res.output


def test_a_node_on_its_hosts_network_meets_node_0_at_its_hosts_address(tmp_path: Path) -> None:
    topo = topology.Topology(2, 2, network=topology.HOST)
    one = _job(tmp_path, topology=topo, network="host", node=1, peers=("10.0.0.4", "10.0.0.5"))
    spec = container_spec(one)
    assert spec.network == "host"
    argv = runtime_argv(one)
    assert argv[argv.index("--master") + 1] == "10.0.0.4:29500"
    assert argv[argv.index("--peers") + 1] == "10.0.0.4,10.0.0.5"
    # Gloo's interface is not one name for every host: the runtime finds the one towards node 0
    assert topo.env() == {} and topology.Topology(2, 2).env() == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert topo.record(["a", "b"])["network"] == "host"
    assert topology.Topology(2, 2, backend="nccl", network=topology.HOST).env()["NCCL_PROTO"] == "Simple"


class Reached(LocalHost):
    """This machine as a host that SSH reached at ``address``: its commands run here for real."""

    def __init__(self, root: Path, address: str, name: str) -> None:
        super().__init__(workspace_root=root)
        self.address, self.name = address, name

    def run(self, argv: Sequence[str], *, input: bytes | None = None, check: bool = True,
            timeout: float | None = None) -> Completed:
        if list(argv[:2]) == ["sh", "-c"] and "SSH_CONNECTION" in argv[2]:
            said = f"10.9.9.9 50000 {self.address}\n".encode()
            return Completed(tuple(argv), 0, said, b"")
        return super().run(argv, input=input, check=check, timeout=timeout)


def _placement(tmp_path: Path, *addresses: str) -> HostsPlacement:
    hosts = [Reached(tmp_path / f"h{k}", a, f"host{k}") for k, a in enumerate(addresses)]
    return HostsPlacement(hosts, [HostSpec(f"host{k}") for k in range(len(hosts))])


def test_every_host_is_asked_whether_it_reaches_the_others_before_anything_is_sent(tmp_path: Path) -> None:
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            shut = closed.getsockname()[1]  # bound, never listening: a connection there is refused
            placement = _placement(tmp_path, f"127.0.0.1 {port}", f"127.0.0.1 {port}")
            assert placement._reachable() == ["127.0.0.1", "127.0.0.1"]
            placement = _placement(tmp_path, f"127.0.0.1 {port}", f"127.0.0.1 {shut}")
            with pytest.raises(HostUnreachable) as refused:
                placement._reachable()
    assert f"node 0 (host0) cannot reach another node's host: 127.0.0.1:{shut}" in refused.value.message
    assert "one network" in refused.value.hint


def test_a_placement_on_hosts_takes_only_as_many_nodes_as_hosts_and_reopens_from_its_record(tmp_path: Path) -> None:
    placement = _placement(tmp_path, "10.0.0.1 22", "10.0.0.2 22")
    assert placement.topology_for(topology.Topology(2, 3)).network == topology.HOST
    for wrong in (None, topology.Topology(3, 1)):
        with pytest.raises(UsageError):
            placement.topology_for(wrong)
    assert placement.node_names(2) == ["host0", "host1"]
    record = placement.record()
    assert record == {"kind": "hosts", "hosts": [{"spec": "host0"}, {"spec": "host1"}]}
    with pytest.raises(UsageError):  # a record without its hosts is refused, not guessed
        HostsPlacement.reopen(placement.host, HostSpec("host0"), {"kind": "hosts"})
    # node 1 shares node 0's folder (a cluster's home): nothing more to pull; else its nodes/1 and ranks/ there
    launch: LaunchRecord = {"run_id": "r", "node_dirs": ["/a/r", None]}  # type: ignore[typeddict-item]
    assert placement.more_outputs(launch) == []
    launch["node_dirs"] = ["/a/r", "/b/r"]
    assert [(h.name, there, part) for h, there, part in placement.more_outputs(launch)] == [
        ("host1", "/b/r/out/nodes/1", "nodes/1"), ("host1", "/b/r/out/ranks", "ranks")]


def test_the_first_node_to_fail_on_its_own_host_stops_the_nodes_on_the_others() -> None:
    launch: LaunchRecord = {"node_containers": ["n0", "n1"]}  # type: ignore[typeddict-item]
    first, second = ScriptedEngine({"n0": RUNNING}), ScriptedEngine({"n1": RUNNING})
    state = nodes.state([first, second], launch)  # type: ignore[list-item]
    assert state is not None and state.running
    second.states["n1"] = _exited(137, "t5")
    state = nodes.state([first, second], launch)  # type: ignore[list-item]
    assert first.stopped == ["n0"] and second.stopped == []
    assert state is not None and state.ended and state.exit_code == 137
    assert nodes.stop([first, second], launch, timeout_s=1)  # type: ignore[list-item]
    assert first.stopped == ["n0", "n0"] and second.stopped == ["n1"]


class TwoPlaces(DirectPlacement):
    """A run's outputs on this machine in two folders, as a node on another host would send its own."""

    def __init__(self, host: LocalHost, main: Path, more: Path) -> None:
        super().__init__(host)
        self.main, self.more = main, more

    def outputs(self, launch: LaunchRecord) -> str:
        return str(self.main)

    def more_outputs(self, launch: LaunchRecord) -> list[tuple[Any, str, str]]:
        return [(self.host, str(self.more), "ranks")]


def test_a_nodes_outputs_join_the_run_folder_and_a_file_two_hosts_send_differently_is_refused(tmp_path: Path) -> None:
    main, more = tmp_path / "host0/out", tmp_path / "host1/ranks"
    (main / "ranks/1").mkdir(parents=True)
    (main / "model.pt").write_bytes(b"weights")
    (main / "ranks/1/steps.jsonl").write_text("{}\n")
    (more / "2").mkdir(parents=True)
    (more / "2/steps.jsonl").write_text("{}\n")
    local = RunDir(tmp_path / "ws/runs/r")
    local.path.mkdir(parents=True)
    placement = TwoPlaces(LocalHost(workspace_root=tmp_path), main, more)
    launch: LaunchRecord = {"run_id": "r"}  # type: ignore[typeddict-item]
    result = _pull_outputs(placement, launch, local, None)
    assert set(result.files) == {"model.pt", "ranks/1/steps.jsonl", "ranks/2/steps.jsonl"}
    assert json.loads(local.pulled_file_of("ranks").read_text()).keys() == {"2/steps.jsonl"}
    # the other host sends rank 1's record too, with other bytes: neither copy is taken as the run's
    (more / "1").mkdir()
    (more / "1/steps.jsonl").write_text('{"forged": true}\n')
    result = _pull_outputs(placement, launch, local, None)
    assert "ranks/1/steps.jsonl" not in result.files
    assert any("ranks/1/steps.jsonl (sent by" in r for r in result.refused)  # pull_record stops on refusals


def test_a_run_on_hosts_is_reopened_from_its_launch_record_with_every_nodes_host(tmp_path: Path) -> None:
    from launcher.targets.registry import open_placement

    launch: LaunchRecord = {"run_id": "r", "host_options": {"spec": None},  # type: ignore[typeddict-item]
                            "placement": {"kind": "hosts", "hosts": [{"spec": None}, {"spec": None}]}}
    with open_placement(Workspace(tmp_path, tmp_path / "cache"), launch) as placement:
        assert isinstance(placement, HostsPlacement) and len(placement.parts) == 2
