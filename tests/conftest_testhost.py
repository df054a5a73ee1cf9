"""Fixtures for tests against real hosts: the SSH test host container and a tiny image.

Load as a pytest plugin (``pytest_plugins = ["tests.conftest_testhost"]`` or
``-p conftest_testhost``). Everything is session-scoped and removed at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import testhost as th

REPO = Path(__file__).resolve().parent.parent
TINY_RECIPES = Path(__file__).resolve().parent / "fixtures" / "tiny_recipes"


def _docker_ok() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        return "no Docker engine answers"
    return None


def _need_host_tools() -> None:
    why = _docker_ok()
    if why is None and shutil.which("debootstrap") is None:
        why = "debootstrap is not installed (apt-get install debootstrap)"
    if why is None and (shutil.which("ssh-keygen") is None or shutil.which("ssh") is None):
        why = "the OpenSSH client is not installed"
    if why and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"required test component missing in CI: a test host container: {why}")
    if why:
        pytest.skip(f"needs a test host container: {why}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """A head start: when a selected test will ask for a test host, their root filesystems are made (debootstrap)
    and imported in the background from the start, while the first tests wait on image builds; the fixtures then
    find them made (rootfs_tarball waits for one being made). A failure here is left to the fixture to meet."""
    marked = {m.name for item in session.items for m in item.iter_markers()}
    if session.config.option.collectonly or "testhost" not in marked or _docker_ok() is not None or \
            shutil.which("debootstrap") is None:
        return
    wanted = [(th.HOST_PACKAGES, "launcher-testhost")]
    if "cluster" in marked:
        wanted.append((th.HOST_PACKAGES, "launcher-slurmnode"))
    ray = any("ray_cluster" in getattr(item, "fixturenames", ()) for item in session.items)
    if any(item.path.name == "test_hosts_provision.py" for item in session.items):  # a host without Docker
        wanted.append((th.BARE_PACKAGES, "launcher-testhost"))

    def make() -> None:
        if ray:  # Ray from PyPI, into the cache (raycluster.ray_site), while debootstrap is not yet busy
            try:
                import raycluster

                raycluster.ray_site()
            except Exception:
                pass
        for packages, name in wanted:
            try:
                th.import_image(th.rootfs_tarball(packages), name)
            except Exception:  # the fixture that needs it makes it again, and says why if it cannot
                return

    # not a daemon: a session that ends first waits for it, so no debootstrap is left running half-way
    threading.Thread(target=make, name="testhost-rootfs").start()


@pytest.fixture(scope="session")
def testhost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[th.TestHost]:
    """A Debian container with its own sshd and dockerd, reached only over SSH at its bridge IP."""
    _need_host_tools()
    host = th.start_testhost(tmp_path_factory.mktemp("testhost"))
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture(scope="module")
def ray_cluster(slurm_cluster: Any) -> Iterator[Any]:
    """A real Ray cluster, Ray from PyPI, on the Slurm test cluster's two nodes (tests/raycluster.py): the head on
    the first, a worker with a home of its own on the second; Ray stopped when the module's tests end."""
    import raycluster
    from conftest import need

    try:
        raycluster.ray_site()
    except Exception as exc:  # no PyPI here: said, and a failure in CI
        need(False, f"Ray {raycluster.RAY_VERSION} cannot be installed from PyPI: {str(exc)[-300:]}")
    cluster = raycluster.start_cluster(slurm_cluster)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two test hosts running a real Slurm cluster (tests/slurmcluster.py); the first is its login node."""
    _need_host_tools()
    import slurmcluster

    cluster = slurmcluster.start_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


TINY_DOCKERFILE = """\
# The tiny test image: the pinned base's python3 and launcher's runtime, no packages.
ARG LAUNCHER_BASE
FROM ${LAUNCHER_BASE}
RUN ln -sf /usr/bin/python3 /usr/local/bin/python
ENV PYTHONPATH=/opt/launcher PYTHONDONTWRITEBYTECODE=1
COPY launcher/ /opt/launcher/launcher/
"""


def write_tiny_inputs(root: Path, base_ref: str) -> None:
    """The build inputs of the tiny workspace: a lock with no packages, a Dockerfile per variant,
    and images.lock pinning the bootstrapped base by digest."""
    from launcher.images import pins as images
    from launcher.workspace import VARIANTS, Workspace

    for sub in ("lockfiles", "dockerfiles"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    if not (root / "recipes").exists():
        shutil.copytree(TINY_RECIPES, root / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    lock = images.ImagesLock()
    for v in VARIANTS:
        (root / "lockfiles" / f"{v}.txt").write_text("# no packages: the base's python3 runs the tiny recipes\n")
        (root / "dockerfiles" / f"{v}.Dockerfile").write_text(TINY_DOCKERFILE)
        lock.pins[v] = images.BasePin(v, base_ref, python="3.11", source="bootstrap")
    images.save(Workspace.at(root), lock)


@pytest.fixture(scope="session")
def tiny_image(tmp_path_factory: pytest.TempPathFactory, base_ref: str) -> Iterator[dict[str, Any]]:
    """Debian + python3 + launcher's in-container runtime + the tiny recipes, built by `launcher
    build` like any image (so runs see a real build record): seconds to build."""
    _need_host_tools()
    from conftest import made_once

    from launcher.images.build import build
    from launcher.workspace import Workspace

    root = tmp_path_factory.mktemp("tiny-image") / "tiny"
    write_tiny_inputs(root, base_ref)
    with made_once("tiny-image"):
        rec = build(Workspace.at(root), "cpu")
    yield {"id": rec.image_id, "tag": rec.tag, "base": base_ref, "workspace": root}


def make_workspace(root: Path, image: dict[str, Any], variant: str = "cpu") -> Path:
    """A workspace of the tiny recipes built as `launcher build` leaves it (found in the build
    cache when its inputs equal the tiny image's, which is the usual case: no Docker build)."""
    from launcher.images.build import build
    from launcher.workspace import Workspace

    write_tiny_inputs(root, image["base"])
    build(Workspace.at(root), variant)
    return root


@pytest.fixture
def tiny_workspace(tmp_path: Path, tiny_image: dict[str, Any]) -> Path:
    return make_workspace(tmp_path / "ws", tiny_image)
