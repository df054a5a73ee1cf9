"""The shared recipe library (recipes/_lib): on the recipe's path in every run of a recipe
folder, its code digest recorded beside the recipe's (``_launcher/code.json`` "lib", the
manifest's ``recipe.lib_digest``), and an edit to it a code change that verify names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.runtime.code import code_digest

REPO = Path(__file__).resolve().parents[1]
LIB_MODULE = "FACTOR = 2\n"
RECIPE_TOML = 'name = "libuser"\nframework = "none"\nentry = "train.py"\ndescription = "imports the library"\n'
TRAIN = '''import json
import os
from pathlib import Path

from sharedlib.scale import FACTOR

out = Path(os.environ["LAUNCHER_OUT"])
(out / "model").mkdir(parents=True, exist_ok=True)
(out / "model" / "weights.bin").write_bytes(bytes([FACTOR]) * 64)
(out / "metrics.jsonl").write_text(json.dumps({"epoch": 0, "factor": FACTOR}) + "\\n")
print("libuser: factor", FACTOR, flush=True)
'''


def write_lib_and_recipe(recipes: Path) -> Path:
    """recipes/_lib/sharedlib/scale.py and recipes/libuser/ that imports it; the library folder."""
    lib = recipes / "_lib"
    (lib / "sharedlib").mkdir(parents=True)
    (lib / "sharedlib" / "__init__.py").write_text("")
    (lib / "sharedlib" / "scale.py").write_text(LIB_MODULE)
    (recipes / "libuser").mkdir()
    (recipes / "libuser" / "recipe.toml").write_text(RECIPE_TOML)
    (recipes / "libuser" / "train.py").write_text(TRAIN)
    return lib


def runtime(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "launcher.runtime", "run", "--out", str(out), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, check=False)


def test_the_runtime_puts_the_library_beside_the_recipe_on_its_path_and_records_its_digest(tmp_path: Path) -> None:
    lib = write_lib_and_recipe(tmp_path / "recipes")
    done = runtime(tmp_path / "a", "--recipe", str(tmp_path / "recipes" / "libuser"))
    assert done.returncode == 0, done.stdout + done.stderr
    code = json.loads((tmp_path / "a" / "_launcher" / "code.json").read_text())
    assert code["lib"]["digest"] == code_digest(lib) and code["lib"]["files"] == 2
    assert code["recipe"]["digest"] == code_digest(tmp_path / "recipes" / "libuser")
    assert f"recipe library {lib.resolve()} (2 files)" in done.stdout

    other = tmp_path / "other_lib"
    (other / "sharedlib").mkdir(parents=True)
    (other / "sharedlib" / "__init__.py").write_text("")
    (other / "sharedlib" / "scale.py").write_text("FACTOR = 3\n")
    done = runtime(tmp_path / "b", "--recipe", str(tmp_path / "recipes" / "libuser"), "--lib", str(other))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "b" / "model" / "weights.bin").read_bytes() == bytes([3]) * 64
    assert json.loads((tmp_path / "b" / "_launcher" / "code.json").read_text())["lib"]["digest"] == \
        code_digest(other) != code_digest(lib)

    # a plain script is its own code: no library on its path, none recorded
    script = tmp_path / "alone.py"
    script.write_text("print('alone')\n")
    done = runtime(tmp_path / "c", "--script", str(script))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lib" not in json.loads((tmp_path / "c" / "_launcher" / "code.json").read_text())


def test_the_seed_recipes_library_is_found_from_the_repository() -> None:
    from launcher.runtime import recipespec as spec
    from launcher.runtime import runner

    recipe = spec.load_spec(REPO / "recipes" / "mnist_torch")
    assert runner.recipe_lib(recipe, None) == (REPO / "recipes" / "_lib").resolve()


def cli(ws: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["--workspace", str(ws), "--json", "--quiet", *args])
    data = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.exit_code, data, result.stderr


def manifests(ws: Path) -> list[dict[str, Any]]:
    """In the order the runs ended (two runs started in one second would sort by their folders' random suffix)."""
    found = sorted(ws.glob("runs/*/manifest.json"), key=lambda p: p.stat().st_mtime_ns)
    return [json.loads(p.read_text()) for p in found]


@pytest.mark.docker
@pytest.mark.registry
def test_the_manifest_pins_the_library_and_an_edit_to_it_is_a_code_change(tiny_workspace: Path) -> None:
    lib = write_lib_and_recipe(tiny_workspace / "recipes")
    code, listed, _ = cli(tiny_workspace, "recipes", "list")
    assert code == 0 and sorted(r["name"] for r in listed["data"]["recipes"]) == ["crash", "evil", "libuser", "tiny"]

    code, first, err = cli(tiny_workspace, "run", "libuser", "--seed", "1")  # builds the edited recipes first
    assert code == 0, (first, err)
    before = manifests(tiny_workspace)[0]
    assert before["recipe"]["lib_digest"] == code_digest(lib)
    assert before["recipe"]["tree_digest"] == code_digest(tiny_workspace / "recipes" / "libuser")

    # a mounted recipe folder runs with the library baked into the image, and records it
    code, _, err = cli(tiny_workspace, "run", "libuser", "--seed", "1", "--mount", "--no-build")
    assert code == 0, err
    mounted = manifests(tiny_workspace)[1]
    assert mounted["recipe"]["code_source"] == "mounted"
    assert mounted["recipe"]["lib_digest"] == before["recipe"]["lib_digest"]

    (lib / "sharedlib" / "scale.py").write_text("FACTOR = 5\n")
    code, _, err = cli(tiny_workspace, "run", "libuser", "--seed", "1", "--no-build")
    assert code == ExitCode.IMAGE_OUT_OF_DATE, err  # the library is baked: an edit needs a build
    code, second, err = cli(tiny_workspace, "run", "libuser", "--seed", "1")
    assert code == 0, (second, err)
    after = manifests(tiny_workspace)[2]
    assert after["recipe"]["tree_digest"] == before["recipe"]["tree_digest"]
    assert after["recipe"]["lib_digest"] == code_digest(lib) != before["recipe"]["lib_digest"]

    code, verdict, _ = cli(tiny_workspace, "verify", "checksums", before["run_id"], after["run_id"], "--across-code")
    assert code == ExitCode.NOT_REPRODUCIBLE, verdict
    cls = verdict["data"]["explanations"][after["run_id"]]["classification"]
    assert cls["kind"] == "input-change" and "code" in cls["causes"], cls
    assert "recipe.lib_digest" in cls["line"], cls
