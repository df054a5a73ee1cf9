"""Runs of several processes without Docker: the options, the rank layout, each node's container, the runtime's
torchrun line and rank records, the records read back (how each rank ended, the first failure, the cross-rank
check), the verdict's environment, and the nodes' state on an engine that a test scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import UsageError
from launcher.records import ranks
from launcher.records.manifest import Manifest
from launcher.records.records import LaunchRecord
from launcher.runtime import distributed
from launcher.specs import topology
from launcher.specs.container import (
    CONTAINER_OUT,
    NODE_LABEL,
    RUN_LABEL,
    ContainerJob,
    container_spec,
    runtime_argv,
)
from launcher.specs.recipes import load_script
from launcher.targets import nodes
from launcher.verify.artifacts import is_volatile
from launcher.verify.environment import categorize, environment_diff


def test_options_give_no_topology_for_one_process_and_refuse_counts_below_one() -> None:
    assert topology.topology_option(None, None, gpu=False) is None
    assert topology.topology_option(1, 1, gpu=False) is None
    assert topology.topology_option(2, None, gpu=False) == topology.Topology(2, 1, "gloo")
    assert topology.topology_option(1, 4, gpu=True) == topology.Topology(1, 4, "nccl")
    for nodes_n, procs in ((0, 2), (2, -1)):
        with pytest.raises(UsageError) as err:
            topology.topology_option(nodes_n, procs, gpu=False)
        assert "at least one" in err.value.message
    with pytest.raises(UsageError):
        topology.topology_option(64, 64, gpu=False)


def test_ranks_are_laid_out_node_by_node_and_the_collectives_pinned_per_backend() -> None:
    topo = topology.Topology(2, 3)
    assert [(r["rank"], r["node"], r["local_rank"]) for r in topo.ranks()] == [
        (0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 0), (4, 1, 1), (5, 1, 2)]
    assert topo.world_size == 6
    assert topo.env() == {"GLOO_SOCKET_IFNAME": "eth0"}
    nccl = topology.Topology(2, 8, "nccl").env()
    assert nccl["NCCL_PROTO"] == "Simple" and nccl["NCCL_NVLS_ENABLE"] == "0"
    assert nccl["NCCL_MIN_NCHANNELS"] == nccl["NCCL_MAX_NCHANNELS"]
    record = topo.record(["a", "b"])
    assert record["world_size"] == 6 and record["node_hosts"] == ["a", "b"] and len(record["ranks"]) == 6


def test_pytorch_tensorflow_and_jax_runs_are_started_as_several_processes_and_others_refused() -> None:
    topology.check_framework(None, "keras", "x.py")
    for framework in ("torch", "tensorflow", "jax"):
        topology.check_framework(topology.Topology(2, 1), framework, "x.py")
    with pytest.raises(UsageError) as err:
        topology.check_framework(topology.Topology(2, 1), "keras", "x.py")
    assert "PyTorch" in err.value.message and "--nodes" in (err.value.hint or "")
    assert topology.Topology(2, 1).for_framework("tensorflow").launcher == "tf_config"
    assert topology.Topology(2, 1).for_framework("jax").launcher == "jax_distributed"
    assert topology.Topology(2, 1).for_framework("torch").record(["a", "b"])["launcher"].startswith("torchrun")


def _job(tmp_path: Path, **kw: Any) -> ContainerJob:
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    return ContainerJob(run_id="20261129T000000-train.py-abcdef", image_id="sha256:" + "a" * 64, env={},
                        host_out="/runs/r/out", recipe=load_script(script), params={}, host_code="/code",
                        code_entry="train.py", args=("--steps", "3"), **kw)


def test_each_node_gets_its_container_name_outputs_ranks_folder_network_and_rendezvous(tmp_path: Path) -> None:
    topo = topology.Topology(2, 2)
    zero = _job(tmp_path, topology=topo, network="launcher-net")
    one = _job(tmp_path, topology=topo, network="launcher-net", node=1)
    spec0, spec1 = container_spec(zero), container_spec(one)
    assert spec0.name == "launcher-20261129T000000-train.py-abcdef"
    assert spec1.name == spec0.name + "-node1"
    assert spec0.labels == {RUN_LABEL: zero.run_id} and spec1.labels == {NODE_LABEL: zero.run_id}
    assert spec0.network == spec1.network == "launcher-net"
    assert {(m.source, m.target) for m in spec1.mounts} >= {("/runs/r/out/nodes/1", CONTAINER_OUT),
                                                            ("/runs/r/out/ranks", CONTAINER_OUT + "/ranks")}
    assert ("/runs/r/out", CONTAINER_OUT) in {(m.source, m.target) for m in spec0.mounts}
    argv = runtime_argv(one)
    flags = argv[argv.index("--nodes"):argv.index("--")]
    assert flags == ["--nodes", "2", "--procs-per-node", "2", "--node-rank", "1", "--master", f"{spec0.name}:29500",
                     "--launcher", "torchrun", "--peers", f"{spec0.name},{spec1.name}"]
    assert argv[-3:] == ["--", "--steps", "3"]  # the script's own arguments stay last
    # one node of several processes: no network, the rendezvous on the container itself
    single = _job(tmp_path, topology=topology.Topology(1, 4))
    assert container_spec(single).network is None and "localhost:29500" in runtime_argv(single)
    assert "--nodes" not in runtime_argv(_job(tmp_path))


def test_jax_processes_get_node_0_as_their_coordinator_and_their_ids_by_rank() -> None:
    layout = distributed.Layout(2, 2, 1, "n0", 29501)
    env = distributed.worker_env(layout, ["n0", "n1"], 1, "jax_distributed")
    assert env["LAUNCHER_JAX_COORDINATOR"] == "n0:29501" and env["RANK"] == "3" and env["WORLD_SIZE"] == "4"
    assert "TF_CONFIG" not in env and env["LAUNCHER_DISTRIBUTED"] == "jax_distributed"
    tf = json.loads(distributed.worker_env(layout, ["n0", "n1"], 0)["TF_CONFIG"])
    assert tf == {"cluster": {"worker": ["n0:20000", "n0:20001", "n1:20000", "n1:20001"]},
                  "task": {"type": "worker", "index": 2}}


def test_the_runtime_starts_torchrun_static_with_an_explicit_node_rank() -> None:
    layout = distributed.Layout(2, 2, 1, "node0", 29501)
    argv = distributed.torchrun_argv("/py", layout, "/code/train.py", ["--x", "1"])
    assert argv[:3] == ["/py", "-m", "torch.distributed.run"]
    joined = " ".join(argv)
    for part in ("--nnodes 2", "--nproc-per-node 2", "--node-rank 1", "--rdzv-backend static", "--master-addr node0",
                 "--master-port 29501", "--max-restarts 0", "-m launcher.runtime.child /code/train.py --x 1"):
        assert part in joined
    assert list(layout.global_ranks()) == [2, 3]
    assert distributed.parse_master("node0") == ("node0", 29500)
    assert distributed.parse_master("10.0.0.1:1234") == ("10.0.0.1", 1234)
    with pytest.raises(ValueError):
        distributed.parse_master("node0:http")


TORCHRUN_SUMMARY = """\
launcher.runtime.child FAILED
Failures:
[1]:
  time      : 2026-11-29_11:27:31
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 8)
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_11:27:31
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 9)
"""


def test_a_node_records_each_rank_by_its_own_record_else_by_torchruns_summary(tmp_path: Path) -> None:
    layout = distributed.Layout(2, 2, 1, "node0")
    (tmp_path / "ranks/2/_launcher").mkdir(parents=True)
    (tmp_path / "ranks/2/_launcher/rank.json").write_text(json.dumps({"exit_code": 1, "ended_at": 5.5}))
    rows = distributed.node_ranks(tmp_path, layout, TORCHRUN_SUMMARY)
    assert rows == [{"rank": 2, "node": 1, "exit_code": 1, "ended_at": 5.5},
                    {"rank": 3, "node": 1, "exit_code": 137, "ended_at": None}]  # SIGKILL as a shell says it


def test_a_rank_beyond_zero_writes_its_records_and_console_under_ranks(tmp_path: Path) -> None:
    code = ("import os, sys; from launcher.runtime import distributed as d; r = d.this_rank(); d.enter_rank(r); "
            "print('hello from', r, os.environ['LAUNCHER_OUT']); sys.stdout.flush(); d.leave_rank(r, 3)")
    env = {**os.environ, "LAUNCHER_OUT": str(tmp_path), "LAUNCHER_DISTRIBUTED": "torchrun", "RANK": "2",
           "LOCAL_RANK": "0", "GROUP_RANK": "1", "WORLD_SIZE": "4"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout == ""  # its console went to its own log
    assert (tmp_path / "ranks/2/logs/train.log").read_text() == f"hello from 2 {tmp_path}/ranks/2\n"
    record = json.loads((tmp_path / "ranks/2/_launcher/rank.json").read_text())
    assert (record["rank"], record["node_rank"], record["world_size"], record["exit_code"]) == (2, 1, 4, 3)
    env.pop("LAUNCHER_DISTRIBUTED")
    assert subprocess.run([sys.executable, "-c", "from launcher.runtime import distributed as d; "
                           "print(d.this_rank())"], env=env, capture_output=True, text=True).stdout == "None\n"


def _outputs(tmp_path: Path, ends: dict[int, tuple[int | None, float | None]], steps: dict[int, list[str]]) -> Path:
    """A pulled run of 2 nodes x 2 processes: each node's ranks.json and each rank's step digests."""
    out = tmp_path / "run/outputs"
    for node in (0, 1):
        folder = out if node == 0 else out / f"nodes/{node}"
        (folder / "_launcher").mkdir(parents=True, exist_ok=True)
        rows = [{"rank": r, "node": node, "exit_code": ends[r][0], "ended_at": ends[r][1]}
                for r in (2 * node, 2 * node + 1)]
        (folder / "_launcher/ranks.json").write_text(json.dumps({"ranks": rows}))
    for rank, digests in steps.items():
        folder = out if rank == 0 else out / f"ranks/{rank}"
        (folder / "fingerprints").mkdir(parents=True, exist_ok=True)
        (folder / "fingerprints/steps.jsonl").write_text(
            "".join(json.dumps({"step": 4 * i, "epoch": 0, "digest": d}) + "\n" for i, d in enumerate(digests)))
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        (folder / "logs/train.log").write_text("".join(f"line {i}\n" for i in range(20)) + f"rank {rank} ends\n")
    return out


def test_the_first_failure_is_a_killed_rank_else_the_earliest_recorded(tmp_path: Path) -> None:
    topo = topology.Topology(2, 2).record(["h", "h"])
    same = {r: ["a", "b"] for r in range(4)}
    # rank 3 killed (no record of its own); ranks 0 and 1 failed in their collectives after it; rank 2 stopped
    out = _outputs(tmp_path, {0: (1, 10.0), 1: (1, 10.1), 2: (143, None), 3: (137, None)}, same)
    done = ranks.completed(topo, out, out.parent)
    assert done["failed"] is not None
    assert (done["failed"]["rank"], done["failed"]["node"], done["failed"]["exit_code"]) == (3, 1, 137)
    assert done["failed"]["log"] == "outputs/ranks/3/logs/train.log"
    assert done["failed"]["last_lines"][-1] == "rank 3 ends" and len(done["failed"]["last_lines"]) == ranks.LOG_LINES
    # a rank that raised: the one whose own record ended first, not the lowest rank
    out = _outputs(tmp_path / "b", {0: (1, 10.4), 1: (0, 9.0), 2: (1, 10.2), 3: (1, 10.3)}, same)
    failed = ranks.completed(topo, out, out.parent)["failed"]
    assert failed is not None and failed["rank"] == 2
    out = _outputs(tmp_path / "c", {r: (0, 1.0) for r in range(4)}, same)
    assert ranks.completed(topo, out, out.parent)["failed"] is None


def test_ranks_holding_different_weights_at_a_step_are_named(tmp_path: Path) -> None:
    topo = topology.Topology(2, 2).record(["h", "h"])
    ok = {r: (0, 1.0) for r in range(4)}
    out = _outputs(tmp_path, ok, {0: ["a", "b", "c"], 1: ["a", "b", "c"], 2: ["a", "b", "c"], 3: ["a", "x", "y"]})
    assert ranks.inconsistency(out, topo) == {"rank": 3, "step": 4, "epoch": 0}
    out = _outputs(tmp_path / "b", ok, {r: ["a", "b"] for r in range(4)})
    assert ranks.inconsistency(out, topo) is None


def _manifest(topo: dict[str, Any] | None) -> Manifest:
    data: dict[str, Any] = {"schema_version": 1, "run_id": "r", "group": "g", "seed": 1, "status": "succeeded",
                            "recipe": {"name": "train"}, "image": {"id": "i"}, "determinism": {"profile": "p"},
                            "host": {"name": "local"}, "artifacts": [], "started_at": "t"}
    if topo is not None:
        data["topology"] = topo
    return Manifest(Path("/nowhere"), data, ())  # type: ignore[arg-type]


def test_verify_names_a_change_of_world_size_or_layout_as_the_environment() -> None:
    four = topology.Topology(2, 2).record(["a", "b"])
    other_hosts = topology.Topology(2, 2).record(["c", "d"])
    two = topology.Topology(1, 2).record(["a"])
    assert environment_diff(_manifest(four), _manifest(other_hosts)) == []  # where the nodes ran is not the layout
    keys = {row["key"]: row for row in environment_diff(_manifest(four), _manifest(two))}
    assert keys["topology.world_size"]["reference"] == 4 and keys["topology.world_size"]["run"] == 2
    assert {"topology.nodes", "topology.ranks"} <= set(keys)
    assert all(row["category"] == "hardware" for row in keys.values())
    one = {row["key"]: row for row in environment_diff(_manifest(None), _manifest(two))}
    assert one["topology.procs_per_node"]["reference"] == 1 and one["topology.procs_per_node"]["run"] == 2
    assert categorize("topology.backend") == "hardware"
    assert environment_diff(_manifest(None), _manifest(None)) == []


def test_each_node_and_rank_record_and_console_log_is_left_out_like_the_runs_own() -> None:
    for path in ("outputs/nodes/1/_launcher/exit.json", "outputs/nodes/1/logs/train.log",
                 "outputs/ranks/3/_launcher/rank.json", "outputs/ranks/3/logs/train.log"):
        assert is_volatile(path), path
    for path in ("outputs/ranks/3/fingerprints/steps.jsonl", "outputs/nodes/1/model.pt"):
        assert not is_volatile(path), path


class ScriptedEngine:
    """Docker's answers about a run's node containers, as a test sets them; what was stopped and removed."""

    def __init__(self, states: dict[str, dict[str, Any]]) -> None:
        self.states = states
        self.stopped: list[str] = []
        self.removed: list[str] = []

    def container_states(self, names: list[str]) -> dict[str, Any]:
        return {n: dict(self.states[n]) for n in names if n in self.states}

    def stop(self, name: str, *, timeout_s: int = 10) -> Any:
        self.stopped.append(name)
        self.states[name] = {"Running": False, "Status": "exited", "ExitCode": 143, "FinishedAt": "t9",
                             "StartedAt": "t0"}
        return subprocess.CompletedProcess([], 0)

    def rm(self, name: str) -> Any:
        self.removed.append(name)
        return subprocess.CompletedProcess([], 0)

    def network_rm(self, name: str) -> Any:
        self.removed.append(name)
        return subprocess.CompletedProcess([], 0)


RUNNING = {"Running": True, "Status": "running", "ExitCode": 0, "StartedAt": "t0", "FinishedAt": ""}


def _exited(code: int, at: str) -> dict[str, Any]:
    return {"Running": False, "Status": "exited", "ExitCode": code, "StartedAt": "t0", "FinishedAt": at}


def test_the_first_node_to_fail_stops_the_others_and_gives_the_run_its_exit_code() -> None:
    launch: LaunchRecord = {"node_containers": ["n0", "n1", "n2"], "network": "net"}  # type: ignore[typeddict-item]
    engine = ScriptedEngine({"n0": RUNNING, "n1": RUNNING, "n2": RUNNING})
    state = nodes.state(engine, launch)  # type: ignore[arg-type]
    assert state is not None and state.running and not state.ended and engine.stopped == []
    engine.states["n1"] = _exited(1, "t5")
    state = nodes.state(engine, launch)  # type: ignore[arg-type]
    assert engine.stopped == ["n0", "n2"]  # they would wait in a collective for the rank that died
    assert state is not None and state.ended and state.exit_code == 1
    nodes.remove(engine, ["n0", "n1", "n2"], "net")  # type: ignore[arg-type]
    assert engine.removed == ["n0", "n1", "n2", "net"]
    done = ScriptedEngine({"n0": _exited(0, "t3"), "n1": _exited(0, "t4"), "n2": _exited(0, "t2")})
    state = nodes.state(done, launch)  # type: ignore[arg-type]
    assert state is not None and state.ended and state.exit_code == 0 and state.finished_at == "t4"
    assert nodes.state(ScriptedEngine({}), launch) is None  # type: ignore[arg-type]


def test_ctrl_c_while_a_run_of_several_nodes_goes_stops_every_node(tmp_path: Path) -> None:
    from launcher.hosts.local import LocalHost
    from launcher.records.rundir import RunDir
    from launcher.runs.collect import wait_run
    from launcher.targets.placement import DirectPlacement
    from launcher.workspace import Workspace

    ws = Workspace.at(tmp_path / "ws", cache_dir=tmp_path / "cache")
    ws.runs.mkdir(parents=True)
    stopped: list[str] = []

    class Interrupted(DirectPlacement):
        """The local engine's placement, its log cut by Ctrl-C and its stop recorded."""

        def logs(self, launch: Any, *, follow: bool = False) -> Any:
            yield "rank 0: step 1\n"
            raise KeyboardInterrupt

        def stop(self, launch: Any) -> None:
            stopped.extend(launch["node_containers"])

    for run_id, containers in (("20261129T000000-a-aaaaaa", ["n0", "n1"]), ("20261129T000000-b-bbbbbb", None)):
        launch: dict[str, Any] = {"run_id": run_id, "group": "g", "remote_dir": "/r", "launched_at": "t",
                                  "recipe": {"name": "a"}, "determinism": {}, "image": {"id": "i"},
                                  "host": {"name": "local", "kind": "local"}}
        if containers:
            launch["node_containers"] = containers
        RunDir(ws.runs / run_id).write_launch(launch)  # type: ignore[arg-type]
        with pytest.raises(KeyboardInterrupt):
            wait_run(ws, run_id, Interrupted(LocalHost(ws.root)), on_log=lambda line: None)
    assert stopped == ["n0", "n1"]  # a run of one container is left to `launcher attach`, as before


WORKER = """\
import json, os, sys, time
cfg = json.loads(os.environ["TF_CONFIG"])
rank = int(os.environ["RANK"])
print("worker", cfg["task"]["index"], "of", len(cfg["cluster"]["worker"]), cfg["cluster"]["worker"][rank], flush=True)
if "--fail" in sys.argv:
    if rank == 1:
        sys.exit(3)
    time.sleep(600)
"""


def test_tensorflow_workers_get_their_tf_config_and_the_first_to_fail_stops_the_others(tmp_path: Path) -> None:
    """The runtime starts TensorFlow's workers itself (no framework here: a script that reads what it was given)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "worker.py").write_text(WORKER)

    def node(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "launcher.runtime", "run", "--script", str(code / "worker.py"),
                               "--out", str(out), "--procs-per-node", "2", "--launcher", "tf_config", *extra],
                              capture_output=True, text=True, timeout=120)

    done = node(tmp_path / "ok")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "worker 0 of 2 localhost:20000" in (tmp_path / "ok/logs/train.log").read_text()
    assert (tmp_path / "ok/ranks/1/logs/train.log").read_text() == "worker 1 of 2 localhost:20001\n"
    rows = json.loads((tmp_path / "ok/_launcher/ranks.json").read_text())["ranks"]
    assert [(r["rank"], r["exit_code"]) for r in rows] == [(0, 0), (1, 0)]
    # worker 1 fails at once while worker 0 would sleep ten minutes: the node ends with worker 1's status
    failed = node(tmp_path / "bad", "--", "--fail")
    assert failed.returncode == 3, failed.stdout + failed.stderr
    rows = json.loads((tmp_path / "bad/_launcher/ranks.json").read_text())["ranks"]
    assert [(r["rank"], r["exit_code"]) for r in rows] == [(0, 143), (1, 3)]
    assert "rank 1 (node 0) ended with exit code 3" in (tmp_path / "bad/logs/train.log").read_text()


def _run_with(run_id: str, world: int, paths: list[str]) -> Manifest:
    from launcher.records.manifest import Artifact

    data: dict[str, Any] = {"run_id": run_id, "topology": topology.Topology(1, world).record(["h"])}
    return Manifest(Path("/nowhere") / run_id, data, tuple(Artifact(p, 1, "sha256:" + "0" * 64) for p in paths))  # type: ignore[arg-type]


def test_only_records_of_ranks_the_other_world_lacks_are_left_out_not_files_added_under_any_rank() -> None:
    from launcher.verify.artifacts import compare_artifacts

    steps = "fingerprints/steps.jsonl"
    four = _run_with("four", 4, ["outputs/model.pt", *(f"outputs/ranks/{r}/{steps}" for r in (1, 2, 3))])
    two = _run_with("two", 2, ["outputs/model.pt", f"outputs/ranks/1/{steps}"])
    rows, differs = compare_artifacts(four, [four, two], [], [])
    cells = {row.path: row.cells["two"]["status"] for row in rows}
    assert cells[f"outputs/ranks/3/{steps}"] == "ignored" and differs == {"two": False}
    # the attacker's run: world 2, yet a file under a rank no world here has, or a rank of its own world missing
    added = _run_with("added", 2, ["outputs/model.pt", f"outputs/ranks/1/{steps}", "outputs/ranks/9/payload.bin"])
    _, differs = compare_artifacts(two, [two, added], [], [])
    assert differs == {"added": True}
    lacking = _run_with("lacking", 2, ["outputs/model.pt"])
    _, differs = compare_artifacts(two, [two, lacking], [], [])
    assert differs == {"lacking": True}
    _, differs = compare_artifacts(two, [two, four], [], [])  # the larger world second: its ranks 2 and 3 alone
    assert differs == {"four": False}
