"""A project's own Python requirements, locked beside it against the image it runs in.

A project (the folder a plain script is sent with, or a recipe folder) declares what it needs
beyond the framework in ``requirements.in`` (preferred), ``requirements.txt`` or ``pyproject.toml``
``[project] dependencies``. ``lock_project`` resolves them with pip-tools inside the variant's
pinned base image (as :mod:`launcher.images.lock` does for variants), with hashes, constrained by
the variant's lock: the framework and everything the image already holds cannot move. The
result is ``requirements.lock`` beside the declaration, byte-stable; its header records the
input's sha256 and the variant lock's, so a run can tell when it is stale (:func:`stale_reason`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import tomllib

from launcher.errors import LockFailed, NotFound, UsageError
from launcher.hashing import atomic_write_text, sha256_bytes, sha256_file
from launcher.images import lock
from launcher.images import pins as images
from launcher.images.lock import LockedRequirement, parse_lock
from launcher.progress import NullReporter, Reporter
from launcher.workspace import Workspace

LOCK_NAME = "requirements.lock"
DECLARATIONS = ("requirements.in", "requirements.txt", "pyproject.toml")
PYPROJECT_INPUT = "pyproject-dependencies.in"  # what pip-compile is given for pyproject.toml's list
CONSTRAINTS = "launcher-constraints.txt"
_INPUT = re.compile(r"^# input: (\S+) (sha256:[0-9a-f]{64})", re.MULTILINE)
_CONSTRAINTS = re.compile(r"^# constraints: lockfiles/(\S+)\.txt (sha256:[0-9a-f]{64})", re.MULTILINE)
_INCLUDE = re.compile(r"^\s*(?:-r|-c|--requirement|--constraint)(?:\s+|=)(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Requirements:
    """What a project declares: the file, the requirements text pip-compile gets, and its digest."""

    folder: Path
    source: Path
    text: str
    sha256: str

    @property
    def lock_path(self) -> Path:
        return self.folder / LOCK_NAME

    @property
    def input_name(self) -> str:
        return PYPROJECT_INPUT if self.source.name == "pyproject.toml" else self.source.name


@dataclass(frozen=True)
class ProjectLockResult:
    folder: Path
    path: Path
    variant: str
    changed: bool
    packages: int  # every package of the lock
    extra: int  # those the variant's image does not hold
    sha256: str
    target: str
    base: str

    def to_dict(self) -> dict[str, object]:
        return {"folder": str(self.folder), "path": str(self.path), "variant": self.variant, "changed": self.changed,
                "packages": self.packages, "extra": self.extra, "sha256": self.sha256, "target": self.target,
                "base": self.base}


def find(folder: Path) -> Requirements | None:
    """The project's declared requirements (requirements.in, else requirements.txt, else pyproject.toml's
    [project] dependencies), or None when it declares none."""
    for name in DECLARATIONS[:2]:
        path = folder / name
        if path.is_file():
            data = path.read_bytes()
            return Requirements(folder, path, data.decode("utf-8", "replace"), sha256_bytes(data))
    path = folder / "pyproject.toml"
    if not path.is_file():
        return None
    try:
        project = tomllib.loads(path.read_text()).get("project")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}", "fix it, or declare the requirements in a "
                         "requirements.in beside it") from None
    if not isinstance(project, dict):
        return None
    if "dependencies" in (project.get("dynamic") or []):
        raise UsageError(f"{path} declares its dependencies as dynamic, which launcher cannot read",
                         "list them in [project] dependencies, or in a requirements.in beside it")
    deps = project.get("dependencies") or []
    if not deps:
        return None
    text = "".join(f"{d}\n" for d in deps)
    return Requirements(folder, path, text, sha256_bytes(text.encode()))


def header(req: Requirements, variant: str, constraints_sha: str, pin: images.BasePin, python: str | None,
           platform: str | None) -> str:
    what = " (its [project] dependencies)" if req.source.name == "pyproject.toml" else ""
    how = (f"# resolved inside the base image by CPython {python} on {platform} (pip-tools {lock.PIP_TOOLS})\n"
           if python else "# nothing to resolve: every requirement is a package the image pins, at a version it "
           "allows\n")
    return (
        f"# launcher project lock: what this project needs beside the {variant} image, every package pinned by "
        "version and sha256.\n"
        f"# input: {req.source.name} {req.sha256}{what}\n"
        f"# constraints: lockfiles/{variant}.txt {constraints_sha} (the image's packages cannot move)\n"
        + how +
        f"# base: {pin.ref}\n"
        f"# regenerate: launcher lock PROJECT_FOLDER --variant {variant}\n"
    )


def recorded(text: str) -> tuple[str | None, str | None, str | None]:
    """(input digest, variant, variant lock digest) a lock's header records; None where it records none."""
    inp, con = _INPUT.search(text), _CONSTRAINTS.search(text)
    return (inp.group(2) if inp else None, con.group(1) if con else None, con.group(2) if con else None)


def stale_reason(ws: Workspace, req: Requirements, variant: str) -> str | None:
    """Why the project's requirements.lock must be locked again for variant (None: it is current)."""
    if not req.lock_path.is_file():
        return f"{LOCK_NAME} is missing"
    digest, locked_for, constraints = recorded(req.lock_path.read_text())
    if digest is None or locked_for is None:
        return f"{LOCK_NAME} has no launcher header"
    if locked_for != variant:
        return f"{LOCK_NAME} was locked for the {locked_for} image, not {variant}"
    if digest != req.sha256:
        return f"{req.source.name} changed since it was locked"
    variant_lock = ws.lock_txt(variant)
    if variant_lock.is_file() and sha256_file(variant_lock) != constraints:
        return f"lockfiles/{variant}.txt changed since it was locked"
    return None


def extra_requirements(project: Sequence[LockedRequirement], variant: Sequence[LockedRequirement]
                       ) -> list[LockedRequirement]:
    """The project's packages the variant's image does not already hold (at the same version)."""
    held = {r.name: r.version for r in variant}
    return [r for r in project if held.get(r.name) != r.version]


def lock_project(ws: Workspace, folder: Path, variant: str, *, upgrade: bool = False,
                 upgrade_packages: tuple[str, ...] = (), ca_bundle: Path | None = None,
                 find_links: Sequence[Path] = (), reporter: Reporter | None = None) -> ProjectLockResult:
    """Lock the project's requirements into FOLDER/requirements.lock for the variant's image: resolved
    inside its pinned base image, constrained by lockfiles/VARIANT.txt, companions checked against the
    framework build. Written atomically, and only when it changed."""
    from launcher.images import wheelsources

    rep = reporter or NullReporter()
    folder = folder.resolve()
    req = find(folder)
    if req is None:
        raise NotFound(f"{folder} declares no requirements (no requirements.in, requirements.txt or "
                       "pyproject.toml [project] dependencies)", "add a requirements.in, one requirement a line")
    variant_lock = ws.lock_txt(variant)
    if not variant_lock.is_file():
        raise NotFound(f"{variant_lock} is missing: a project is locked against its variant's lock",
                       f"lock the variant first: `launcher lock --variant {variant}`")
    try:
        pin = images.load(ws).get(variant)
    except NotFound as exc:
        raise NotFound(exc.message, images.FIX_BASE) from exc
    ca_path = ca_bundle if ca_bundle is not None else lock.default_ca_bundle()
    ca_text = lock.read_ca_bundle(ca_path) if ca_path is not None else None
    constraints_text = variant_lock.read_text()
    held = parse_lock(constraints_text, str(variant_lock))
    satisfied = held_by_image(req, held)
    if satisfied is not None:  # nothing to resolve: every requirement is a package the image pins
        return _write(req, variant, header(req, variant, sha256_file(variant_lock), pin, None, None)
                      + _pinned_lines(req, satisfied), held, folder, pin)
    eng = lock.base_engine(pin, rep)
    files, dropped = _inputs(req, constraints_text, held, upgrade)
    out = f"lockfiles/{LOCK_NAME}"
    argv = lock.compile_argv(f"lockfiles/{req.input_name}", out, upgrade, upgrade_packages)
    diagnose = ["install", "--dry-run", "--ignore-installed", "--no-input", "-r", f"lockfiles/{req.input_name}"]
    answer = lock.compile_in_base(eng, pin, files, argv, out, find_links=find_links, ca_text=ca_text,
                                  diagnose=diagnose, task=rep.task(f"locking {req.source.name} of {folder.name} "
                                                                   f"against the {variant} image"))
    if not answer.get("ok"):
        raise _failure(answer, ws, req, variant, held, pin, ca_path, dropped)
    python, plat = lock.check_target(answer, pin)
    body = str(answer["lock"]).replace(" -r lockfiles/", " -r ").replace(
        f"lockfiles/{CONSTRAINTS}", f"lockfiles/{variant}.txt")
    indexes = "".join(f"{o} {u}\n" for o, u in dict.fromkeys(
        [*wheelsources.index_options(constraints_text), *wheelsources.index_options(req.text)]))
    text = header(req, variant, sha256_file(variant_lock), pin, python, plat) + indexes + body
    return _write(req, variant, text, held, folder, pin, f"CPython {python} {plat}")


def _write(req: Requirements, variant: str, text: str, held: Sequence[LockedRequirement], folder: Path,
           pin: images.BasePin, target: str = "") -> ProjectLockResult:
    reqs = parse_lock(text, str(req.lock_path))
    _check_against(reqs, held, req, variant, folder, text)
    path = req.lock_path
    changed = not (path.is_file() and path.read_text() == text)
    if changed:
        atomic_write_text(path, text)
    return ProjectLockResult(folder, path, variant, changed, len(reqs), len(extra_requirements(reqs, held)),
                             sha256_file(path), target or "none: every requirement is pinned by the image", pin.ref)


def held_by_image(req: Requirements, held: Sequence[LockedRequirement]) -> list[LockedRequirement] | None:
    """The variant's pins that satisfy every requirement the project declares, when each of its lines is a
    plain requirement (a name, a version specifier, no extras, markers, URLs or options) of a package the
    image pins at a version it allows (``torch>=2.6`` beside the image's ``torch==2.13.0+cpu``); else None,
    and the requirements are resolved by pip-compile."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    pins = {canonicalize_name(r.name): r for r in held}
    found: list[LockedRequirement] = []
    for raw in req.text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            return None
        try:
            parsed = Requirement(line)
        except InvalidRequirement:
            return None
        pinned = pins.get(canonicalize_name(parsed.name))
        if parsed.extras or parsed.marker or parsed.url or pinned is None:
            return None
        if not parsed.specifier.contains(pinned.version, prereleases=True):
            return None
        if pinned not in found:
            found.append(pinned)
    return found


def _pinned_lines(req: Requirements, pinned: Sequence[LockedRequirement]) -> str:
    """The pins a project takes from its image, in the lock's usual form (each with its hashes)."""
    out = []
    for r in sorted(pinned, key=lambda r: r.name):
        hashes = "".join(f" \\\n    --hash=sha256:{h}" for h in r.hashes)
        out.append(f"{r.name}=={r.version}{hashes}\n    # via -r {req.source.name} (pinned by the image)\n")
    return "".join(out)


def _inputs(req: Requirements, constraints_text: str, held: Sequence[LockedRequirement],
            upgrade: bool) -> tuple[dict[str, str], list[str]]:
    """The files pip-compile works on: the requirement files its input includes (-r, -c), its input
    constrained by the variant's pins and headed by the indexes this machine reaches, and the pins
    of its existing lock that the image does not fix (kept unless an upgrade is asked for)."""
    from launcher.images import wheelsources

    files = _included(req.folder, req.text)
    indexes = "".join(f"{o} {u}\n" for o, u in wheelsources.index_options(constraints_text))
    files[req.input_name] = f"{indexes}{req.text.rstrip()}\n-c {CONSTRAINTS}\n"
    files[CONSTRAINTS] = "".join(f"{r.name}=={r.version}\n" for r in held)
    if req.lock_path.is_file() and not upgrade:
        try:
            old = parse_lock(req.lock_path.read_text(), str(req.lock_path))
        except LockFailed:
            old = []
        fixed = {r.name for r in held}
        files[LOCK_NAME] = "".join(f"{r.name}=={r.version}\n" for r in old if r.name not in fixed)
    dropped: list[str] = []
    for name, text in files.items():
        files[name], gone = wheelsources.split_indexes(text)
        dropped += [u for u in gone if u not in dropped]
    return files, dropped


def _included(folder: Path, text: str, seen: dict[str, str] | None = None) -> dict[str, str]:
    """The requirement files text names with -r/-c (and those they name), beside it in folder."""
    seen = {} if seen is None else seen
    for name in _INCLUDE.findall(text):
        path = (folder / name).resolve()
        if name in seen or not path.is_file() or not path.is_relative_to(folder.resolve()) or "/" in name:
            continue
        seen[name] = path.read_text()
        _included(folder, seen[name], seen)
    return seen


def _check_against(reqs: Sequence[LockedRequirement], held: Sequence[LockedRequirement], req: Requirements,
                   variant: str, folder: Path, text: str) -> None:
    from launcher.images import companions

    pins = {r.name: r.version for r in held}
    for r in reqs:
        if r.name in pins and pins[r.name] != r.version:  # the constraints make this impossible; never trust it
            raise LockFailed(f"{req.source.name} locked {r.name}=={r.version}, but the {variant} image pins "
                             f"{r.name}=={pins[r.name]}", f"`launcher lock {folder} --variant {variant}` again")
    where = {**dict.fromkeys(pins, f"lockfiles/{variant}.txt"), **{r.name: LOCK_NAME for r in reqs
                                                                    if r.name not in pins}}
    companions.check({**pins, **{r.name: r.version for r in reqs}}, where, source=req.source.name,
                     relock=f"launcher lock {folder} --variant {variant}", pulled_by=companions.via(text))


def conflict(output: str, diagnosis: str, source: str, variant: str, held: Sequence[LockedRequirement],
             ws: Workspace | None = None) -> LockFailed | None:
    """A resolution that failed on a requirement a pin of the image does not satisfy: both sides named and the
    two ways out (launcher.images.lockcauses); None when it met no pin, or when every pin satisfies what pip
    named (then no conflict: see :func:`_failure`)."""
    from launcher.images import lockcauses

    clash = lockcauses.read_clash(output, diagnosis, source, held)
    if clash is None or not clash.real:
        return None
    return lockcauses.conflict_error(clash, ws, source, variant)


def _failure(answer: lock.LockAnswer, ws: Workspace, req: Requirements, variant: str,
             held: Sequence[LockedRequirement], pin: images.BasePin, ca_path: Path | None,
             dropped: Sequence[str]) -> LockFailed:
    from launcher.images import lockcauses, wheelsources

    output, diagnosis = str(answer.get("output", "")), str(answer.get("diagnosis", ""))
    clash = lockcauses.read_clash(output, diagnosis, req.source.name, held)
    if clash is not None and clash.real:  # a bound the image's pin breaks: no index or folder can help
        return lockcauses.conflict_error(clash, ws, req.source.name, variant)
    if clash is not None:  # every pin satisfies what pip named: it could not read the pinned build
        return lockcauses.unavailable_error(clash, req.source.name, variant, dropped, pin, str(req.folder))
    failed = lock.explain_failure(answer, req.source.name, pin, ca_path)
    if failed.message.startswith("pip-tools could not resolve"):
        said = [ln.strip().removeprefix("ERROR: ") for ln in output.splitlines()]
        best = next((ln for key in ("No matching distribution", "Could not find a version")
                     for ln in said if ln.startswith(key)), None)
        if best:  # pip's first ERROR line may only list yanked releases it ignored
            failed.message = f"pip-tools could not resolve {req.source}: {best}"
        failed.hint = (f"check the names and versions in {req.source}; a wheel no reachable index serves "
                       "goes in a folder given with --find-links DIR")
    failed.message += wheelsources.unreachable_hint(dropped)
    return failed
