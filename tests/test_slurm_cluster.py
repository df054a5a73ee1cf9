"""The two-node Slurm test cluster (tests/slurmcluster.py): jobs reach both nodes, each node has its engine."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from slurmcluster import SlurmCluster

pytestmark = [pytest.mark.docker, pytest.mark.testhost]


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The session's cluster (conftest_testhost.slurm_cluster), shared with test_slurm_runs.py."""
    return slurm_cluster


def ssh(c: SlurmCluster, command: str, timeout: float = 180) -> str:
    """Run a shell command on the login node over SSH, as launcher would."""
    cp = subprocess.run([*c.login.ssh_argv(), command], capture_output=True, text=True, timeout=timeout, check=False)
    assert cp.returncode == 0, f"{command!r} failed ({cp.returncode}): {cp.stdout}{cp.stderr}\n{c.logs()}"
    return cp.stdout


def node_cpus(c: SlurmCluster) -> int:
    out = ssh(c, f"sinfo -h -N -n {c.node_names[0]} -o %c")
    return int(out.split()[0])


def test_sinfo_lists_both_nodes_idle_in_the_debug_partition(cluster: SlurmCluster) -> None:
    out = ssh(cluster, "sinfo -h -N -o '%N %P %t'")
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == [[n, f"{cluster.partition}*", "idle"] for n in cluster.node_names]


def test_job_array_runs_on_both_nodes_and_writes_to_the_shared_folder(cluster: SlurmCluster) -> None:
    t = f"{cluster.shared}/t"
    # Each task asks for all CPUs of a node, so two run at once, one per node.
    wrap = f"hostname > {t}/$SLURM_ARRAY_TASK_ID; sleep 2"
    ssh(
        cluster,
        f"mkdir -p {t} && sbatch --wait --array=0-3 -c {node_cpus(cluster)} "
        f"-o {t}/array-%A_%a.out --wrap {shlex.quote(wrap)}",
    )
    hosts = {i: ssh(cluster, f"cat {t}/{i}").strip() for i in range(4)}
    assert set(hosts.values()) == set(cluster.node_names), hosts
    # The shared folder is the same on both nodes: node2 sees what node1's tasks wrote.
    node2 = cluster.node(cluster.node_names[1])
    assert node2.exec("sh", "-c", f"cat {t}/0 {t}/1 {t}/2 {t}/3").split() == [hosts[i] for i in range(4)]


def test_batch_job_on_node2_has_its_own_docker_engine(cluster: SlurmCluster) -> None:
    t = f"{cluster.shared}/t"
    node2 = cluster.node_names[1]
    wrap = f"docker info --format '{{{{.ServerVersion}}}}' > {t}/docker-{node2} && hostname >> {t}/docker-{node2}"
    ssh(cluster, f"mkdir -p {t} && sbatch --wait -w {node2} -o {t}/docker-%j.out --wrap {shlex.quote(wrap)}")
    version, host = ssh(cluster, f"cat {t}/docker-{node2}").split()
    assert version and version[0].isdigit()
    assert host == node2
    # A different engine from the login node's: each node's dockerd has its own ID.
    ids = {n.exec("docker", "info", "--format", "{{.ID}}").strip() for n in cluster.nodes}
    assert len(ids) == 2
