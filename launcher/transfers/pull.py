"""Pulling a run's outputs back from its host: every file streamed, hashed on both sides, verified.

A small python3 script on the host (launcher/hosts/scripts/pull_files.py, sent as text) hashes
what it sends; the client hashes what it writes, writes under a temporary name, compares,
renames. Nothing is ever read whole into memory, and no path the host names can land outside
the run directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TypedDict, cast

from launcher.errors import CommandFailed, Corrupt, DiskFull, UnsafePath
from launcher.hashing import CHUNK, atomic_write_json, sha256_file
from launcher.hosts.base import Host, RemoteEntry
from launcher.hosts.scripts import text as host_script
from launcher.progress import NullReporter, Reporter
from launcher.records.records import PulledFile, PullSummary
from launcher.records.rundir import RunDir
from launcher.specs.container import CONTAINER_CODE, CONTAINER_DATA

# Runs on the host with its own python3: a file of this package, sent as the text of `python3 -c`.
PULL_SCRIPT = host_script("pull_files.py")
JOURNAL_SUFFIX = ".log"  # .pulled.json.log: the files verified since the state file was last written


def safe_relpath(rel: str) -> PurePosixPath:
    """A path that stays under its root: relative, no `..`, no empty or odd parts."""
    p = PurePosixPath(rel)
    if (
        not rel
        or rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or p.is_absolute()
        or any(part in ("..", "") for part in rel.split("/"))
        or rel.split("/")[0] == "."
    ):
        raise UnsafePath(
            f"the host sent an output path that escapes the run directory: {rel!r}",
            "inspect the run's outputs on the host; nothing was written outside runs/",
        )
    return p


def _dest(root: Path, rel: str, checked: set[Path] | None = None) -> Path:
    """Where rel lands under root, its folder made and checked to resolve inside root (once per
    folder when the caller keeps `checked`: many small files in one folder cost one check)."""
    p = safe_relpath(rel)
    target = root.joinpath(*p.parts)
    parent = target.parent
    if checked is None or parent not in checked:
        parent.mkdir(parents=True, exist_ok=True)
        real_root = root.resolve()
        real_parent = parent.resolve()
        if real_parent != real_root and real_root not in real_parent.parents:
            raise UnsafePath(
                f"{rel!r} would be written outside {root}", "remove the symlinks in the local run directory"
            )
        if checked is not None:
            checked.add(parent)
    if target.is_symlink():
        target.unlink()
    return target


@dataclass
class PullResult:
    files: dict[str, PulledFile] = field(default_factory=dict)  # rel -> {size, sha256}
    transferred: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    bytes: int = 0

    def to_dict(self) -> PullSummary:
        return {
            "files": len(self.files),
            "transferred": len(self.transferred),
            "skipped": len(self.skipped),
            "refused": self.refused,
            "bytes": self.bytes,
        }


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError("stream ended early")
        buf += chunk
    return bytes(buf)


class _WireRecord(TypedDict, total=False):
    """A JSON line of the host's pull script (PULL_SCRIPT): a file's header (its path, or its path and
    why it could not be read) or its trailer (its size and sha256)."""

    path: str
    error: str
    size: int
    sha256: str


def _json_line(line: bytes) -> _WireRecord:
    if not line.endswith(b"\n"):
        raise EOFError("stream ended inside a record")
    try:
        data = json.loads(line)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise Corrupt(f"the host sent a malformed record: {line[:80]!r}", "run `launcher pull RUN` again")
    return cast(_WireRecord, data)  # each field is checked where it is read


class _HashingWriter:
    """Hashes and writes blocks; past the first INLINE bytes on a worker thread, so reading the network
    never waits for the disk on big files, and a small file costs no thread."""

    INLINE = 4 << 20

    def __init__(self, f: IO[bytes], depth: int = 16) -> None:
        self.f = f
        self.h = hashlib.sha256()
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.inline = 0
        self.thread: threading.Thread | None = None

    def _work(self) -> None:
        while (block := self.q.get()) is not None:
            if self.error is None:
                try:
                    self.h.update(block)
                    self.f.write(block)
                except BaseException as exc:  # handed to the reading thread
                    self.error = exc

    def write(self, block: bytes) -> None:
        if self.error is not None:
            raise self.error
        if self.thread is None:
            if self.inline + len(block) <= self.INLINE:
                self.inline += len(block)
                self.h.update(block)
                self.f.write(block)
                return
            self.thread = threading.Thread(target=self._work, daemon=True)
            self.thread.start()
        self.q.put(block)

    def finish(self, *, abort: bool = False) -> str:
        if self.thread is not None and self.thread.is_alive():
            self.q.put(None)
            self.thread.join()
        if self.error is not None and not abort:
            raise self.error
        return "sha256:" + self.h.hexdigest()


def _copy_chunks(stream: IO[bytes], sink: _HashingWriter, on_bytes: Callable[[int], None] | None) -> int:
    """One file's length-framed chunks from stream into sink, up to the empty chunk; the bytes copied."""
    size = 0
    while True:
        (n,) = struct.unpack(">Q", _read_exact(stream, 8))
        if n == 0:
            return size
        remaining = n
        while remaining:
            block = stream.read(min(remaining, CHUNK))
            if not block:
                raise EOFError("stream ended inside a file")
            sink.write(block)
            remaining -= len(block)
            size += len(block)
            if on_bytes is not None:
                on_bytes(len(block))


def receive_files(
    stream: IO[bytes],
    dest: Path,
    on_bytes: Callable[[int], None] | None = None,
    on_file: Callable[[str, int, str], None] | None = None,
) -> list[tuple[str, str]]:
    """Read the pull protocol from stream into dest. Returns (path, error) for files the host refused."""
    errors: list[tuple[str, str]] = []
    checked: set[Path] = set()
    while True:
        line = stream.readline()
        if not line:
            return errors
        header = _json_line(line)
        rel = str(header.get("path", ""))
        if "error" in header:
            errors.append((rel, str(header["error"])))
            continue
        target = _dest(dest, rel, checked)
        size = 0
        tmp_path = target.with_name(f".{target.name}.{os.getpid()}.partial")
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as tmp:
            sink = _HashingWriter(tmp)
            try:
                size = _copy_chunks(stream, sink, on_bytes)
                trailer = _json_line(stream.readline())
                digest = sink.finish()
            except OSError as exc:
                sink.finish(abort=True)
                tmp_path.unlink(missing_ok=True)
                if getattr(exc, "errno", None) in (28, 122):
                    raise DiskFull(
                        f"no space left while writing {target}", "free space and run `launcher pull` again"
                    ) from exc
                raise
            except BaseException:
                sink.finish(abort=True)
                tmp_path.unlink(missing_ok=True)
                raise
        if trailer.get("sha256") != digest or trailer.get("size") != size:
            tmp_path.unlink(missing_ok=True)
            raise Corrupt(
                f"{rel}: received {size} bytes with {digest}, the host sent {trailer}",
                "run `launcher pull RUN` again",
            )
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, target)
        if on_file is not None:
            on_file(rel, size, digest)


def _pulled_file(rec: object) -> PulledFile | None:
    """A .pulled.json entry, or None where it lacks the size and sha256 a skip relies on (pulled again)."""
    if isinstance(rec, dict) and isinstance(rec.get("size"), int) and isinstance(rec.get("sha256"), str):
        return cast(PulledFile, rec)
    return None


def read_state(state_path: Path) -> dict[str, PulledFile]:
    """What earlier pulls verified: the state file, then its journal's lines on top (a pull that was
    cut leaves its journal; a torn last line, or any unreadable one, is ignored: that file is pulled again)."""
    state: dict[str, PulledFile] = {}
    try:
        loaded = json.loads(state_path.read_text())
        if isinstance(loaded, dict):
            state = {rel: entry for rel, value in loaded.items() if (entry := _pulled_file(value)) is not None}
    except (OSError, ValueError):
        pass
    try:
        with open(state_path.with_name(state_path.name + JOURNAL_SUFFIX), encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("path"), str):
                    rel = rec.pop("path")
                    if (entry := _pulled_file(rec)) is not None:
                        state[rel] = entry
    except OSError:
        pass
    return state


# where the runtime's links in a container's working directory point: its read-only code and data
VIEW_ROOTS = (CONTAINER_CODE + "/", CONTAINER_DATA + "/")


def is_view(e: RemoteEntry) -> bool:
    """A link the runtime made in the working directory to the run's read-only code or data
    (launcher.runtime.workdir): what the script was shown, never an output. Never followed."""
    target = e.target or ""
    return e.kind == "symlink" and "/" not in e.path and target.startswith(VIEW_ROOTS) and ".." not in target.split("/")


def classify(entries: Iterable[RemoteEntry]) -> tuple[list[RemoteEntry], list[str]]:
    """Split a listing into regular files that are safe to pull and refused entries (with reasons);
    the runtime's links to the code and the data are neither."""
    files: list[RemoteEntry] = []
    refused: list[str] = []
    for e in entries:
        try:
            safe_relpath(e.path)
        except UnsafePath:
            refused.append(f"{e.path} (escapes the run directory)")
            continue
        if is_view(e):
            continue
        if e.kind == "symlink":
            refused.append(f"{e.path} (a symlink to {e.target})")
        elif e.kind == "file":
            files.append(e)
        elif e.kind != "dir":
            refused.append(f"{e.path} (not a regular file)")
    return files, refused


def _verified_before(files: list[RemoteEntry], state: dict[str, PulledFile], dest: Path,
                    result: PullResult) -> list[RemoteEntry]:
    """The files to pull: those not verified before with the same size and mtime and still here intact
    (the rest go into result as skipped)."""
    todo: list[RemoteEntry] = []
    for e in files:
        prev = state.get(e.path)
        local = dest.joinpath(*PurePosixPath(e.path).parts)
        if (
            prev
            and prev.get("size") == e.size
            and prev.get("mtime_ns") == e.mtime_ns
            and local.is_file()
            and local.stat().st_size == e.size
            and sha256_file(local) == prev.get("sha256")
        ):
            result.files[e.path] = {"size": e.size, "sha256": prev["sha256"]}
            result.skipped.append(e.path)
        else:
            todo.append(e)
    return todo


def _transfer(host: Host, remote_dir: str, dest: Path, todo: list[RemoteEntry], state: dict[str, PulledFile],
              state_path: Path, result: PullResult, rep: Reporter,
              on_file: Callable[[str, int, str], None] | None) -> None:
    """Pull the files of todo, each verified by sha256; journaled per file, folded into the state file."""
    journal_path = state_path.with_name(state_path.name + JOURNAL_SUFFIX)
    mtimes = {e.path: e.mtime_ns for e in todo}
    dest.mkdir(parents=True, exist_ok=True)
    task = rep.task(
        f"pull {len(todo)} files from {host.name}", total=float(sum(e.size for e in todo)), unit="B"
    )

    journal = open(journal_path, "a", encoding="utf-8")

    def done(rel: str, size: int, digest: str) -> None:
        result.files[rel] = {"size": size, "sha256": digest}
        result.transferred.append(rel)
        result.bytes += size
        rec: PulledFile = {"size": size, "sha256": digest, "mtime_ns": mtimes.get(rel, 0)}
        state[rel] = rec
        # one appended line per verified file (O(1)); folded into the state file when the pull ends
        journal.write(json.dumps({"path": rel, **dict(rec)}, separators=(",", ":")) + "\n")
        journal.flush()
        if on_file is not None:
            on_file(rel, size, digest)

    try:
        with host.send_stream([host.python, "-c", PULL_SCRIPT, remote_dir],
                              cut=f"the transfer from {host.name} was cut",
                              hint="run `launcher pull RUN` again; verified files are kept") as p:
            p.stdin.write(json.dumps([e.path for e in todo]).encode())
            p.stdin.close()
            errors = receive_files(p.stdout, dest, on_bytes=lambda n: task.advance(n), on_file=done)
    finally:
        task.close()
        journal.close()
    atomic_write_json(state_path, state)  # the journal folded in: then it can go
    journal_path.unlink(missing_ok=True)
    rc = p.wait()
    if rc != 0:
        raise CommandFailed(
            f"pulling from {host.name} failed (exit {rc}): {p.stderr_text().strip()}",
            "run `launcher pull RUN` again; verified files are kept",
        )
    result.refused += [f"{rel} ({why})" for rel, why in errors if why != "No such file or directory"]


def pull_outputs(
    host: Host,
    remote_dir: str,
    dest: Path,
    *,
    state_file: Path | None = None,
    reporter: Reporter | None = None,
    on_file: Callable[[str, int, str], None] | None = None,
) -> PullResult:
    """Copy every regular file under remote_dir into dest, verified; skip files verified before."""
    rep = reporter or NullReporter()
    state_path = state_file or RunDir(dest.parent).pulled_file
    state = read_state(state_path)
    result = PullResult()
    files, result.refused = classify(host.list_dir(remote_dir, hashes=False))
    todo = _verified_before(files, state, dest, result)
    if todo:
        _transfer(host, remote_dir, dest, todo, state, state_path, result, rep, on_file)
    return result


def check_remote_digests(host: Host, remote_dir: str, files: dict[str, PulledFile]) -> list[str]:
    """Paths whose sha256 on the host now differs from what was pulled (the host hashes them again)."""
    remote = {e.path: e.sha256 for e in host.list_dir(remote_dir, hashes=True) if e.kind == "file"}
    return [rel for rel, rec in files.items() if remote.get(rel) not in (None, rec["sha256"])]
