"""lockfiles/images.lock: each variant's base image pinned by digest, and the checks
that keep a Dockerfile from building on anything else."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from launcher.errors import BadRecipe, HostUnreachable, LauncherError, NotFound, PinMismatch
from launcher.hashing import atomic_write_text
from launcher.images.imageref import ImageRef
from launcher.workspace import VARIANT_NAME, Workspace, check_variant_name

BASE_ARG = "LAUNCHER_BASE"
HEADER = (
    "# launcher images.lock: the base image of each variant, pinned by digest.\n"
    "# Written by `launcher base resolve REF` and `launcher base bootstrap`; builds refuse\n"
    "# any FROM that is not exactly one of these.\n"
)
KEYS = {"ref", "python", "platform", "source"}


@dataclass(frozen=True)
class BasePin:
    variant: str
    ref: str
    python: str = "3.11"
    platform: str = "linux/amd64"
    source: str = "registry"

    @property
    def digest(self) -> str:
        digest = ImageRef.parse(self.ref).digest
        assert digest is not None
        return digest


@dataclass
class ImagesLock:
    pins: dict[str, BasePin] = field(default_factory=dict)

    def get(self, variant: str) -> BasePin:
        check_variant(variant)
        try:
            return self.pins[variant]
        except KeyError:
            raise NotFound(f"images.lock has no base for variant {variant!r}",
                           f"run `launcher base resolve REF --variant {variant}`") from None

    def render(self) -> str:
        out = [HEADER]
        for variant in sorted(self.pins):
            pin = self.pins[variant]
            # a dotted name is one key only when quoted ([a.b] would be table b inside table a)
            out.append(f'\n["{variant}"]\n' if "." in variant else f"\n[{variant}]\n")
            out.append(f'ref = "{pin.ref}"\n')
            out.append(f'python = "{pin.python}"\n')
            out.append(f'platform = "{pin.platform}"\n')
            out.append(f'source = "{pin.source}"\n')
        return "".join(out)


def check_variant(variant: str) -> str:
    """A well-formed variant name; whether the workspace has it is for the files it needs to say."""
    return check_variant_name(variant)


def load(ws: Workspace) -> ImagesLock:
    return load_file(ws.images_lock)


def load_file(path: Path) -> ImagesLock:
    if not path.is_file():
        raise NotFound(f"{path} is missing", "pin a base with `launcher base resolve REF` or `launcher base bootstrap`")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PinMismatch(f"{path} is not valid TOML: {exc}", "restore it from git or re-pin the base") from exc
    lock = ImagesLock()
    for variant, table in data.items():
        if not VARIANT_NAME.match(variant) or not isinstance(table, dict):
            raise PinMismatch(f"{path}: [{variant}] is not a variant section",
                              "name each section after a variant ([cpu], [torch-gpu]): ref, python, platform, source")
        unknown = set(table) - KEYS
        if unknown or "ref" not in table:
            raise PinMismatch(f"{path} [{variant}]: unknown keys {sorted(unknown)} or no ref",
                              "keys are ref, python, platform, source")
        ref = str(table["ref"])
        if ImageRef.parse(ref).digest is None:
            raise PinMismatch(f"{path} [{variant}]: {ref} has no digest", "pin it: NAME:TAG@sha256:DIGEST")
        lock.pins[variant] = BasePin(variant, ref, str(table.get("python", "3.11")),
                                     str(table.get("platform", "linux/amd64")), str(table.get("source", "registry")))
    return lock


def save(ws: Workspace, lock: ImagesLock) -> bool:
    """Write images.lock; returns False (and writes nothing) when the content is unchanged."""
    text = lock.render()
    path = ws.images_lock
    if path.is_file() and path.read_text() == text:
        return False
    atomic_write_text(path, text)
    return True


_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE)


def dockerfile_froms(text: str) -> list[str]:
    refs: list[str] = []
    for line in text.splitlines():
        m = _FROM.match(line)
        if m:
            refs.append(m.group(1))
    return refs


def check_dockerfile(path: Path, pin: BasePin) -> list[str]:
    """Every FROM must be the pinned base (literally, or through ${LAUNCHER_BASE}) or an earlier stage."""
    if not path.is_file():
        raise NotFound(f"{path} is missing", "restore it from git or scaffold a workspace with `launcher init`")
    text = path.read_text()
    stages: set[str] = set()
    refs = dockerfile_froms(text)
    if not refs:
        raise BadRecipe(f"{path} has no FROM line", f"start it with `ARG {BASE_ARG}` and `FROM ${{{BASE_ARG}}}`")
    for line in text.splitlines():
        m = _FROM.match(line)
        if not m:
            continue
        ref, alias = m.group(1), m.group(2)
        if ref in (f"${{{BASE_ARG}}}", f"${BASE_ARG}") or ref in stages:
            pass
        else:
            parsed = ImageRef.parse(ref)
            if parsed.digest is None:
                raise PinMismatch(f"{path}: `FROM {ref}` has no digest",
                                  f"use `FROM ${{{BASE_ARG}}}` (filled from images.lock) or pin it with @sha256:...")
            if parsed.digest != pin.digest:
                raise PinMismatch(f"{path}: `FROM {ref}` disagrees with images.lock ({pin.ref})",
                                  "use `FROM ${LAUNCHER_BASE}`, or re-pin with `launcher base resolve`")
        if alias:
            stages.add(alias)
    return refs


FIX_BASE = ("build and pin a local base with `launcher base bootstrap --start-registry`, "
            "or pin a reachable one with `launcher base resolve REF`")


def base_pull_failed(pin: BasePin, error: str, last_line: str) -> LauncherError:
    """The error for a pinned base that is not in the engine and whose `docker pull` failed (error: docker's
    stderr): HostUnreachable when its registry could not be reached at all, NotFound when it answered."""
    from launcher.hosts.engine import registry_of, registry_unreachable

    if registry_unreachable(error):
        return HostUnreachable(f"the {pin.variant} base image {pin.ref} is not in the local Docker engine and its "
                               f"registry {registry_of(pin.ref)} cannot be reached ({last_line})", FIX_BASE)
    return NotFound(f"the {pin.variant} base image {pin.ref} is not in the local Docker engine and cannot be pulled "
                    f"({last_line})", f"check that the digest exists in {registry_of(pin.ref)}; or {FIX_BASE}")
