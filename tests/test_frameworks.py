"""The Framework seam: TensorFlow, PyTorch and JAX are each one module of launcher.runtime.frameworks,
and a new framework is one more. A toy framework declared in one throwaway module is picked up by
every place that knows frameworks: the host's reading of a script's imports, the check that an
image's lock holds the framework, the deterministic profile's environment, recipe.toml's
`framework`, `recipes new --framework`, and in the runtime the profile applied at its import and its
seeding calls listed."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.determinism import profile_env
from launcher.runtime import frameworks, hooks, importwatch
from launcher.runtime.recipespec import known_frameworks
from launcher.runtime.record import Recorder
from launcher.specs import imports
from launcher.specs.runspec import framework_packages, holds_framework
from launcher.workspace import Workspace

TOY_MODULE = '''
"""A toy framework for launcher: one module."""
from launcher.runtime.frameworks import Framework, register

def apply(module, profile, seed, threads):
    if seed is not None:
        module.seed(seed)
    return {"name": "toyfw", "version": module.__version__, "seeded_with": seed, "profile": profile}

TOY = Framework(name="toyfw", label="ToyFW", modules=("toyfw", "toyfw_extras"), packages=("toyfw",),
                variant="toy-cpu", apply=apply, env=lambda threads: {"TOYFW_DETERMINISTIC": "1"},
                seeders={"toyfw": (("seed", "toyfw.seed"),)},
                scaffold="import toyfw\\nprint('{name}')\\n")
register(TOY)
'''
TOY_LIBRARY = "__version__ = '0.1'\nSEEDS = []\ndef seed(n):\n    SEEDS.append(n)\n"


@pytest.fixture
def toy(tmp_path: Path) -> Iterator[Path]:
    """The toy framework's module (imported: registered) and the toy library, on sys.path."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "launcher_toyfw.py").write_text(TOY_MODULE)
    (lib / "toyfw.py").write_text(TOY_LIBRARY)
    sys.path.insert(0, str(lib))
    before = list(sys.meta_path)
    importlib.import_module("launcher_toyfw")
    yield lib
    frameworks.unregister("toyfw")
    sys.path.remove(str(lib))
    sys.meta_path[:] = before
    for name in ("launcher_toyfw", "toyfw"):
        sys.modules.pop(name, None)


def test_the_three_frameworks_are_registered_with_their_variants_and_environment() -> None:
    assert frameworks.names()[:3] == ("tensorflow", "torch", "jax")
    assert [frameworks.named(n).variant for n in ("tensorflow", "torch", "jax")] == [None, "torch-cpu", "jax-cpu"]
    assert frameworks.for_module("keras.layers").name == "tensorflow"
    assert frameworks.for_module("flax.linen").name == "jax" and frameworks.for_module("numpy") is None
    env = profile_env("deterministic", 3, 2)
    assert env["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=true" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["TF_NUM_INTRAOP_THREADS"] == "2" and "XLA_FLAGS" not in profile_env("seeded", 3)


def test_a_toy_framework_in_one_module_is_known_to_the_host_side(toy: Path, tmp_path: Path) -> None:
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    (script.parent / "model_def.py").write_text("import toyfw_extras.layers\n")
    script.write_text("import numpy\nimport model_def\n")
    assert imports.frameworks(script) == ["toyfw"]  # through the project's own module
    assert framework_packages("toyfw") == ("toyfw",) and "toyfw" in known_frameworks()
    assert profile_env("deterministic", 1, 2)["TOYFW_DETERMINISTIC"] == "1"

    ws = Workspace.at(tmp_path / "ws")
    ws.lockfiles.mkdir(parents=True)
    (ws.lockfiles / "toy-cpu.txt").write_text("toyfw==0.1 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    (ws.lockfiles / "cpu.txt").write_text("numpy==2.0 \\\n    --hash=sha256:" + "1" * 64 + "\n")
    assert holds_framework(ws, "toy-cpu", "toyfw") and not holds_framework(ws, "cpu", "toyfw")


def test_recipes_new_scaffolds_the_toy_framework_and_names_its_variant(toy: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert CliRunner().invoke(app, ["init", str(ws)]).exit_code == 0
    (ws / "lockfiles" / "toy-cpu.in").write_text("toyfw\n")
    (ws / "dockerfiles" / "toy-cpu.Dockerfile").write_text("FROM scratch\n")
    res = CliRunner().invoke(app, ["-w", str(ws), "--json", "recipes", "new", "tiny", "--framework", "toyfw"])
    assert res.exit_code == 0, res.output
    assert (ws / "recipes/tiny/train.py").read_text() == "import toyfw\nprint('tiny')\n"
    toml = (ws / "recipes/tiny/recipe.toml").read_text()
    assert 'framework = "toyfw"' in toml and 'variant = "toy-cpu"' in toml
    res = CliRunner().invoke(app, ["-w", str(ws), "recipes", "new", "other", "--framework", "nosuch"])
    assert res.exit_code != 0 and "unknown framework 'nosuch'" in res.output and "toyfw" in res.output


def test_the_runtime_applies_the_profile_at_the_toy_frameworks_import_and_lists_its_seed_calls(
        toy: Path, tmp_path: Path) -> None:
    rt = hooks.Runtime("deterministic", 5, 2, Recorder(tmp_path / "out"))
    watch = importwatch.ImportWatch()
    sys.meta_path.insert(0, watch)
    hooks.watch_framework(watch, rt, frameworks.named("toyfw"))  # type: ignore[arg-type]
    watch.on_import("toyfw", rt.seed_calls.wrap_module)
    toyfw = importlib.import_module("toyfw")
    toyfw.seed(11)  # the script's own seeding, after launcher's
    assert toyfw.SEEDS == [5, 11]
    assert rt.frameworks == ["toyfw"] and rt.applied["toyfw"]["seeded_with"] == 5
    assert rt.seed_calls.calls == [{"api": "toyfw.seed", "seed": 11}]
    assert rt.determinism() == {"in_force": True, "reason": "deterministic profile applied to toyfw"}
    doc = json.loads((tmp_path / "out/_launcher/runtime.json").read_text())
    assert doc["frameworks"] == ["toyfw"] and doc["applied"]["toyfw"]["version"] == "0.1"
