"""One node on each of two SSH hosts, for real: the DDP script (tests/fixtures/ddp/train.py, Gloo on CPUs) in the
torch-cpu image as 2 nodes x 2 processes, node k's container on host k's own Docker engine (the two nodes of the
Slurm test cluster, reached over SSH like any host, each with its own dockerd), on its host's network.

Reached as root, the two hosts share launcher's area (the cluster's shared home): node 1's records are in node 0's
run folder. Reached as another user on the second host, they share nothing: node 1's records come back from its
own host. Either way the run is bit-identical to its replicate. The Slurm job of two nodes runs first: its nodes
load the image from the cluster's shared filesystem, so the runs over SSH find it on both hosts."""

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
from slurmcluster import SlurmCluster
from testhost import TestHost
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.workspace import Workspace

pytestmark = [pytest.mark.tfimage]
WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
SCRIPT = Path(__file__).parent / "fixtures/ddp/train.py"
USER = "alice"  # a user on the second host whose home is its own (not the cluster's shared one)


def cli(ws: Workspace, *args: str, code: int = 0) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == code, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def ddp(make_workspace: Callable[[Path], Workspace],
        tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, Path]:
    """A workspace with the torch-cpu image (found by content when another test built it) and the script."""
    wheels = Path("/opt/wheels")
    need((wheels / WHEEL).is_file(), f"no {WHEEL} in {wheels} (download.pytorch.org serves it)")
    root = tmp_path_factory.mktemp("ddp-hosts")
    ws = make_workspace(root / "ws")
    cli(ws, "build", "--variant", "torch-cpu", "--find-links", str(wheels))
    project = root / "project"
    project.mkdir()
    shutil.copy(SCRIPT, project / "train.py")
    return ws, project / "train.py"


@pytest.fixture(scope="module")
def hosts(slurm_cluster: SlurmCluster) -> tuple[str, str, str, Path]:
    """The two nodes as SSH hosts (root on each: a shared home), the second also as a user with a home of its own
    (in the docker group, as a user who runs containers is); and the SSH config that names them."""
    first, second = slurm_cluster.nodes
    second.exec("sh", "-c", f"id {USER} >/dev/null 2>&1 || useradd -m -s /bin/sh -G docker {USER}; "
                f"mkdir -p /home/{USER}/.ssh && cp /root/.ssh/authorized_keys /home/{USER}/.ssh/ && "
                f"chown -R {USER}:{USER} /home/{USER}/.ssh && chmod 700 /home/{USER}/.ssh")
    return first.alias, second.alias, f"{USER}@{second.alias}", first.ssh_config


def run(ws: Workspace, script: Path, *opts: str, code: int = 0) -> dict[str, Any]:
    return cli(ws, "run", str(script), "--variant", "torch-cpu", "--trace-every", "4", *opts, code=code)["data"]


def manifest(ws: Workspace, run_id: str) -> dict[str, Any]:
    return json.loads((ws.runs / run_id / "manifest.json").read_text())


def containers_on(node: TestHost, run_id: str) -> list[str]:
    return [n for n in node.exec("docker", "ps", "-a", "--format", "{{.Names}}").split() if run_id in n]


def test_a_slurm_job_of_two_nodes_one_task_each_verifies_identical_across_replicates(
        ddp: tuple[Workspace, Path], hosts: tuple[str, str, str, Path], slurm_cluster: SlurmCluster) -> None:
    ws, script = ddp
    first, _second, _user, config = hosts
    login = slurm_cluster.login
    archives = set(login.exec("sh", "-c", "ls /root/.launcher/images 2>/dev/null || true").split())
    try:
        group = run(ws, script, "--host", first, "--ssh-config", str(config), "--scheduler", "slurm",
                    "--nodes", "2", "--procs-per-node", "2", "--runs", "2")
    finally:  # the image's archive on the shared home goes: the cluster's other tests count theirs
        added = set(login.exec("sh", "-c", "ls /root/.launcher/images 2>/dev/null || true").split()) - archives
        for name in added:
            login.exec("rm", "-f", f"/root/.launcher/images/{name}")
    a, b = (r["run_id"] for r in group["runs"])
    for run_id in (a, b):
        m = manifest(ws, run_id)
        assert m["status"] == "succeeded", m
        assert m["placement"]["kind"] == "slurm" and m["placement"]["nodes"] == slurm_cluster.node_names
        topo = m["topology"]
        assert (topo["nodes"], topo["world_size"], topo["network"]) == (2, 4, "host")
        assert [(e["rank"], e["node"], e["exit_code"]) for e in topo["ended"]] == [(0, 0, 0), (1, 0, 0), (2, 1, 0),
                                                                                   (3, 1, 0)]
        out = ws.runs / run_id / "outputs"
        for rank in (1, 2, 3):
            assert (out / f"ranks/{rank}/fingerprints/steps.jsonl").is_file()
        assert "after 24 steps of 4 ranks" in (out / "logs/train.log").read_text()
    verdict = cli(ws, "verify", "checksums", a, b)["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]
    assert login.exec("squeue", "-h").strip() == ""


def test_one_node_on_each_of_two_hosts_shared_home_or_not_verifies_identical(
        ddp: tuple[Workspace, Path], hosts: tuple[str, str, str, Path], slurm_cluster: SlurmCluster) -> None:
    ws, script = ddp
    first, second, second_user, config = hosts
    on_hosts = ("--ssh-config", str(config), "--procs-per-node", "2")
    # the second host reached as root shares the cluster's home with the first; as a user with a home of its own, it
    # shares nothing, and node 1's records come back from its host
    (shared,) = run(ws, script, "--host", first, "--host", second, *on_hosts)["runs"]  # --nodes: one per host
    (apart,) = run(ws, script, "--host", first, "--host", second_user, *on_hosts)["runs"]
    a = shared["run_id"]
    for run_id, node_one in ((a, second), (apart["run_id"], second_user)):
        m = manifest(ws, run_id)
        topo = m["topology"]
        assert m["status"] == "succeeded", m
        assert (topo["nodes"], topo["world_size"], topo["network"]) == (2, 4, "host")
        assert topo["node_hosts"] == [first, node_one]
        assert topo["collectives"] == {}  # Gloo's interface: the one each node routes to node 0 through
        assert [e["exit_code"] for e in topo["ended"]] == [0, 0, 0, 0] and topo["inconsistent"] is None
        out = ws.runs / run_id / "outputs"
        for rank in (1, 2, 3):
            assert (out / f"ranks/{rank}/fingerprints/steps.jsonl").is_file()
        assert (out / "nodes/1/_launcher/ranks.json").is_file()
        assert "Gloo over eth0, the interface towards node 0" in (out / "logs/train.log").read_text()
        for node in slurm_cluster.nodes:
            assert containers_on(node, run_id) == []
    launch = json.loads((ws.runs / a / "launch.json").read_text())
    assert launch["node_dirs"][1] is None  # the shared home: node 1 wrote into node 0's folder
    launch = json.loads((ws.runs / apart["run_id"] / "launch.json").read_text())
    assert launch["node_dirs"][1].startswith(f"/home/{USER}/")
    assert (ws.runs / apart["run_id"] / ".pulled-nodes-1.json").is_file()
    files = {f["path"] for f in manifest(ws, apart["run_id"])["artifacts"]}
    assert {"outputs/nodes/1/_launcher/ranks.json", "outputs/ranks/2/fingerprints/steps.jsonl",
            "outputs/ranks/3/fingerprints/steps.jsonl"} <= files
    verdict = cli(ws, "verify", "checksums", a, apart["run_id"])["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]


def test_a_rank_killed_on_the_second_host_stops_the_node_on_the_first(
        ddp: tuple[Workspace, Path], hosts: tuple[str, str, str, Path], slurm_cluster: SlurmCluster) -> None:
    ws, script = ddp
    first, _second, second_user, config = hosts
    # rank 3 (node 1) dies after step 6; the others sleep 600 s before their next all-reduce
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "-w", str(ws.root), "--json", "run", str(script), "--variant", "torch-cpu",
         "--host", first, "--host", second_user, "--ssh-config", str(config), "--procs-per-node", "2",
         "--", "--die-rank", "3", "--die-step", "6"], capture_output=True, text=True, timeout=240)
    assert res.returncode == ExitCode.RUN_FAILED, res.stderr
    failure = json.loads(res.stdout)["data"]["failure"]
    assert (failure["rank"], failure["node"], failure["exit_code"]) == (3, 1, 137)
    assert "rank 3 dies after step 6" in "\n".join(failure["log_tail"])
    topo = manifest(ws, failure["run_id"])["topology"]
    assert all(e["exit_code"] != 0 for e in topo["ended"])  # node 0's ranks were stopped, not finished
    for node in slurm_cluster.nodes:
        assert containers_on(node, failure["run_id"]) == []


def test_hosts_that_cannot_reach_each_other_are_refused_before_anything_is_sent(
        ddp: tuple[Workspace, Path], hosts: tuple[str, str, str, Path], testhost: TestHost, tmp_path: Path) -> None:
    ws, script = ddp
    _first, second, _user, config = hosts
    # the test host is on Docker's default bridge, the cluster's node on its own network: neither reaches the other
    both = tmp_path / "ssh_config"
    both.write_text(testhost.ssh_config.read_text() + config.read_text())
    before = set(ws.runs.iterdir()) if ws.runs.is_dir() else set()
    res = CliRunner().invoke(app, ["-w", str(ws.root), "run", str(script), "--variant", "torch-cpu",
                                   "--host", testhost.alias, "--host", second, "--ssh-config", str(both)])
    assert res.exit_code == ExitCode.HOST_UNREACHABLE, res.output
    assert "cannot reach another node's host" in res.output and "Traceback" not in res.output
    assert (set(ws.runs.iterdir()) if ws.runs.is_dir() else set()) == before  # no run directory begun

