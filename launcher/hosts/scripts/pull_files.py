"""Runs on the host (python3, stdlib only), sent as text by launcher.transfers.pull: streams files, hashed as sent.

Argument: the run's output directory. Reads a JSON list of relative paths on stdin; for each
regular file under that directory writes to stdout a JSON header line, chunks framed by an
8-byte big-endian length, a zero-length chunk, and a JSON trailer line with the size and
sha256 of what it sent. A path that escapes the directory, a link or a non-regular file gets a
header line with an error instead.
"""

import hashlib
import json
import os
import queue
import stat
import struct
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

F_SETPIPE_SZ = 1031
SMALL = 1 << 20


def produce(f: IO[bytes], q: "queue.Queue[bytes]", h: Any) -> None:
    # reading and hashing on one thread, writing to the pipe on the other: they overlap
    while True:
        block = f.read(1 << 20)
        h.update(block)
        q.put(block)
        if not block:
            return


def open_regular(root: str, rel: str) -> "tuple[int | None, str | None]":
    """A descriptor of root/rel, or why it is not sent."""
    full = os.path.join(root, rel)
    if rel.startswith("/") or ".." in rel.split("/") or os.path.realpath(full) != os.path.normpath(full) \
            or not os.path.realpath(full).startswith(root + os.sep):
        return None, "escapes the run directory"
    try:
        fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return None, exc.strerror or str(exc)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None, "not a regular file"
    return fd, None


def blocks(f: IO[bytes], h: Any, small: bool) -> "Iterator[bytes]":
    """The file's blocks, hashed: a small file read here, a big one read ahead on another thread."""
    if small:
        while block := f.read(1 << 20):
            h.update(block)
            yield block
        return
    q: queue.Queue[bytes] = queue.Queue(16)
    worker = threading.Thread(target=produce, args=(f, q, h))
    worker.start()
    while block := q.get():
        yield block
    worker.join()


def send(fd: int, out: IO[bytes]) -> None:
    h, size = hashlib.sha256(), 0
    small = os.fstat(fd).st_size <= SMALL
    with os.fdopen(fd, "rb") as f:
        for block in blocks(f, h, small):
            size += len(block)
            out.write(struct.pack(">Q", len(block)))
            out.write(block)
    out.write(struct.pack(">Q", 0))
    out.write((json.dumps({"size": size, "sha256": "sha256:" + h.hexdigest()}) + "\n").encode())


def main() -> None:
    root = os.path.realpath(sys.argv[1])
    paths = json.loads(sys.stdin.read())
    out = sys.stdout.buffer
    try:  # a bigger pipe to sshd: fewer wake-ups per MB
        import fcntl

        fcntl.fcntl(out.fileno(), F_SETPIPE_SZ, 1 << 20)
    except (ImportError, OSError, ValueError):
        pass
    for rel in paths:
        fd, err = open_regular(root, rel)
        if fd is None:
            out.write((json.dumps({"path": rel, "error": err}) + "\n").encode())
            continue
        out.write((json.dumps({"path": rel}) + "\n").encode())
        send(fd, out)
    out.flush()


if __name__ == "__main__":
    main()
