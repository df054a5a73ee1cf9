"""The digest of a folder of code: what a manifest records as the code that ran.

One definition for both sides: the host computes it for the recipes it bakes into an image and
the code it mounts, and the runtime computes it inside the container from the files it is
about to execute. Two folders have the same digest exactly when they hold the same files
(relative path and content). Directories, modes, mtimes, owners, byte-code caches and VCS
metadata do not count; scripts run through the interpreter, so an executable bit changes
nothing. A symlink counts as the file it points to, since that is what an import reads and
what a copy into the image holds.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

SKIP_DIRS = frozenset({"__pycache__", ".ipynb_checkpoints", ".git", ".hg", ".svn", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache"})
SKIP_SUFFIXES = (".pyc", ".pyo")
CHUNK = 1 << 20


def skipped(name: str, is_dir: bool) -> bool:
    return name in SKIP_DIRS if is_dir else name.endswith(SKIP_SUFFIXES)


def iter_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative posix path, path) of every regular file under root that counts, sorted."""
    found: list[tuple[str, Path]] = []
    for top, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not skipped(d, True))
        for name in files:
            if skipped(name, False):
                continue
            full = Path(top) / name
            if not full.is_file():  # a dangling link or a special file is not code
                continue
            found.append((full.relative_to(root).as_posix(), full))
    yield from sorted(found)


def file_line(rel: str, path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return f"{rel} {os.stat(path).st_size} {h.hexdigest()}"


def digest_lines(lines: list[str]) -> str:
    h = hashlib.sha256()
    for line in sorted(lines):
        h.update(line.encode("utf-8", "surrogateescape") + b"\n")
    return "sha256:" + h.hexdigest()


def code_digest(root: Path) -> str:
    """The code digest of a folder, or of a single file (as a folder holding only it)."""
    if root.is_file():
        return digest_lines([file_line(root.name, root)])
    return digest_lines([file_line(rel, p) for rel, p in iter_files(root)])


def runtime_digest(package_dir: Path) -> str:
    """The digest of launcher's in-container runtime: package_dir's __init__.py and runtime/,
    which is all an image holds of launcher (computed alike on the host and in the image)."""
    lines = [file_line("__init__.py", package_dir / "__init__.py")]
    lines += [file_line(f"runtime/{rel}", p) for rel, p in iter_files(package_dir / "runtime")]
    return digest_lines(lines)


def describe(root: Path) -> dict[str, object]:
    """What the runtime records about the code it runs: digest, file count and bytes."""
    files = [(rel, p) for rel, p in iter_files(root)] if root.is_dir() else [(root.name, root)]
    return {"digest": digest_lines([file_line(rel, p) for rel, p in files]), "files": len(files),
            "bytes": sum(p.stat().st_size for _, p in files)}
