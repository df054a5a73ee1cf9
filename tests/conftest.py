"""Shared real components for the suite: the Docker engine, a local registry, a base
image bootstrapped from Debian packages and pinned by digest, and the TensorFlow CPU
image, built once per session and shared (cached by content between sessions on the
same machine, never relied on)."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import LauncherError
from launcher.hosts import dockerapi
from launcher.images import pins as images
from launcher.images import registry
from launcher.images.bootstrap import bootstrap
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace, default_cache_dir

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
sys.path.insert(0, str(Path(__file__).resolve().parent))
# the SSH test host and a tiny image (tests/testhost.py); the tiers of the suite (tests/tiers.py)
pytest_plugins = ["conftest_testhost", "tiers"]


@contextlib.contextmanager
def made_once(name: str) -> Iterator[None]:
    """Make a shared thing (the base, an image) with the other lane of this run waiting (tests/tiers.py): the
    first makes it, the other then finds it made (by content) instead of making it beside it on two cores."""
    folder = Path(tempfile.gettempdir()) / f"launcher-tests-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    with open(folder / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def need(ok: bool, reason: str) -> None:
    """Skip with a printed reason on a developer machine; in CI a missing component fails."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"required test component missing in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def azure_sdk() -> None:
    """The Azure SDK for Python (launcher[azure], in the dev extra), which `vm up | ls | down` call Azure
    through. Without it a test that reaches Azure is skipped; a broken install still fails."""
    for module in ("azure.identity", "azure.mgmt.compute", "azure.mgmt.network", "azure.mgmt.resource"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            need(False, f"the Azure SDK is not installed (no module {exc.name}: pip install -e '.[azure]' or "
                        "'.[dev]')")


@pytest.fixture(scope="session")
def repo_workspace() -> Workspace:
    return Workspace.at(REPO)


@pytest.fixture(scope="session")
def engine() -> dict[str, Any]:
    try:
        return dockerapi.require()
    except LauncherError as exc:
        need(False, f"no Docker engine: {exc.one_line()}")
        raise


@pytest.fixture(scope="session")
def registry_addr(engine: dict[str, Any]) -> str:
    addr = os.environ.get("LAUNCHER_TEST_REGISTRY", registry.DEFAULT_LOCAL)
    try:
        registry.start_local_registry(default_cache_dir() / "registry", addr)
    except LauncherError as exc:
        need(False, f"no local registry: {exc.one_line()}")
    return addr


@pytest.fixture(scope="session")
def base_ref(registry_addr: str) -> str:
    try:
        with made_once("base"):
            return bootstrap(default_cache_dir(), registry_address=registry_addr).ref
    except LauncherError as exc:
        need(False, f"cannot bootstrap a base image: {exc.one_line()}")
        raise


@pytest.fixture(scope="session")
def make_workspace(base_ref: str, repo_workspace: Workspace) -> Callable[[Path], Workspace]:
    """A scratch copy of this repository's workspace, pinned to the bootstrapped base."""

    def make(root: Path, *, recipes: bool = True) -> Workspace:
        init_workspace(root, from_workspace=repo_workspace)
        if not recipes:
            shutil.rmtree(root / "recipes")
            (root / "recipes").mkdir()
        ws = Workspace.at(root)
        lock = images.load(ws)
        for v in list(lock.pins):
            lock.pins[v] = images.BasePin(v, base_ref, python="3.11", source="bootstrap")
        images.save(ws, lock)
        return ws

    return make


SIX_LOCK_IN = "six==1.17.0\npip\nsetuptools\n"


@pytest.fixture(scope="session")
def six_lock(make_workspace: Callable[..., Workspace], tmp_path_factory: pytest.TempPathFactory
             ) -> Callable[[Workspace], Workspace]:
    """Puts the lock of the small image (six, pip, setuptools) in a workspace: lockfiles/cpu.in and the
    cpu.txt that `launcher lock` resolved for it in the bootstrapped base, once per session (the build,
    cache and ship tests of small images need a real lock, not each its own resolution)."""
    from launcher.images import lock

    ws = make_workspace(tmp_path_factory.mktemp("six-lock") / "ws", recipes=False)
    ws.lock_in("cpu").write_text(SIX_LOCK_IN)
    lock.lock_variant(ws, "cpu")
    locked = ws.lock_txt("cpu").read_text()

    def put(into: Workspace) -> Workspace:
        into.lock_in("cpu").write_text(SIX_LOCK_IN)
        into.lock_txt("cpu").write_text(locked)
        return into

    return put


@pytest.fixture(scope="session")
def tf_workspace(make_workspace: Callable[[Path], Workspace], tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("tfws") / "ws")


@pytest.fixture(scope="session")
def cpu_image(tf_workspace: Workspace) -> Iterator[dict[str, Any]]:
    """The real TensorFlow CPU image, built once from the committed lock (lockfiles/cpu.txt)."""
    from launcher.images.build import build

    with made_once("tensorflow-image"):
        rec = build(tf_workspace, "cpu")
    yield {"id": rec.image_id, "tag": rec.tag, "record": rec, "workspace": tf_workspace}
