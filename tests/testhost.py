"""A real SSH test host: a Debian container running its own sshd and dockerd.

It is reachable only over SSH at its bridge IP, with a fresh key pair and a known_hosts
file made for it. Root filesystems come from debootstrap and are cached by the inputs that
made them (checked against their recorded sha256 before use), so a second session is fast;
a missing or damaged cache is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from launcher.workspace import default_cache_dir

SUITE = "bookworm"
# One root filesystem for the SSH test hosts and the Slurm nodes (one debootstrap per session, not two):
# the Slurm daemons are installed on every test host but started only on the cluster's nodes.
HOST_PACKAGES = ("python3", "openssh-server", "docker.io", "iptables", "ca-certificates",
                 "slurmctld", "slurmd", "slurm-client", "munge")
# A host as a fresh VM comes: sshd and python3, no Docker (provision --install puts it there)
BARE_PACKAGES = ("python3", "openssh-server", "ca-certificates")
RUN_FLAGS = (
    "--cap-add=ALL",
    "--cap-drop=SYS_RESOURCE",
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
    "--cgroupns=host",
    "-v",
    "/sys/fs/cgroup:/sys/fs/cgroup:rw",
)
LABEL = "org.launcher.testhost"


def _sh(*argv: str, input: bytes | None = None, check: bool = True, timeout: float = 600) -> str:
    cp = subprocess.run(argv, input=input, capture_output=True, timeout=timeout, check=False)
    if check and cp.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({cp.returncode}): {cp.stderr.decode(errors='replace')[-2000:]}"
        )
    return cp.stdout.decode(errors="replace")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def rootfs_tarball(packages: tuple[str, ...], cache_dir: Path | None = None) -> Path:
    """A debootstrap minbase rootfs with the packages, as a tar file; cached by its inputs. Made under a lock:
    a caller that asks while another makes it (conftest_testhost's head start) waits for that one."""
    cache = (cache_dir or default_cache_dir()) / "testhost"
    cache.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(json.dumps(["minbase", SUITE, sorted(packages)]).encode()).hexdigest()[:16]
    with open(cache / f"rootfs-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _rootfs_locked(packages, cache, key)


def _rootfs_locked(packages: tuple[str, ...], cache: Path, key: str) -> Path:
    tarball, sidecar = cache / f"rootfs-{key}.tar", cache / f"rootfs-{key}.sha256"
    if tarball.exists() and sidecar.exists() and _file_sha256(tarball) == sidecar.read_text().strip():
        return tarball
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=cache) as tmp:
        root = Path(tmp) / "root"
        _sh(
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(packages)}",
            SUITE,
            str(root),
            timeout=1800,
        )
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        partial = Path(tmp) / "rootfs.tar"
        _sh("tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), ".")
        digest = _file_sha256(partial)
        os.replace(partial, tarball)
        sidecar.write_text(digest + "\n")
    return tarball


_IMPORTING = threading.Lock()  # one docker import at a time in this process: a second asker finds the first's


def import_image(tarball: Path, name: str) -> str:
    """docker import the tarball once; the tag carries the tarball's content hash."""
    tag = f"{name}:{_file_sha256(tarball)[:12]}"
    with _IMPORTING:
        if subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False).returncode != 0:
            with open(tarball, "rb") as f:
                subprocess.run(["docker", "import", "-", tag], stdin=f, capture_output=True, check=True)
    return tag


@dataclass
class TestHost:
    __test__ = False  # a fixture object, not a test class

    container: str
    ip: str
    key: Path
    known_hosts: Path
    ssh_config: Path
    alias: str
    host_key_fingerprint: str
    volume: str
    user: str = "root"
    port: int = 22
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        return f"{self.user}@{self.ip}"

    def exec(self, *argv: str, check: bool = True, timeout: float = 300) -> str:
        """Run a command inside the host container through docker (the test's back door, not SSH)."""
        return _sh("docker", "exec", self.container, *argv, check=check, timeout=timeout)

    def ssh_argv(self) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), self.alias]

    def stop(self) -> None:
        subprocess.run(["docker", "rm", "-f", "-v", self.container], capture_output=True, check=False)
        subprocess.run(["docker", "volume", "rm", "-f", self.volume], capture_output=True, check=False)


def _wait_port(ip: str, port: int, deadline: float) -> None:
    while True:
        try:
            with socket.create_connection((ip, port), timeout=1) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd on {ip}:{port} did not come up")
        time.sleep(0.2)


def start_testhost(workdir: Path, cache_dir: Path | None = None, *, network: str | None = None,
                   also: tuple[str, ...] = (), reachable: bool = True,
                   packages: tuple[str, ...] = HOST_PACKAGES) -> TestHost:
    """network: the Docker network it runs on (its address there is `ip`; default: the bridge);
    also: more networks it joins (a bastion on the bridge and on an internal network);
    reachable False: this machine cannot reach it (an internal network), so sshd is awaited inside;
    packages: its root filesystem's (BARE_PACKAGES: no Docker, so no dockerd runs until one is installed;
    the container keeps the caps and the /var/lib/docker volume a dockerd needs)."""
    docker = "docker.io" in packages
    image = import_image(rootfs_tarball(packages, cache_dir), "launcher-testhost")  # tagged by content
    workdir.mkdir(parents=True, exist_ok=True)
    name = f"launcher-testhost-{uuid.uuid4().hex[:8]}"
    volume = f"{name}-docker"
    key = workdir / "id_ed25519"
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "launcher-test", "-f", str(key))
    pub = key.with_suffix(".pub").read_text().strip()
    boot = (
        "set -e; ssh-keygen -A >/dev/null; mkdir -p /run/sshd /root/.ssh; chmod 700 /root/.ssh; "
        'printf "%s\\n" "$AUTHORIZED_KEY" > /root/.ssh/authorized_keys; '
        "chmod 600 /root/.ssh/authorized_keys; "
        "/usr/sbin/sshd -o ClientAliveInterval=0 -o MaxStartups=50:30:100 -o MaxSessions=50; "
        + ("exec dockerd >/var/log/dockerd.log 2>&1" if docker else "exec sleep infinity")
    )
    _sh("docker", "volume", "create", "--label", LABEL, volume)
    container = _sh(
        "docker",
        "run",
        "-d",
        "--name",
        name,
        "--hostname",
        "testhost",
        "--label",
        LABEL,
        *(["--network", network] if network else []),
        *RUN_FLAGS,
        "-v",
        f"{volume}:/var/lib/docker",
        "-e",
        f"AUTHORIZED_KEY={pub}",
        image,
        "/bin/sh",
        "-c",
        boot,
    ).strip()
    host = TestHost(
        container=container,
        ip="",
        key=key,
        known_hosts=workdir / "known_hosts",
        ssh_config=workdir / "ssh_config",
        alias=name,
        host_key_fingerprint="",
        volume=volume,
    )
    try:
        net = network or "bridge"
        host.ip = _sh(
            "docker", "inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{net}").IPAddress}}}}', container
        ).strip()
        for other in also:
            _sh("docker", "network", "connect", other, container)
        deadline = time.monotonic() + 60
        if reachable:
            _wait_port(host.ip, 22, deadline)
        else:
            while host.exec("sh", "-c", "test -s /run/sshd.pid && echo up", check=False).strip() != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError("sshd in the test host did not start")
                time.sleep(0.2)
        host_pub = host.exec("cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()
        host.known_hosts.write_text(f"{host.ip} {host_pub[0]} {host_pub[1]}\n")
        host.host_key_fingerprint = _sh(
            "ssh-keygen", "-l", "-E", "sha256", "-f", str(host.known_hosts)
        ).split()[1]
        host.ssh_config.write_text(
            f"Host {name}\n  HostName {host.ip}\n  User root\n  Port 22\n  IdentityFile {key}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {host.known_hosts}\n  StrictHostKeyChecking yes\n"
        )
        while docker and host.exec("docker", "info", "--format", "{{.ServerVersion}}", check=False).strip() == "":
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "dockerd in the test host did not start: " + host.exec("tail", "/var/log/dockerd.log")
                )
            time.sleep(0.5)
    except BaseException:
        host.stop()
        raise
    return host
