"""The local Docker engine as a host: no SSH, subprocesses through launcher.proc."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from launcher import proc
from launcher.errors import NotFound
from launcher.hosts.base import Host
from launcher.proc import Completed


class LocalProcess:
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._p = popen

    @property
    def stdin(self) -> IO[bytes]:
        assert self._p.stdin is not None
        return self._p.stdin

    @property
    def stdout(self) -> IO[bytes]:
        assert self._p.stdout is not None
        return self._p.stdout

    def wait(self, timeout: float | None = None) -> int:
        return self._p.wait(timeout)

    def stderr_text(self) -> str:
        if self._p.stderr is None:
            return ""
        try:
            return self._p.stderr.read().decode("utf-8", "replace")
        except ValueError:
            return ""

    def kill(self) -> None:
        if self._p.poll() is None:
            self._p.kill()


class LocalHost(Host):
    kind = "local"

    def __init__(self, workspace_root: Path | None = None) -> None:
        self.name = "local"
        self.python = sys.executable
        self._root = (workspace_root or Path.cwd()) / ".launcher" / "host-runs"

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> Completed:
        try:
            return proc.run(list(argv), input=input, check=check, timeout=timeout)
        except NotFound:
            if check:
                raise
            # what a remote shell answers for a missing program, so callers treat both hosts alike
            return Completed(tuple(argv), 127, b"", f"{argv[0]}: command not found\n".encode())

    def start(self, argv: Sequence[str], *, bulk: bool = False, merge_stderr: bool = False) -> LocalProcess:
        return LocalProcess(
            proc.popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            )
        )

    def put_file(self, local: Path, remote: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, remote)

    def get_file(self, remote: str, local: Path) -> None:
        shutil.copyfile(remote, local)

    def home(self) -> str:
        return str(Path.home())

    def runs_root(self) -> str:
        return str(self._root)
