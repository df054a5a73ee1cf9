"""Where a lock's wheels come from besides PyPI: the package indexes a requirements file names
(`--extra-index-url https://download.pytorch.org/whl/cpu` in lockfiles/torch-cpu.in), and folders of
wheels a user has (`--find-links DIR`: an air-gapped mirror, a wheel built in-house).

An index that cannot be reached from this machine is left out before pip sees it (pip would
retry it for every package), and the error then names it; a wheel from a folder is used only
when its sha256 is one the lock allows and its tags fit the image's Python and platform, so a
folder can never change what an image contains.
"""

from __future__ import annotations

import re
import socket
import urllib.parse
from collections.abc import Iterable, Sequence
from pathlib import Path

from launcher.errors import UsageError
from launcher.hashing import sha256_file

INDEX_OPTION = re.compile(r"^\s*(--index-url|--extra-index-url|-i)(?:\s+|=)(\S+)\s*$")
WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?"
                   r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")
PROBE_TIMEOUT_S = 3.0


def index_options(text: str) -> list[tuple[str, str]]:
    """The (option, URL) index lines of a requirements file, in order."""
    out = []
    for line in text.splitlines():
        m = INDEX_OPTION.match(line)
        if m:
            out.append(("--index-url" if m.group(1) == "-i" else m.group(1), m.group(2)))
    return out


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


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _cp_minor(tag: str) -> int:
    digits = tag[3:]
    return int(digits) if digits.isdigit() else 10**6


def fits(filename: str, python: str, platforms: Sequence[str]) -> bool:
    """Whether a wheel's tags fit CPython `python` (X.Y) on one of `platforms` (wheel platform tags)."""
    m = WHEEL.match(filename)
    if not m:
        return False
    cp = "cp" + python.replace(".", "")
    pys = set(m.group("py").split("."))
    abis = set(m.group("abi").split("."))
    plats = set(m.group("plat").split("."))
    py_ok = bool(pys & {cp, "py3", f"py{python.replace('.', '')}"}) or \
        ("abi3" in abis and any(_cp_minor(p) <= _cp_minor(cp) for p in pys if p.startswith("cp3")))
    abi_ok = bool(abis & {cp, "abi3", "none"})
    plat_ok = "any" in plats or bool(plats & set(platforms))
    return py_ok and abi_ok and plat_ok


def find_local(wanted: dict[str, tuple[str, tuple[str, ...]]], dirs: Sequence[Path], python: str,
               platforms: Sequence[str]) -> dict[str, Path]:
    """Wheels in `dirs` that satisfy `wanted` (normalized name -> (version, allowed sha256s)):
    the right name and version, tags that fit, and a hash the lock allows."""
    found: dict[str, Path] = {}
    for d in dirs:
        for path in sorted(d.glob("*.whl")):
            m = WHEEL.match(path.name)
            if not m:
                continue
            name = _norm(m.group("name"))
            if name in found or name not in wanted:
                continue
            version, hashes = wanted[name]
            if m.group("version") != version or not fits(path.name, python, platforms):
                continue
            if sha256_file(path).removeprefix("sha256:") in hashes:
                found[name] = path
    return found
