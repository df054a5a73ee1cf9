"""The framework is learnt from what the code imports while it runs (an import watch), not from its
text; the seeds a script sets itself are listed; runtime.json says whether determinism was in force.

The import watch and the seed calls are tested in this interpreter on throwaway modules; the whole
runtime on the host (`python -m launcher.runtime run --script`) with PyTorch, which this machine's
test environment has, imported only through a project's own modules."""

from __future__ import annotations

import importlib
import json
import os
import random
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.determinism import profile_env
from launcher.runtime import importwatch, seedcalls

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    """A folder on sys.path for throwaway modules, and the watch removed again afterwards."""
    sys.path.insert(0, str(tmp_path))
    before = list(sys.meta_path)
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.meta_path[:] = before
    for name in [n for n in sys.modules if n.startswith("lw_")]:
        del sys.modules[name]


def test_a_watched_module_imported_through_another_module_calls_back_once_when_complete(modules: Path) -> None:
    (modules / "lw_fw").mkdir()
    (modules / "lw_fw" / "__init__.py").write_text("READY = True\nfrom lw_fw import part\n")
    (modules / "lw_fw" / "part.py").write_text("X = 1\n")
    (modules / "lw_user.py").write_text("import lw_fw\n")
    seen: list[tuple[str, bool, bool]] = []
    watch = importwatch.ImportWatch()
    sys.meta_path.insert(0, watch)
    watch.on_import("lw_fw", lambda m: seen.append((m.__name__, m.READY, hasattr(m, "part"))))
    importlib.import_module("lw_user")
    importlib.import_module("lw_fw")
    assert seen == [("lw_fw", True, True)]  # once, after the package's code ran, from the user's module
    mod = sys.modules["lw_fw"]
    assert mod.__file__ == str(modules / "lw_fw" / "__init__.py") and mod.__path__ == [str(modules / "lw_fw")]
    later: list[str] = []
    watch.on_import("lw_fw", lambda m: later.append(m.__name__))  # imported already: at once
    assert later == ["lw_fw"]


def test_a_failed_import_leaves_the_callback_waiting_and_the_error_unchanged(modules: Path) -> None:
    (modules / "lw_bad.py").write_text("raise ImportError('no libcuda here')\n")
    watch = importwatch.ImportWatch()
    sys.meta_path.insert(0, watch)
    seen: list[str] = []
    watch.on_import("lw_bad", lambda m: seen.append(m.__name__))
    with pytest.raises(ImportError, match="no libcuda here"):
        importlib.import_module("lw_bad")
    assert seen == [] and "lw_bad" in watch.callbacks
    watch.on_import("lw_absent", seen.append)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lw_absent")


def test_seed_calls_list_the_outermost_call_and_pass_everything_through(modules: Path) -> None:
    (modules / "lw_seeds.py").write_text(
        "import random\nCALLS = []\n"
        "def set_all(seed):\n    CALLS.append(seed)\n    random.seed(seed)\n    return 'done'\n")
    mod = importlib.import_module("lw_seeds")
    calls = seedcalls.SeedCalls()
    fake_random = types.ModuleType("random")
    fake_random.seed = random.seed  # type: ignore[attr-defined]
    calls.wrap_module(fake_random)
    seedcalls.SEEDERS["lw_seeds"] = (("set_all", "lw.set_all"),)
    try:
        calls.wrap_module(mod)
        calls.wrap_module(mod)  # wrapped once only
        mod.random = fake_random  # the module's random.seed is the wrapped one
        assert mod.set_all(7) == "done" and mod.CALLS == [7]
        fake_random.seed(8)  # type: ignore[attr-defined]
        fake_random.seed("text")  # type: ignore[attr-defined]
    finally:
        del seedcalls.SEEDERS["lw_seeds"]
    assert calls.calls == [{"api": "lw.set_all", "seed": 7}, {"api": "random.seed", "seed": 8},
                           {"api": "random.seed", "seed": "'text'"}]
    assert calls.count == 3
    random.seed(1)
    a = random.random()
    fake_random.seed(1)  # type: ignore[attr-defined]
    assert random.random() == a  # the original did the seeding


def run_script(script: Path, out: Path, *args: str, profile: str = "deterministic",
               seed: int | None = 3) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "TF_"))}
    env.update(profile_env(profile, seed))
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "launcher.runtime", "run", "--script", str(script), "--out",
                           str(out), "--", *args], env=env, capture_output=True, text=True, timeout=300)


def runtime_doc(out: Path) -> dict[str, object]:
    doc: dict[str, object] = json.loads((out / "_launcher/runtime.json").read_text())
    return doc


TORCH_PROJECT = {
    "train.py": "import json\nimport nets\nfrom helpers.data import batch\n"
                "model = nets.make()\nloss = model(batch()).sum()\nloss.backward()\n"
                "json.dump({'w': model.weight.detach().flatten().tolist()}, open('result.json', 'w'))\n",
    "nets.py": "import torch\n\ndef make():\n    return torch.nn.Linear(4, 2)\n",
    "helpers/__init__.py": "",
    "helpers/data.py": "from . import rng\n\ndef batch():\n    return rng.normal((8, 4))\n",
    "helpers/rng.py": "import torch\n\ndef normal(shape):\n    return torch.randn(*shape)\n",
}


def make_project(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "train.py"


@pytest.mark.slow
def test_a_script_importing_torch_only_through_its_modules_is_seeded_and_made_deterministic(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed in this interpreter (pip install -e '.[dev]')")
    script = make_project(tmp_path / "proj", TORCH_PROJECT)
    results = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        res = run_script(script, tmp_path / name, seed=seed)
        assert res.returncode == 0, res.stdout + res.stderr
        results.append(json.loads((tmp_path / name / "result.json").read_text())["w"])
    assert results[0] == results[1] != results[2]  # seeded by launcher at torch's import, from launcher's seed
    doc = runtime_doc(tmp_path / "a")
    assert doc["frameworks"] == ["torch"]
    assert doc["framework"]["name"] == "torch" and doc["framework"]["deterministic_algorithms"] is True  # type: ignore[index]
    assert doc["determinism"] == {"in_force": True, "reason": "deterministic profile applied to torch"}
    assert doc["seed_calls"] == []  # launcher's own seeding is not the script's


@pytest.mark.slow
def test_the_seeds_a_script_sets_itself_are_listed(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed in this interpreter (pip install -e '.[dev]')")
    files = dict(TORCH_PROJECT)
    files["train.py"] = "import random\nimport numpy as np\nimport torch\nrandom.seed(1)\nnp.random.seed(2)\n" \
                        "torch.manual_seed(5)\n" + files["train.py"]
    script = make_project(tmp_path / "proj", files)
    assert run_script(script, tmp_path / "a").returncode == 0
    doc = runtime_doc(tmp_path / "a")
    assert doc["seed_calls"] == [{"api": "random.seed", "seed": 1}, {"api": "numpy.random.seed", "seed": 2},
                                 {"api": "torch.manual_seed", "seed": 5}]
    plain = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    # the script seeds itself: launcher's run and the plain interpreter train the same weights
    assert json.loads((tmp_path / "result.json").read_text()) == json.loads(
        (tmp_path / "a" / "result.json").read_text())


def test_numpy_is_seeded_the_moment_the_code_imports_it_before_its_next_line(tmp_path: Path) -> None:
    helper = tmp_path / "helper.py"
    helper.write_text("import numpy\n")
    script = tmp_path / "np_script.py"
    script.write_text("import sys\nprint('numpy before', 'numpy' in sys.modules)\nimport helper\n"
                      "import numpy as np\nprint('draw', np.random.randint(1 << 30))\n")
    res = run_script(script, tmp_path / "a")
    assert res.returncode == 0, res.stderr
    assert "numpy before False" in res.stdout  # not imported for the script before its first line
    import numpy as np

    expected = np.random.RandomState(3).randint(1 << 30)
    assert f"draw {expected}" in res.stdout
    doc = runtime_doc(tmp_path / "a")
    assert doc["seeded"] == {"python_random": 3, "numpy": 3}
    assert doc["seed_calls"] == []  # launcher's seeding is not the code's


def test_code_importing_no_known_framework_is_seeded_but_determinism_is_not_claimed(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("import random\nprint('draw', random.random())\n")
    res = run_script(script, tmp_path / "a")
    assert res.returncode == 0, res.stderr
    doc = runtime_doc(tmp_path / "a")
    assert doc["frameworks"] == [] and doc["framework"] is None
    assert doc["determinism"]["in_force"] is False  # type: ignore[index]
    assert "no known framework was imported" in doc["determinism"]["reason"]  # type: ignore[index]
    assert doc["seeded"] == {"python_random": 3}  # NumPy is seeded when the code imports it; this one does not
    off = run_script(script, tmp_path / "b", profile="off", seed=None)
    assert off.returncode == 0
    assert runtime_doc(tmp_path / "b")["determinism"] == {
        "in_force": False, "reason": "profile off: nothing was seeded or made deterministic"}


def test_runtime_json_names_the_interpreter_and_machine_as_the_platform_module_does() -> None:
    import platform

    from launcher.runtime import hooks

    assert hooks.python_info() == {"version": platform.python_version(),
                                   "implementation": platform.python_implementation(),
                                   "executable": sys.executable}
    assert hooks.platform_info() == {"system": platform.system(), "machine": platform.machine(),
                                     "release": platform.release(), "cpu_count": os.cpu_count()}
