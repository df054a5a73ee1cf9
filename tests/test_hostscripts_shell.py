"""The shell scripts launcher sends to hosts (launcher/hosts/scripts/*.sh, launcher/vms/setup.sh): clean
under shellcheck, and what they do, run here with stand-ins for docker and enroot first on PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import launcher
from launcher.hosts.scripts import text as host_script

PACKAGE = Path(launcher.__file__).parent


def test_shell_scripts_are_clean_under_shellcheck() -> None:
    scripts = sorted(PACKAGE.rglob("*.sh"))
    assert scripts, "no shell scripts found in the package"
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian: apt-get install shellcheck; scripts/setup.sh does)")
    done = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _stand_in(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + body)
    (bin_dir / name).chmod(0o755)


def _sh(script: str, *args: str, bin_dir: Path, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["sh", "-c", host_script(script), "sh", *args], input=input, env=env,
                          capture_output=True, check=False)


def test_the_node_probe_reports_docker_runtimes_enroot_and_the_registry(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "docker", 'echo "docker=24.0.7 runtimes=io.containerd.runc.v2,nvidia,runc,"\n')
    _stand_in(bin_dir, "enroot", "exit 0\n")
    done = _sh("node_probe.sh", bin_dir=bin_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == ["docker=24.0.7", "runtimes=io.containerd.runc.v2,nvidia,runc,",
                                            "enroot=1"]
    # a port nothing listens on (the probe only talks to the registry address it is given: loopback here)
    done = _sh("node_probe.sh", "127.0.0.1", "9", bin_dir=bin_dir)
    assert done.stdout.decode().split()[-1] == "registry=0"


def test_the_node_probe_without_docker_says_so(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1\n")
    out = _sh("node_probe.sh", bin_dir=bin_dir).stdout.decode().split()
    assert out[0] == "docker=" and "registry=0" not in out and "registry=1" not in out


def test_the_staged_load_feeds_docker_load_one_archive_with_empty_layers(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "001.tar.gz").write_bytes(b"layer one")
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "docker", f'[ "$*" = "load -q" ] || exit 9\ncat > {tmp_path}/loaded.tar\necho Loaded\n')
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [], "Layers": ["000.empty", "001.tar.gz"]}])
    done = _sh("stage_load.sh", str(stage), "000.empty", manifest, "000.empty 001.tar.gz", bin_dir=bin_dir,
               input=b'{"config": 1}')
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(["tar", "-tvf", str(tmp_path / "loaded.tar")], capture_output=True, text=True,
                            check=True).stdout.split("\n")
    names = [line.split()[-1] for line in listed if line]
    assert names == ["config.json", "manifest.json", "000.empty", "001.tar.gz"]
    assert (stage / "config.json").read_bytes() == b'{"config": 1}'
    assert json.loads((stage / "manifest.json").read_text())[0]["Layers"] == ["000.empty", "001.tar.gz"]
    assert (stage / "000.empty").stat().st_size == 0


def test_dockerd_wait_gives_up_saying_how_the_log_ends(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "docker", "exit 1\n")
    _stand_in(bin_dir, "sleep", "exit 0\n")
    log = tmp_path / "dockerd.log"
    log.write_text("starting\nfailed to start daemon: no space\n")
    done = _sh("dockerd.sh", "wait", str(log), "3", bin_dir=bin_dir)
    assert done.returncode == 1
    said = done.stderr.decode().strip()
    assert said == f"Docker did not answer within 3 s; {log} ends: failed to start daemon: no space"
    _stand_in(bin_dir, "docker", "exit 0\n")
    assert _sh("dockerd.sh", "wait", str(log), "3", bin_dir=bin_dir).returncode == 0
    assert _sh("dockerd.sh", "restart", str(log), "3", bin_dir=bin_dir).returncode == 2


def test_write_atomic_writes_whole_files_in_new_folders_and_private_ones_for_the_user_alone(tmp_path: Path) -> None:
    from launcher.hosts.base import write_atomic_argv

    target = tmp_path / "new dir" / "it's.txt"
    done = subprocess.run(write_atomic_argv(str(target)), input=b"one\n", capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == b"one\n" and not (tmp_path / "new dir" / "it's.txt.part").exists()
    secret = tmp_path / "secrets" / "env"
    done = subprocess.run(write_atomic_argv(str(secret), private=True), input=b"T=1\n", capture_output=True,
                          check=False)
    assert done.returncode == 0 and secret.read_bytes() == b"T=1\n"
    assert secret.stat().st_mode & 0o077 == 0
    blocked = tmp_path / "file"
    blocked.write_text("x")
    done = subprocess.run(write_atomic_argv(str(blocked / "under a file")), input=b"x", capture_output=True,
                          check=False)
    assert done.returncode != 0
