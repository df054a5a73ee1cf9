"""Runs placed by a real Ray cluster (Ray from PyPI on the two nodes of the Slurm test cluster, each with its own
sshd and Docker engine; the worker as a user whose home is its own, so head and worker share no files launcher
uses), reached only through the head over SSH, exactly as a user runs them:
`launcher run RECIPE --host HEAD --scheduler ray`."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from raycluster import RayCluster
from testhost import TestHost
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode

pytestmark = [pytest.mark.docker, pytest.mark.testhost]
runner = CliRunner()


def _cli(ws: Path, *args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["--workspace", str(ws), "--quiet", *args])
    return res.exit_code, res.output


def _on(host: TestHost) -> list[str]:
    return ["--host", host.alias, "--ssh-config", str(host.ssh_config)]


def _manifests(ws: Path) -> list[dict[str, Any]]:
    found = [json.loads(p.read_text()) for p in (ws / "runs").glob("*/manifest.json")]
    return sorted(found, key=lambda m: m["replicate"])


def _run_ids(ws: Path) -> list[str]:
    launches = [json.loads(p.read_text()) for p in (ws / "runs").glob("*/launch.json")]
    return [rec["run_id"] for rec in sorted(launches, key=lambda rec: rec["replicate"])]


def _containers(cluster: RayCluster) -> dict[str, TestHost]:
    """launcher's containers running on the cluster's nodes, by name."""
    out = {}
    for node in cluster.nodes:
        for name in node.exec("docker", "ps", "--format", "{{.Names}}", check=False).split():
            if name.startswith("launcher-"):
                out[name] = node
    return out


def test_replicates_spread_over_both_nodes_verify_identical_and_the_image_is_loaded_once_per_node(
        ray_cluster: RayCluster, tiny_workspace: Path, tiny_image: dict[str, Any]) -> None:
    for node in ray_cluster.nodes:  # neither node has the image: each gets it from the head
        node.exec("docker", "rmi", "-f", tiny_image["id"], check=False)
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(ray_cluster.head), "--scheduler", "ray", "--runs", "4",
                     "--seed", "7", "--param", "sleep=1")
    assert code == 0, out
    manifests = _manifests(tiny_workspace)
    assert [m["status"] for m in manifests] == ["succeeded"] * 4
    placed = [m["placement"] for m in manifests]
    assert {p["kind"] for p in placed} == {"ray"} and len({p["job_id"] for p in placed}) == 1
    nodes = ray_cluster.node_ids()
    assert {p["node_id"] for p in placed} == set(nodes)  # SPREAD put replicates on both nodes
    assert all(p["node"] == nodes[p["node_id"]] for p in placed)
    assert len({p["task_id"] for p in placed}) == 4 and all(p["node_facts"].get("cpu_cores") for p in placed)
    assert {p["image_source"]["kind"] for p in placed} == {"head"}
    image = manifests[0]["image"]["id"]
    assert {m["image"]["id"] for m in manifests} == {image}
    for node in ray_cluster.nodes:  # loaded from the head's archive into each node's own engine
        assert node.exec("docker", "image", "inspect", "--format", "{{.Id}}", image).strip() == image
    # the worker's copy of the runs' folders, emptied once their outputs were sent back to the head
    assert ray_cluster.as_worker("ls", f"{ray_cluster.worker_area}/ray-node/runs").strip() == ""
    code, out = _cli(tiny_workspace, "verify", "checksums", "--group", manifests[0]["group"])
    # tiny imports no known framework: no difference, but no determinism guaranteed either
    assert code == ExitCode.INCONCLUSIVE, out
    assert "inconclusive: identical outputs" in out
    code, out = _cli(tiny_workspace, "logs", manifests[0]["run_id"])
    assert code == 0 and "tiny: seed 7" in out and "tiny: done" in out


def test_ps_lists_a_running_group_and_stop_cancels_every_replicate(
        ray_cluster: RayCluster, tiny_workspace: Path) -> None:
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(ray_cluster.head), "--scheduler", "ray", "--runs", "2",
                     "--param", "sleep=300", "--detach")
    assert code == 0, out
    group = _run_ids(tiny_workspace)
    deadline = time.monotonic() + 90
    while len(_containers(ray_cluster)) < 2:
        assert time.monotonic() < deadline, "the group's containers never ran"
        time.sleep(0.3)
    res = runner.invoke(app, ["--workspace", str(tiny_workspace), "--json", "ps", *_on(ray_cluster.head),
                              "--scheduler", "ray"])
    rows = {r["run_id"]: r for r in json.loads(res.stdout)["data"]["runs"]}
    assert any("Ray job launcher-" in str(rows[r].get("container_status")) for r in group), rows
    code, out = _cli(tiny_workspace, "stop", group[0])
    assert code == 0, out
    assert [m["status"] for m in _manifests(tiny_workspace)] == ["cancelled"] * 2
    assert sorted(m["run_id"] for m in _manifests(tiny_workspace)) == sorted(group)
    assert _containers(ray_cluster) == {}


FAILS_ON_SEED_2 = """import hashlib, json, os, sys, time
seed = int(os.environ["LAUNCHER_SEED"])
token = os.environ.get("TOKEN", "")
data = open(os.path.join(os.environ["LAUNCHER_DATA"], "x.txt")).read()
json.dump({"mode": os.environ.get("MODE"), "data": data, "token_sha256": hashlib.sha256(token.encode()).hexdigest()},
          open("env.json", "w"))
print("seed", seed, "in", os.getcwd(), flush=True)
if seed == 2:  # fails once the test says both replicates run (each node had the image by then)
    waited = time.monotonic()
    while not os.path.exists("go") and time.monotonic() - waited < 150:
        time.sleep(0.2)
    sys.exit(4)
time.sleep(60)
"""


def _say_go_once_both_run(cluster: RayCluster) -> threading.Thread:
    """In the background: once two containers print their folder, a file "go" put there in each."""
    def go() -> None:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            said = {name: (node, node.exec("docker", "logs", name, check=False))
                    for name, node in _containers(cluster).items()}
            folders = {name: (node, line.split(" in ", 1)[1].strip())
                       for name, (node, log) in said.items()
                       for line in log.splitlines() if line.startswith("seed ") and " in /" in line}
            if len(folders) == 2:
                for name, (node, folder) in folders.items():
                    node.exec("docker", "exec", name, "touch", f"{folder}/go", check=False)
                return
            time.sleep(0.3)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def test_a_script_with_data_and_secrets_runs_on_the_nodes_and_a_failure_cancels_the_rest(
        ray_cluster: RayCluster, tiny_workspace: Path, tiny_image: dict[str, Any], tmp_path: Path) -> None:
    # the head's archive of the image gone, the worker without the image: launcher finds the image in the head's
    # engine and sends nothing; the worker's task gets it saved there by the head
    image = tiny_image["id"]
    if ray_cluster.head.exec("docker", "image", "inspect", "--format", "{{.Id}}", image, check=False).strip() != image:
        # (this test run alone: the others leave the image in the head's engine)
        subprocess.run(f"docker save {image} | docker exec -i {ray_cluster.head.container} docker load -q",
                       shell=True, check=True, capture_output=True)
    ray_cluster.head.exec("rm", "-f", f"/root/.launcher/images/{image.removeprefix('sha256:')}.tar")
    ray_cluster.worker.exec("docker", "rmi", "-f", image, check=False)
    project, data = tmp_path / "rayproj", tmp_path / "data"
    project.mkdir()
    data.mkdir()
    (project / "train.py").write_text(FAILS_ON_SEED_2)
    (data / "x.txt").write_text("from the dataset\n")
    go = _say_go_once_both_run(ray_cluster)
    res = runner.invoke(app, ["--workspace", str(tiny_workspace), "--json", "--quiet", "run",
                              str(project / "train.py"), "--data-from", str(data), *_on(ray_cluster.head),
                              "--scheduler", "ray", "--seed", "2", "--seed", "1",
                              "--env", "MODE=on nodes", "--secret-env", "TOKEN=hunter2 s3cr3t"])
    go.join()
    assert res.exit_code == ExitCode.RUN_FAILED, res.output
    failure = json.loads(res.stdout)["data"]["failure"]
    by_replicate = {m["replicate"]: m for m in json.loads(res.stdout)["data"]["runs"]}
    assert (failure["replicate"], failure["exit_code"]) == (0, 4) and "seed 2 in /launcher/out" in failure["log_tail"]
    assert by_replicate[1]["status"] == "cancelled"  # it sleeps a minute
    seen = json.loads((tiny_workspace / "runs" / failure["run_id"] / "outputs" / "env.json").read_text())
    assert seen == {"mode": "on nodes", "data": "from the dataset\n",
                    "token_sha256": hashlib.sha256(b"hunter2 s3cr3t").hexdigest()}
    assert {m["placement"]["node"] for m in by_replicate.values()} == {n.ip for n in ray_cluster.nodes}
    assert ray_cluster.worker.exec("docker", "image", "inspect", "--format", "{{.Id}}", image).strip() == image
    shipped = ray_cluster.head.exec("sh", "-c", "ls /root/.launcher/images 2>/dev/null || true").split()
    assert f"{image[7:]}.tar" not in shipped
    for node in ray_cluster.nodes:  # no job file, node copy or env file left holding the secret
        grep = f"grep -rl s3cr3t /root/.launcher {ray_cluster.worker_area} /tmp 2>/dev/null || true"
        assert node.exec("sh", "-c", grep).strip() == ""


def test_provision_probes_every_node_and_a_head_without_ray_is_refused(
        ray_cluster: RayCluster, testhost: TestHost, tiny_workspace: Path) -> None:
    res = runner.invoke(app, ["--workspace", str(tiny_workspace), "--json", "provision", *_on(ray_cluster.head),
                              "--scheduler", "ray"])
    assert res.exit_code == 0, res.output
    facts = json.loads(res.stdout)["data"]["ray"]
    assert facts["ray_version"] == "2.60.0"
    assert {n["node_id"]: n["address"] for n in facts["nodes"]} == ray_cluster.node_ids()
    assert all(n["docker"] and n["cpus"] == 2 for n in facts["nodes"])
    assert [n["head"] for n in facts["nodes"] if n["address"] == ray_cluster.head.ip] == [True]
    assert json.loads(res.stdout)["summary"] == "Ray 2.60.0: 2 nodes alive, 2 with a usable Docker engine"
    code, out = _cli(tiny_workspace, "run", "tiny", "--host", testhost.alias, "--ssh-config", str(testhost.ssh_config),
                     "--scheduler", "ray")
    assert code == ExitCode.NO_SCHEDULER, out
    assert "has no Ray with its job API" in out and "Traceback" not in out


WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
DDP = Path(__file__).parent / "fixtures/ddp/train.py"


@pytest.mark.tfimage
def test_two_nodes_reserved_together_verify_identical(
        ray_cluster: RayCluster, make_workspace: Any, tmp_path: Path) -> None:
    """--nodes 2 on Ray: a placement group of two bundles, one per node (STRICT_SPREAD); node 0's address handed to
    node 1; each node's records sent back to the head; the DDP script's replicates (2 x 1: its cost, on two cores)
    bit-identical. (After
    tests/test_multinode_hosts.py, both nodes and the head's area already hold the torch-cpu image: nothing ships.)"""
    import shutil

    from conftest import need

    wheels = Path("/opt/wheels")
    need((wheels / WHEEL).is_file(), f"no {WHEEL} in {wheels} (download.pytorch.org serves it)")
    ws = make_workspace(tmp_path / "ws")
    code, out = _cli(ws.root, "build", "--variant", "torch-cpu", "--find-links", str(wheels))
    assert code == 0, out
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(DDP, project / "train.py")
    code, out = _cli(ws.root, "run", str(project / "train.py"), "--variant", "torch-cpu", *_on(ray_cluster.head),
                     "--scheduler", "ray", "--nodes", "2", "--runs", "2", "--", "--steps", "8")
    assert code == 0, out
    manifests = _manifests(ws.root)
    nodes = ray_cluster.node_ids()
    for m in manifests:
        p = m["placement"]
        assert m["status"] == "succeeded" and m["topology"]["world_size"] == 2
        assert sorted(p["node_ids"]) == sorted(nodes) and p["nodes"] == [nodes[i] for i in p["node_ids"]]
        assert p["node"] == p["nodes"][0]
        outputs = ws.root / "runs" / m["run_id"] / "outputs"
        assert [d.name for d in (outputs / "ranks").iterdir()] == ["1"]  # node 1's rank came back
    code, out = _cli(ws.root, "verify", "checksums", "--group", manifests[0]["group"])
    assert code == 0 and "identical: all 2 runs are bit-identical" in out, out


def _both_running(cluster: RayCluster, ws: Path, sleep: int) -> tuple[str, str]:
    """A detached group of two tiny replicates, once each has started training on its node (SPREAD: one on each):
    the run IDs on the head and on the worker."""
    code, out = _cli(ws, "run", "tiny", *_on(cluster.head), "--scheduler", "ray", "--runs", "2",
                     "--param", f"sleep={sleep}", "--detach")
    assert code == 0, out
    deadline = time.monotonic() + 90
    while True:
        running = _containers(cluster)
        started = {name: node for name, node in running.items()
                   if "tiny: seed" in node.exec("docker", "logs", name, check=False)}
        if len(started) == 2:
            break
        assert time.monotonic() < deadline, f"the two replicates never trained together: {running}"
        time.sleep(0.3)
    (on_head,) = [n.removeprefix("launcher-") for n, node in started.items() if node is cluster.head]
    (on_worker,) = [n.removeprefix("launcher-") for n, node in started.items() if node is cluster.worker]
    return on_head, on_worker


def test_a_container_killed_on_its_node_fails_that_replicate_alone_and_the_rest_succeed(
        ray_cluster: RayCluster, tiny_workspace: Path) -> None:
    killed, kept = _both_running(ray_cluster, tiny_workspace, sleep=9)
    ray_cluster.head.exec("docker", "kill", f"launcher-{killed}")
    code, out = _cli(tiny_workspace, "attach", killed)
    assert code == ExitCode.RUN_FAILED, out
    code, out = _cli(tiny_workspace, "attach", kept)
    assert code == 0, out
    by_id = {m["run_id"]: m for m in _manifests(tiny_workspace)}
    bad = by_id[killed]
    assert (bad["status"], bad["exit_code"]) == ("failed", 137) and "killed by signal 9" in bad["placement"]["error"]
    assert bad["placement"]["node"] == ray_cluster.head.ip and by_id[kept]["status"] == "succeeded"
    assert "tiny: seed" in (tiny_workspace / "runs" / killed / "outputs" / "logs" / "train.log").read_text()
    code, out = _cli(tiny_workspace, "verify", "checksums", "--group", bad["group"])
    assert f"left out {killed}: failed (exit 137)" in out, out


def test_a_node_lost_mid_run_fails_the_replicate_it_ran_and_the_other_finishes(
        ray_cluster: RayCluster, tiny_workspace: Path) -> None:
    """Ray on the worker stopped while a replicate runs there (as a VM lost would be): it fails, naming the node
    that left; the one on the head finishes. Last in this file: the cluster keeps one node after it."""
    on_head, on_worker = _both_running(ray_cluster, tiny_workspace, sleep=9)
    ray_cluster.as_worker("ray", "stop", "--force")
    ray_cluster.worker.exec("docker", "rm", "-f", f"launcher-{on_worker}")  # the node is gone, its containers too
    code, out = _cli(tiny_workspace, "attach", on_worker)
    assert code == ExitCode.RUN_FAILED, out
    code, out = _cli(tiny_workspace, "attach", on_head)
    assert code == 0, out
    by_id = {m["run_id"]: m for m in _manifests(tiny_workspace)}
    gone = by_id[on_worker]
    assert gone["status"] == "failed" and "left the cluster while it ran" in gone["placement"]["error"]
    assert ray_cluster.worker.ip in gone["placement"]["error"] and by_id[on_head]["status"] == "succeeded"
