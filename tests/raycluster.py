"""A real two-node Ray cluster for tests: Ray from PyPI at a pinned version, on the two nodes of the Slurm test
cluster (tests/slurmcluster.py), each an SSH test host with its own sshd and Docker engine.

The head runs as root on the first node; the worker runs as another user on the second node, with a home of its
own, so the two share no files launcher uses (the Slurm nodes' shared volume is root's home): whatever a task on
the worker needs comes from the head through Ray, as on a cluster of VMs. launcher reaches the head alone, over
SSH; the job API listens on 127.0.0.1:8265 as the head sees it. Running beside the Slurm daemons, the nodes keep
the images earlier tests left in their engines and the archives in the head's area.

Ray (``ray[default]``, RAY_VERSION) is installed by this set-up from PyPI with this machine's pip into a folder kept
in launcher's cache by its version (a second session reuses it; a damaged one is made again), copied into both
nodes, where the system python3 finds it (a .pth file) and ``ray`` runs it. ``stop()`` stops Ray on both nodes.
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
from dataclasses import dataclass, field
from pathlib import Path

from slurmcluster import SlurmCluster
from testhost import TestHost, _sh

from launcher.workspace import default_cache_dir

RAY_VERSION = "2.60.0"
RAY_SITE = "/opt/ray-site"  # where the nodes see the installed Ray
WORKER_USER = "alice"  # the worker's user on the second node: a home of its own, in the docker group
INSTALL = (
    f"echo {RAY_SITE} > /usr/lib/python3/dist-packages/ray-site.pth; "
    "printf '#!/usr/bin/python3\\nimport sys\\nfrom ray.scripts.scripts import main\\nsys.exit(main())\\n' "
    "> /usr/local/bin/ray; chmod +x /usr/local/bin/ray"
)
# two CPUs for Ray's tasks on each node (two replicates at once on each), and a small object store (the machine
# runs other tests beside them)
RAY_FLAGS = ("--num-cpus", "2", "--object-store-memory", str(100 << 20), "--disable-usage-stats")


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
    worker_user: str = WORKER_USER
    archives: frozenset[str] = frozenset()  # the head area's image archives before (the Slurm tests count theirs)
    ids: dict[str, str] = field(default_factory=dict)  # each alive node's Ray ID -> its address, once asked

    @property
    def nodes(self) -> list[TestHost]:
        return [self.head, self.worker]

    @property
    def worker_area(self) -> str:
        """launcher's folder on the worker node, under its user's own home."""
        return f"/home/{self.worker_user}/.launcher"

    def as_worker(self, *argv: str, check: bool = True) -> str:
        return self.worker.exec("runuser", "-u", self.worker_user, "--", *argv, check=check, timeout=120)

    def status(self) -> str:
        return self.head.exec("ray", "status", check=False)

    def node_ids(self) -> dict[str, str]:
        """Each alive node's Ray node ID -> its address (asked once: a driver's start on the head takes seconds)."""
        if not self.ids:
            self.ids = self.alive()
        return dict(self.ids)

    def alive(self) -> dict[str, str]:
        out = self.head.exec("python3", "-c", "import json, ray; ray.init(log_to_driver=False); print(json.dumps("
                             "{n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']}))")
        return dict(json.loads(out.strip().splitlines()[-1]))

    def images(self) -> set[str]:
        return set(self.head.exec("sh", "-c", "ls /root/.launcher/images 2>/dev/null || true").split())

    def stop(self) -> None:
        """Stop Ray on both nodes, in the background: the tests after these need the nodes, not Ray's end. The image
        archives the Ray runs left in the head's area (root's, the Slurm cluster's shared home) go."""
        for name in self.images() - self.archives:
            self.head.exec("rm", "-f", f"/root/.launcher/images/{name}")
        for node, user in ((self.head, "root"), (self.worker, self.worker_user)):
            subprocess.run(["docker", "exec", "-d", "-u", user, node.container, "ray", "stop", "--force"],
                           capture_output=True, check=False)


def _copy_site(site: Path, node: TestHost) -> None:
    """The installed Ray into the node's root filesystem (the running container cannot mount it)."""
    node.exec("sh", "-c", f"rm -rf {RAY_SITE} && mkdir -p {RAY_SITE}")
    tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
    subprocess.run(["docker", "exec", "-i", node.container, "tar", "-C", RAY_SITE, "-xf", "-"], stdin=tar.stdout,
                   check=True, capture_output=True)
    if tar.wait() != 0:
        raise RuntimeError(f"tar of {site} failed")
    node.exec("sh", "-c", INSTALL)


def start_cluster(slurm: SlurmCluster, cache_dir: Path | None = None, timeout: float = 90) -> RayCluster:
    """Start Ray's head on the Slurm cluster's first node (root) and a worker on its second (WORKER_USER); return
    once Ray counts both nodes alive."""
    site = ray_site(cache_dir)
    head, worker = slurm.nodes
    threads = [threading.Thread(target=_copy_site, args=(site, node)) for node in (head, worker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worker.exec("sh", "-c", f"id {WORKER_USER} >/dev/null 2>&1 || useradd -m -s /bin/sh -G docker {WORKER_USER}")
    cluster = RayCluster(head=head, worker=worker)
    cluster.archives = frozenset(cluster.images())
    try:
        head.exec("ray", "start", "--head", f"--node-ip-address={head.ip}", "--port=6379",
                  "--dashboard-host=127.0.0.1", "--dashboard-port=8265", *RAY_FLAGS, timeout=120)
        cluster.as_worker("ray", "start", f"--address={head.ip}:6379", f"--node-ip-address={worker.ip}", *RAY_FLAGS)
        deadline = time.monotonic() + timeout
        while len(cluster.ids) < 2:
            cluster.ids = cluster.alive()
            if len(cluster.ids) == 2:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray counts fewer than two nodes after {timeout:.0f} s:\n{cluster.status()}")
            time.sleep(1)
        return cluster
    except BaseException:
        cluster.stop()
        raise
