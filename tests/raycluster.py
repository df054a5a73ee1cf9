"""A real two-node Ray cluster for tests: Ray from PyPI at a pinned version, on two SSH test hosts.

Two containers in the style of the SSH test host (tests/testhost.py), each with its own sshd and its own
dockerd, on a Docker network of their own, sharing nothing: the first runs Ray's head (GCS, dashboard and job
API on 127.0.0.1:8265 as the head sees it), the second a Ray worker joined to it. launcher reaches the head alone,
over SSH. Ray (``ray[default]``, RAY_VERSION) is installed by this set-up from PyPI with this machine's pip into a
folder kept in launcher's cache by its version (a second session reuses it; a damaged one is made again) and
mounted read-only into both hosts, where the system python3 finds it (a .pth file) and ``ray`` runs it.
Everything is removed by ``stop()``.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from testhost import HOST_PACKAGES, LABEL, RUN_FLAGS, TestHost, _sh, _wait_port, import_image, rootfs_tarball

from launcher.workspace import default_cache_dir

RAY_VERSION = "2.60.0"
RAY_SITE = "/opt/ray-site"  # where the hosts see the installed Ray
DASHBOARD = "http://127.0.0.1:8265"
NODE_CPUS = 2  # each node offers two CPUs to Ray: two replicates at once on each

BOOT = (
    "set -e; ssh-keygen -A >/dev/null; mkdir -p /run/sshd /root/.ssh; chmod 700 /root/.ssh; "
    'printf "%s\\n" "$AUTHORIZED_KEY" > /root/.ssh/authorized_keys; chmod 600 /root/.ssh/authorized_keys; '
    f"echo {RAY_SITE} > /usr/lib/python3/dist-packages/ray-site.pth; "
    "printf '#!/usr/bin/python3\\nimport sys\\nfrom ray.scripts.scripts import main\\nsys.exit(main())\\n' "
    "> /usr/local/bin/ray; chmod +x /usr/local/bin/ray; "
    "/usr/sbin/sshd -o ClientAliveInterval=0 -o MaxStartups=50:30:100 -o MaxSessions=50; "
    "exec dockerd >/var/log/dockerd.log 2>&1"
)
# what Ray's processes need besides the CPUs: a small object store (the machine runs other tests beside them)
RAY_FLAGS = ("--num-cpus", str(NODE_CPUS), "--object-store-memory", str(200 << 20), "--disable-usage-stats")


_made = threading.Lock()  # the collection's background thread and the fixture: one installs, the other waits


def ray_site(cache_dir: Path | None = None) -> Path:
    """ray[default]==RAY_VERSION installed from PyPI into a folder of launcher's cache (made once; kept by version,
    checked by importing it)."""
    site = (cache_dir or default_cache_dir()) / "testhost" / f"ray-{RAY_VERSION}"
    site.parent.mkdir(parents=True, exist_ok=True)
    with _made, open(site.with_name(f"{site.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _site_locked(site)


def _site_locked(site: Path) -> Path:
    probe = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r}); import ray; "
             f"assert ray.__version__ == {RAY_VERSION!r}; import ray.dashboard, aiohttp"]
    if (site / ".complete").is_file() and subprocess.run(probe, capture_output=True).returncode == 0:
        return site
    part = site.with_name(f"{site.name}.part-{uuid.uuid4().hex[:6]}")
    try:
        _sh(sys.executable, "-m", "pip", "install", "-q", "--no-warn-script-location", "--target", str(part),
            f"ray[default]=={RAY_VERSION}", timeout=900)
        (part / ".complete").write_text(RAY_VERSION + "\n")
        shutil.rmtree(site, ignore_errors=True)
        part.rename(site)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return site


@dataclass
class RayCluster:
    __test__ = False  # a fixture object, not a test class

    head: TestHost
    worker: TestHost
    network: str

    @property
    def nodes(self) -> list[TestHost]:
        return [self.head, self.worker]

    def status(self) -> str:
        return self.head.exec("ray", "status", check=False)

    def node_ids(self) -> dict[str, str]:
        """Each alive node's Ray node ID -> its address."""
        out = self.head.exec("python3", "-c", "import json, ray; ray.init(log_to_driver=False); print(json.dumps("
                             "{n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']}))")
        return dict(json.loads(out.strip().splitlines()[-1]))

    def logs(self) -> str:
        return "\n".join(h.exec("sh", "-c", "tail -n 30 /tmp/ray/session_latest/logs/raylet.out 2>/dev/null",
                                check=False) for h in self.nodes)

    def stop(self) -> None:
        for host in self.nodes:
            host.stop()
        subprocess.run(["docker", "network", "rm", self.network], capture_output=True, check=False)


def start_cluster(workdir: Path, cache_dir: Path | None = None, timeout: float = 90) -> RayCluster:
    """Start the head and the worker; return once Ray counts both nodes alive."""
    site = ray_site(cache_dir)
    image = import_image(rootfs_tarball(HOST_PACKAGES, cache_dir), "launcher-slurmnode")
    workdir.mkdir(parents=True, exist_ok=True)
    prefix = f"launcher-ray-{uuid.uuid4().hex[:8]}"
    network = f"{prefix}-net"
    key = workdir / "id_ed25519"
    known_hosts, ssh_config = workdir / "known_hosts", workdir / "ssh_config"
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "launcher-test", "-f", str(key))
    pub = key.with_suffix(".pub").read_text().strip()
    hosts: list[TestHost] = []
    try:
        _sh("docker", "network", "create", "--label", LABEL, network)
        for name in ("head", "worker"):
            container = f"{prefix}-{name}"
            host = TestHost(container=container, ip="", key=key, known_hosts=known_hosts, ssh_config=ssh_config,
                            alias=container, host_key_fingerprint="", volume=f"{container}-docker",
                            extra={"ray_role": name})
            hosts.append(host)
            _sh("docker", "volume", "create", "--label", LABEL, host.volume)
            _sh("docker", "run", "-d", "--init", "--name", container, "--hostname", f"ray-{name}",
                "--network", network, "--label", LABEL, *RUN_FLAGS,
                "-v", f"{host.volume}:/var/lib/docker", "-v", f"{site}:{RAY_SITE}:ro",
                "--shm-size", "512m", "-e", f"AUTHORIZED_KEY={pub}", image, "/bin/sh", "-c", BOOT)
        deadline = time.monotonic() + 60
        known, config = [], []
        for host in hosts:
            host.ip = _sh("docker", "inspect", "-f",
                          f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}', host.container).strip()
            _wait_port(host.ip, 22, deadline)
            host_pub = host.exec("cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()
            known.append(f"{host.ip} {host_pub[0]} {host_pub[1]}\n")
            config.append(f"Host {host.alias}\n  HostName {host.ip}\n  User root\n  Port 22\n  IdentityFile {key}\n"
                          f"  IdentitiesOnly yes\n  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n")
        known_hosts.write_text("".join(known))
        ssh_config.write_text("".join(config))
        fingerprints = _sh("ssh-keygen", "-l", "-E", "sha256", "-f", str(known_hosts)).splitlines()
        for host, line in zip(hosts, fingerprints, strict=True):
            host.host_key_fingerprint = line.split()[1]
        for host in hosts:
            while host.exec("docker", "info", "--format", "{{.ServerVersion}}", check=False).strip() == "":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"dockerd in {host.container} did not start: "
                                       + host.exec("tail", "/var/log/dockerd.log"))
                time.sleep(0.5)
        head, worker = hosts
        head.exec("ray", "start", "--head", f"--node-ip-address={head.ip}", "--port=6379",
                  "--dashboard-host=127.0.0.1", "--dashboard-port=8265", *RAY_FLAGS, timeout=120)
        worker.exec("ray", "start", f"--address={head.ip}:6379", f"--node-ip-address={worker.ip}", *RAY_FLAGS,
                    timeout=120)
        cluster = RayCluster(head=head, worker=worker, network=network)
        deadline = time.monotonic() + timeout
        while len(cluster.node_ids()) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray counts fewer than two nodes after {timeout:.0f} s:\n{cluster.status()}")
            time.sleep(1)
        return cluster
    except BaseException:
        for host in hosts:
            host.stop()
        subprocess.run(["docker", "network", "rm", network], capture_output=True, check=False)
        raise
