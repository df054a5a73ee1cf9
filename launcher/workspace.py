"""A workspace: the directory holding lockfiles/, dockerfiles/ and recipes/.

Everything launcher writes for a project lives under its workspace (runs/, reports/,
.launcher/ for build records and host fact sheets); downloads shared between
workspaces live in the cache directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import NotFound, UsageError

MARKERS = ("lockfiles", "dockerfiles")
VARIANTS = ("cpu", "gpu")  # the variants `launcher init` writes; a workspace may have any others
VARIANT_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# `LABEL launcher.accelerator="gpu"` in a variant's Dockerfile: its runs need a GPU on the host.
_ACCELERATOR = re.compile(r"""^\s*LABEL\s+.*\blauncher\.accelerator\s*=\s*["']?(\w+)""", re.MULTILINE)


def check_variant_name(variant: str) -> str:
    """A variant name is a file-name stem: lower-case letters, digits, '.', '_' and '-'."""
    if not VARIANT_NAME.match(variant):
        raise UsageError(f"{variant!r} is not a variant name",
                         "use lower-case letters, digits, '.', '_' and '-' (e.g. cpu, torch-gpu)")
    return variant


def default_cache_dir() -> Path:
    env = os.environ.get("LAUNCHER_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "launcher"


def user_config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's own launcher configuration, which no workspace can write for them: $XDG_CONFIG_HOME/launcher,
    else ~/.config/launcher."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "launcher"


def user_allowed_signers(environ: Mapping[str, str] | None = None) -> Path:
    """Whom this user trusts when no --allowed-signers or LAUNCHER_ALLOWED_SIGNERS says otherwise."""
    return user_config_dir(environ) / "allowed_signers"


@dataclass(frozen=True)
class Workspace:
    root: Path
    cache_dir: Path

    @classmethod
    def at(cls, root: Path, cache_dir: Path | None = None) -> Workspace:
        return cls(root.resolve(), (cache_dir or default_cache_dir()).resolve())

    @classmethod
    def discover(cls, start: Path | None = None, cache_dir: Path | None = None) -> Workspace:
        here = (start or Path.cwd()).resolve()
        for candidate in (here, *here.parents):
            if all((candidate / m).is_dir() for m in MARKERS):
                return cls.at(candidate, cache_dir)
        raise NotFound(
            f"no launcher workspace at or above {here} (a workspace holds lockfiles/ and dockerfiles/)",
            "cd into your project, pass --workspace DIR, or create one with `launcher init DIR`",
        )

    @property
    def lockfiles(self) -> Path:
        return self.root / "lockfiles"

    @property
    def dockerfiles(self) -> Path:
        return self.root / "dockerfiles"

    @property
    def recipes(self) -> Path:
        return self.root / "recipes"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def explanations(self) -> Path:
        return self.root / "explanations"

    @property
    def state(self) -> Path:
        return self.root / ".launcher"

    @property
    def images_lock(self) -> Path:
        return self.lockfiles / "images.lock"

    def variants(self) -> tuple[str, ...]:
        """The image variants of the workspace: each NAME with lockfiles/NAME.in and dockerfiles/NAME.Dockerfile."""
        if not self.lockfiles.is_dir():
            return ()
        return tuple(sorted(p.name[: -len(".in")] for p in self.lockfiles.glob("*.in")
                            if self.dockerfile(p.name[: -len(".in")]).is_file()))

    def accelerator(self, variant: str) -> str:
        """"gpu" when the variant's Dockerfile declares `LABEL launcher.accelerator="gpu"`, else "cpu".
        A Dockerfile without the label is a GPU variant only when the variant is named gpu (older workspaces)."""
        try:
            found = _ACCELERATOR.search(self.dockerfile(variant).read_text())
        except OSError:
            found = None
        if found:
            return "gpu" if found.group(1).lower() == "gpu" else "cpu"
        return "gpu" if variant == "gpu" else "cpu"

    def known_variant(self, variant: str, *, all_ok: bool = False) -> str:
        """The variant, if the workspace has it (and `all` where all_ok); else a usage error naming those
        it has. A half-made variant (NAME.in or NAME.Dockerfile alone) passes: the command then names the
        file it lacks."""
        have = list(self.variants())
        if variant in have or (all_ok and variant == "all"):
            return variant
        if "/" not in variant and (self.lock_in(variant).is_file() or self.dockerfile(variant).is_file()):
            return variant
        allowed = [*have, *(["all"] if all_ok else [])]
        none = "none (add lockfiles/NAME.in and dockerfiles/NAME.Dockerfile)"
        raise UsageError(f"unknown variant {variant!r} in {self.root}", f"use one of: {', '.join(allowed) or none}")

    def needs_gpu(self, variant: str) -> bool:
        return self.accelerator(variant) == "gpu"

    def lock_in(self, variant: str) -> Path:
        return self.lockfiles / f"{variant}.in"

    def lock_txt(self, variant: str) -> Path:
        return self.lockfiles / f"{variant}.txt"

    def dockerfile(self, variant: str) -> Path:
        return self.dockerfiles / f"{variant}.Dockerfile"

    def build_record(self, variant: str) -> Path:
        return self.state / "builds" / f"{variant}.json"

    def host_facts(self, host_name: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host_name)
        return self.state / "hosts" / f"{safe}.json"

    @property
    def wheelhouse(self) -> Path:
        return self.cache_dir / "wheels"
