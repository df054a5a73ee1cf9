"""A run's code as people name it, and the form of that name in run ids and group names.

A recipe is named by its name. A plain script is named by its project (the folder it is sent
with: ``--code DIR``, the git work tree, else the folder) and its path inside it:
``myproj/train.py``. Two projects' ``train.py`` are then two codes, and a user's
``mnist_convnet.py`` is never taken for the recipe ``mnist_convnet``. The launch record keeps it as
``recipe.identity`` and the manifest copies it (``Manifest.code_name`` reads it back).
"""

from __future__ import annotations

import re
from pathlib import Path

from launcher.errors import UsageError
from launcher.records.records import MOUNTED, CodePlan

MAX_SLUG = 40
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def script_identity(root: Path, script: Path) -> str:
    """``<project folder name>/<the script's path inside it>`` (the project is the code root the script
    is sent with)."""
    root, script = root.resolve(), script.resolve()
    if not script.is_relative_to(root):
        raise UsageError(f"the script {script} is not inside the code folder {root}",
                         "pick a --code DIR that holds the script")
    return f"{root.name or 'code'}/{script.relative_to(root).as_posix()}"


def from_plan(plan: CodePlan | None) -> str | None:
    """The identity of a plain script from its code plan (specs.runspec.plan_code), None for a recipe."""
    if plan is None or plan.get("source") != MOUNTED or not plan.get("root") or not plan.get("entry"):
        return None
    return f"{Path(str(plan['root'])).name or 'code'}/{plan['entry']}"


def slug(name: str, identity: str | None = None) -> str:
    """The name a run id or a group carries: the recipe's name, or the script's identity made safe for
    a file name (``myproj/train.py`` -> ``myproj_train.py``). A script's keeps its ``.py``, which no
    recipe name has (recipe names are letters, digits, ``_`` and ``-``), so the two never collide."""
    if identity is None:
        return _UNSAFE.sub("_", name)[:MAX_SLUG] or "run"
    project, _, entry = identity.partition("/")
    head, tail = _UNSAFE.sub("_", project), _UNSAFE.sub("_", entry.removesuffix(".py"))
    room = MAX_SLUG - len(".py") - 1 - len(tail)  # what is left for the project's name
    if room < 4:  # a deep entry path: keep its end, where the script's own name is
        tail = tail[-(MAX_SLUG - len(".py") - 1 - 4):]
        room = 4
    return f"{head[:room]}_{tail}.py"
