"""A real two-node Slurm cluster for tests, built from Debian's packages.

Two containers in the style of the SSH test host (tests/testhost.py): each runs its own sshd
and its own dockerd, plus munged and slurmd; the first also runs slurmctld and is the login
node that launcher reaches over SSH. They sit on a dedicated Docker network where their node
names resolve, share one munge key and one slurm.conf, and mount one Docker volume at the same
path on both, /root/.launcher (launcher's default working area under root's home), so what a
job writes there on one node is seen on the other. Everything is removed by ``stop()``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from testhost import HOST_PACKAGES, LABEL, RUN_FLAGS, TestHost, _sh, _wait_port, import_image, rootfs_tarball

SLURM_PACKAGES = HOST_PACKAGES  # the test hosts' root filesystem: the Slurm packages are in it
PARTITION = "debug"
SHARED = "/root/.launcher"
NODE_NAMES = ("node1", "node2")
CLUSTER_NAME = "launcher"
SLURM_LOGS = ("/var/log/slurm/slurmctld.log", "/var/log/slurm/slurmd.log", "/var/log/munge/munged.log")

BOOT = (
    "set -e; ssh-keygen -A >/dev/null; mkdir -p /run/sshd /root/.ssh; chmod 700 /root/.ssh; "
    'printf "%s\\n" "$AUTHORIZED_KEY" > /root/.ssh/authorized_keys; '
    "chmod 600 /root/.ssh/authorized_keys; "
    "/usr/sbin/sshd -o ClientAliveInterval=0 -o MaxStartups=50:30:100 -o MaxSessions=50; "
    "exec dockerd >/var/log/dockerd.log 2>&1"
)

SLURM_CONF = """\
# Written by tests/slurmcluster.py: a two-node test cluster, no accounting, no cgroups.
ClusterName={cluster}
SlurmctldHost={controller}
SlurmUser=slurm
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
{nodes}
PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

PREPARE = (
    "set -e; mkdir -p /var/log/slurm /var/lib/slurm/slurmd /var/lib/slurm/slurmctld /run/munge "
    "/var/log/munge /var/lib/munge /etc/munge; "
    "chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge; chmod 0755 /run/munge; "
    "chmod 0700 /etc/munge; chown slurm:slurm /var/lib/slurm/slurmctld /var/log/slurm"
)


@dataclass
class SlurmCluster:
    __test__ = False  # a fixture object, not a test class

    login: TestHost
    nodes: list[TestHost]
    node_names: list[str]
    partition: str = PARTITION
    shared: str = SHARED
    network: str = ""
    shared_volume: str = ""
    slurm_conf: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def node(self, name: str) -> TestHost:
        return self.nodes[self.node_names.index(name)]

    def logs(self, lines: int = 40) -> str:
        """The tails of the munged/slurmctld/slurmd logs of every node, for error messages."""
        out = []
        for name, host in zip(self.node_names, self.nodes, strict=False):
            for log in SLURM_LOGS:
                text = host.exec("sh", "-c", f"tail -n {lines} {log} 2>/dev/null", check=False).rstrip()
                if text:
                    out.append(f"--- {name}:{log}\n{text}")
        return "\n".join(out) or "(no Slurm logs)"

    def stop(self) -> None:
        _remove(self.nodes, self.shared_volume, self.network)


def _remove(nodes: list[TestHost], shared_volume: str, network: str) -> None:
    for host in nodes:
        host.stop()
    if shared_volume:
        subprocess.run(["docker", "volume", "rm", "-f", shared_volume], capture_output=True, check=False)
    if network:
        subprocess.run(["docker", "network", "rm", network], capture_output=True, check=False)


def _write(host: TestHost, path: str, data: bytes, owner: str, mode: str) -> None:
    q = shlex.quote(path)
    _sh(
        "docker",
        "exec",
        "-i",
        host.container,
        "sh",
        "-c",
        f"umask 077; cat > {q} && chown {owner} {q} && chmod {mode} {q}",
        input=data,
    )


def _daemon(host: TestHost, command: str, log: str) -> None:
    """Start a daemon that forks into the background; its first words go to a log file."""
    host.exec("sh", "-c", f"{command} </dev/null >>{log} 2>&1")


def _node_line(host: TestHost, name: str) -> str:
    """The node's NodeName line as slurmd reports the hardware (CPUs, sockets, cores, memory)."""
    reported = host.exec("slurmd", "-C")
    for line in reported.splitlines():
        if line.startswith("NodeName="):
            return " ".join([f"NodeName={name}", *line.split()[1:]])
    return f"NodeName={name} CPUs=2 RealMemory=1000"


def _idle_nodes(login: TestHost) -> dict[str, str]:
    out = login.exec("sinfo", "-h", "-N", "-o", "%N %t", check=False)
    return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)


def start_cluster(workdir: Path, cache_dir: Path | None = None, timeout: float = 90) -> SlurmCluster:
    """Start the two-node cluster; return once ``sinfo`` shows both nodes idle."""
    image = import_image(rootfs_tarball(SLURM_PACKAGES, cache_dir), "launcher-slurmnode")
    workdir.mkdir(parents=True, exist_ok=True)
    prefix = f"launcher-slurm-{uuid.uuid4().hex[:8]}"
    network, shared_volume = f"{prefix}-net", f"{prefix}-shared"
    key = workdir / "id_ed25519"
    known_hosts, ssh_config = workdir / "known_hosts", workdir / "ssh_config"
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "launcher-test", "-f", str(key))
    pub = key.with_suffix(".pub").read_text().strip()
    nodes: list[TestHost] = []
    try:
        _sh("docker", "network", "create", "--label", LABEL, network)
        _sh("docker", "volume", "create", "--label", LABEL, shared_volume)
        for name in NODE_NAMES:
            container = f"{prefix}-{name}"
            host = TestHost(
                container=container,
                ip="",
                key=key,
                known_hosts=known_hosts,
                ssh_config=ssh_config,
                alias=container,
                host_key_fingerprint="",
                volume=f"{container}-docker",
                extra={"node_name": name},
            )
            nodes.append(host)
            _sh("docker", "volume", "create", "--label", LABEL, host.volume)
            _sh(
                "docker", "run", "-d", "--init",
                "--name", container,
                "--hostname", name,
                "--network", network,
                "--network-alias", name,
                "--label", LABEL,
                *RUN_FLAGS,
                "-v", f"{host.volume}:/var/lib/docker",
                "-v", f"{shared_volume}:{SHARED}",
                "-e", f"AUTHORIZED_KEY={pub}",
                "--shm-size", "256m",  # Ray's object store, when the Ray tests start Ray on these nodes
                image, "/bin/sh", "-c", BOOT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        config, known = [], []
        for host in nodes:
            host.ip = _sh(
                "docker",
                "inspect",
                "-f",
                f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}',
                host.container,
            ).strip()
            _wait_port(host.ip, 22, deadline)
            host_pub = host.exec("cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()
            known.append(f"{host.ip} {host_pub[0]} {host_pub[1]}\n")
            config.append(
                f"Host {host.alias}\n  HostName {host.ip}\n  User root\n  Port 22\n  IdentityFile {key}\n"
                f"  IdentitiesOnly yes\n  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n"
            )
        known_hosts.write_text("".join(known))
        ssh_config.write_text("".join(config))
        fingerprints = _sh("ssh-keygen", "-l", "-E", "sha256", "-f", str(known_hosts)).splitlines()
        for host, line in zip(nodes, fingerprints, strict=True):
            host.host_key_fingerprint = line.split()[1]
        for host in nodes:
            while host.exec("docker", "info", "--format", "{{.ServerVersion}}", check=False).strip() == "":
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dockerd in {host.container} did not start: " + host.exec("tail", "/var/log/dockerd.log")
                    )
                time.sleep(0.5)

        login = nodes[0]
        conf = SLURM_CONF.format(
            cluster=CLUSTER_NAME,
            controller=NODE_NAMES[0],
            nodes="\n".join(_node_line(h, n) for h, n in zip(nodes, NODE_NAMES, strict=True)),
            partition=PARTITION,
        )
        munge_key = os.urandom(1024)  # the same fresh key on every node
        for host in nodes:
            host.exec("sh", "-c", PREPARE)
            _write(host, "/etc/munge/munge.key", munge_key, "munge:munge", "0400")
            _write(host, "/etc/slurm/slurm.conf", conf.encode(), "root:root", "0644")
            _daemon(host, "runuser -u munge -- /usr/sbin/munged", "/var/log/munge/munged.start.log")
        _daemon(login, "/usr/sbin/slurmctld", "/var/log/slurm/slurmctld.start.log")
        for host in nodes:
            _daemon(host, "/usr/sbin/slurmd", "/var/log/slurm/slurmd.start.log")

        cluster = SlurmCluster(
            login=login,
            nodes=nodes,
            node_names=list(NODE_NAMES),
            network=network,
            shared_volume=shared_volume,
            slurm_conf=conf,
        )
        deadline = time.monotonic() + timeout
        while True:
            states = _idle_nodes(login)
            if all(states.get(n, "").rstrip("*") == "idle" for n in NODE_NAMES):
                return cluster
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Slurm nodes not idle after {timeout:.0f} s (sinfo: {states or 'nothing'}):\n{cluster.logs()}"
                )
            time.sleep(0.5)
    except BaseException:
        _remove(nodes, shared_volume, network)
        raise


@dataclass
class ClusterRegistry:
    """A TLS registry the cluster's nodes pull from, as a lab runs one: Debian's docker-registry on this
    machine, listening on the cluster network's gateway address, with a certificate from a CA of its own
    that this machine's Docker engine and every node's trust (/etc/docker/certs.d/ADDRESS/ca.crt)."""

    __test__ = False

    address: str
    process: subprocess.Popen[bytes]
    certs_dirs: list[Path]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        for d in self.certs_dirs:
            subprocess.run(["rm", "-rf", str(d)], check=False)


def _free_port(address: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _wait_https(url: str, ca: Path, deadline: float, log: Path) -> None:
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(ca))
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the test registry did not answer on {url}: {log.read_text()[-2000:]}")
        time.sleep(0.2)


def start_registry(cluster: SlurmCluster, workdir: Path, timeout: float = 20) -> ClusterRegistry:
    gateway = _sh("docker", "network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", cluster.network).strip()
    address = f"{gateway}:{_free_port(gateway)}"
    workdir.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (workdir / n for n in ("ca.key", "ca.crt", "reg.key", "reg.csr", "reg.crt"))
    _sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=launcher test CA",
        "-keyout", str(ca_key), "-out", str(ca))
    _sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={gateway}", "-keyout", str(key),
        "-out", str(csr))
    ext = workdir / "san.cnf"
    ext.write_text(f"subjectAltName=IP:{gateway}\n")
    _sh("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert))
    config = workdir / "registry.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n"
        f"http:\n  addr: {address}\n  tls:\n    certificate: {cert}\n    key: {key}\n"
    )
    log = open(workdir / "registry.log", "ab")
    process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    here = Path("/etc/docker/certs.d") / address
    registry = ClusterRegistry(address=address, process=process, certs_dirs=[here])
    try:
        here.mkdir(parents=True, exist_ok=True)
        (here / "ca.crt").write_bytes(ca.read_bytes())
        for node in cluster.nodes:
            node.exec("mkdir", "-p", f"/etc/docker/certs.d/{address}")
            _write(node, f"/etc/docker/certs.d/{address}/ca.crt", ca.read_bytes(), "root:root", "0644")
        _wait_https(f"https://{address}/v2/", ca, time.monotonic() + timeout, workdir / "registry.log")
        return registry
    except BaseException:
        registry.stop()
        raise
