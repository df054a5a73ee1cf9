"""Runs placed by a real Slurm cluster (Debian's slurmctld/slurmd/munge in two test host containers,
each with its own sshd and Docker engine, sharing /root/.launcher), reached only through the login
node over SSH, exactly as a user runs them: `launcher run RECIPE --host LOGIN --scheduler slurm`."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from slurmcluster import SlurmCluster
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
    out = []
    for d in sorted((ws / "runs").iterdir()):
        if (d / "manifest.json").is_file():
            out.append(json.loads((d / "manifest.json").read_text()))
    return sorted(out, key=lambda m: m["replicate"])


def _run_ids(ws: Path) -> list[str]:
    launches = [json.loads(p.read_text()) for p in (ws / "runs").glob("*/launch.json")]
    return [rec["run_id"] for rec in sorted(launches, key=lambda rec: rec["replicate"])]


def _wait_running(cluster: SlurmCluster, n: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while cluster.login.exec("squeue", "-h", "-o", "%T").split().count("RUNNING") < n:
        assert time.monotonic() < deadline, cluster.login.exec("squeue")
        time.sleep(0.5)


def test_a_job_array_on_both_nodes_is_bit_identical(slurm_cluster: SlurmCluster, tiny_workspace: Path) -> None:
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--runs", "4", "--seed", "7", "--slurm-opt", "exclusive", "--param", "sleep=1")
    assert code == 0, out
    manifests = _manifests(tiny_workspace)
    assert [m["status"] for m in manifests] == ["succeeded"] * 4
    placed = [m["placement"] for m in manifests]
    assert {p["kind"] for p in placed} == {"slurm"} and len({p["job_id"] for p in placed}) == 1
    assert sorted(int(p["array_index"]) for p in placed) == [0, 1, 2, 3]
    assert {p["node"] for p in placed} == set(slurm_cluster.node_names)  # Slurm spread the array
    assert all(p["partition"] == slurm_cluster.partition and p["node_facts"].get("cpu_cores") for p in placed)
    assert {m["image"]["id"] for m in manifests} == {manifests[0]["image"]["id"]}
    group = manifests[0]["group"]
    code, out = _cli(tiny_workspace, "verify", "checksums", "--group", group)
    # tiny imports no known framework: no difference, but no determinism guaranteed either
    assert code == ExitCode.INCONCLUSIVE, out
    assert "inconclusive: identical outputs" in out and "bit-identical" not in out
    # the image went once to the shared filesystem, and a second group sends nothing
    archives = slurm_cluster.login.exec("sh", "-c", "ls /root/.launcher/images").split()
    assert archives == [manifests[0]["image"]["id"].removeprefix("sha256:") + ".tar"]


def test_stop_cancels_the_array_and_every_replicate_gets_a_manifest(
    slurm_cluster: SlurmCluster, tiny_workspace: Path
) -> None:
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--runs", "3", "--slurm-opt", "exclusive", "--param", "sleep=300", "--detach")
    assert code == 0, out
    _wait_running(slurm_cluster, 2)  # two run (one per node), the third waits
    run_ids = _run_ids(tiny_workspace)
    code, out = _cli(tiny_workspace, "stop", run_ids[0])
    assert code == 0, out
    assert "stopped the job array" in out
    manifests = _manifests(tiny_workspace)
    # every replicate (run IDs made in the same second sort by their random suffix, not by replicate)
    assert sorted(m["run_id"] for m in manifests) == sorted(run_ids)
    assert [m["status"] for m in manifests] == ["cancelled"] * 3
    assert slurm_cluster.login.exec("squeue", "-h").strip() == ""


def test_a_task_killed_on_its_node_fails_that_replicate_alone(
    slurm_cluster: SlurmCluster, tiny_workspace: Path
) -> None:
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--runs", "2", "--slurm-opt", "exclusive", "--param", "sleep=12", "--detach")
    assert code == 0, out
    first, second = _run_ids(tiny_workspace)
    deadline = time.monotonic() + 90
    killed = None
    while killed is None:  # once the recipe has printed its first line, kill its container on its node
        for node in slurm_cluster.nodes:
            if "tiny: seed" in node.exec("docker", "logs", f"launcher-{first}", check=False):
                node.exec("docker", "kill", f"launcher-{first}")
                killed = node
        assert time.monotonic() < deadline, "the first replicate's container never ran"
        time.sleep(0.3)
    code, out = _cli(tiny_workspace, "attach", first)
    assert code == ExitCode.RUN_FAILED, out
    code, out = _cli(tiny_workspace, "attach", second)
    assert code == 0, out
    bad, good = _manifests(tiny_workspace)
    assert (bad["status"], bad["exit_code"], good["status"]) == ("failed", 137, "succeeded")
    assert "tiny: seed" in (tiny_workspace / "runs" / first / "outputs" / "logs" / "train.log").read_text()
    code, out = _cli(tiny_workspace, "verify", "checksums", "--group", bad["group"])
    assert code == 0 and f"left out {first}: failed (exit 137)" in out


def test_a_node_without_the_pinned_image_runs_nothing(slurm_cluster: SlurmCluster, tiny_workspace: Path) -> None:
    node1, node2 = slurm_cluster.node_names
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--slurm-opt", f"nodelist={node1}")
    assert code == 0, out
    image = _manifests(tiny_workspace)[0]["image"]["id"]
    archive = f"/root/.launcher/images/{image.removeprefix('sha256:')}.tar"
    try:
        slurm_cluster.node(node2).exec("docker", "rmi", "-f", image, check=False)
        slurm_cluster.login.exec("sh", "-c", f"cp {archive} {archive}.keep && echo damaged > {archive}")
        code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                         "--slurm-opt", f"nodelist={node2}")
        assert code == ExitCode.RUN_FAILED, out
        failed = _manifests(tiny_workspace)[-1]
        assert failed["status"] == "failed" and failed["exit_code"] == 125 and failed["artifacts"] == []
        assert "does not have the pinned image" in failed["placement"]["error"]
        assert failed["placement"]["node"] == node2
        code, out = _cli(tiny_workspace, "verify", "checksums", "--group", failed["group"])
        assert code == ExitCode.RUN_FAILED and "nothing to compare" in out
    finally:
        slurm_cluster.login.exec("sh", "-c", f"mv -f {archive}.keep {archive}")


def test_a_login_node_without_slurm_and_an_unknown_partition_are_refused_before_shipping(
    slurm_cluster: SlurmCluster, testhost: TestHost, tiny_workspace: Path
) -> None:
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(testhost), "--scheduler", "slurm")
    assert code == ExitCode.NO_SCHEDULER, out
    assert "has no Slurm client (sbatch)" in out and "Traceback" not in out
    assert testhost.exec("sh", "-c", "ls /root/.launcher/images 2>/dev/null | wc -l").strip() == "0"
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--partition", "gpu-nope")
    assert code == ExitCode.UNKNOWN_PARTITION, out
    assert "no partition 'gpu-nope' (it has: debug)" in out
    assert not list((tiny_workspace / "runs").glob("*/manifest.json"))


def test_an_experiment_on_the_cluster_is_two_job_arrays(slurm_cluster: SlurmCluster, tiny_workspace: Path) -> None:
    code, out = _cli(tiny_workspace, "experiment", "tiny", "--runs", "2", *_on(slurm_cluster.login),
                     "--scheduler", "slurm", "--slurm-opt", "exclusive")
    assert code == 0, out
    manifests = _manifests(tiny_workspace)
    assert len(manifests) == 4 and {m["status"] for m in manifests} == {"succeeded"}
    groups = {m["group"]: m["placement"]["job_id"] for m in manifests}
    assert len(groups) == 2 and len(set(groups.values())) == 2  # one array per group
    same = next(g for g in groups if g.endswith("same-seed"))
    code, out = _cli(tiny_workspace, "verify", "checksums", "--group", same)
    # tiny imports no known framework: no difference, but no determinism guaranteed either
    assert code == ExitCode.INCONCLUSIVE and "identical outputs" in out, out
    code, out = _cli(tiny_workspace, "verify", "checksums", "--group", same.replace("same-seed", "different-seeds"))
    assert code == ExitCode.NOT_REPRODUCIBLE, out  # other seeds, other weights


def test_provision_prints_the_cluster_fact_sheet(slurm_cluster: SlurmCluster, tiny_workspace: Path) -> None:
    res = runner.invoke(app, ["--workspace", str(tiny_workspace), "--json", "provision",
                              *_on(slurm_cluster.login), "--scheduler", "slurm"])
    assert res.exit_code == 0, res.output
    cluster = json.loads(res.stdout)["data"]["cluster"]
    assert re.fullmatch(r"slurm(-wlm)? \d+\.\d+\.\d+", cluster["slurm_version"]), cluster["slurm_version"]
    assert [p["name"] for p in cluster["partitions"]] == [slurm_cluster.partition]
    assert {n["name"] for n in cluster["nodes"]} == set(slurm_cluster.node_names)
    assert all(n["docker"] and n["cpus"] for n in cluster["nodes"])
    code, out = _cli(tiny_workspace, "provision", *_on(slurm_cluster.login), "--scheduler", "slurm")
    assert code == 0 and "2 nodes, 2 with a usable Docker engine" in out


def test_ps_logs_and_pull_watch_follow_a_detached_array(slurm_cluster: SlurmCluster, tiny_workspace: Path) -> None:
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--runs", "2", "--param", "sleep=6", "--detach")
    assert code == 0, out
    first, second = _run_ids(tiny_workspace)
    _wait_running(slurm_cluster, 1)
    res = runner.invoke(app, ["--workspace", str(tiny_workspace), "--json", "ps", *_on(slurm_cluster.login),
                              "--scheduler", "slurm"])
    rows = {r["run_id"]: r for r in json.loads(res.stdout)["data"]["runs"]}
    assert rows[first]["container"] in ("running", "pending") and "job " in rows[first]["container_status"]
    code, out = _cli(tiny_workspace, "logs", first, "--follow")
    assert code == 0 and "tiny: seed" in out and "tiny: done" in out
    code, out = _cli(tiny_workspace, "pull", second, "--watch", "1")
    assert code == 0 and "succeeded" in out
    code, out = _cli(tiny_workspace, "pull", first)
    assert code == 0
    assert [m["status"] for m in _manifests(tiny_workspace)] == ["succeeded", "succeeded"]


@pytest.fixture
def cluster_registry(slurm_cluster: SlurmCluster, tmp_path: Path) -> Any:
    """A TLS registry on the cluster's network that this machine pushes to and the nodes pull from."""
    import slurmcluster

    reg = slurmcluster.start_registry(slurm_cluster, tmp_path / "registry")
    try:
        yield reg
    finally:
        slurm_cluster.login.exec("rm", "-f", f"{slurm_cluster.shared}/cluster.json")  # the shared path again
        reg.stop()


def test_with_a_registry_set_the_nodes_pull_the_image_by_digest(
    slurm_cluster: SlurmCluster, cluster_registry: Any, tiny_workspace: Path
) -> None:
    addr = cluster_registry.address
    res = runner.invoke(app, ["--workspace", str(tiny_workspace), "--json", "provision", *_on(slurm_cluster.login),
                              "--scheduler", "slurm", "--registry", addr])
    assert res.exit_code == 0, res.output
    cluster = json.loads(res.stdout)["data"]["cluster"]
    assert cluster["settings"] == {"registry": addr}
    assert [n["reaches_registry"] for n in cluster["nodes"]] == [True, True]
    code, out = _cli(tiny_workspace, "provision", *_on(slurm_cluster.login), "--scheduler", "slurm")
    assert code == 0 and f"runs get the image: pushed to {addr}, pulled by digest on each node" in out
    # neither node has the image, and there is no archive to load: only the registry can give it
    for node in slurm_cluster.nodes:
        node.exec("sh", "-c", "docker ps -aq | xargs -r docker rm -f >/dev/null; docker images -q | sort -u | "
                  "xargs -r docker rmi -f >/dev/null 2>&1 || true")
    slurm_cluster.login.exec("rm", "-rf", f"{slurm_cluster.shared}/images")
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--runs", "2", "--seed", "4", "--slurm-opt", "exclusive")
    assert code == 0, out
    manifests = _manifests(tiny_workspace)
    assert [m["status"] for m in manifests] == ["succeeded"] * 2
    image = manifests[0]["image"]["id"]
    source = manifests[0]["placement"]["image_source"]
    assert source["kind"] == "registry" and re.fullmatch(rf"{re.escape(addr)}/launcher/ship@sha256:[0-9a-f]{{64}}",
                                                         source["ref"])
    assert {m["image"]["id"] for m in manifests} == {image}  # the ID each task checked before it ran
    launches = sorted((json.loads(p.read_text()) for p in (tiny_workspace / "runs").glob("*/launch.json")),
                      key=lambda rec: rec["replicate"])
    assert [rec["ship"]["skipped"] for rec in launches] == [False, True]  # one push for the group
    assert not slurm_cluster.login.exec("sh", "-c", f"ls {slurm_cluster.shared}/images 2>/dev/null || true").strip()
    for name in {m["placement"]["node"] for m in manifests}:  # each node that ran one pulled it by that digest
        digests = slurm_cluster.node(name).exec("docker", "image", "inspect", "-f", "{{.Id}} {{.RepoDigests}}", image)
        assert digests.split()[0] == image and source["ref"] in digests
    code, out = _cli(tiny_workspace, "verify", "checksums", "--group", manifests[0]["group"])
    # tiny imports no known framework: no difference, but no determinism guaranteed either
    assert code == ExitCode.INCONCLUSIVE and "identical outputs" in out, out
    # --ship-via shared still takes the archive path for one run
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--ship-via", "shared")
    assert code == 0, out
    (single,) = [m for m in _manifests(tiny_workspace) if m["group"] != manifests[0]["group"]]
    assert single["status"] == "succeeded" and single["placement"]["image_source"] == {"kind": "shared"}
    archives = slurm_cluster.login.exec("ls", f"{slurm_cluster.shared}/images").split()
    assert archives == [image.removeprefix("sha256:") + ".tar"]


def test_a_registry_the_nodes_cannot_reach_is_refused_and_nothing_is_recorded(
    slurm_cluster: SlurmCluster, cluster_registry: Any, tiny_workspace: Path
) -> None:
    closed = cluster_registry.address.rsplit(":", 1)[0] + ":1"  # the gateway, a port nothing listens on
    code, out = _cli(tiny_workspace, "provision", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--registry", closed)
    assert code == ExitCode.REGISTRY_UNAVAILABLE, out
    assert f"node1, node2 cannot reach registry {closed} (nothing was changed)" in out and "Traceback" not in out
    assert slurm_cluster.login.exec("sh", "-c", f"cat {slurm_cluster.shared}/cluster.json 2>/dev/null || true") == ""


def test_slurm_opt_values_sbatch_refuses_stop_the_run_before_anything_is_shipped(
    slurm_cluster: SlurmCluster, tiny_workspace: Path
) -> None:
    slurm_cluster.login.exec("rm", "-rf", f"{slurm_cluster.shared}/images")
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--slurm-opt", "time=banana")
    assert code == ExitCode.SLURM_REFUSED, out
    assert "sbatch on" in out and "refuses the job" in out and "time" in out.lower() and "Traceback" not in out
    code, out = _cli(tiny_workspace, "run", "tiny", *_on(slurm_cluster.login), "--scheduler", "slurm",
                     "--slurm-opt", "no-such-option=1")
    assert code == ExitCode.SLURM_REFUSED, out
    assert not slurm_cluster.login.exec("sh", "-c", f"ls {slurm_cluster.shared}/images 2>/dev/null || true").strip()
    assert not list((tiny_workspace / "runs").glob("*/launch.json"))


FAILS_ON_SEED_2 = """import hashlib, json, os, sys, time
seed = int(os.environ["LAUNCHER_SEED"])
token = os.environ.get("TOKEN", "")
json.dump({"mode": os.environ.get("MODE"), "token_sha256": hashlib.sha256(token.encode()).hexdigest()},
          open("env.json", "w"))
print("seed", seed, flush=True)
if seed == 2:
    sys.exit(4)
time.sleep(60)
"""


def test_a_failed_replicate_cancels_the_rest_of_its_array_and_secrets_reach_the_nodes(
        slurm_cluster: SlurmCluster, tiny_workspace: Path, tmp_path: Path) -> None:
    import hashlib

    project = tmp_path / "slurmproj"
    project.mkdir()
    (project / "train.py").write_text(FAILS_ON_SEED_2)
    res = runner.invoke(app, ["--workspace", str(tiny_workspace), "--json", "--quiet", "run",
                              str(project / "train.py"), *_on(slurm_cluster.login), "--scheduler", "slurm",
                              "--seed", "1", "--seed", "2", "--seed", "3", "--env", "MODE=on nodes",
                              "--secret-env", "TOKEN=hunter2 s3cr3t"])
    assert res.exit_code == ExitCode.RUN_FAILED, res.output
    data = json.loads(res.stdout)["data"]
    failure = data["failure"]
    assert (failure["replicate"], failure["exit_code"]) == (1, 4) and "seed 2" in failure["log_tail"]
    by_replicate = {m["replicate"]: m for m in data["runs"]}
    assert by_replicate[1]["status"] == "failed"
    assert {by_replicate[0]["status"], by_replicate[2]["status"]} == {"cancelled"}  # they sleep a minute
    assert sorted(failure["cancelled"]) == sorted(by_replicate[i]["run_id"] for i in (0, 2))
    assert by_replicate[1]["recipe"]["identity"] == "slurmproj/train.py"
    seen = json.loads((tiny_workspace / "runs" / failure["run_id"] / "outputs" / "env.json").read_text())
    assert seen == {"mode": "on nodes", "token_sha256": hashlib.sha256(b"hunter2 s3cr3t").hexdigest()}
    shared = slurm_cluster.login.exec("sh", "-c", "grep -rl s3cr3t /root/.launcher || true")
    assert shared.strip() == ""  # no task script, array script or env file left holding the secret
