"""`launcher resume` of a run of several processes, without Docker or training: the checkpoint every rank holds
(read from each rank's folder, wherever its node ran; a folder named like no checkpoint of launcher's ignored),
each node's container started again as it was with the checkpoint named, each of a node's ranks put back to it
by the runtime, and a rank of several keeping the checkpoint before its latest (tests/test_resume_runtime.py and
tests/test_multinode.py resume real DDP runs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from test_topology import RUNNING, ScriptedEngine, _exited, _job

from launcher.errors import CommandFailed, NotResumable, UsageError
from launcher.hosts.hostspec import HostSpec
from launcher.hosts.local import LocalHost
from launcher.proc import Completed
from launcher.records.records import LaunchRecord
from launcher.runs import resume
from launcher.runtime import checkpoint, runner
from launcher.specs import topology
from launcher.specs.container import container_spec
from launcher.targets import nodes
from launcher.targets.hostnodes import HostsPlacement
from launcher.targets.placement import DirectPlacement


def _checkpoints(out: Path, *names: str, partial: str | None = None) -> None:
    for name in names:
        (out / "checkpoints" / name).mkdir(parents=True)
        (out / "checkpoints" / name / "state.json").write_text('{"epoch": 0, "next_epoch": 1, "step": 6}\n')
    if partial:
        (out / "checkpoints" / partial).mkdir(parents=True)  # being written: no state.json yet


def test_the_newest_checkpoint_every_rank_holds_is_chosen_or_the_resume_refused() -> None:
    launch: LaunchRecord = {"run_id": "r"}  # type: ignore[typeddict-item]
    held = {0: {"epoch-0002", "epoch-0003"}, 1: {"epoch-0002", "epoch-0003"}, 2: {"epoch-0001", "epoch-0002"}}
    assert resume.common_checkpoint(held, launch) == "epoch-0002"  # rank 2 lags by one: the one before
    with pytest.raises(NotResumable, match="no checkpoint of rank 1: it stopped before its first one"):
        resume.common_checkpoint({0: {"epoch-0001"}, 1: set()}, launch)
    with pytest.raises(NotResumable, match="hold no checkpoint in common"):
        resume.common_checkpoint({0: {"epoch-0003"}, 1: {"epoch-0001"}}, launch)


def test_every_ranks_checkpoints_are_read_and_a_folder_named_otherwise_is_ignored(tmp_path: Path) -> None:
    out = tmp_path / "run/out"
    _checkpoints(out, "epoch-0001", "epoch-0002")
    _checkpoints(out / "ranks/1", "epoch-0001", "epoch-0002", partial=".epoch-0003.partial")
    # a rank that lost its newest, and a folder that would be a command if it reached a shell
    _checkpoints(out / "ranks/2", "epoch-0001", "epoch-0009 $(touch pwned)")
    _checkpoints(out / "ranks/3", "epoch-0001", "epoch-0002")
    launch: LaunchRecord = {"run_id": "r", "remote_dir": str(tmp_path / "run"),  # type: ignore[typeddict-item]
                            "topology": {"world_size": 4, "procs_per_node": 2}}
    placement = DirectPlacement(LocalHost(workspace_root=tmp_path))
    assert resume.checkpoint_on_host(placement, launch) == "epoch-0001"
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
    (out / "ranks/2/checkpoints/epoch-0001").rename(out / "ranks/2/checkpoints/old")
    with pytest.raises(NotResumable, match="no checkpoint of rank 2"):
        resume.checkpoint_on_host(placement, launch)


def test_a_node_on_its_own_host_has_its_ranks_folders_there_unless_it_shares_node_0s() -> None:
    placement = HostsPlacement([LocalHost(), LocalHost()], [HostSpec("host0"), HostSpec("host1")])
    launch: LaunchRecord = {"run_id": "r", "remote_dir": "/h0/run",  # type: ignore[typeddict-item]
                            "topology": {"world_size": 4, "procs_per_node": 2}, "node_dirs": ["/h0/run", "/h1/run"]}
    found = [(rank, placement.parts.index(next(p for p in placement.parts if p.host is host)), folder)
             for rank, host, folder in placement.rank_outputs(launch)]
    assert found == [(0, 0, "/h0/run/out"), (1, 0, "/h0/run/out/ranks/1"), (2, 1, "/h1/run/out/ranks/2"),
                     (3, 1, "/h1/run/out/ranks/3")]
    launch["node_dirs"] = ["/h0/run", None]  # a shared home: every rank's folder is in node 0's
    assert [(h is placement.host, f) for _, h, f in placement.rank_outputs(launch)][2:] == [
        (True, "/h0/run/out/ranks/2"), (True, "/h0/run/out/ranks/3")]


class StartingEngine(ScriptedEngine):
    """A scripted engine that also starts containers (refusing those named in ``refuse``) and makes networks."""

    def __init__(self, states: dict[str, dict[str, Any]], refuse: tuple[str, ...] = ()) -> None:
        super().__init__(states)
        self.refuse = refuse
        self.ran: list[Any] = []
        self.networks: list[str] = []

    def run(self, spec: Any) -> Any:
        self.ran.append(spec)
        return Completed((), 1 if spec.name in self.refuse else 0, b"", b"no such image\n")

    def network_create(self, name: str, labels: dict[str, str]) -> Any:
        self.networks.append(name)
        return Completed((), 0, b"", b"")

    def container_image(self, name: str) -> str:
        return "sha256:" + "a" * 64


def _nodes_launch(tmp_path: Path) -> LaunchRecord:
    job = _job(tmp_path, topology=topology.Topology(2, 2), network="launcher-net")
    specs = [container_spec(job), container_spec(_job(tmp_path, topology=topology.Topology(2, 2),
                                                      network="launcher-net", node=1))]
    return {"run_id": job.run_id, "node_containers": [s.name for s in specs],  # type: ignore[typeddict-item]
            "network": "launcher-net", "node_specs": [s.to_record() for s in specs]}


def test_every_nodes_container_starts_again_as_it_was_with_the_checkpoint_named(tmp_path: Path) -> None:
    launch = _nodes_launch(tmp_path)
    names = launch["node_containers"]
    engine = StartingEngine({names[0]: _exited(143, "t9"), names[1]: _exited(137, "t8")})
    env = {"LAUNCHER_RESUME": "1", "LAUNCHER_RESUME_FROM": "epoch-0002"}
    record = nodes.restart(engine, launch, env, "here")  # type: ignore[arg-type]
    assert engine.removed == [*names, "launcher-net"] and engine.networks == ["launcher-net"]
    assert [s.name for s in engine.ran] == names
    assert all(s.env["LAUNCHER_RESUME_FROM"] == "epoch-0002" and s.network == "launcher-net" for s in engine.ran)
    assert [s.mounts for s in engine.ran] == [s.mounts for s in nodes.node_specs(launch)]  # as it was started
    assert record["container"] == names[0] and record["node_containers"] == names

    refusing = StartingEngine({}, refuse=(names[1],))
    with pytest.raises(CommandFailed, match=r"node 1's container .* did not start again on here: no such image"):
        nodes.restart(refusing, launch, env, "here")  # type: ignore[arg-type]
    assert refusing.removed[-3:] == [*names, "launcher-net"]  # node 0, started, is not left waiting for node 1

    del launch["node_specs"]
    with pytest.raises(NotResumable, match="does not hold each node's container"):
        nodes.restart(engine, launch, env, "here")  # type: ignore[arg-type]


def test_nodes_on_their_own_hosts_start_again_each_on_its_engine(tmp_path: Path) -> None:
    launch = _nodes_launch(tmp_path)
    names = launch["node_containers"]
    placement = HostsPlacement([LocalHost(), LocalHost()], [HostSpec("host0"), HostSpec("host1")])
    engines = [StartingEngine({names[0]: RUNNING}), StartingEngine({names[1]: _exited(137, "t8")})]
    for part, engine in zip(placement.parts, engines, strict=True):
        part.engine = engine  # type: ignore[assignment]
    placement.restart(launch, {"LAUNCHER_RESUME": "1", "LAUNCHER_RESUME_FROM": "epoch-0001"})
    assert [[s.name for s in e.ran] for e in engines] == [[names[0]], [names[1]]]
    assert engines[0].stopped == [names[0]] and engines[1].removed == [names[1]]


def test_a_run_of_several_nodes_does_not_move_to_another_host(tmp_path: Path) -> None:
    launch = _nodes_launch(tmp_path)
    with pytest.raises(NotResumable, match="resumes where it ran"):
        resume._move(None, launch, None, HostSpec("elsewhere"), None)  # type: ignore[arg-type]


def _rank_folder(out: Path, *, lagging: bool = False) -> None:
    names = ("epoch-0001",) if lagging else ("epoch-0001", "epoch-0002")
    for name in names:
        folder = out / "checkpoints" / name
        folder.mkdir(parents=True)
        size = 10 if name == "epoch-0001" else 20
        folder.joinpath("state.json").write_text(json.dumps(
            {"epoch": 0, "next_epoch": 1, "step": 6, "framework": "torch",
             "files": {"fingerprints/steps.jsonl": size}}))
    (out / "fingerprints").mkdir(parents=True)
    (out / "fingerprints/steps.jsonl").write_bytes(b"x" * 30)
    (out / "_launcher").mkdir(parents=True)
    (out / "_launcher/rank.json").write_text('{"exit_code": 137}\n')
    (out / "checkpoints/latest.json").write_text(json.dumps({"name": names[-1]}))


def test_a_node_puts_each_of_its_ranks_back_to_the_checkpoint_named(tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "node1"
    (out / "_launcher").mkdir(parents=True)
    (out / "_launcher/ranks.json").write_text("{}\n")
    _rank_folder(out / "ranks/2")
    _rank_folder(out / "ranks/3", lagging=True)
    args = argparse.Namespace(out=out, nodes=2, procs_per_node=2, node_rank=1, master="node0:29500")
    monkeypatch.delenv("LAUNCHER_RESUME_FROM", raising=False)
    with pytest.raises(checkpoint.NotResumable, match="names none"):
        runner.prepare_resume(args)
    monkeypatch.setenv("LAUNCHER_RESUME_FROM", "epoch-0001")
    folder, _ = runner.prepare_resume(args)
    assert folder == out / "ranks/2/checkpoints/epoch-0001"
    for rank in (2, 3):
        mine = out / f"ranks/{rank}"
        assert (mine / "fingerprints/steps.jsonl").read_bytes() == b"x" * 10  # cut back to epoch-0001
        assert checkpoint.checkpoint_names(mine) == ["epoch-0001"]  # rank 2's later one goes: written again
        assert json.loads((mine / "checkpoints/latest.json").read_text()) == {"name": "epoch-0001"}
        assert not (mine / "_launcher/rank.json").exists()  # how it ended before is not how it ends now
    assert not (out / "_launcher/ranks.json").exists()
    monkeypatch.setenv("LAUNCHER_RESUME_FROM", "../../etc")
    with pytest.raises(checkpoint.NotResumable, match=r"no checkpoint '\.\./\.\./etc'"):
        runner.prepare_resume(args)


def test_a_rank_of_several_keeps_the_checkpoint_before_its_latest(tmp_path: Path) -> None:
    for keep_previous, kept in ((False, ["epoch-0003"]), (True, ["epoch-0002", "epoch-0003"])):
        out = tmp_path / str(keep_previous)
        points = checkpoint.Checkpoints(out, 1, False, keep_previous=keep_previous)
        for epoch in range(3):
            points.write(epoch, epoch * 6, "torch", lambda folder: None, trace_epoch=0)
        assert checkpoint.checkpoint_names(out) == kept
        assert json.loads((out / "checkpoints/epoch-0003/state.json").read_text())["trace_epoch"] == 0


def test_checkpoints_of_several_processes_are_refused_where_launcher_cannot_resume_every_rank() -> None:
    two = topology.Topology(1, 2)
    topology.check_framework(two, "torch", "train.py", checkpoints=True)
    topology.check_framework(two, "tensorflow", "train.py")
    with pytest.raises(UsageError, match="checkpoints and resumes runs of several processes for PyTorch only"):
        topology.check_framework(two, "tensorflow", "train.py", checkpoints=True)


def test_diverge_re_executes_runs_of_several_processes_from_the_start_and_says_why() -> None:
    from types import SimpleNamespace

    from launcher.workflows import diverge
    from launcher.workflows.divergence import Divergence

    result = Divergence("a", "b", None)
    launch: LaunchRecord = {"checkpoint": {"every": 1, "keep": "all"},  # type: ignore[typeddict-item]
                            "topology": {"world_size": 4}}
    ms = [SimpleNamespace(run_id="a"), SimpleNamespace(run_id="b")]
    points = diverge._start_points(None, result, ms, [launch, launch], 12)  # type: ignore[arg-type]
    assert points == [None, None] and not result.started_from
    assert result.not_from_checkpoint[0].startswith("a ran as several processes, whose re-executions start from")
