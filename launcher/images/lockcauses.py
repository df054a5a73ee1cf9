"""Why a project's requirements could not be locked against its image, said as the cause it is.

pip reports two different failures in one way, `ResolutionImpossible` between a requirement and the
image's pin (the lock's constraint). Told apart here by asking whether the pin satisfies each
requirement pip named:

* **a real conflict** (``torch<2.6`` against the image's ``torch==2.13.0+cpu``): no index or folder can
  help. The two ways out are to relax the bound, or to run on a variant of the image built with a version
  the bound allows: the error gives the exact commands (:func:`variant_commands`);
* **no conflict** (``torch`` or ``torch>=2.6``, which the pin satisfies): pip could not read the pinned
  build's metadata, because the index that serves it was left out as unreachable (or none reachable serves
  it). The error names the index and the package, and the fix: that wheel in a folder, ``--find-links DIR``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.errors import LauncherError, LockFailed
from launcher.images import companions
from launcher.images import pins as images
from launcher.images.lock import LockedRequirement, normalize_name
from launcher.workspace import VARIANT_NAME, Workspace

_CONFLICT = re.compile(r"^The conflict is caused by:\s*$((?:\n[ \t]+\S.*)+)", re.MULTILINE)
_CANNOT = re.compile(r"Cannot install (.+?) because these package versions have conflicting dependencies")
_DEPENDS = re.compile(r"^(\S+) (\S+) depends on (.+)$")
_OPS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne", "~=": "compat", "===": "is"}
MAX_WANTS = 3  # pip lists every release it tried; the newest few say it


@dataclass(frozen=True)
class Want:
    """One requirement pip named against the image's pins."""

    line: str  # as said: "requirements.in asks for torch<2.6", "torchvision 0.27.0 depends on torch==2.12.0"
    requirement: str  # "torch<2.6"
    pinned: str | None  # the image's pin of the package it names ("torch==2.13.0+cpu"); None: the image has none
    allowed: bool  # the pin satisfies it (True where the image pins nothing of that name)
    direct: bool  # the project's own requirement (not a dependency's)


@dataclass(frozen=True)
class Clash:
    """What pip said conflicts: the requirements and the pins they meet."""

    wants: list[Want]
    pins: list[str]

    @property
    def real(self) -> list[Want]:
        """The requirements the image's pins do not satisfy."""
        return [w for w in self.wants if w.pinned is not None and not w.allowed]

    @property
    def pinned_wants(self) -> list[Want]:
        return [w for w in self.wants if w.pinned is not None]


def _want(spec: str, line: str, held: dict[str, LockedRequirement], direct: bool) -> Want:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(spec)
    except InvalidRequirement:
        return Want(line, spec, None, True, direct)
    pin = held.get(normalize_name(req.name))
    if pin is None:
        return Want(line, spec, None, True, direct)
    allowed = req.specifier.contains(pin.version, prereleases=True)
    return Want(line, spec, f"{pin.name}=={pin.version}", allowed, direct)


def read_clash(output: str, diagnosis: str, source: str, held: Sequence[LockedRequirement]) -> Clash | None:
    """The requirements and pins of a failed resolution that met a pin of the image; None when it met none."""
    if "conflicting dependencies" not in output and "ResolutionImpossible" not in output:
        return None
    by_name = {normalize_name(r.name): r for r in held}
    wants: list[Want] = []
    pins: list[str] = []
    block = _CONFLICT.search(diagnosis)
    for line in (ln.strip() for ln in (block.group(1) if block else "").splitlines() if ln.strip()):
        if line.startswith("The user requested (constraint) "):
            pins.append(line.removeprefix("The user requested (constraint) "))
        elif line.startswith("The user requested "):
            spec = line.removeprefix("The user requested ")
            wants.append(_want(spec, f"{source} asks for {spec}", by_name, True))
        elif (dep := _DEPENDS.match(line)) is not None:
            wants.append(_want(dep.group(3), line, by_name, False))
        else:
            wants.append(Want(line, line, None, True, False))
    cannot = _CANNOT.search(output)
    if cannot and not any(w.pinned for w in wants):
        for spec in re.split(r",\s*| and ", cannot.group(1)):
            found = _want(spec.strip(), f"{source} asks for {spec.strip()}", by_name, True)
            if found.pinned is not None:
                wants.append(found)
                pins.append(found.pinned)
    if not pins or not any(w.pinned for w in wants):
        return None
    return Clash(list({w.line: w for w in wants}.values()), list(dict.fromkeys(pins)))


def _said(wants: Sequence[Want]) -> str:
    lines = [w.line for w in wants]
    if len(lines) > MAX_WANTS:
        lines = [*lines[:MAX_WANTS], f"({len(lines) - MAX_WANTS} older releases alike)"]
    return "; ".join(lines)


def variant_name(variant: str, requirement: str) -> str:
    """A variant name for the image built with this requirement: ``torch-cpu`` + ``torch<2.6`` ->
    ``torch-cpu-torch-lt2_6``."""
    spec = requirement.replace(" ", "")
    for op in sorted(_OPS, key=len, reverse=True):
        spec = spec.replace(op, f"-{_OPS[op]}")
    # no dot: images.lock names its sections bare, and TOML reads [a.b] as a table in a table
    name = re.sub(r"[^a-z0-9_-]+", "-", f"{variant}-{spec.lower().replace('.', '_')}").strip("-_")[:64]
    return name if VARIANT_NAME.match(name) else f"{variant}-custom"


def variant_commands(ws: Workspace | None, variant: str, want: Want) -> tuple[str, str]:
    """(the new variant's name, the shell commands that make, lock and build it in the workspace): the
    variant's .in with the pin's line replaced by the requirement, the variant's Dockerfile, its base pinned
    as the variant's is (without a workspace to read: the .in copied whole, the base for the user to pin)."""
    new = variant_name(variant, want.requirement)
    lock_in, new_in = f"lockfiles/{variant}.in", f"lockfiles/{new}.in"
    try:
        lines = [ln.strip() for ln in ws.lock_in(variant).read_text().splitlines()] if ws is not None else []
    except OSError:
        lines = []
    pinned_line = next((ln for ln in lines if want.pinned and ln == want.pinned), None)
    copy = (f"grep -vxF {shlex.quote(pinned_line)} {lock_in} > {new_in}" if pinned_line
            else f"cp {lock_in} {new_in}")
    steps = [copy, f"echo {shlex.quote(want.requirement)} >> {new_in}",
             f"cp dockerfiles/{variant}.Dockerfile dockerfiles/{new}.Dockerfile"]
    try:
        if ws is None:
            raise LauncherError("no workspace to read images.lock from")
        pin = images.load(ws).get(variant)
        section = (f"\\n[{new}]\\nref = \"{pin.ref}\"\\npython = \"{pin.python}\"\\nplatform = \"{pin.platform}\"\\n"
                   f"source = \"{pin.source}\"\\n")
        steps.append(f"printf {shlex.quote(section)} >> lockfiles/images.lock")
    except LauncherError:  # no pin to copy: the base is the user's to choose
        steps.append(f"launcher base resolve REF --variant {new}")
    steps += [f"launcher lock --variant {new}", f"launcher build --variant {new}"]
    if ws is not None:  # the paths are the workspace's, wherever the user is
        steps.insert(0, f"cd {shlex.quote(str(ws.root))}")
    return new, " && ".join(steps)


def conflict_error(clash: Clash, ws: Workspace | None, source: str, variant: str) -> LockFailed:
    """A real conflict: both sides named, and the two ways out (relax the bound; a variant built with it)."""
    named = ", ".join(clash.pins)
    message = f"{_said(clash.wants) or source}, but the {variant} image pins {named} (lockfiles/{variant}.txt)"
    direct = next((w for w in clash.real if w.direct), None)
    relax = f"relax the bound in {source} so that it allows {named} (the image's packages cannot move)"
    if direct is None:
        return LockFailed(message, f"either {relax}, or run the project with another --variant whose lock fits")
    new, commands = variant_commands(ws, variant, direct)
    return LockFailed(message, f"either {relax}: e.g. `{direct.requirement.split(';')[0]}` -> "
                               f"`{_name_of(direct.requirement)}`; or build a variant of the {variant} image with "
                               f"{direct.requirement} and run on it: `{commands}`, then run with --variant {new}")


def _name_of(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0]


def _wheel_platforms(platform: str) -> list[str]:
    arch = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}.get(platform, "x86_64")
    return [f"manylinux_2_28_{arch}", f"manylinux2014_{arch}"]


def unavailable_error(clash: Clash, source: str, variant: str, dropped: Sequence[str], pin: images.BasePin,
                      folder: str) -> LockFailed:
    """No conflict: the pins satisfy every requirement pip named, but their build could not be read: the index
    that serves it was left out as unreachable (or none reachable serves it)."""
    wanted = clash.pinned_wants[0]
    pinned = wanted.pinned or clash.pins[0]
    name, _, version = pinned.partition("==")
    tag = companions.label(version)
    index = next((u for u in dropped if tag and u.rstrip("/").endswith(f"/{tag}")), dropped[0] if dropped else None)
    where = (f"{index}, the index that serves it, cannot be reached from this machine" if index
             else "no index this machine reaches serves it")
    message = (f"{source} asks for {wanted.requirement}, which the {variant} image's {pinned} satisfies (no "
               f"conflict); but resolving needs {pinned}'s metadata and {where}")
    platforms = " ".join(f"--platform {p}" for p in _wheel_platforms(pin.platform))
    download = (f"pip download --no-deps --only-binary=:all: --python-version {pin.python} --implementation cp "
                f"{platforms}" + (f" --index-url {index}" if index else "") + f" -d DIR {shlex.quote(pinned)}")
    return LockFailed(message, f"put the {name} {version} wheel for the image's Python {pin.python} in a folder DIR "
                               f"(on a machine that reaches {index or 'its index'}: `{download}`) and pass "
                               f"--find-links DIR (`launcher lock {folder} --variant {variant} --find-links DIR`, "
                               "or the same option on `launcher run`)")
