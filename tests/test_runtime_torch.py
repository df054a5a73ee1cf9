"""mnist_torch on the host, without a container: the PyTorch determinism profile and the
fingerprints a torch recipe reports through launcher.runtime.api.

Needs an interpreter with torch: this one, or the one named by LAUNCHER_TEST_TORCH_PYTHON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from launcher.determinism import profile_env

pytestmark = pytest.mark.slow  # PyTorch trains on the host

REPO = Path(__file__).resolve().parents[1]
PARAMS = json.dumps({"epochs": 2, "train_samples": 256, "test_samples": 64, "device": "cpu"})
COMPARED = ("fingerprints/dataset.json", "fingerprints/initial_weights.json", "fingerprints/batches.jsonl",
            "metrics.jsonl", "weights/layers.json", "model/canonical.npz", "model/model.pt")


def torch_python() -> str:
    named = os.environ.get("LAUNCHER_TEST_TORCH_PYTHON")
    if named:
        return named
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed here; "
                    "set LAUNCHER_TEST_TORCH_PYTHON to an interpreter that has it")
    return sys.executable


def run(out: Path, env: dict[str, str], recipe: Path = REPO / "recipes/mnist_torch", params: str = PARAMS) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "TF_"))}
    full.update(env)
    full["PYTHONPATH"] = str(REPO)
    argv = [torch_python(), "-m", "launcher.runtime", "run", "--recipe", str(recipe), "--out", str(out),
            "--params", params]
    res = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def run_all(jobs: dict[Path, dict[str, str]], **recipe: Any) -> None:
    """Independent runs, two at a time: most of one is Python importing torch, on one core (the bits do
    not depend on it: the profile fixes the thread counts)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(run, out, env, **recipe) for out, env in jobs.items()]:
            future.result()


def test_mnist_torch_is_bit_identical_with_the_default_profile_and_seed_sensitive(tmp_path: Path) -> None:
    run_all({tmp_path / "a": profile_env("deterministic", 3), tmp_path / "b": profile_env("deterministic", 3),
             tmp_path / "c": profile_env("deterministic", 4)})
    for rel in COMPARED:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    for rel in ("fingerprints/initial_weights.json", "fingerprints/batches.jsonl", "model/canonical.npz"):
        assert (tmp_path / "a" / rel).read_bytes() != (tmp_path / "c" / rel).read_bytes(), rel
    doc = json.loads((tmp_path / "a/_launcher/runtime.json").read_text())
    fw = doc["framework"]
    assert fw["name"] == "torch" and fw["deterministic_algorithms"] is True
    assert fw["cudnn_flags"] == {"deterministic": True, "benchmark": False}
    assert fw["threads"]["intra_op"] == 2
    assert "trainable params: 1,199,882" in (tmp_path / "a/logs/train.log").read_text()
    batches = [json.loads(ln) for ln in (tmp_path / "a/fingerprints/batches.jsonl").read_text().splitlines()]
    assert [len(b["batches"]) for b in batches] == [2, 2]  # 256 samples in batches of 128


def test_mnist_torch_off_profile_is_unseeded(tmp_path: Path) -> None:
    run_all({tmp_path / "a": profile_env("off"), tmp_path / "b": profile_env("off")})
    a, b = (tmp_path / "a/model/canonical.npz").read_bytes(), (tmp_path / "b/model/canonical.npz").read_bytes()
    assert a != b
    assert json.loads((tmp_path / "a/_launcher/runtime.json").read_text())["framework"][
        "deterministic_algorithms"] is False


def test_a_scaffolded_torch_recipe_runs_and_repeats(tmp_path: Path) -> None:
    from launcher.specs.recipes import scaffold_recipe
    from launcher.workspace import Workspace

    for d in ("lockfiles", "dockerfiles", "recipes"):
        (tmp_path / "ws" / d).mkdir(parents=True)
    recipe = scaffold_recipe(Workspace.at(tmp_path / "ws"), "mine", "torch")
    run_all({tmp_path / name: profile_env("deterministic", 2) for name in "ab"}, recipe=recipe.path, params="{}")
    for rel in ("model/canonical.npz", "fingerprints/batches.jsonl", "metrics.jsonl"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
