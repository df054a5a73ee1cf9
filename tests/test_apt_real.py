"""OS packages for real: a project declaring `jq` (which pulls libjq1 and libonig5) locked by apt inside
the bootstrapped Debian base against Debian's archive, the .debs fetched into a scratch cache and checked
against the archive's Packages index sha256, unpacked without maintainer scripts, and jq run in the base
with nothing but those files added (no ldconfig). A corrupted cached .deb is refused with exit 13."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.images import aptlock, debs
from launcher.workspace import Workspace

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.network]
runner = CliRunner()


@pytest.fixture(scope="module")
def locked(make_workspace: Callable[..., Workspace], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("apt")
    ws = make_workspace(root / "ws", recipes=False)
    project = root / "myproj"
    project.mkdir()
    (project / "train.py").write_text("print('hello')\n")
    (project / "launcher.toml").write_text('[system]\napt = ["jq"]\n')
    env = {"LAUNCHER_CACHE": str(root / "cache")}
    res = runner.invoke(app, ["-w", str(ws.root), "--json", "lock", str(project)], env=env)
    if res.exit_code == ExitCode.LOCK_FAILED and "could not reach its sources" in res.output:
        need(False, f"Debian's archive cannot be reached from a container: {res.output.strip()[-300:]}")
    assert res.exit_code == 0, res.output
    return {"ws": ws, "project": project, "env": env, "cache": root / "cache", "data": json.loads(res.stdout)["data"]}


def test_lock_lists_jq_and_its_libraries_with_version_and_index_sha256(locked: dict[str, Any]) -> None:
    system = locked["data"]["system"]
    names = [p["name"] for p in system["packages"]]
    assert names == ["jq", "libjq1", "libonig5"]
    lock = aptlock.read(locked["project"] / "system.lock")
    assert lock.requested == ("jq",) and lock.codename == "bookworm" and lock.architecture == "amd64"
    assert lock.base == locked["data"]["system"]["base"] and lock.base_digest.startswith("sha256:")
    assert lock.base_links.get("lib") == "usr/lib"
    text = (locked["project"] / "system.lock").read_text()
    for p in lock.packages:
        assert p.version and p.url.startswith("http://") and p.size > 0
        assert f'version = "{p.version}"' in text and f'sha256 = "{p.sha256}"' in text
    assert system["sha256"] == aptlock.lock_sha256(locked["project"] / "system.lock")
    assert system["packages"] == lock.records()


def test_the_debs_are_cached_and_match_the_lock(locked: dict[str, Any]) -> None:
    lock = aptlock.read(locked["project"] / "system.lock")
    paths = [Path(p) for p in locked["data"]["system"]["debs"]]
    assert paths == [debs.cache_path(locked["cache"], p.sha256) for p in lock.packages]
    for path, p in zip(paths, lock.packages, strict=True):
        assert "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() == p.sha256
        assert path.stat().st_size == p.size


def test_locking_again_changes_nothing(locked: dict[str, Any]) -> None:
    before = (locked["project"] / "system.lock").read_bytes()
    res = runner.invoke(app, ["-w", str(locked["ws"].root), "--json", "lock", str(locked["project"])],
                        env=locked["env"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["data"]["system"]["changed"] is False
    assert (locked["project"] / "system.lock").read_bytes() == before


def test_unpacked_files_make_jq_run_in_the_base(locked: dict[str, Any], base_ref: str, tmp_path: Path) -> None:
    lock = aptlock.read(locked["project"] / "system.lock")
    out = debs.unpack_lock(lock, locked["cache"], tmp_path / "layer")
    paths = {e.path for e in out.entries}
    assert {"usr/bin/jq", "usr/lib/x86_64-linux-gnu/libjq.so.1", "usr/lib/x86_64-linux-gnu/libonig.so.5"} <= paths
    assert not (tmp_path / "layer" / "lib").exists() and not (tmp_path / "layer" / "var/lib/dpkg").exists()
    assert os.access(tmp_path / "layer/usr/bin/jq", os.X_OK)
    done = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{tmp_path / 'layer'}:/layer:ro",
                           base_ref, "sh", "-c", "cp -a /layer/. / && echo '{\"a\": [1, 2]}' | jq -c .a"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "[1,2]", done.stderr


def test_a_corrupted_cached_deb_is_refused_with_exit_13(locked: dict[str, Any]) -> None:
    lock = aptlock.read(locked["project"] / "system.lock")
    cached = debs.cache_path(locked["cache"], lock.packages[0].sha256)
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cached.write_bytes(bytes(data))
    res = runner.invoke(app, ["-w", str(locked["ws"].root), "lock", str(locked["project"])], env=locked["env"])
    assert res.exit_code == ExitCode.CORRUPT == 13, res.output
    assert f"the cached {lock.packages[0].filename}" in res.output and "does not match system.lock" in res.output
    assert not cached.exists()  # moved aside: nothing left looking complete
    res = runner.invoke(app, ["-w", str(locked["ws"].root), "lock", str(locked["project"])], env=locked["env"])
    assert res.exit_code == 0, res.output  # downloaded afresh and verified
    assert "sha256:" + hashlib.sha256(cached.read_bytes()).hexdigest() == lock.packages[0].sha256
