"""The host's guess of a plain script's framework follows the project's own imports, as Python would."""

from __future__ import annotations

from pathlib import Path

from launcher.specs import imports
from launcher.specs.recipes import load_script


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "train.py"


def test_keras_imported_only_through_a_sibling_module(tmp_path: Path) -> None:
    script = write(tmp_path, {"train.py": "import model_def\nmodel = model_def.build()\n",
                              "model_def.py": "from keras import layers\n\ndef build():\n    return layers\n"})
    assert imports.frameworks(script) == ["tensorflow"]
    recipe = load_script(script)
    assert recipe.framework == "tensorflow" and recipe.adhoc


def test_packages_relative_imports_and_import_module_strings_are_followed(tmp_path: Path) -> None:
    script = write(tmp_path, {
        "train.py": "from mypkg.models import net\nimport importlib\nopt = importlib.import_module('optax')\n",
        "mypkg/__init__.py": "import jax  # the package itself, run before its modules\n",
        "mypkg/models/__init__.py": "from .net import *\n",
        "mypkg/models/net.py": "from ..backend import torch_bits\n",
        "mypkg/backend/__init__.py": "",
        "mypkg/backend/torch_bits.py": "import torch.nn as nn\n",
        "unused.py": "import tensorflow\n",  # in the folder, never imported: not the script's
    })
    assert imports.frameworks(script) == ["jax", "torch"]  # the package's __init__ runs first
    assert imports.framework(script) == "jax"
    dynamic = write(tmp_path / "dyn", {"train.py": "import importlib\nopt = importlib.import_module('torch')\n"})
    assert imports.frameworks(dynamic) == ["torch"]


def test_no_framework_a_syntax_error_and_an_import_cycle_are_harmless(tmp_path: Path) -> None:
    script = write(tmp_path, {"train.py": "import a\nimport broken\nprint('numpy only')\n",
                              "a.py": "import b\n", "b.py": "import a\nimport numpy\n",
                              "broken.py": "def (:\n"})
    assert imports.frameworks(script) == []
    assert load_script(script).framework == "none"
    assert "tensorflow" not in imports.frameworks(write(tmp_path / "t", {"train.py": "# uses tensorflow-ish ideas\n"
                                                                                     "keras = 'a word'\n"}))


def test_a_script_importing_torch_runs_in_the_one_cpu_variant_that_has_it(tmp_path: Path) -> None:
    from launcher.specs.runspec import framework_variant
    from launcher.workspace import Workspace

    ws = Workspace.at(Path(__file__).resolve().parents[1])  # cpu, gpu (TensorFlow), torch-cpu, torch-gpu
    torch_script = load_script(write(tmp_path / "t", {"train.py": "import nets\n", "nets.py": "import torch\n"}))
    keras_script = load_script(write(tmp_path / "k", {"train.py": "import keras\n"}))
    assert framework_variant(ws, torch_script, "cpu") == "torch-cpu"
    assert framework_variant(ws, torch_script, "gpu") == "torch-gpu"  # where the default runs: on a GPU
    assert framework_variant(ws, torch_script, "torch-cpu") is None  # the default has it
    assert framework_variant(ws, keras_script, "cpu") is None
    assert framework_variant(ws, keras_script, "torch-cpu") == "cpu"
