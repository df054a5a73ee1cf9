"""`launcher init`: a new workspace for a user's own project."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import UsageError
from launcher.workspace import VARIANTS, Workspace

TEMPLATES = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True)
class InitResult:
    root: Path
    created: list[str]
    skipped: list[str]
    next_steps: list[str]  # the commands that take the new workspace to its first run, in order


def next_steps(ws: Workspace, variant: str = "cpu") -> list[str]:
    """What a workspace still needs before `launcher run` of a script in the variant's image: a base pinned
    in a registry this machine reaches (the template pins python:3.11-slim on Docker Hub; bootstrap builds
    one locally), the variant's lock (resolved once, over the network), its image."""
    steps = []
    if not ws.lock_txt(variant).is_file():
        steps.append(f"launcher lock --variant {variant}")
    steps.append(f"launcher build --variant {variant}")
    steps.append("launcher run path/to/train.py")
    return steps


def init_workspace(root: Path, *, from_workspace: Workspace | None = None) -> InitResult:
    """Create lockfiles/, dockerfiles/, recipes/ under root; never overwrite a file.

    With from_workspace, copy that workspace's inputs (locks, Dockerfiles, recipes) instead
    of the templates, e.g. to try launcher on a scratch copy of a project.
    """
    if root.exists() and not root.is_dir():
        raise UsageError(f"{root} exists and is not a directory", "choose another path")
    plan: dict[str, Path] = {}
    if from_workspace is not None:
        src = from_workspace
        for p in sorted(src.lockfiles.glob("*")):
            if p.is_file():
                plan[f"lockfiles/{p.name}"] = p
        for p in sorted(src.dockerfiles.glob("*.Dockerfile")):
            plan[f"dockerfiles/{p.name}"] = p
        if src.recipes.is_dir():
            for p in sorted(src.recipes.rglob("*")):
                if p.is_file() and "__pycache__" not in p.parts:
                    plan[f"recipes/{p.relative_to(src.recipes).as_posix()}"] = p
    else:
        for v in VARIANTS:
            plan[f"lockfiles/{v}.in"] = TEMPLATES / f"{v}.in"
            plan[f"dockerfiles/{v}.Dockerfile"] = TEMPLATES / f"{v}.Dockerfile"
        plan["lockfiles/images.lock"] = TEMPLATES / "images.lock"
    created: list[str] = []
    skipped: list[str] = []
    for d in ("lockfiles", "dockerfiles", "recipes"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for rel, src_path in plan.items():
        dest = root / rel
        if dest.exists():
            skipped.append(rel)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src_path, dest)
        created.append(rel)
    gitignore = root / ".gitignore"
    if not gitignore.exists():
        gitignore.write_text("/runs/\n/reports/\n/explanations/\n/mlruns/\n/.launcher/\n")
        created.append(".gitignore")
    return InitResult(root.resolve(), created, skipped, next_steps(Workspace.at(root)))
