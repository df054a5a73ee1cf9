"""Fixtures for tests against real hosts: the SSH test host container and a tiny image.

Load as a pytest plugin (``pytest_plugins = ["tests.conftest_testhost"]`` or
``-p conftest_testhost``). Everything is session-scoped and removed at the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
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
    if why:
        pytest.skip(f"needs a test host container: {why}")


@pytest.fixture(scope="session")
def testhost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[th.TestHost]:
    """A Debian container with its own sshd and dockerd, reached only over SSH at its bridge IP."""
    _need_host_tools()
    host = th.start_testhost(tmp_path_factory.mktemp("testhost"))
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture(scope="session")
def tiny_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Debian + python3 + launcher's in-container runtime + the tiny recipes: seconds to build."""
    _need_host_tools()
    ctx = tmp_path_factory.mktemp("tiny-image")
    (ctx / "launcher").mkdir()
    shutil.copy(REPO / "launcher" / "__init__.py", ctx / "launcher" / "__init__.py")
    shutil.copytree(
        REPO / "launcher" / "runtime",
        ctx / "launcher" / "runtime",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copytree(TINY_RECIPES, ctx / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    base = th.base_image()
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\n"
        "RUN ln -sf /usr/bin/python3 /usr/local/bin/python\n"
        "ENV PYTHONPATH=/opt/launcher PYTHONDONTWRITEBYTECODE=1\n"
        "COPY launcher /opt/launcher/launcher\n"
        "COPY recipes /opt/launcher/recipes\n"
    )
    tag = f"launcher-test/tiny:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True)
    image_id = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        yield {"id": image_id, "tag": tag, "base": base}
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def make_workspace(root: Path, image: dict[str, Any], variant: str = "cpu") -> Path:
    """A workspace whose build record points at image (as `launcher build` would leave it)."""
    for sub in ("lockfiles", "dockerfiles"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    if not (root / "recipes").exists():
        shutil.copytree(TINY_RECIPES, root / "recipes")
    record = {
        "image_id": image["id"],
        "tag": image["tag"],
        "labels": {
            "org.launcher.lock-sha256": "sha256:" + "0" * 64,
            "org.launcher.base-digest": "sha256:" + "1" * 64,
            "org.launcher.git-commit": "0" * 40,
            "org.launcher.git-dirty": "false",
            "org.launcher.version": "0.1.0",
        },
    }
    (root / ".launcher" / "builds").mkdir(parents=True, exist_ok=True)
    (root / ".launcher" / "builds" / f"{variant}.json").write_text(json.dumps(record))
    return root


@pytest.fixture
def tiny_workspace(tmp_path: Path, tiny_image: dict[str, Any]) -> Path:
    return make_workspace(tmp_path / "ws", tiny_image)
