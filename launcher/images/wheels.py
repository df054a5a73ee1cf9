"""The wheelhouse: every locked wheel downloaded on the host for the image's platform
and Python, hash-checked, so the image installs offline (air-gapped hosts need that too)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import proc
from launcher.errors import BuildFailed, Corrupt, plain_text
from launcher.images import wheelsources as sources
from launcher.images.lock import LockedRequirement, normalize_name, parse_lock, pip_env
from launcher.progress import NullReporter, Reporter

SAVED = re.compile(r"(?:Saved|File was already downloaded)\s+(\S+\.whl)")
COLLECTING = re.compile(r"^Collecting\s+(\S+)")
MISMATCH = re.compile(r"(\S+)==(\S+) from [\s\S]*?Expected sha256 (\S+)[\s\S]*?Got\s+(\S+)")


@dataclass(frozen=True)
class Wheelhouse:
    files: dict[str, Path]  # normalized project name -> wheel file
    pool: Path


def platform_args(python: str, platform: str) -> list[str]:
    arch = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}.get(platform)
    if arch is None:
        raise BuildFailed(f"no wheel platform tags known for {platform}", "use linux/amd64 or linux/arm64")
    tags = [f"manylinux_2_{n}_{arch}" for n in range(36, 4, -1)] + [f"manylinux2014_{arch}"]
    if arch == "x86_64":
        tags += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    abi = "cp" + python.replace(".", "")
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", python,
            "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for t in tags:
        args += ["--platform", t]
    return args


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_project(filename: str) -> str:
    return normalize_name(filename.split("-", 1)[0])


WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?"
                   r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


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
            name = normalize_name(m.group("name"))
            if name in found or name not in wanted:
                continue
            version, hashes = wanted[name]
            if m.group("version") != version or not fits(path.name, python, platforms):
                continue
            if _sha256(path) in hashes:
                found[name] = path
    return found


def platform_tags(python: str, platform: str) -> list[str]:
    """The wheel platform tags platform_args allows (for matching wheels found in folders)."""
    args = platform_args(python, platform)
    return [args[i + 1] for i, a in enumerate(args) if a == "--platform"]


def download(lockfile: Path, pool: Path, *, python: str, platform: str, ca_bundle: Path | None = None,
             find_links: Sequence[Path] = (), reporter: Reporter | None = None) -> Wheelhouse:
    """Every wheel of the lock for this Python and platform, in pool. Wheels already in the pool or in
    a find_links folder are used when their hash is locked; pip downloads the rest (from the lock's
    reachable indexes and the folders), each checked against its locked hash."""
    rep = reporter or NullReporter()
    text = lockfile.read_text()
    reqs = parse_lock(text, str(lockfile))
    pool.mkdir(parents=True, exist_ok=True)
    if not reqs:  # an image of the base's own Python: nothing to download
        return Wheelhouse({}, pool)
    wanted = {r.name: (r.version, r.hashes) for r in reqs}
    have = find_local(wanted, [pool, *find_links], python, platform_tags(python, platform))
    for name, path in list(have.items()):
        if path.parent != pool.resolve() and path.parent != pool:
            have[name] = _into_pool(path, pool)
    rest = [r for r in reqs if r.name not in have]
    if not rest:  # find_local checked each hash already
        return Wheelhouse(files=have, pool=pool)
    task = rep.task(f"wheels for {lockfile.name}", total=len(rest))
    kept, dropped = sources.split_indexes("".join(f"{o} {u}\n" for o, u in sources.index_options(text)))
    with tempfile.TemporaryDirectory(prefix="launcher-wheels-") as tmp:
        req_file = Path(tmp) / lockfile.name
        req_file.write_text(kept + "".join(
            f"{r.name}=={r.version} " + " ".join(f"--hash=sha256:{h}" for h in r.hashes) + "\n" for r in rest))
        env, drop = pip_env(ca_bundle)
        env["COLUMNS"] = "400"  # pip's error output is wrapped to the terminal width otherwise
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--progress-bar", "off",
                *platform_args(python, platform), *(a for d in find_links for a in ("--find-links", str(d))),
                "-d", str(pool), "-r", str(req_file)]
        saved, rc, out_lines = _pip_download(argv, env, drop, pool, task)
    output = "\n".join(out_lines)
    if rc != 0:
        mm = MISMATCH.search(output)
        if mm or "DO NOT MATCH THE HASHES" in output:
            what = f"{mm.group(1)}=={mm.group(2)}: the lockfile expects sha256 {mm.group(3)[:16]}..., the index " \
                   f"serves {mm.group(4)[:16]}..." if mm else "a downloaded wheel"
            raise Corrupt(f"hash mismatch in {lockfile.name} for {what}",
                          "restore the lockfile from git or regenerate it with `launcher lock`; no image was tagged")
        last = next((ln for ln in reversed(out_lines) if ln.startswith("ERROR")), out_lines[-1] if out_lines else "")
        raise BuildFailed(f"downloading the locked wheels failed: {last.removeprefix('ERROR: ')}"
                          f"{sources.unreachable_hint(dropped)}",
                          "check the network (or --ca-bundle behind a TLS proxy) and that every package has a "
                          "wheel for the image's platform (or give a folder of them with --find-links DIR)")
    task.close()
    return Wheelhouse(files={**_check(rest, saved, lockfile), **have}, pool=pool)


def _pip_download(argv: list[str], env: dict[str, str], drop: tuple[str, ...], pool: Path,
                  task: Any) -> tuple[dict[str, Path], int, list[str]]:
    p = proc.popen(argv, env=env, drop_env_prefixes=drop, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    saved: dict[str, Path] = {}
    out_lines: list[str] = []
    assert p.stdout is not None
    for raw in p.stdout:
        line = plain_text(raw.decode("utf-8", "replace")).rstrip()  # pip colours its errors on some setups
        out_lines.append(line)
        if COLLECTING.match(line):
            task.advance(1)
        m = SAVED.search(line)
        if m:
            path = Path(m.group(1))
            path = path if path.is_absolute() else pool / path.name
            saved[wheel_project(path.name)] = path
    return saved, p.wait(), out_lines


def _into_pool(path: Path, pool: Path) -> Path:
    """A wheel from a find-links folder, linked (or copied) into the pool under its own name."""
    target = pool / path.name
    if not target.exists():
        tmp = pool / f".{path.name}.partial"  # cache prune removes one an interrupted copy left
        try:
            os.link(path, tmp)
        except OSError:
            import shutil

            shutil.copyfile(path, tmp)
        os.replace(tmp, target)
    return target


def _check(reqs: list[LockedRequirement], saved: dict[str, Path], lockfile: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for req in reqs:
        path = saved.get(req.name)
        if path is None or not path.is_file():
            raise BuildFailed(f"pip did not report a wheel for {req.name}=={req.version}",
                              f"run `pip download` for it by hand to see why; lockfile {lockfile}")
        if _sha256(path) not in req.hashes:
            raise Corrupt(f"{path.name} does not match any hash for {req.name} in {lockfile.name}",
                          f"delete {path} and build again; if it persists, regenerate the lock")
        files[req.name] = path
    return files


def link_into(house: Wheelhouse, dest: Path) -> None:
    """Put the wheels of one lock into a build context (hard links when possible)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in house.files.values():
        target = dest / path.name
        try:
            os.link(path, target)
        except OSError:
            import shutil

            shutil.copyfile(path, target)
