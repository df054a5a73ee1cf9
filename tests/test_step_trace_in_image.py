"""Step fingerprints for real in the TensorFlow CPU image: a plain Keras script (no line of launcher
in it) whose weights are nudged by OS noise after optimizer step 7 is run twice with
``--trace-every 3``; verify says the runs agree up to step 6 and part by step 9, and diverge that the
out layer's weights changed outside the traced operations between the update of step 7 and the forward
pass of step 8."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.workspace import Workspace

pytestmark = [pytest.mark.docker, pytest.mark.tfimage]

SCRIPT = '''"""Digits with a small MLP; a callback nudges one weight by OS noise after a given step."""
import argparse, os

import keras
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--part-at", type=int, default=0)
args = parser.parse_args()


class Nudge(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == args.part_at:
            w = self.model.layers[-1].kernel
            w.assign(w + (1 + os.urandom(1)[0]) * 1e-6)


d = load_digits()
x, y = (d.data / 16.0).astype("float32"), d.target
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu", name="hidden"),
                          keras.layers.Dense(10, activation="softmax", name="out")])
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x[:640], y[:640], batch_size=128, epochs=2, callbacks=[Nudge()], verbose=2)
'''


def cli(ws: Workspace, *args: str, code: int = 0) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == code, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_two_keras_runs_nudged_after_step_7_part_between_6_and_9(cpu_image: dict[str, Any], tmp_path: Path) -> None:
    ws = cpu_image["workspace"]
    script = tmp_path / "nudged" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    runs = cli(ws, "run", str(script), "--runs", "2", "--trace-every", "3", "--", "--part-at", "7")["data"]["runs"]
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"]
    assert runs[0]["trace"] == {"every": "3"}
    out = ws.runs / runs[0]["run_id"] / "outputs"
    rows = [json.loads(line) for line in (out / "fingerprints/steps.jsonl").read_text().splitlines()]
    # 5 steps an epoch: step 0, every 3 steps, and each epoch's end
    assert [(r["step"], r.get("epoch")) for r in rows] == [(0, None), (3, None), (5, 0), (6, None), (9, None),
                                                          (10, 1)]
    assert list(rows[0]["layers"]) == ["hidden", "out"] and "loss" in rows[1]
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", "verify", "checksums",
                                   *(r["run_id"] for r in runs)])
    assert res.exit_code == ExitCode.NOT_REPRODUCIBLE, res.output
    exp = json.loads(res.stdout)["data"]["explanations"][runs[1]["run_id"]]
    steps = exp["steps"]
    assert (steps["agree_until"], steps["parts_by"]) == (6, 9), steps
    assert steps["layers_differing"] == ["hidden", "out"]
    assert "weights agree up to step 6 and part by step 9" in exp["classification"]["line"]
    text = CliRunner().invoke(app, ["-w", str(ws.root), "verify", "checksums", *(r["run_id"] for r in runs)])
    assert "training steps: weights agree up to step 6 and part by step 9 (first layer hidden)" in text.stdout

    # launcher diverge: both runs executed again with steps 7..9 traced value by value. The nudge after step 7
    # changed the out layer's kernel in each run by its own noise: the weights the forward pass of step 8
    # reads differ, each run's from its own fingerprint of step 7. No setting is tried for such a change, and
    # neither re-execution repeats its run's fingerprint at step 9 (the noise is new each time).
    ids = [r["run_id"] for r in runs]
    d = cli(ws, "diverge", *ids)["data"]
    first = d["first_difference"]
    assert d["window"] == [7, 9] and (first["step"], first["kind"], first["layer"]) == (8, "weights", "out"), first
    assert first["changed_in"] == ["reference", "run"] and first["size"]["differing"] > 0
    assert (d["exact"]["agree_until"], d["exact"]["parts_by"]) == (7, 8)
    assert d["candidates"] == [] and d["cause"] == "a change the code made to the weights outside the traced operations"
    assert [(c["repeats"], c["parting_repeated"]) for c in d["checks"]] == [(True, False), (True, False)]
    assert ("step 8: the weights of layer out changed between the optimizer update of step 7 and the forward pass of "
            "step 8 outside the traced operations") in "\n".join(d["lines"])
    assert all((ws.runs / rerun / "outputs/optrace/ops.jsonl").is_file() for rerun in d["reruns"].values())

