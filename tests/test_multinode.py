"""Runs of several processes and nodes, for real: a DDP script (tests/fixtures/ddp/train.py, Gloo on CPUs) in the
torch-cpu image as 2 nodes x 2 processes (two containers on a private network on the local engine), as 1 node x 4
processes and as 1 x 2; verified across replicates, across layouts of the same world size, and across world sizes;
one rank killed mid-run while the others wait outside any collective, so only launcher can end the run, and that
run resumed, every rank from its checkpoint, to the bits of the runs never stopped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from typer.testing import CliRunner

from launcher.cli import app
from launcher.workspace import Workspace

pytestmark = [pytest.mark.tfimage]
WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
SCRIPT = Path(__file__).parent / "fixtures/ddp/train.py"


def cli(ws: Workspace, *args: str, code: int = 0) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == code, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def ddp(make_workspace: Callable[[Path], Workspace],
        tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, Path]:
    """A workspace with the torch-cpu image (found by content when another test built it) and the script in its
    own project folder."""
    wheels = Path("/opt/wheels")
    need((wheels / WHEEL).is_file(), f"no {WHEEL} in {wheels} (download.pytorch.org serves it)")
    root = tmp_path_factory.mktemp("ddp")
    ws = make_workspace(root / "ws")
    cli(ws, "build", "--variant", "torch-cpu", "--find-links", str(wheels))
    project = root / "project"
    project.mkdir()
    shutil.copy(SCRIPT, project / "train.py")
    return ws, project / "train.py"


def run(ws: Workspace, script: Path, *opts: str, code: int = 0) -> dict[str, Any]:
    return cli(ws, "run", str(script), "--variant", "torch-cpu", "--trace-every", "4", *opts, code=code)["data"]


def manifest(ws: Workspace, run_id: str) -> dict[str, Any]:
    return json.loads((ws.runs / run_id / "manifest.json").read_text())


def leftovers(run_id: str) -> list[str]:
    """The run's containers and network still on the engine."""
    names = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    nets = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True).stdout
    return [n for n in (names + nets).split() if run_id in n]


@pytest.fixture(scope="module")
def pair(ddp: tuple[Workspace, Path]) -> tuple[str, str]:
    """Two replicates of 2 nodes x 2 ranks, as an experiment's same-seed group (its runs take --nodes as `run`
    does); the tests below compare other runs with them."""
    ws, script = ddp
    done = cli(ws, "experiment", str(script), "--variant", "torch-cpu", "--trace-every", "4", "--nodes", "2",
               "--procs-per-node", "2", "--runs", "2", "--seeds", "same")["data"]
    assert all(r["ok"] for r in done["runs"]), done
    a, b = (run_id for r in done["runs"] for run_id in r["run_ids"])
    return a, b


def test_two_nodes_of_two_verify_identical_and_match_one_node_of_four(ddp: tuple[Workspace, Path],
                                                                      pair: tuple[str, str]) -> None:
    ws, script = ddp
    a, b = pair
    for run_id in (a, b):
        m = manifest(ws, run_id)
        topo = m["topology"]
        assert m["status"] == "succeeded", m
        assert (topo["nodes"], topo["procs_per_node"], topo["world_size"], topo["backend"]) == (2, 2, 4, "gloo")
        assert [(r["rank"], r["node"], r["local_rank"]) for r in topo["ranks"]] == [(0, 0, 0), (1, 0, 1), (2, 1, 0),
                                                                                     (3, 1, 1)]
        assert [e["exit_code"] for e in topo["ended"]] == [0, 0, 0, 0]
        assert topo["failed"] is None and topo["inconsistent"] is None  # every rank's weights agree at every step
        assert topo["collectives"] == {"GLOO_SOCKET_IFNAME": "eth0"}
        assert m["determinism"]["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
        out = ws.runs / run_id / "outputs"
        for rank in (1, 2, 3):  # every rank's records, whichever node ran it
            assert (out / f"ranks/{rank}/fingerprints/steps.jsonl").is_file()
        assert "after 24 steps of 4 ranks" in (out / "logs/train.log").read_text()
        assert leftovers(run_id) == []  # both containers and the private network removed
    verdict = cli(ws, "verify", "checksums", a, b)["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]

    # the same ranks in the same order on one node: the same bits
    (one_by_four,) = run(ws, script, "--procs-per-node", "4")["runs"]
    assert manifest(ws, one_by_four["run_id"])["topology"]["nodes"] == 1
    verdict = cli(ws, "verify", "checksums", a, one_by_four["run_id"])["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]



def test_the_canonical_reduction_gives_a_world_of_four_and_one_of_two_the_same_bits(
        ddp: tuple[Workspace, Path]) -> None:
    ws, script = ddp
    (four,) = run(ws, script, "--nodes", "2", "--procs-per-node", "2", "--reduction", "canonical", "--",
                  "--micro", "4")["runs"]
    (two,) = run(ws, script, "--procs-per-node", "2", "--reduction", "canonical", "--", "--micro", "4")["runs"]
    assert manifest(ws, four["run_id"])["determinism"]["env"]["LAUNCHER_REDUCTION"] == "canonical"
    verdict = cli(ws, "verify", "checksums", four["run_id"], two["run_id"])["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]  # ranks 2 and 3's records: the larger world's only
    # the same micro-batches summed by DDP's own all-reduce: the world size shows in the bits, and the verdict names
    # the topology as the environment that differs
    (default_two,) = run(ws, script, "--procs-per-node", "2", "--", "--micro", "4")["runs"]
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", "verify", "checksums", four["run_id"],
                                   default_two["run_id"]])
    verdict = json.loads(res.stdout)["data"]
    assert verdict["verdict"] == "differs"
    assert "LAUNCHER_REDUCTION" not in manifest(ws, default_two["run_id"])["determinism"]["env"]
    explained = verdict["explanations"][default_two["run_id"]]
    assert explained["classification"]["kind"] == "environment", explained["classification"]
    rows = {row["key"]: row for row in explained["environment"]}
    assert rows["topology.world_size"]["reference"] == 4 and rows["topology.world_size"]["run"] == 2
    assert rows["topology.world_size"]["category"] == "hardware"
    assert "topology.nodes" in rows


def test_a_replica_that_parts_from_rank_0_is_named_with_its_step_verify_and_diverge_name_the_rank(
        ddp: tuple[Workspace, Path], pair: tuple[str, str]) -> None:
    ws, script = ddp
    clean = {"run_id": pair[0]}  # 2 x 2, nothing nudged
    result = cli(ws, "run", str(script), "--variant", "torch-cpu", "--trace-every", "4", "--nodes", "2",
                 "--procs-per-node", "2", "--", "--part-rank", "2", "--part-step", "5")
    (parted,) = result["data"]["runs"]
    # rank 2 nudged its own weights after step 5 (steps count from 0: its sixth update); the next trace is step 8
    assert manifest(ws, parted["run_id"])["topology"]["inconsistent"] == {"rank": 2, "step": 8, "epoch": None}
    assert any("rank 2's weights differ from rank 0's at step 8" in note for note in result["data"]["notes"])
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", "verify", "checksums", clean["run_id"],
                                   parted["run_id"]])
    files = {f["path"]: f for f in json.loads(res.stdout)["data"]["explanations"][parted["run_id"]]["files"]}
    rank_two = files["outputs/ranks/2/fingerprints/steps.jsonl"]
    assert rank_two["kind"] == "weight digests"
    assert "agree up to step 4 and part by step 8" in rank_two["content"]["difference"]

    # diverge re-executes both as 2 x 2, every rank fingerprinted every step and steps 5..8 traced: ranks 0 and 2
    # part at the same step (DDP's all-reduce carries rank 2's nudge to every rank), and the traces say which
    # rank's difference comes first in that step: rank 2's weights, changed outside any traced operation
    found = cli(ws, "diverge", clean["run_id"], parted["run_id"])["data"]
    assert found["outcome"] == "localised" and found["rank"] == 2, found["lines"]
    assert found["window"] == [5, 8] and all(c["repeats"] for c in found["checks"])
    first = found["first_difference"]
    assert (first["kind"], first["changed_in"]) == ("weights", ["run"]), first
    assert first["step"] == found["exact"]["parts_by"]
    assert found["cause"] == "a change the code made to the weights outside the traced operations"
    assert any("(rank 2, the first rank whose weights part)" in line for line in found["lines"])
    for rerun in found["reruns"].values():
        assert manifest(ws, rerun)["topology"]["world_size"] == 4


def test_a_rank_killed_mid_run_stops_every_node_and_the_run_resumes_to_the_bits_of_an_uninterrupted_one(
        ddp: tuple[Workspace, Path], pair: tuple[str, str]) -> None:
    ws, script = ddp
    # rank 3 dies after step 8 (epoch 2 of 4, every rank checkpointed after epoch 1); the other ranks sleep 600 s
    # before their next all-reduce, so the run ends only because launcher stops the nodes (the command's own timeout
    # would otherwise fail the test)
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "-w", str(ws.root), "--json", "run", str(script),
         "--variant", "torch-cpu", "--trace-every", "4", "--nodes", "2", "--procs-per-node", "2",
         "--checkpoint-every", "1", "--", "--epochs", "4", "--die-rank", "3", "--die-step", "8"],
        capture_output=True, text=True, timeout=240)
    assert res.returncode != 0, res.stderr
    data = json.loads(res.stdout)["data"]
    failure = data["failure"]
    assert (failure["rank"], failure["node"], failure["exit_code"]) == (3, 1, 137)
    assert "rank 3 dies after step 8" in "\n".join(failure["log_tail"])
    run_id = failure["run_id"]
    m = manifest(ws, run_id)
    assert m["status"] == "failed" and m["exit_code"] == 137
    topo = m["topology"]
    assert topo["failed"]["log"] == "outputs/ranks/3/logs/train.log"
    assert {e["rank"]: e["exit_code"] for e in topo["ended"]}[3] == 137
    assert all(e["exit_code"] != 0 for e in topo["ended"])  # none finished: the others were stopped
    assert leftovers(run_id) == []

    # every rank goes on from epoch-0001 (the fixture dies only in a run that was not resumed) in both nodes'
    # containers started again, and ends with the bits of the 2 x 2 runs never stopped
    resumed = cli(ws, "resume", run_id)["data"]["run"]
    assert resumed["status"] == "succeeded" and resumed["exit_code"] == 0
    assert [s["resumed_from"] for s in resumed["segments"]] == [None, "epoch-0001"]
    assert [e["exit_code"] for e in manifest(ws, run_id)["topology"]["ended"]] == [0, 0, 0, 0]
    out = ws.runs / run_id / "outputs"
    log = (out / "ranks/3/logs/train.log").read_text()
    assert "rank 3 dies after step 8" in log and "restored checkpoint epoch-0001" in log
    for rel in ("model.pt", "fingerprints/steps.jsonl", "ranks/3/fingerprints/steps.jsonl"):
        assert (out / rel).read_bytes() == (ws.runs / pair[0] / "outputs" / rel).read_bytes(), rel
    verdict = cli(ws, "verify", "checksums", pair[0], run_id)["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]
    assert leftovers(run_id) == []
