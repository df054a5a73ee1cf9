"""Whether a run's code was a committed, clean state (code.git_state), against a real git repository."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from launcher.specs import code


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_clean_only_when_the_code_is_committed(tmp_path: Path) -> None:
    assert code.git_state(tmp_path) == {}  # outside git
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.org")
    git(tmp_path, "config", "user.name", "t")
    recipe = tmp_path / "recipes" / "r"
    recipe.mkdir(parents=True)
    (recipe / "train.py").write_text("print(1)\n")
    (tmp_path / ".gitignore").write_text("copies/\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "r")
    state = code.git_state(recipe)
    assert state["dirty"] is False and len(state["commit"]) == 40
    (recipe / "__pycache__").mkdir()
    (recipe / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    assert code.git_state(recipe)["dirty"] is False  # caches are not code
    (recipe / "util.py").write_text("X = 1\n")
    assert code.git_state(recipe)["dirty"] is True  # untracked code
    (recipe / "util.py").unlink()
    (recipe / "train.py").write_text("print(2)\n")
    assert code.git_state(recipe)["dirty"] is True  # changed code
    git(tmp_path, "checkout", "-q", "--", ".")
    copy = tmp_path / "copies" / "r"
    copy.mkdir(parents=True)
    (copy / "train.py").write_text("print(1)\n")
    assert code.git_state(copy)["dirty"] is True  # an ignored copy is not committed code


def test_a_folders_work_tree_is_asked_of_git_once_in_a_kept_block(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher import memo, proc
    from launcher.specs import code

    asked: list[tuple[str, ...]] = []
    real = proc.run

    def counting(argv: Any, **kw: Any) -> proc.Completed:
        asked.append(tuple(map(str, argv)))
        return real(argv, **kw)

    monkeypatch.setattr(proc, "run", counting)
    (tmp_path / "proj").mkdir()
    assert code.git_toplevel(tmp_path / "proj") is None and code.git_toplevel(tmp_path / "proj") is None
    assert len(asked) == 2
    with memo.kept():
        assert code.git_toplevel(tmp_path / "proj") is None and code.git_toplevel(tmp_path / "proj") is None
        assert len(asked) == 3
        proc.run(["git", "init", "-q", str(tmp_path / "proj")])
    assert code.git_toplevel(tmp_path / "proj") == (tmp_path / "proj").resolve()  # the block ended: asked again
