"""Companion packages must match the framework build they extend.

torchvision, torchaudio and torchtext carry compiled operators built against one torch build:
PyPI's torchvision (no local version label) is built for PyPI's torch, a CUDA build; beside
``torch==2.13.0+cpu`` from PyTorch's CPU index its operators fail to load (``operator
torchvision::nms does not exist``), at import time, minutes after a build. pip cannot see that: a
requirement ``torch==2.13.0`` is met by ``2.13.0+cpu``. So a lock is checked here instead: every
companion must carry its framework's local version label (``+cpu`` beside ``+cpu``, none beside
none), which also says the index it came from. TensorFlow's companions (``tensorflow-text``,
``tf-keras``) follow TensorFlow's major.minor, and two builds of one framework in one environment
(``tensorflow`` beside ``tensorflow-cpu``) are refused too: they share the import name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.errors import LockFailed

PYTORCH_INDEX = "https://download.pytorch.org/whl"


@dataclass(frozen=True)
class Family:
    builds: tuple[str, ...]  # the framework's distributions: one import name, so at most one of them
    companions: tuple[str, ...]
    rule: str  # "label": the same local version label; "minor": the same major.minor


FAMILIES = (
    Family(("torch",), ("torchvision", "torchaudio", "torchtext"), "label"),
    Family(("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel"), ("tensorflow-text", "tf-keras"),
           "minor"),
)


def label(version: str) -> str:
    """The local version label (``2.13.0+cpu`` -> ``cpu``; none -> "")."""
    return version.partition("+")[2]


def public(version: str) -> str:
    return version.partition("+")[0]


def minor(version: str) -> str:
    return ".".join(public(version).split(".")[:2])


def index_of(tag: str) -> str:
    """Where a torch-family wheel with this label is served: PyTorch's index of that build, or PyPI."""
    return f"{PYTORCH_INDEX}/{tag}" if tag else "https://pypi.org/simple"


def describe(tag: str) -> str:
    if not tag:
        return "PyPI's build (no local version label; on Linux built for PyPI's CUDA torch)"
    return f"the +{tag} build ({index_of(tag)})"


@dataclass(frozen=True)
class Mismatch:
    companion: str
    companion_version: str
    framework: str
    framework_version: str
    rule: str

    @property
    def wanted(self) -> str:
        """The companion version that would match (label rule: the same release with the framework's label)."""
        tag = label(self.framework_version)
        return public(self.companion_version) + (f"+{tag}" if tag else "")


def mismatches(pins: Mapping[str, str]) -> list[Mismatch]:
    """Companions in pins (normalized name -> version) that do not match their framework's build."""
    out: list[Mismatch] = []
    for family in FAMILIES:
        builds = [b for b in family.builds if b in pins]
        if not builds:
            continue
        fw = builds[0]
        for other in builds[1:]:
            out.append(Mismatch(other, pins[other], fw, pins[fw], "build"))
        for comp in family.companions:
            if comp not in pins:
                continue
            if family.rule == "label" and label(pins[comp]) != label(pins[fw]):
                out.append(Mismatch(comp, pins[comp], fw, pins[fw], "label"))
            elif family.rule == "minor" and minor(pins[comp]) != minor(pins[fw]):
                out.append(Mismatch(comp, pins[comp], fw, pins[fw], "minor"))
    return out


def via(lock_text: str) -> dict[str, list[str]]:
    """What pulls in each package of a pip-compile lock, from its annotations (``# via tf-keras``, or
    ``# via`` followed by ``#   name`` lines): normalized name -> the names given (``-r file`` as written)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    listing = False
    for line in lock_text.splitlines():
        stripped = line.strip()
        if line and not line[0].isspace() and not stripped.startswith(("#", "-")) and "==" in stripped:
            current, listing = stripped.split("==", 1)[0].split("[")[0].strip().lower().replace("_", "-"), False
        elif current is not None and stripped.startswith("# via"):
            rest = stripped[len("# via"):].strip()
            listing = not rest
            if rest:
                out.setdefault(current, []).append(rest)
        elif current is not None and listing and stripped.startswith("#   "):
            out.setdefault(current, []).append(stripped[1:].strip())
        elif not stripped.startswith("--hash") and not stripped.startswith("#"):
            listing = False
    return out


def _second_build(m: Mismatch, where: Mapping[str, str], pulled_by: Mapping[str, Sequence[str]],
                  source: str, relock: str) -> LockFailed:
    """Two builds of one framework: the one the image's lock (lockfiles/) pins is kept, the other named with
    what pulls it in."""
    def pinned(name: str, version: str) -> str:
        return f"{name}=={version} ({where.get(name, 'the lock')})"

    image = [n for n in (m.framework, m.companion) if where.get(n, "").startswith("lockfiles/")]
    extra, kept = (m.framework, m.companion) if image == [m.companion] else (m.companion, m.framework)
    versions = {m.framework: m.framework_version, m.companion: m.companion_version}
    by = pulled_by.get(extra) or []
    what = f"{extra} (pulled in by {', '.join(by)})" if by else extra
    keep = f"keep the image's {kept}" if len(image) == 1 else "keep one"  # both in one lock: a variant's own
    return LockFailed(f"{pinned(extra, versions[extra])} is a second build of {m.framework} beside "
                      f"{pinned(kept, versions[kept])}: both install the same module",
                      f"{keep}: remove what pulls in {what} from {source}, then `{relock}`")


def check(pins: Mapping[str, str], where: Mapping[str, str], *, source: str, relock: str,
          pulled_by: Mapping[str, Sequence[str]] | None = None) -> None:
    """Refuse a set of pins that pairs a framework build with a companion of another build.
    where: name -> the lockfile that pins it; source: the requirements file to edit; relock: the
    `launcher lock ...` command that locks it again; pulled_by: what pulls in each package (:func:`via`)."""
    found = mismatches(pins)
    if not found:
        return
    m = found[0]
    comp = f"{m.companion}=={m.companion_version} ({where.get(m.companion, 'the lock')})"
    fw = f"{m.framework}=={m.framework_version} ({where.get(m.framework, 'the lock')})"
    if m.rule == "build":
        raise _second_build(m, where, pulled_by or {}, source, relock)
    if m.rule == "minor":
        raise LockFailed(f"{comp} does not match {fw}: its releases follow {m.framework}'s major.minor "
                         f"({minor(m.framework_version)})",
                         f"pin {m.companion}=={minor(m.framework_version)}.* in {source}, then `{relock}`")
    tag = label(m.framework_version)
    index = index_of(tag)
    problem = (f"{comp} does not match {fw}: {m.companion} is {describe(label(m.companion_version))}, "
               f"{m.framework} is {describe(tag)}; its compiled operators would fail to load (e.g. `operator "
               f"{m.companion}::nms does not exist`)")
    if not tag:
        raise LockFailed(problem, f"pin {m.companion}=={m.wanted} (PyPI's build) in {source}, then `{relock}`")
    raise LockFailed(
        problem,
        f"pin {m.companion}=={m.wanted} in {source} and give its wheel from {index}: either add "
        f"`--extra-index-url {index}` to {source}, or download the {m.companion} {m.wanted} wheel for the image's "
        f"Python from {index}/{m.companion}/ into a folder DIR and run `{relock} --find-links DIR`")
