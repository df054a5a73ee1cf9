"""A project's OS packages, locked like its wheels: `[system] apt = [...]` (a recipe's recipe.toml or a
project's launcher.toml) resolved against the variant's pinned base image, with its own Debian release
and apt sources, into `system.lock` beside the project: every .deb to add (dependencies included, not
those the base has) with version, architecture, URL, size and the sha256 of the archive's Packages index.

Resolving runs launcher.images.aptdriver in a container of the base, with network; aptplan parses and
cross-checks apt's answer. The .debs are fetched and unpacked by launcher.images.debs, never installed:
no maintainer script runs (see the README, section Lock).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import tomllib

from launcher.config import FILE as PROJECT_FILE
from launcher.config import PROJECT_TABLE
from launcher.errors import BadConfig, BadRecipe, LockFailed, NotFound
from launcher.hashing import atomic_write_text, sha256_file
from launcher.hosts.containerspec import ContainerSpec
from launcher.images import lock as pylock
from launcher.images import pins
from launcher.progress import NullReporter, Reporter
from launcher.runtime import recipespec as rspec
from launcher.runtime.systemspec import SystemSpecError, check_system, merge_packages
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.images.aptplan import DebPackage

LOCK_FILE = "system.lock"
LOCK_VERSION = 1
RESOLVE_TIMEOUT_S = 900.0
_HEAD = "# launcher system lock"
_FIX_BASE = ("build and pin a local base with `launcher base bootstrap --start-registry`, "
             "or pin a reachable one with `launcher base resolve REF`")


@dataclass(frozen=True)
class Declared:
    """The OS packages a project folder declares, and the files that declare them."""

    packages: tuple[str, ...]
    files: tuple[Path, ...] = ()

    def where(self, folder: Path) -> str:
        names = " and ".join(p.name for p in self.files) or f"{PROJECT_FILE} or {rspec.RECIPE_FILE}"
        return f"[system] apt of {folder}/{names}" if len(self.files) <= 1 else f"[system] apt of {folder} ({names})"


@dataclass(frozen=True)
class SystemLock:
    """system.lock: the .debs a project adds to its variant's base, and what they were resolved against."""

    base: str  # the pinned base image, name@sha256:...
    debian: str
    codename: str
    architecture: str
    requested: tuple[str, ...]  # as declared: NAME or NAME=VERSION, sorted
    packages: tuple[DebPackage, ...]  # sorted by name
    in_base: tuple[str, ...] = ()  # requested packages the base already has, NAME=VERSION
    sources: tuple[str, ...] = ()  # the base's Packages indexes
    base_links: dict[str, str] = field(default_factory=dict)  # merged /usr: {"lib": "usr/lib", ...}

    @property
    def base_digest(self) -> str:
        return self.base.rpartition("@")[2]

    def records(self) -> list[dict[str, str]]:
        """Each package's name, version, architecture and sha256: what a run's manifest lists."""
        return [p.record() for p in self.packages]

    def text(self) -> str:
        """The file's bytes: sorted, no times, the same for the same resolution on any machine."""
        q = _toml_str
        lines = [
            f"{_HEAD}: OS packages, each .deb pinned by version and the sha256 of the archive's Packages index.",
            f"# resolved inside the base image {self.base}",
            f"# Debian {self.debian} ({self.codename}, {self.architecture}); regenerate: launcher lock PROJECT",
            f"lock_version = {LOCK_VERSION}",
            f"base = {q(self.base)}",
            f"debian = {q(self.debian)}",
            f"codename = {q(self.codename)}",
            f"architecture = {q(self.architecture)}",
            f"requested = {_toml_list(self.requested)}",
            f"in_base = {_toml_list(self.in_base)}",
            f"sources = {_toml_list(self.sources)}",
            "",
            "[base_links]",
            *(f"{k} = {q(v)}" for k, v in sorted(self.base_links.items())),
        ]
        for p in self.packages:
            lines += ["", "[[package]]", f"name = {q(p.name)}", f"version = {q(p.version)}",
                      f"architecture = {q(p.architecture)}", f"url = {q(p.url)}", f"size = {p.size}",
                      f"sha256 = {q(p.sha256)}"]
            if p.base_version is not None:
                lines.append(f"base_version = {q(p.base_version)}")
        return "\n".join(lines) + "\n"


class SystemLockRecord(TypedDict):
    """`launcher lock`'s data for a project's OS packages (SystemLockResult.to_dict)."""

    folder: str
    path: str
    changed: bool
    sha256: str
    base: str
    debian: str
    requested: list[str]
    in_base: list[str]
    packages: list[dict[str, str]]  # SystemLock.records(): name, version, architecture, sha256
    debs: list[str]


@dataclass(frozen=True)
class SystemLockResult:
    folder: Path
    path: Path
    changed: bool
    lock: SystemLock
    sha256: str  # of system.lock: what a run's manifest records as image.project.system_lock_sha256
    debs: tuple[Path, ...] = ()  # the verified .deb files in the cache, in the lock's order

    def to_dict(self) -> SystemLockRecord:
        return {"folder": str(self.folder), "path": str(self.path), "changed": self.changed, "sha256": self.sha256,
                "base": self.lock.base, "debian": self.lock.debian, "requested": list(self.lock.requested),
                "in_base": list(self.lock.in_base), "packages": self.lock.records(),
                "debs": [str(d) for d in self.debs]}


def _toml_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string


def _toml_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


def declared(folder: Path) -> Declared:
    """The OS packages `folder` declares: [system] apt in its recipe.toml and in its launcher.toml."""
    found: list[str] = []
    files: list[Path] = []
    recipe = folder / rspec.RECIPE_FILE
    if recipe.is_file():
        try:
            apt = rspec.load_spec(folder.resolve()).apt
        except rspec.SpecError as exc:
            raise BadRecipe(str(exc), "fix that key in recipe.toml (the README's Recipes section has the format)") \
                from None
        if apt:
            found += apt
            files.append(recipe)
    project = folder / PROJECT_FILE
    if project.is_file():
        try:
            data = tomllib.loads(project.read_text(encoding="utf-8"))
            apt = check_system(data[PROJECT_TABLE]) if PROJECT_TABLE in data else ()
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise BadConfig(f"{project} cannot be read as TOML: {exc}",
                            'write it as TOML, e.g. [system] then apt = ["tree"]') from None
        except SystemSpecError as exc:
            raise BadConfig(f"{project}: {exc}", 'declare OS packages as [system] then apt = ["NAME", ...]') \
                from None
        if apt:
            found += apt
            files.append(project)
    try:
        return Declared(merge_packages(found), tuple(files))
    except SystemSpecError as exc:
        raise BadConfig(f"{folder}: {exc.detail}", "pin each package once, in one file") from None


def resolve(ws: Workspace, variant: str, packages: tuple[str, ...], reporter: Reporter | None = None, *,
            where: str = "[system] apt") -> SystemLock:
    """The .debs that installing `packages` adds to the variant's pinned base, resolved by apt inside a
    container of that base (with network) against its own Debian release and sources."""
    from launcher.images import aptdriver, aptplan  # apt's side: only where a project declares OS packages

    rep = reporter or NullReporter()
    requested = merge_packages(list(packages))
    try:
        pin = pins.load(ws).get(variant)
    except NotFound as exc:
        raise NotFound(exc.message, _FIX_BASE) from exc
    eng = pylock.base_engine(pin, rep)
    env = {k: v for k in pylock.PROXY_ENV if (v := os.environ.get(k))}
    request = json.dumps({"packages": list(requested), "env": env}).encode()
    task = rep.task(f"resolving {' '.join(requested)} with apt inside the {variant} base image")
    try:
        driver = (Path(__file__).parent / "aptdriver.py").read_text()
        spec = ContainerSpec(pin.ref, ("python3", "-c", driver), platform=pin.platform, network="bridge", stdin=True)
        done = eng.run_to_end(spec, input=request, timeout=RESOLVE_TIMEOUT_S)
    finally:
        task.close()
    answer = next((json.loads(ln[len(aptdriver.MARKER):]) for ln in done.out.splitlines()
                   if ln.startswith(aptdriver.MARKER)), None)
    if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
        raise LockFailed(f"resolving OS packages inside the base image {pin.ref} failed: {done.last_error_line()}",
                         "check that the base image runs python3 and apt-get (`docker run --rm IMAGE apt-get -v`)")
    base, found, in_base = aptplan.plan(cast(aptplan.AptAnswer, answer), requested, where)
    return SystemLock(pin.ref, base.debian, base.codename, base.architecture, requested, tuple(found),
                      tuple(in_base), base.sources, base.links)


def read(path: Path) -> SystemLock:
    """system.lock, checked; LockFailed when it is not one launcher wrote."""
    from launcher.images.aptplan import DebPackage

    fix = f"regenerate it with `launcher lock {path.parent}`"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFound(f"{path} is missing", f"create it with `launcher lock {path.parent}`") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise LockFailed(f"{path} is not a readable system lock: {exc}", fix) from None
    if data.get("lock_version") != LOCK_VERSION:
        raise LockFailed(f"{path} has lock_version {data.get('lock_version')!r}; this launcher reads {LOCK_VERSION}",
                         fix)
    try:
        packages = tuple(DebPackage(str(p["name"]), str(p["version"]), str(p["architecture"]), str(p["url"]),
                                    int(p["size"]), _digest(p["sha256"]),
                                    str(p["base_version"]) if "base_version" in p else None)
                         for p in data.get("package", []))
        return SystemLock(str(data["base"]), str(data["debian"]), str(data["codename"]), str(data["architecture"]),
                          tuple(map(str, data["requested"])), packages, tuple(map(str, data.get("in_base", []))),
                          tuple(map(str, data.get("sources", []))),
                          {str(k): str(v) for k, v in dict(data.get("base_links", {})).items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise LockFailed(f"{path} is not a valid system lock ({type(exc).__name__}: {exc})", fix) from None


def _digest(value: Any) -> str:
    from launcher.images.aptplan import SHA256_HEX

    text = str(value)
    if not (text.startswith("sha256:") and SHA256_HEX.match(text[7:])):
        raise ValueError(f"sha256 {text!r} is not sha256:<64 hex digits>")
    return text


def write(lock: SystemLock, path: Path) -> bool:
    """Write system.lock atomically when its bytes change; whether they did."""
    text = lock.text()
    if path.is_file() and path.read_bytes() == text.encode():
        return False
    atomic_write_text(path, text)
    return True


def lock_sha256(path: Path) -> str:
    """sha256:<hex> of system.lock, as the manifest records it."""
    return sha256_file(path)


def lock_project(ws: Workspace, folder: Path, variant: str, reporter: Reporter | None = None, *,
                 upgrade: bool = False, fetch: bool = True) -> SystemLockResult | None:
    """Lock the OS packages `folder` declares for `variant` into folder/system.lock, and (fetch) put their
    .debs, verified, in launcher's cache. A lock of the same packages on the same base is kept as it is
    (no container, no network) unless `upgrade`. None when the folder declares no OS packages (a
    system.lock launcher wrote there before is removed: nothing would keep it current)."""
    rep = reporter or NullReporter()
    folder = folder.resolve()
    decl = declared(folder)
    path = folder / LOCK_FILE
    if not decl.packages:
        if path.is_file() and path.read_text(errors="replace").startswith(_HEAD):
            path.unlink()
            rep.note(f"removed {path}: {folder} declares no OS packages any more")
        return None
    pin = pins.load(ws).get(variant)
    existing: SystemLock | None = None
    if path.is_file() and not upgrade:
        try:
            existing = read(path)
        except LockFailed:
            existing = None  # rewritten below
    if existing is not None and existing.base == pin.ref and existing.requested == decl.packages:
        lock, changed = existing, False
    else:
        lock = resolve(ws, variant, decl.packages, rep, where=decl.where(folder))
        changed = write(lock, path)
    from launcher.images import debs  # with its network client: only when packages are fetched

    files = tuple(debs.fetch(lock, ws.cache_dir, rep)) if fetch else ()
    return SystemLockResult(folder, path, changed, lock, lock_sha256(path), files)


def current(ws: Workspace, folder: Path, variant: str) -> SystemLock | None:
    """The project's system.lock when it matches what the folder declares and the variant's base; None when
    it declares no OS packages. NotFound (no lock) or LockFailed (out of date) name `launcher lock` as fix."""
    folder = folder.resolve()
    decl = declared(folder)
    if not decl.packages:
        return None
    path = folder / LOCK_FILE
    fix = f"run `launcher lock {folder} --variant {variant}`"
    if not path.is_file():
        raise NotFound(f"{decl.where(folder)} declares OS packages ({' '.join(decl.packages)}) but {path} is missing",
                       fix)
    lock = read(path)
    if lock.requested != decl.packages:
        raise LockFailed(f"{path} is out of date: it locks {' '.join(lock.requested)}, {decl.where(folder)} "
                         f"declares {' '.join(decl.packages)}", fix)
    pin = pins.load(ws).get(variant)
    if lock.base != pin.ref:
        raise LockFailed(f"{path} was resolved for the base {lock.base}; the {variant} image builds on {pin.ref}",
                         fix)
    return lock
