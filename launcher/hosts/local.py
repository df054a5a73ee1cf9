"""The local Docker engine as a host: no SSH, subprocesses through launcher.proc."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from launcher import proc
from launcher.errors import NotFound
from launcher.hashing import atomic_path
from launcher.hosts.base import Host, ListedEntry, PopenProcess, RemoteEntry
from launcher.proc import Completed


def _failed(argv: tuple[str, ...], exc: OSError) -> proc.CommandFailed:
    """What the command argv's failure raises on any host, for the same work done in this process."""
    return proc.CommandFailed(Completed(argv, 1, b"", f"{argv[0]}: {exc}".encode()))


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
            return proc.run(self._argv(argv), input=input, check=check, timeout=timeout)
        except NotFound:
            if check:
                raise
            # what a remote shell answers for a missing program, so callers treat both hosts alike
            return Completed(tuple(argv), 127, b"", f"{argv[0]}: command not found\n".encode())

    def start(self, argv: Sequence[str], *, bulk: bool = False, merge_stderr: bool = False) -> PopenProcess:
        return PopenProcess(
            proc.popen(
                self._argv(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            )
        )

    def _argv(self, argv: Sequence[str]) -> list[str]:
        """argv, a host script (`python -c SCRIPT`, stdlib only) run isolated and without site-packages: this
        interpreter then starts in a tenth of the time (no .pth files, no editable installs' finders to load)."""
        if len(argv) > 1 and argv[0] == self.python and argv[1] == "-c":
            return [self.python, "-I", "-S", *argv[1:]]
        return list(argv)

    def put_file(self, local: Path, remote: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, remote)

    def get_file(self, remote: str, local: Path) -> None:
        shutil.copyfile(remote, local)

    def write_atomic(self, path: str, data: bytes, *, private: bool = False) -> None:
        with atomic_path(Path(path)) as tmp:
            if private:
                tmp.chmod(0o600)
            tmp.write_bytes(data)

    def list_dir(self, remote_dir: str, *, hashes: bool = True) -> list[RemoteEntry]:
        """As on any host, by the same listdir.py, called in this process: no interpreter to start."""
        from launcher.hosts.scripts import listdir

        if not os.path.isdir(remote_dir):
            return []
        try:
            return [RemoteEntry.from_json(cast(ListedEntry, rec)) for rec in listdir.entries(remote_dir, hashes)]
        except OSError as exc:  # as the script's failure reads on any host
            done = Completed(("listdir.py", remote_dir), 1, b"", f"{type(exc).__name__}: {exc}".encode())
            why = done.last_error_line()
            raise proc.CommandFailed(done, f"could not list {remote_dir} on {self.name}: {why}") from None

    def makedirs(self, path: str) -> None:
        """As `mkdir -p` on any host, in this process (its failure a CommandFailed as there)."""
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise _failed(("mkdir", "-p", path), exc) from None

    def free_bytes(self, path: str) -> int:
        """As `df -Pk` answers on any host (the space available to the user, in whole KiB), in this process."""
        try:
            return shutil.disk_usage(path).free // 1024 * 1024
        except OSError as exc:
            raise _failed(("df", "-Pk", path), exc) from None

    def exists(self, path: str) -> bool:
        """As `test -e` on any host (a link by what it points to), in this process."""
        return os.path.exists(path)

    def owner(self) -> str | None:
        """"UID:GID" of this process's user, as `id -u`, `id -g` say it on any host."""
        return f"{os.getuid()}:{os.getgid()}"

    def home(self) -> str:
        return str(Path.home())

    def runs_root(self) -> str:
        return str(self._root)
