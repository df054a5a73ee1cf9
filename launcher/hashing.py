"""Content hashes, named by algorithm (``sha256:<hex>``), and atomic writes."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from launcher.errors import DiskFull

CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_stream(stream: IO[bytes]) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: stream.read(CHUNK), b""):
        h.update(block)
    return "sha256:" + h.hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f)


def hex_of(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64:
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return hexpart


def iter_tree(root: Path, *, exclude: Iterable[str] = ()) -> Iterator[Path]:
    """Every entry under root, sorted, skipping names in exclude (such as __pycache__)."""
    skip = set(exclude)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        base = Path(dirpath)
        for name in sorted(dirnames + [f for f in filenames if f not in skip]):
            yield base / name


def tree_digest(root: Path, *, exclude: Iterable[str] = ("__pycache__", ".ipynb_checkpoints")) -> str:
    """sha256 over relative path, type, executable bit and content of every entry (no mtimes)."""
    h = hashlib.sha256()
    for p in sorted(iter_tree(root, exclude=exclude), key=lambda q: q.relative_to(root).as_posix()):
        rel = p.relative_to(root).as_posix()
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            rec = f"l {rel} -> {os.readlink(p)}"
        elif stat.S_ISDIR(st.st_mode):
            rec = f"d {rel}"
        else:
            x = "x" if st.st_mode & 0o111 else "-"
            rec = f"f {rel} {x} {st.st_size} {sha256_file(p)}"
        h.update(rec.encode() + b"\n")
    return "sha256:" + h.hexdigest()


def _raise_if_full(exc: OSError, path: Path) -> None:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFull(f"no space left on the device holding {path}",
                       "free some space (old runs, `docker system prune`) and try again") from exc


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside target; rename it over target only if the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    tmp_path.chmod(0o666 & ~umask)  # mkstemp's 0600 would leak into lockfiles and artifacts
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    except OSError as exc:
        tmp_path.unlink(missing_ok=True)
        _raise_if_full(exc, target)
        raise
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def atomic_write_bytes(target: Path, data: bytes) -> None:
    with atomic_path(target) as tmp:
        try:
            tmp.write_bytes(data)
        except OSError as exc:
            _raise_if_full(exc, target)
            raise


def atomic_write_text(target: Path, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))


def canonical_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def atomic_write_json(target: Path, data: Any) -> None:
    atomic_write_text(target, canonical_json(data))
