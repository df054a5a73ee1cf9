"""Every subprocess launcher starts goes through this module (argv lists, never a shell)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generic, TypeVar, cast

from launcher import errors
from launcher.errors import NotFound, TimedOut, plain_text

T = TypeVar("T")


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def last_error_line(self) -> str:
        """The last line the command printed (stderr first), without terminal escapes: for messages."""
        for text in (self.err, self.out):
            lines = [ln.strip() for ln in plain_text(text).splitlines() if ln.strip()]
            if lines:
                return lines[-1]
        return f"exit status {self.returncode}"


class CommandFailed(errors.CommandFailed):
    """A local or remote command that exited non-zero, with what it printed."""

    def __init__(self, completed: Completed, message: str | None = None, hint: str | None = None) -> None:
        super().__init__(message or f"{completed.argv[0]} failed: {completed.last_error_line()}", hint)
        self.completed = completed


def merged_env(env: Mapping[str, str] | None, *, drop_prefixes: Sequence[str] = ()) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not any(k.startswith(p) for p in drop_prefixes)}
    if env:
        base.update(env)
    return base


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    input: bytes | None = None,
    stdin: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    drop_env_prefixes: Sequence[str] = (),
    cwd: Path | None = None,
    timeout: float | None = None,
    check: bool = True,
) -> Completed:
    args = tuple(os.fspath(a) for a in argv)
    try:
        cp = subprocess.run(
            args,
            input=input,
            stdin=stdin,
            capture_output=True,
            env=merged_env(env, drop_prefixes=drop_env_prefixes),
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise NotFound(f"program not found: {args[0]}", f"install {args[0]} and make sure it is on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise TimedOut(f"{args[0]} did not finish within {timeout:.0f} s",
                       "check that the service it talks to is up") from exc
    done = Completed(args, cp.returncode, cp.stdout or b"", cp.stderr or b"")
    if check and done.returncode != 0:
        raise CommandFailed(done)
    return done


def popen(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    drop_env_prefixes: Sequence[str] = (),
    cwd: Path | None = None,
    stdin: int | IO[bytes] | None = None,
    stdout: int | IO[bytes] | None = subprocess.PIPE,
    stderr: int | IO[bytes] | None = subprocess.PIPE,
) -> subprocess.Popen[bytes]:
    """Start a process for streaming (image save/load, log following)."""
    args = tuple(os.fspath(a) for a in argv)
    try:
        return subprocess.Popen(
            args, env=merged_env(env, drop_prefixes=drop_env_prefixes), cwd=cwd,
            stdin=stdin, stdout=stdout, stderr=stderr,
        )
    except FileNotFoundError as exc:
        raise NotFound(f"program not found: {args[0]}", f"install {args[0]} and make sure it is on PATH") from exc


def widen_pipe(stream: Any) -> None:
    """Give a pipe from a child 1 MiB of buffer (Linux), so bulk reads wake up less often."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), 1031, 1 << 20)  # F_SETPIPE_SZ
    except (ImportError, AttributeError, OSError, ValueError):
        pass  # not a pipe, not Linux, or a paramiko channel


class Meanwhile(Generic[T]):
    """fn(*args) on a thread of its own while the caller goes on; result() waits for it and returns its
    value or raises its error. As a context manager, leaving the block waits for it too (an error the
    caller never asked for is dropped: the block's own error, if any, is the one that counts), so no
    thread outlives the work that started it."""

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(fn, args), daemon=False)
        self._thread.start()

    def _work(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return cast(T, self._value)

    def __enter__(self) -> Meanwhile[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join()
