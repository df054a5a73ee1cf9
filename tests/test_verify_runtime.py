"""Verify runs that the real in-container runtime wrote (run here without a container).

A numpy-only recipe records its dataset, initial weights, batches, metrics and final weights
through launcher.runtime.api, exactly as a recipe in an image does; the runs are then adopted
into run directories with manifests and verified.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from runfactory import adopt_outputs, make_workspace

from launcher.determinism import profile_env
from launcher.errors import ExitCode
from launcher.verify.differences import CLASS_INPUT, CLASS_NONDETERMINISM
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace

RECIPE_TOML = """\
name = "numpy_mlp"
framework = "none"
entry = "train.py"

[params]
epochs = 3
unseeded = 0
"""

TRAIN_PY = """\
import os
import numpy as np
from launcher.runtime import api

p = api.params()
rng = np.random.default_rng(api.seed())
x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(64, 4)
y = (x.sum(axis=1) > 0).astype(np.float32)
api.record_dataset({"x": x, "y": y})
w1 = rng.standard_normal((4, 8)).astype(np.float32) * 0.5
w2 = rng.standard_normal((8, 1)).astype(np.float32) * 0.5
api.record_initial_weights([("hidden", [w1]), ("out", [w2])])
noise = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))  # unseeded on purpose
for epoch in range(int(p["epochs"])):
    order = rng.permutation(64)
    batches = [order[i:i + 16] for i in range(0, 64, 16)]
    for ids in batches:
        h = np.tanh(x[ids] @ w1)
        err = (h @ w2)[:, 0] - y[ids]
        g2 = h.T @ err[:, None] / len(ids)
        g1 = x[ids].T @ ((err[:, None] @ w2.T) * (1 - h * h)) / len(ids)
        if int(p["unseeded"]):  # an unseeded dropout-like perturbation of the output layer only
            g2 = g2 + noise.standard_normal(g2.shape) * 1e-7
        w1 -= np.float32(0.1) * g1.astype(np.float32)
        w2 -= np.float32(0.1) * g2.astype(np.float32)
    loss = float(np.mean(((np.tanh(x @ w1) @ w2)[:, 0] - y) ** 2))
    api.record_epoch(epoch, batches, {"loss": loss})
api.save_final([("hidden", [w1]), ("out", [w2])])
"""


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("recipe") / "numpy_mlp"
    d.mkdir()
    (d / "recipe.toml").write_text(RECIPE_TOML)
    (d / "train.py").write_text(TRAIN_PY)
    return d


def _run(ws: Workspace, recipe: Path, n: int, seed: int, **params: int) -> Path:
    out = ws.root / f"out{n}"
    env = profile_env("deterministic", seed, 2)
    root = str(Path(__file__).resolve().parent.parent)
    p = subprocess.run(
        [sys.executable, "-m", "launcher.runtime", "run", "--recipe", str(recipe), "--out", str(out),
         "--params", json.dumps(params)],
        env={**os.environ, **env, "PYTHONPATH": root}, capture_output=True, text=True, timeout=120,
        check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    return adopt_outputs(ws.runs, f"20261122T10000{n}-numpy_mlp-00000{n}", out, recipe="numpy_mlp",
                         seed=seed, replicate=n, params=params, env=env,
                         started_at=f"2026-11-22T10:00:0{n}Z")


def test_real_runtime_outputs(tmp_path: Path, recipe: Path) -> None:
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    a = _run(ws, recipe, 0, 42)
    b = _run(ws, recipe, 1, 42)
    c = _run(ws, recipe, 2, 43)
    d = _run(ws, recipe, 3, 42, unseeded=1)
    e = _run(ws, recipe, 4, 42, unseeded=1)

    same = verify_checksums(ws, [a.name, b.name])
    # A numpy-only recipe imports no known framework: no difference, but launcher guaranteed no
    # determinism beyond the seeds, so the verdict says so instead of calling it a proof.
    assert same.identical and same.exit_code == ExitCode.INCONCLUSIVE, same.summary_line()
    assert "no known framework was imported" in same.summary_line()
    assert "bit-identical" not in same.summary_line()

    (seed_run,) = verify_checksums(ws, [a.name, c.name]).differing
    cls = seed_run.explanation["classification"]
    assert cls["kind"] == CLASS_INPUT and cls["causes"] == ["seed"]
    assert seed_run.explanation["data"]["same"] is True
    assert seed_run.explanation["batches"]["first_divergence"] == {"epoch": 0, "batch": 0}

    (params_run,) = verify_checksums(ws, [a.name, d.name]).differing
    assert params_run.explanation["classification"]["line"] == "differs in params (unseeded): an input change"

    (noisy,) = verify_checksums(ws, [d.name, e.name]).differing
    exp = noisy.explanation
    assert exp["classification"]["kind"] == CLASS_NONDETERMINISM, exp["classification"]
    # The perturbation enters through the output layer's gradient, then reaches the hidden layer
    # through backpropagation from the next batch on; model order still names the first array.
    assert exp["model"]["first_difference"] == {"layer": "hidden", "array": "0"}
    assert exp["initial_weights"]["same"] and exp["batches"]["same"] and exp["data"]["same"]
    # A perturbation this small usually leaves the float32 loss as it was; when it does move it,
    # the explanation must say from which epoch.
    metrics = exp["metrics"]
    assert metrics["same"] is True or metrics["first_divergence"] is not None, metrics
    assert 0 < exp["model"]["arrays"][0]["max_abs_diff"] < 1e-4
