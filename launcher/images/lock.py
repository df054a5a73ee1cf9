"""lockfiles/<variant>.in -> lockfiles/<variant>.txt: every package pinned with == and
its sha256 hashes, resolved with pip-tools for the image's interpreter and platform."""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher import proc
from launcher.errors import LockFailed, NotFound
from launcher.hashing import atomic_write_text, sha256_file
from launcher.images import pins as images
from launcher.progress import NullReporter, Reporter
from launcher.workspace import VARIANTS, Workspace

# pip settings of the machine that locks must not leak into a lockfile (local indexes,
# find-links, constraints); the certificate settings are kept so that TLS still works.
KEEP_PIP_ENV = ("PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_CACHE_DIR")
REQ_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class LockedRequirement:
    name: str
    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class LockResult:
    variant: str
    path: Path
    changed: bool
    packages: int
    sha256: str
    target: str


def pip_env(ca_bundle: Path | None = None) -> tuple[dict[str, str], tuple[str, ...]]:
    drop = tuple(k for k in os.environ if k.startswith("PIP_") and k not in KEEP_PIP_ENV)
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if ca_bundle is not None:
        env["PIP_CERT"] = str(ca_bundle)
    return env, drop


def normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str, source: str = "lockfile") -> list[LockedRequirement]:
    """Parse a hashed lockfile; refuse any requirement that is not pinned and hashed."""
    reqs: list[LockedRequirement] = []
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            if buf:
                logical.append(buf)
                buf = ""
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        logical.append(buf)
        buf = ""
    if buf:
        logical.append(buf)
    for entry in logical:
        entry = entry.strip()
        if entry.startswith("--"):
            continue
        m = REQ_LINE.match(entry)
        if not m:
            raise LockFailed(f"{source}: `{entry.split()[0]}` is not pinned with ==",
                             "regenerate the lockfile with `launcher lock`")
        hashes = tuple(HASH.findall(entry))
        if not hashes:
            raise LockFailed(f"{source}: {m.group(1)}=={m.group(3)} has no sha256 hash",
                             "regenerate the lockfile with `launcher lock`")
        reqs.append(LockedRequirement(normalize_name(m.group(1)), m.group(3), hashes))
    return reqs


def host_target() -> tuple[str, str]:
    machine = platform.machine().lower()
    plat = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64"}.get(machine, machine)
    if sys.platform != "linux":
        plat = f"{sys.platform}/{machine}"
    return f"{sys.version_info.major}.{sys.version_info.minor}", plat


def header(variant: str, pin: images.BasePin) -> str:
    return (
        f"# launcher lock, variant {variant}: every package pinned by version and sha256.\n"
        f"# target: CPython {pin.python} on {pin.platform} (the base image's interpreter and platform)\n"
        f"# base: {pin.ref}\n"
        f"# regenerate: launcher lock --variant {variant}\n"
    )


def lock_variant(ws: Workspace, variant: str, *, upgrade: bool = False, upgrade_packages: tuple[str, ...] = (),
                 ca_bundle: Path | None = None, reporter: Reporter | None = None) -> LockResult:
    rep = reporter or NullReporter()
    images.check_variant(variant)
    src = ws.lock_in(variant)
    if not src.is_file():
        raise NotFound(f"{src} is missing", "create it with one requirement per line (see `launcher init`)")
    pin = images.load(ws).get(variant)
    py, plat = host_target()
    if (py, plat) != (pin.python, pin.platform):
        raise LockFailed(
            f"this machine runs CPython {py} on {plat} but the {variant} image has CPython {pin.python} on "
            f"{pin.platform}; a lock resolved here could pick the wrong wheels",
            f"run `launcher lock` on a {pin.platform} host with Python {pin.python} (or inside the base image)",
        )
    out = ws.lock_txt(variant)
    task = rep.task(f"resolving {src.name} with pip-tools")
    with tempfile.TemporaryDirectory(prefix="launcher-lock-") as tmp:
        work = Path(tmp) / out.name
        if out.is_file() and not upgrade:
            shutil.copyfile(out, work)  # existing pins are kept unless an upgrade is asked for
        argv = [sys.executable, "-m", "piptools", "compile", "--quiet", "--no-header", "--generate-hashes",
                "--allow-unsafe", "--strip-extras", "--no-emit-index-url", "--no-emit-find-links",
                "--no-emit-trusted-host", "--resolver=backtracking", "--output-file", str(work)]
        if upgrade:
            argv.append("--upgrade")
        for name in upgrade_packages:
            argv += ["--upgrade-package", name]
        argv.append(str(src.relative_to(ws.root)))
        env, drop = pip_env(ca_bundle)
        done = proc.run(argv, env=env, drop_env_prefixes=drop, cwd=ws.root, check=False)
        if done.returncode != 0:
            reason = _pip_reason(done.err + done.out)
            raise LockFailed(f"pip-tools could not resolve {src.name}: {reason}",
                             "fix the requirement in the .in file (name, version range) or check the index")
        text = header(variant, pin) + _strip_paths(work.read_text(), ws.root)
        reqs = parse_lock(text, str(out))
        names = {r.name for r in reqs}
        missing = {"pip", "setuptools"} - names
        if missing:
            names_missing = ", ".join(sorted(missing))
            raise LockFailed(f"{src.name} must list {names_missing} so the image's installer is locked too",
                             f"add {names_missing} to {src}")
    changed = not (out.is_file() and out.read_text() == text)
    if changed:
        atomic_write_text(out, text)
    task.close()
    return LockResult(variant, out, changed, len(reqs), sha256_file(out), f"CPython {pin.python} {pin.platform}")


def lock(ws: Workspace, variant: str = "all", **kw: object) -> list[LockResult]:
    variants = VARIANTS if variant == "all" else (images.check_variant(variant),)
    return [lock_variant(ws, v, **kw) for v in variants]  # type: ignore[arg-type]


def _strip_paths(text: str, root: Path) -> str:
    return text.replace(str(root) + os.sep, "")


def _pip_reason(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("ERROR:") or "Could not find a version" in ln or "No matching distribution" in ln:
            return ln.removeprefix("ERROR: ")
    return lines[-1] if lines else "unknown error"
