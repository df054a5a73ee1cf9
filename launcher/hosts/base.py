"""The Host interface: run argv, stream a process, move files, list a directory with hashes.

Two implementations: :class:`launcher.hosts.local.LocalHost` (the local Docker engine, no
SSH) and :class:`launcher.hosts.ssh.SSHHost` (paramiko for control, the OpenSSH client for
bulk data where it is installed). Commands are always argv lists; the SSH host quotes them
in one place.
"""

from __future__ import annotations

import json
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NotRequired, Protocol, TypedDict

from launcher.errors import TransferCut
from launcher.hosts.scripts import text as host_script
from launcher.proc import CommandFailed, Completed, widen_pipe


def write_atomic_argv(path: str, *, private: bool = False) -> list[str]:
    """A command that writes its stdin to path whole or not at all: into PATH.part, then renamed
    over path (its folder made first); private=True: readable by the user alone."""
    return ["sh", "-c", host_script("write_atomic.sh"), "sh", "1" if private else "0", path]


class ListedEntry(TypedDict):
    """One line of hosts/scripts/listdir.py's output (JSON): an entry under the listed directory."""

    path: str
    kind: str
    size: NotRequired[int]
    mtime_ns: NotRequired[int]
    sha256: NotRequired[str]
    target: NotRequired[str]


class HostDescription(TypedDict):
    """A host as launch.json's ``host`` and a fact sheet's ``host`` name it (``Host.describe``);
    an SSH host adds where it is."""

    name: str
    kind: str
    hostname: NotRequired[str]
    user: NotRequired[str]
    port: NotRequired[int]


@dataclass(frozen=True)
class RemoteEntry:
    path: str
    kind: str  # file | dir | symlink | other
    size: int = 0
    mtime_ns: int = 0
    sha256: str | None = None
    target: str | None = None

    @classmethod
    def from_json(cls, rec: ListedEntry) -> RemoteEntry:
        return cls(
            path=str(rec["path"]),
            kind=str(rec["kind"]),
            size=int(rec.get("size", 0)),
            mtime_ns=int(rec.get("mtime_ns", 0)),
            sha256=rec.get("sha256"),
            target=rec.get("target"),
        )


def parse_listing(text: str) -> list[RemoteEntry]:
    return [RemoteEntry.from_json(json.loads(line)) for line in text.splitlines() if line.strip()]


class HostProcess(Protocol):
    """A command running on a host with its stdin and stdout as byte streams."""

    @property
    def stdin(self) -> IO[bytes]: ...

    @property
    def stdout(self) -> IO[bytes]: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def stderr_text(self) -> str: ...

    def kill(self) -> None: ...


class PopenProcess:
    """A HostProcess backed by a local subprocess (the local engine, or the OpenSSH client)."""

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


class Host(ABC):
    name: str
    kind: str
    python: str = "python3"
    # what a byte stream to or from the host raises when it is cut (a broken pipe, a dropped
    # connection, a stream ending early); hosts add their transport's own errors
    stream_errors: tuple[type[BaseException], ...] = (OSError, EOFError)

    @abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> Completed:
        """Run argv on the host and wait for it."""

    @abstractmethod
    def start(self, argv: Sequence[str], *, bulk: bool = False, merge_stderr: bool = False) -> HostProcess:
        """Start argv on the host with piped stdin/stdout; bulk=True picks the fastest data path."""

    @abstractmethod
    def put_file(self, local: Path, remote: str) -> None:
        """Copy a local file to a path on the host."""

    @abstractmethod
    def get_file(self, remote: str, local: Path) -> None:
        """Copy a file on the host to a local path (not verified: see launcher.transfers.pull)."""

    @abstractmethod
    def home(self) -> str:
        """The absolute home directory of the user on the host."""

    @abstractmethod
    def runs_root(self) -> str:
        """The directory on the host holding one directory per run."""

    def run_dir(self, run_id: str) -> str:
        return f"{self.runs_root()}/{run_id}"

    def area(self, *names: str) -> str:
        """A path in launcher's own folder on the host, the one holding the runs root (~/.launcher
        on an SSH host): area("data") is where datasets go; no names, that folder itself. Nothing
        is created: callers make what they write into (write_atomic makes a file's folder)."""
        return "/".join([self.runs_root().rsplit("/", 1)[0], *names])

    def write_atomic(self, path: str, data: bytes, *, private: bool = False) -> None:
        """Write data to path on the host whole or not at all (into PATH.part, then renamed over
        path), making its folder if missing; private=True: readable by the user alone."""
        self.run(write_atomic_argv(path, private=private), input=data)

    @contextmanager
    def receive_stream(self, argv: Sequence[str], *, cut: str | Callable[[], str], hint: str) -> Iterator[HostProcess]:
        """Start argv on the host over its bulk path; the block writes a byte stream into its stdin
        (and may then wait for it). A cut stream kills the command and raises TransferCut
        "CUT: WHY" (WHY: what the command said on stderr, else the error); cut may be a function,
        asked when the cut happens (e.g. to say how much had been sent)."""
        with self._stream(argv, cut, hint) as p:
            widen_pipe(p.stdin)
            yield p

    @contextmanager
    def send_stream(self, argv: Sequence[str], *, cut: str | Callable[[], str], hint: str) -> Iterator[HostProcess]:
        """Start argv on the host over its bulk path; the block reads the byte stream it writes to
        its stdout. A cut stream is mapped as by receive_stream."""
        with self._stream(argv, cut, hint) as p:
            widen_pipe(p.stdout)
            yield p

    @contextmanager
    def _stream(self, argv: Sequence[str], cut: str | Callable[[], str], hint: str) -> Iterator[HostProcess]:
        """The one mapping of a cut stream to TransferCut; any other failure of the block also ends
        the command on the host (nothing is left writing or waiting there)."""
        p = self.start(argv, bulk=True)
        try:
            yield p
        except self.stream_errors as exc:
            p.kill()
            what = cut() if callable(cut) else cut
            raise TransferCut(f"{what}: {p.stderr_text().strip() or exc}", hint) from None
        except BaseException:
            p.kill()
            raise

    def close(self) -> None:  # noqa: B027 - most hosts hold nothing to release
        pass

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> HostDescription:
        return {"name": self.name, "kind": self.kind}

    def check(self, argv: Sequence[str], *, input: bytes | None = None, timeout: float | None = None) -> str:
        return self.run(argv, input=input, timeout=timeout).out

    def list_dir(self, remote_dir: str, *, hashes: bool = True) -> list[RemoteEntry]:
        """Every entry under remote_dir (lstat, never following links), files hashed on the host."""
        done = self.run([self.python, "-c", host_script("listdir.py"), remote_dir, "1" if hashes else "0"], check=False)
        if done.returncode == 3:
            return []
        if done.returncode != 0:
            raise CommandFailed(done, f"could not list {remote_dir} on {self.name}: {done.last_error_line()}")
        return parse_listing(done.out)

    def fact_sheet(self) -> Completed:
        """hosts/scripts/facts.sh run on the host: its key=value lines, as provision.parse_facts reads them."""
        return self.run(["sh", "-c", host_script("facts.sh")], check=False)

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], check=False).returncode == 0

    def read_text(self, path: str) -> str | None:
        done = self.run(["cat", path], check=False)
        return done.out if done.returncode == 0 else None

    def makedirs(self, path: str) -> None:
        self.run(["mkdir", "-p", path])

    def owner(self) -> str | None:
        """"UID:GID" of the user on the host: a run hands its outputs to them (containers write
        as root). None when it cannot be told."""
        if not hasattr(self, "_owner"):
            done = self.run(["sh", "-c", "echo $(id -u):$(id -g)"], check=False)
            text = done.out.strip()
            ok = done.returncode == 0 and text.count(":") == 1 and text.replace(":", "").isdigit()
            self._owner: str | None = text if ok else None
        return self._owner

    def free_bytes(self, path: str) -> int:
        """Free space on the filesystem holding path (its nearest existing parent)."""
        out = self.run(["df", "-Pk", path]).out.splitlines()
        return int(out[-1].split()[3]) * 1024

    @contextmanager
    def exclusive(self, name: str) -> Iterator[None]:
        """Hold a lock named `name` on this host (flock on ~/.launcher/locks/NAME) while the block runs:
        launcher processes on several machines, or several on one, take turns. A host without flock
        runs the block unlocked."""
        path = self.area("locks", name)
        script = 'mkdir -p "$(dirname "$1")" && exec flock -x "$1" sh -c "echo locked; exec cat >/dev/null"'
        proc = self.start(["sh", "-c", script, "sh", path])
        try:
            proc.stdout.readline()  # "locked" once held; nothing if flock is missing (then unlocked)
            yield
        finally:
            try:
                proc.stdin.close()  # cat ends, flock lets go
                proc.wait(timeout=10)
            except Exception:  # a lost connection or a stuck process: the host drops the lock itself
                proc.kill()

    def can_reverse_tunnel(self) -> bool:
        return False

    def reverse_tunnel(self, remote_port: int, local_address: str, argv: Sequence[str]) -> Completed:
        """Run argv on the host while its 127.0.0.1:remote_port reaches local_address ("HOST:PORT")
        here; a returncode of 255 with "forwarding" in stderr means the port was taken."""
        raise NotImplementedError(f"{self.kind} hosts have no reverse tunnel")

    def iter_lines(self, argv: Sequence[str]) -> Iterator[str]:
        proc = self.start(argv, merge_stderr=True)
        proc.stdin.close()
        try:
            for raw in iter(proc.stdout.readline, b""):
                yield raw.decode("utf-8", "replace")
        finally:
            proc.kill()
            proc.wait()
