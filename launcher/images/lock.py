"""lockfiles/<variant>.in -> lockfiles/<variant>.txt: every package pinned with == and
its sha256 hashes, resolved with pip-tools by the image's own interpreter, inside the
variant's pinned base image (a container on the local Docker engine), so the host's OS,
Python and architecture do not matter. The CA bundle this machine trusts goes in with the
request, so it works behind a TLS-intercepting proxy."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from launcher.errors import (
    EngineUnavailable,
    HostNotReady,
    LockFailed,
    NotFound,
    PinMismatch,
    UsageError,
    plain_text,
)
from launcher.hashing import atomic_write_text, sha256_file
from launcher.hosts import engine
from launcher.hosts.containerspec import ContainerSpec, Mount
from launcher.hosts.engine import Engine
from launcher.images import pins as images
from launcher.proc import Completed
from launcher.progress import NullReporter, Reporter
from launcher.workspace import Workspace

# pip settings of the machine that locks must not leak into a lockfile (local indexes,
# find-links, constraints); the certificate settings are kept so that TLS still works.
KEEP_PIP_ENV = ("PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_CACHE_DIR")
# Of those, what reaches pip inside the base image (a host path would mean nothing there).
KEEP_CONTAINER_ENV = ("PIP_DEFAULT_TIMEOUT",)
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
    base: str


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
    return list(_parsed(text, source))


@lru_cache(maxsize=16)
def _parsed(text: str, source: str) -> tuple[LockedRequirement, ...]:
    """parse_lock's answer, remembered by the text: a run reads the variant's lock three times (its
    requirements are frozen values, its errors raised again each time)."""
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
    return tuple(reqs)


# pip-tools and what it needs, installed into a venv inside the base image to resolve there.
# Pinned, so that a lock does not depend on the day it was made (checked in bookworm's CPython 3.11;
# not hash-pinned: the tools resolve, they are not part of the image).
PIP_TOOLS = "7.6.2"
TOOLS = (f"pip-tools=={PIP_TOOLS}", "pip==26.3", "build==1.6.1", "click==8.5.1", "pyproject_hooks==1.3.3",
         "wheel==0.48.0", "packaging==26.3")
# Where the host's CA bundle usually is (Debian/Ubuntu, Fedora/RHEL, macOS and Alpine, SUSE).
SYSTEM_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem",
                     "/etc/ssl/ca-bundle.pem")
# The host's proxy settings reach pip inside the container (the index behind a corporate proxy).
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")
LOCK_TIMEOUT_S = 1800.0
_MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}



def header(variant: str, pin: images.BasePin, python: str, platform: str) -> str:
    return (
        f"# launcher lock, variant {variant}: every package pinned by version and sha256.\n"
        f"# resolved inside the base image by CPython {python} on {platform} (pip-tools {PIP_TOOLS})\n"
        f"# base: {pin.ref}\n"
        f"# regenerate: launcher lock --variant {variant}\n"
    )


def default_ca_bundle() -> Path | None:
    """The CA bundle this machine trusts: pip's own setting, the usual variables, then the system's."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    import ssl  # here: loading OpenSSL costs every command that only reads a lock a few tens of milliseconds

    for candidate in (ssl.get_default_verify_paths().cafile, *SYSTEM_CA_BUNDLES):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def read_ca_bundle(path: Path) -> str:
    if not path.is_file():
        raise NotFound(f"CA bundle {path} does not exist",
                       "pass a PEM file with --ca-bundle (often /etc/ssl/certs/ca-certificates.crt)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"CA bundle {path} cannot be read: {exc}",
                         "pass a readable PEM file with --ca-bundle") from exc
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise UsageError(f"CA bundle {path} holds no PEM certificate",
                         "pass a PEM file (-----BEGIN CERTIFICATE-----) with --ca-bundle")
    return text


def base_engine(pin: images.BasePin, reporter: Reporter) -> Engine:
    """The local engine, holding the pinned base image (pulled by digest when missing)."""
    if not engine.installed():
        raise EngineUnavailable("launcher lock resolves inside the base image and needs Docker; "
                                "the docker command is not installed",
                                "install Docker (and start it), or set DOCKER_HOST to an engine")
    eng = engine.local()
    try:
        eng.require()
    except HostNotReady as exc:
        reason = exc.message.split(": ", 1)[-1]
        raise EngineUnavailable(f"launcher lock resolves inside the base image and needs a Docker engine; "
                                f"none answers ({reason})",
                                "start it (`dockerd &` or `systemctl start docker`) or set DOCKER_HOST") from exc
    if not eng.has_image(pin.ref):
        task = reporter.task(f"pulling the base image {pin.ref}")
        pulled = eng.pull(pin.ref, platform=pin.platform)
        task.close()
        if pulled.returncode != 0:
            raise images.base_pull_failed(pin, pulled.err, pulled.last_error_line())
    return eng


def lock_variant(ws: Workspace, variant: str, *, upgrade: bool = False, upgrade_packages: tuple[str, ...] = (),
                 ca_bundle: Path | None = None, find_links: Sequence[Path] = (),
                 reporter: Reporter | None = None) -> LockResult:
    """Resolve lockfiles/VARIANT.in with pip-tools inside the variant's pinned base image, by its
    own interpreter, and write lockfiles/VARIANT.txt atomically (nothing when resolution fails).
    The .in's index options head the lock (so wheels are fetched from there); indexes this machine
    cannot reach are left out of the resolution, and find_links folders are mounted into it."""
    from launcher.images import companions, wheelsources  # for resolving only: a run reads the lock

    rep = reporter or NullReporter()
    images.check_variant(variant)
    src = ws.lock_in(variant)
    if not src.is_file():
        raise NotFound(f"{src} is missing", "create it with one requirement per line (see `launcher init`)")
    try:
        pin = images.load(ws).get(variant)
    except NotFound as exc:
        raise NotFound(exc.message, images.FIX_BASE) from exc
    ca_path = ca_bundle if ca_bundle is not None else default_ca_bundle()
    ca_text = read_ca_bundle(ca_path) if ca_path is not None else None
    eng = base_engine(pin, rep)
    out = ws.lock_txt(variant)
    rel_in = f"lockfiles/{src.name}"
    rel_out = f"lockfiles/{out.name}"
    files = {p.name: p.read_text() for p in sorted(ws.lockfiles.iterdir())
             if p.is_file() and p.suffix in (".in", ".txt") and p.name != out.name}
    if out.is_file() and not upgrade:
        files[out.name] = out.read_text()  # existing pins are kept unless an upgrade is asked for
    dropped: list[str] = []
    for name, text in files.items():
        files[name], gone = wheelsources.split_indexes(text)
        dropped += [u for u in gone if u not in dropped]
    argv = compile_argv(rel_in, rel_out, upgrade, upgrade_packages)
    answer = compile_in_base(eng, pin, files, argv, rel_out, find_links=find_links, ca_text=ca_text,
                             task=rep.task(f"resolving {src.name} inside the base image with pip-tools {PIP_TOOLS}"))
    if not answer.get("ok"):
        failed = _failure(answer, src.name, pin, ca_path)
        failed.message += wheelsources.unreachable_hint(dropped)
        raise failed
    python, plat = _check_target(answer, pin)
    indexes = "".join(f"{opt} {url}\n" for opt, url in wheelsources.index_options(src.read_text()))
    text = header(variant, pin, python, plat) + indexes + str(answer["lock"])
    reqs = parse_lock(text, str(out))
    names = {r.name for r in reqs}
    companions.check({r.name: r.version for r in reqs}, dict.fromkeys(names, rel_out), source=rel_in,
                     relock=f"launcher lock --variant {variant}")
    missing = {"pip", "setuptools"} - names
    if missing:
        names_missing = ", ".join(sorted(missing))
        raise LockFailed(f"{src.name} must list {names_missing} so the image's installer is locked too",
                         f"add {names_missing} to {src}")
    changed = not (out.is_file() and out.read_text() == text)
    if changed:
        atomic_write_text(out, text)
    return LockResult(variant, out, changed, len(reqs), sha256_file(out), f"CPython {python} {plat}", pin.ref)


class LockAnswer(TypedDict):
    """The lock driver's answer (images/lockdriver.py, after its MARKER on stdout): the base's
    interpreter and platform, and the lock's text or the stage that failed with its output."""

    python: str
    implementation: str
    machine: str
    system: str
    ok: bool
    lock: NotRequired[str]
    stage: NotRequired[str]  # venv, install or compile
    output: NotRequired[str]
    diagnosis: NotRequired[str]  # pip's own account of a conflict the compile met


def compile_argv(rel_in: str, rel_out: str, upgrade: bool, upgrade_packages: Sequence[str] = ()) -> list[str]:
    """pip-compile's arguments for a hashed lock that names no index, folder or host of this machine."""
    argv = ["--quiet", "--no-header", "--generate-hashes", "--allow-unsafe", "--strip-extras", "--no-emit-index-url",
            "--no-emit-find-links", "--no-emit-trusted-host", "--resolver=backtracking", "--output-file", rel_out]
    if upgrade:
        argv.append("--upgrade")
    for name in upgrade_packages:
        argv += ["--upgrade-package", name]
    return [*argv, rel_in]


def compile_in_base(eng: Engine, pin: images.BasePin, files: dict[str, str], argv: list[str], output: str, *,
                    find_links: Sequence[Path] = (), ca_text: str | None = None, diagnose: list[str] | None = None,
                    task: Any = None) -> LockAnswer:
    """Run pip-compile (argv, paths relative to a copy of `files` under lockfiles/) in a container of the
    pinned base by its own interpreter; the driver's answer (ok and the lock, or the stage that failed).
    The find_links folders are mounted read-only and added to argv; diagnose: pip's arguments to run
    when the compile fails (its output comes back as "diagnosis")."""
    mounts: list[Mount] = []
    argv = list(argv)
    for i, folder in enumerate(find_links):
        mounts.append(Mount(str(folder), f"/find-links/{i}", read_only=True))
        argv[-1:-1] = ["--find-links", f"/find-links/{i}"]
    env = {k: v for k in (*KEEP_CONTAINER_ENV, *PROXY_ENV) if (v := os.environ.get(k))}
    request = {"files": files, "ca": ca_text, "tools": list(TOOLS), "compile": argv, "output": output, "env": env,
               "diagnose": diagnose}
    try:
        spec = ContainerSpec(pin.ref, ("python3", "-c", _driver_source()), platform=pin.platform, network="bridge",
                             mounts=tuple(mounts), stdin=True)
        done = eng.run_to_end(spec, input=json.dumps(request).encode(), timeout=LOCK_TIMEOUT_S)
    finally:
        if task is not None:
            task.close()
    return _answer(done, pin)


def explain_failure(answer: LockAnswer, src: str, pin: images.BasePin, ca_path: Path | None) -> LockFailed:
    """The one-line error for a failed answer of compile_in_base (TLS, venv, install or resolution)."""
    return _failure(answer, src, pin, ca_path)


def check_target(answer: LockAnswer, pin: images.BasePin) -> tuple[str, str]:
    """The interpreter and platform an answer was resolved by (PinMismatch when not images.lock's)."""
    return _check_target(answer, pin)


def _driver_source() -> str:
    return (Path(__file__).parent / "lockdriver.py").read_text()


def _answer(done: Completed, pin: images.BasePin) -> LockAnswer:
    from launcher.images import lockdriver

    for line in done.out.splitlines():
        if line.startswith(lockdriver.MARKER):
            answer = json.loads(line[len(lockdriver.MARKER):])
            if isinstance(answer, dict) and isinstance(answer.get("ok"), bool):
                return cast(LockAnswer, answer)
    reason = done.last_error_line() or f"exit status {done.returncode}"
    if "python3" in reason and ("not found" in reason or "no such file" in reason.lower()):
        raise LockFailed(f"the base image {pin.ref} has no python3 ({reason})",
                         "pin a base with Python 3 (`launcher base bootstrap` makes one)")
    raise LockFailed(f"locking inside the base image {pin.ref} failed: {reason}",
                     "check that the base image runs (`docker run --rm IMAGE python3 -V`)")


def _failure(answer: LockAnswer, src: str, pin: images.BasePin, ca_path: Path | None) -> LockFailed:
    output = plain_text(str(answer.get("output", "")))
    reason = _pip_reason(output)
    tls = "CERTIFICATE_VERIFY_FAILED" in output or "SSLError" in output or "SSL:" in output
    where = f"inside the base image (CPython {answer.get('python')})"
    if tls:
        m = re.search(r"certificate verify failed: ([^(')]+)", output)
        why = m.group(1).strip() if m else reason
        trusted = f"the CA bundle {ca_path}" if ca_path else "no CA bundle from this machine"
        return LockFailed(f"pip could not verify the package index's TLS certificate {where} ({why}; "
                          f"it trusted {trusted})",
                          "pass the CA bundle your network's proxy uses with --ca-bundle FILE")
    if answer.get("stage") == "venv":
        return LockFailed(f"the base image {pin.ref} cannot make a venv: {reason}",
                          "use a base with python3-venv (`launcher base bootstrap` makes one)")
    if answer.get("stage") == "install":
        return LockFailed(f"installing pip-tools {PIP_TOOLS} {where} failed: {reason}",
                          "check that the package index is reachable from a container (proxy, --ca-bundle)")
    return LockFailed(f"pip-tools could not resolve {src}: {reason}",
                      "fix the requirement in the .in file (name, version range) or check the index")


def _check_target(answer: LockAnswer, pin: images.BasePin) -> tuple[str, str]:
    """The interpreter and platform the lock was resolved by; they must be what images.lock says."""
    python = str(answer["python"])
    machine = str(answer["machine"]).lower()
    plat = _MACHINES.get(machine, f"{str(answer['system']).lower()}/{machine}")
    if answer.get("implementation") != "CPython" or ".".join(python.split(".")[:2]) != pin.python \
            or plat != pin.platform:
        raise PinMismatch(
            f"images.lock says the {pin.variant} base runs CPython {pin.python} on {pin.platform}, but it runs "
            f"{answer.get('implementation')} {python} on {plat}",
            "re-pin the base with the right --python (`launcher base resolve REF --python X.Y`), "
            "or `launcher base bootstrap`")
    return python, plat


def lock(ws: Workspace, variant: str = "all", **kw: object) -> list[LockResult]:
    variants = ws.variants() if variant == "all" else (images.check_variant(variant),)
    return [lock_variant(ws, v, **kw) for v in variants]  # type: ignore[arg-type]


def _pip_reason(output: str) -> str:
    lines = [ln.strip() for ln in plain_text(output).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("ERROR:") or "Could not find a version" in ln or "No matching distribution" in ln:
            return ln.removeprefix("ERROR: ")
    return lines[-1] if lines else "unknown error"
