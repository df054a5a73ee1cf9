"""Where a lock's wheels come from besides PyPI: the package indexes a requirements file names
(`--extra-index-url https://download.pytorch.org/whl/cpu` in lockfiles/torch-cpu.in), and folders of
wheels a user has (`--find-links DIR`: an air-gapped mirror, a wheel built in-house).

An index that cannot be reached from this machine is left out before pip sees it (pip would
retry it for every package), and the error then names it. Which wheels of a folder count is the
wheelhouse's to say (launcher.images.wheels.find_local).
"""

from __future__ import annotations

import functools
import re
import socket
import urllib.parse
from collections.abc import Iterable, Sequence
from pathlib import Path

from launcher.errors import UsageError

INDEX_OPTION = re.compile(r"^\s*(--index-url|--extra-index-url|-i)(?:\s+|=)(\S+)\s*$")
PROBE_TIMEOUT_S = 3.0


def index_options(text: str) -> list[tuple[str, str]]:
    """The (option, URL) index lines of a requirements file, in order."""
    out = []
    for line in text.splitlines():
        m = INDEX_OPTION.match(line)
        if m:
            out.append(("--index-url" if m.group(1) == "-i" else m.group(1), m.group(2)))
    return out


@functools.lru_cache(maxsize=64)  # a lock names its index in the .in and the .txt: probe it once
def reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the URL's host and port opens (a file: URL is reachable when it exists)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        return Path(urllib.parse.unquote(parts.path)).exists()
    if not parts.hostname:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def split_indexes(text: str) -> tuple[str, list[str]]:
    """The requirements text without the index lines that cannot be reached, and those URLs."""
    kept: list[str] = []
    dropped: list[str] = []
    for line in text.splitlines(keepends=True):
        m = INDEX_OPTION.match(line)
        if m and not reachable(m.group(2)):
            dropped.append(m.group(2))
            if m.group(1) != "--extra-index-url":  # never fall back to PyPI in place of a named index
                kept.append("--no-index\n")
            continue
        kept.append(line)
    return "".join(kept), dropped


def unreachable_hint(dropped: Sequence[str]) -> str:
    if not dropped:
        return ""
    return (f" ({', '.join(dropped)} cannot be reached from this machine: put the wheels it serves in a folder "
            "and pass --find-links DIR)")


def check_dirs(dirs: Iterable[Path]) -> tuple[Path, ...]:
    out = []
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"--find-links {d}: no such folder", "give a folder that holds .whl files")
        out.append(d.resolve())
    return tuple(out)
