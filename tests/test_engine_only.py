"""One engine: engine.py is the only module that speaks to Docker (imports docker-py or builds a
docker command line); what it offers over a fake host; the host scripts are clean under shellcheck."""

from __future__ import annotations

import ast
import io
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

import launcher
from launcher.hosts import engine
from launcher.hosts.base import Host, HostProcess
from launcher.proc import Completed

PACKAGE = Path(launcher.__file__).parent
ENGINE = PACKAGE / "hosts" / "engine.py"


class FakeProcess:
    def __init__(self, out: bytes, rc: int = 0, err: str = "") -> None:
        self._in, self._out, self._rc, self._err = io.BytesIO(), io.BytesIO(out), rc, err
        self._in.close = lambda: None  # type: ignore[method-assign]  # keep what was written readable
        self.killed = False

    @property
    def stdin(self) -> io.BytesIO:
        return self._in

    @property
    def stdout(self) -> io.BytesIO:
        return self._out

    def wait(self, timeout: float | None = None) -> int:
        return self._rc

    def stderr_text(self) -> str:
        return self._err

    def kill(self) -> None:
        self.killed = True


class StartHost(Host):
    """Records each started argv and answers with one FakeProcess."""

    kind = "ssh"

    def __init__(self, process: FakeProcess) -> None:
        self.name = "fake"
        self.process = process
        self.started: list[list[str]] = []
        self.ran: list[list[str]] = []

    def run(self, argv: Sequence[str], *, input: bytes | None = None, check: bool = True,
            timeout: float | None = None) -> Completed:
        self.ran.append(list(argv))
        return Completed(tuple(argv), 0, b"launcher-python 3.11\n", b"")

    def start(self, argv: Sequence[str], *, bulk: bool = False, merge_stderr: bool = False) -> HostProcess:
        self.started.append(list(argv))
        return self.process

    def put_file(self, local: Path, remote: str) -> None:
        raise NotImplementedError

    def get_file(self, remote: str, local: Path) -> None:
        raise NotImplementedError

    def home(self) -> str:
        return "/home/fake"

    def runs_root(self) -> str:
        return "/home/fake/.launcher/runs"


def test_import_tar_streams_the_tarball_and_answers_the_id(tmp_path: Path) -> None:
    tarball = tmp_path / "rootfs.tar"
    tarball.write_bytes(b"x" * 3_000_000)
    host = StartHost(FakeProcess(b"sha256:abc\n"))
    done = engine.Engine(host).import_tar(tarball, "127.0.0.1:5000/base:bookworm", changes=['CMD ["python3"]'])
    assert host.started == [["docker", "import", "--change", 'CMD ["python3"]', "-", "127.0.0.1:5000/base:bookworm"]]
    assert host.process.stdin.getvalue() == tarball.read_bytes()
    assert done.returncode == 0 and done.out.strip() == "sha256:abc"


def test_import_tar_failure_is_its_exit_code_and_words(tmp_path: Path) -> None:
    tarball = tmp_path / "rootfs.tar"
    tarball.write_bytes(b"")
    done = engine.Engine(StartHost(FakeProcess(b"", 1, "no space left\n"))).import_tar(tarball, "t:1")
    assert done.returncode == 1 and done.last_error_line() == "no space left"


def test_run_to_end_is_a_named_rm_container() -> None:
    host = StartHost(FakeProcess(b""))
    engine.Engine(host).run_to_end(["--network", "none", "img", "python3", "-c", "pass"])
    argv = host.ran[0]
    assert argv[:4] == ["docker", "run", "--rm", "--name"] and argv[4].startswith("launcher-tool-")
    assert argv[5:] == ["--network", "none", "img", "python3", "-c", "pass"]


def test_installed_follows_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not engine.installed()
    (tmp_path / "docker").write_text("#!/bin/sh\n")
    (tmp_path / "docker").chmod(0o755)
    assert engine.installed()


# ------------------------------------------------------------ the rule, checked on the package

def _python_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != ENGINE)


def test_only_engine_imports_docker() -> None:
    offenders = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "docker" or n.startswith("docker.") for n in names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], "only launcher/hosts/engine.py may import docker"
