"""Which image a run takes (launcher.specs.runspec.choose_variant): --variant as given, else the one the
recipe names, else, for a plain script whose code imports a framework the default image lacks, the
one variant that has it (with a note), else the default; a variant the workspace lacks is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.errors import UsageError
from launcher.scaffold import init_workspace
from launcher.specs.runspec import choose_variant
from launcher.workspace import Workspace

HASH = " \\\n    --hash=sha256:" + "0" * 64 + "\n"


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    init_workspace(tmp_path / "ws")
    ws = Workspace.at(tmp_path / "ws")
    for variant, package in (("cpu", "tensorflow-cpu==2.21.0"), ("jax-cpu", "jax==0.10.2")):
        (ws.lockfiles / f"{variant}.txt").write_text(package + HASH)
    (ws.lockfiles / "jax-cpu.in").write_text("jax\n")
    (ws.dockerfiles / "jax-cpu.Dockerfile").write_text((ws.dockerfiles / "cpu.Dockerfile").read_text())
    return ws


def test_a_script_importing_a_framework_the_default_lacks_takes_the_variant_that_has_it(
        ws: Workspace, tmp_path: Path) -> None:
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    (script.parent / "nets.py").write_text("import optax\n")
    script.write_text("import nets\n")
    chosen = choose_variant(ws, str(script), "cpu", given=False)
    assert chosen.variant == "jax-cpu"
    assert chosen.note == (f"{script} imports jax, which the cpu image lacks: running in the jax-cpu image "
                           "(--variant to choose another)")
    assert choose_variant(ws, str(script), "cpu", given=True).variant == "cpu"  # typed: as given

    script.write_text("import tensorflow as tf\n")
    assert choose_variant(ws, str(script), "cpu", given=False) == choose_variant(ws, str(script), "cpu", given=True)


def test_a_recipes_own_variant_counts_and_an_unknown_one_is_refused(ws: Workspace) -> None:
    folder = ws.recipes / "tiny_jax"
    from launcher.specs.recipes import scaffold_recipe

    scaffold_recipe(ws, "tiny_jax", "jax")
    assert 'variant = "jax-cpu"' in (folder / "recipe.toml").read_text()
    assert choose_variant(ws, "tiny_jax", "cpu", given=False).variant == "jax-cpu"
    with pytest.raises(UsageError, match="unknown variant 'tpu'"):
        choose_variant(ws, "tiny_jax", "tpu", given=True)
