"""Issue 13, item 3's acceptance: a lock for a base image whose Python differs from this host's.

A base is bootstrapped from Debian trixie (CPython 3.13; bookworm's 3.11 if this host ran 3.13)
with the product's own `launcher base bootstrap --suite`, pushed to the test registry and so
pinned by a real digest. `launcher lock` resolves a small set (pure-Python packages, one with a
Python-version marker, one binary wheel) from this host; `launcher build` downloads the wheels
on the host and installs them offline with `--require-hashes` into that base; `pip freeze` in the
image equals the lock, and the binary wheel installed is the image's ABI, not the host's.

From nothing this takes about 1.5 minutes on 2 cores (debootstrap about 50 s); the rootfs, the
wheels and the built image are cached by content on this machine, so a repeat takes about 30 s.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from typer.testing import CliRunner

from launcher.cli import app
from launcher.images import bootstrap as bootstrap_mod
from launcher.images import registry
from launcher.images.lock import normalize_name, parse_lock
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace, default_cache_dir

runner = CliRunner()
pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.network]

HOST_PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
SUITE = "trixie" if HOST_PY != "3.13" else "bookworm"
IMAGE_PY = {"trixie": "3.13", "bookworm": "3.11"}[SUITE]  # Debian's python3; bootstrap asks the image
OLD_PY = tuple(map(int, IMAGE_PY.split("."))) < (3, 12)  # backports.tarfile is needed below 3.12
# Pinned, so that the lock (and with it the build, cached by content) is the same every run.
# jaraco.context needs backports.tarfile only below Python 3.12: a lock resolved by this host's
# 3.11 lists it, one resolved by the image's 3.13 must not. MarkupSafe is a compiled wheel per ABI.
REQUIREMENTS = """\
six==1.17.0
attrs==26.1.0
jaraco.context==6.1.2
markupsafe==3.0.4
pip==26.3
setuptools==84.2.1
"""
# What the image reports about itself: its Python, the binary wheel's tags and extension module.
PROBE = """\
import importlib.metadata as m, json, platform, markupsafe._speedups as s
wheel = m.distribution("markupsafe").read_text("WHEEL") or ""
print(json.dumps({"python": platform.python_version(), "speedups": s.__file__,
                  "tags": [ln.split(":", 1)[1].strip() for ln in wheel.splitlines() if ln.startswith("Tag:")]}))
"""


def cli(ws: Workspace, *argv: str) -> dict[str, Any]:
    res = runner.invoke(app, ["-w", str(ws.root), "--json", *argv])
    assert res.exit_code == 0, res.output
    data: dict[str, Any] = json.loads(res.stdout)["data"]
    return data


def docker_run(image: str, *argv: str) -> str:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", image, *argv], check=True,
                          capture_output=True, text=True).stdout


def test_lock_for_a_base_whose_python_differs_installs_offline_and_freezes_equal(
        tmp_path: Path, registry_addr: str) -> None:
    assert IMAGE_PY != HOST_PY
    rootfs = default_cache_dir() / "bootstrap" / (
        f"{SUITE}-{bootstrap_mod.rootfs_key(SUITE, bootstrap_mod.BASE_PACKAGES, bootstrap_mod.DEFAULT_MIRROR)}.tar")
    need(rootfs.is_file() or shutil.which("debootstrap") is not None,
         f"bootstrapping a {SUITE} base needs debootstrap (apt-get install debootstrap)")
    # The root's name is the image tag's: the same inputs find the same cached build next time.
    init_workspace(tmp_path / "foreign-python")
    ws = Workspace.at(tmp_path / "foreign-python")
    ws.lock_in("cpu").write_text(REQUIREMENTS)
    ws.lock_txt("cpu").unlink(missing_ok=True)  # the scaffold's TensorFlow lock is no preference here

    base = cli(ws, "base", "bootstrap", "--suite", SUITE, "--variant", "cpu", "--registry", registry_addr)
    assert base["python"] == IMAGE_PY and base["variants"] == ["cpu"]
    assert base["ref"] == f"{registry_addr}/launcher-base:{SUITE}@{base['digest']}"
    assert registry.resolve_digest(f"{registry_addr}/launcher-base:{SUITE}") == base["digest"]  # a real digest
    pinned = (ws.images_lock.read_text().split("[cpu]", 1)[1].split("\n\n", 1)[0])
    assert f'ref = "{base["ref"]}"' in pinned and f'python = "{IMAGE_PY}"' in pinned

    locked = cli(ws, "lock", "--variant", "cpu")["locks"][0]
    text = ws.lock_txt("cpu").read_text()
    head = text.splitlines()[:3]
    assert re.fullmatch(rf"# resolved inside the base image by CPython {re.escape(IMAGE_PY)}\.\d+ on linux/amd64 "
                        r"\(pip-tools [\d.]+\)", head[1]), head
    assert head[2] == f"# base: {base['ref']}"
    assert locked["target"].startswith(f"CPython {IMAGE_PY}.") and locked["base"] == base["ref"]
    reqs = {r.name: r for r in parse_lock(text)}
    wanted = {normalize_name(line.split("==")[0]) for line in REQUIREMENTS.split()}
    # resolved for the image's Python, not this host's: the marker dependency follows the image
    assert ("backports-tarfile" in reqs) == OLD_PY, sorted(reqs)
    assert set(reqs) == wanted | ({"backports-tarfile"} if OLD_PY else set())

    # The product's build: wheels downloaded on the host for the pinned base's Python and platform,
    # installed offline and hash-checked by the Dockerfile that `launcher init` writes.
    dockerfile = ws.dockerfile("cpu").read_text()
    assert "--no-index" in dockerfile and "--require-hashes" in dockerfile
    built = cli(ws, "build", "--variant", "cpu")
    assert built["base"] == base["ref"]

    frozen = docker_run(built["tag"], "/opt/venv/bin/python", "-m", "pip", "freeze", "--all")
    installed = {normalize_name(n): v for n, _, v in (ln.partition("==") for ln in frozen.split()) if v}
    assert installed == {name: r.version for name, r in reqs.items()}

    probe = json.loads(docker_run(built["tag"], "/opt/venv/bin/python", "-c", PROBE))
    abi = "cp" + IMAGE_PY.replace(".", "")
    assert probe["python"].startswith(IMAGE_PY + ".")
    assert probe["tags"] and all(t.startswith(f"{abi}-{abi}-manylinux") for t in probe["tags"]), probe
    assert probe["speedups"].endswith(f".cpython-{abi[2:]}-x86_64-linux-gnu.so"), probe
