"""Wheels from folders and indexes that cannot be reached: what a lock lets in, offline."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import BuildFailed, ExitCode
from launcher.images import wheels
from launcher.images import wheelsources as sources
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace

TAGS = wheels.platform_tags("3.11", "linux/amd64")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed once the socket is


def fake_wheel(folder: Path, filename: str, payload: bytes = b"x") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / filename).write_bytes(payload)
    return hashlib.sha256(payload).hexdigest()


def test_index_options_and_the_unreachable_ones(tmp_path: Path) -> None:
    port = closed_port()
    text = (f"--extra-index-url https://127.0.0.1:{port}/whl/cpu\n-i {tmp_path.as_uri()}\n"
            "--index-url=https://pypi.org/simple\nsix==1.17.0\n")
    assert sources.index_options(text) == [("--extra-index-url", f"https://127.0.0.1:{port}/whl/cpu"),
                                           ("--index-url", tmp_path.as_uri()),
                                           ("--index-url", "https://pypi.org/simple")]
    assert sources.reachable(tmp_path.as_uri()) and not sources.reachable((tmp_path / "no").as_uri())
    kept, dropped = sources.split_indexes(text.replace("--index-url=https://pypi.org/simple\n", ""))
    assert dropped == [f"https://127.0.0.1:{port}/whl/cpu"]
    assert kept == f"-i {tmp_path.as_uri()}\nsix==1.17.0\n"
    kept, dropped = sources.split_indexes(f"--index-url https://127.0.0.1:{port}/simple\nsix==1.17.0\n")
    assert kept == "--no-index\nsix==1.17.0\n"  # PyPI is not asked in place of an index the lock names
    assert "cannot be reached" in sources.unreachable_hint(dropped) and sources.unreachable_hint([]) == ""


@pytest.mark.parametrize(("name", "ok"), [
    ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", True),
    ("six-1.17.0-py2.py3-none-any.whl", True),
    ("cryptography-46.0.0-cp39-abi3-manylinux_2_34_x86_64.whl", True),
    ("cryptography-46.0.0-cp312-abi3-manylinux_2_34_x86_64.whl", False),  # abi3 from 3.12 on
    ("numpy-2.4.6-cp313-cp313-manylinux_2_28_x86_64.whl", False),
    ("numpy-2.4.6-cp311-cp311-manylinux_2_28_aarch64.whl", False),
    ("numpy-2.4.6-cp311-cp311-win_amd64.whl", False),
    ("numpy-2.4.6-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("not-a-wheel.tar.gz", False),
])
def test_a_folders_wheel_must_fit_the_images_python_and_platform(name: str, ok: bool) -> None:
    assert wheels.fits(name, "3.11", TAGS) is ok


def test_the_lock_decides_which_local_wheels_count(tmp_path: Path) -> None:
    good = fake_wheel(tmp_path / "a", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", b"right")
    fake_wheel(tmp_path / "b", "six-1.17.0-py2.py3-none-any.whl", b"tampered")
    fake_wheel(tmp_path / "b", "attrs-25.0.0-py3-none-any.whl", b"older")
    wanted = {"torch": ("2.13.0+cpu", (good,)), "six": ("1.17.0", ("0" * 64,)), "attrs": ("26.1.0", ("1" * 64,))}
    found = wheels.find_local(wanted, [tmp_path / "a", tmp_path / "b"], "3.11", TAGS)
    assert found == {"torch": tmp_path / "a" / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"}


def test_a_lock_served_wholly_from_a_folder_needs_no_network(tmp_path: Path) -> None:
    a = fake_wheel(tmp_path / "folder", "alpha-1.0-py3-none-any.whl", b"alpha")
    b = fake_wheel(tmp_path / "folder", "beta_pkg-2.0-cp311-cp311-manylinux_2_28_x86_64.whl", b"beta")
    lock = tmp_path / "v.txt"
    lock.write_text(f"--index-url https://127.0.0.1:{closed_port()}/simple\n"
                    f"alpha==1.0 \\\n    --hash=sha256:{a}\nbeta-pkg==2.0 --hash=sha256:{b}\n")
    house = wheels.download(lock, tmp_path / "pool", python="3.11", platform="linux/amd64",
                            find_links=[tmp_path / "folder"])
    assert sorted(p.name for p in house.files.values()) == ["alpha-1.0-py3-none-any.whl",
                                                            "beta_pkg-2.0-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert all(p.parent == tmp_path / "pool" for p in house.files.values())
    # the next build finds them in the pool, folder or not
    (tmp_path / "folder" / "alpha-1.0-py3-none-any.whl").unlink()
    again = wheels.download(lock, tmp_path / "pool", python="3.11", platform="linux/amd64")
    assert set(again.files) == {"alpha", "beta-pkg"}
    # a pool file whose bytes changed no longer counts: pip is asked for it, offline (the lock's only
    # index cannot be reached, and PyPI is not tried in its place)
    (tmp_path / "pool" / "alpha-1.0-py3-none-any.whl").write_bytes(b"changed")
    with pytest.raises(BuildFailed, match=r"alpha==1\.0") as info:
        wheels.download(lock, tmp_path / "pool", python="3.11", platform="linux/amd64")
    assert "cannot be reached from this machine" in info.value.message


def test_find_links_must_be_a_folder(tmp_path: Path) -> None:
    init_workspace(tmp_path / "ws")
    res = CliRunner().invoke(app, ["-w", str(tmp_path / "ws"), "--json", "build", "--variant", "cpu",
                                   "--find-links", str(tmp_path / "nowhere")])
    assert res.exit_code == ExitCode.USAGE, res.output
    assert "no such folder" in json.loads(res.stdout)["data"]["error"]


def test_a_torch_recipe_in_an_image_without_torch_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    init_workspace(tmp_path / "ws", from_workspace=Workspace.at(repo))
    exe = Path(sys.executable).with_name("launcher")  # the entry point installed beside the running Python
    res = subprocess.run([str(exe), "-w", str(tmp_path / "ws"), "run", "mnist_torch", "--variant", "cpu"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "mnist_torch uses torch, which the cpu image does not have" in res.stderr
    assert "--variant torch-cpu" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "ws" / "runs").exists() and not (tmp_path / "ws" / ".launcher" / "builds").exists()
