"""`launcher diverge` for real in the TensorFlow CPU image, on a plain Keras script (no line of launcher in
it) whose callback adds 0.25 to one weight of its output layer after a known optimizer step.

Two runs, the second edited after step 7, started with ``--trace-every 3 --checkpoint-every 1
--keep-checkpoints`` (5 steps an epoch, 3 epochs): their fingerprints agree up to step 6 and part by
step 9. diverge starts both re-executions from the checkpoint after epoch 1 (step 5), checks that each
repeats its run at step 6, finds the exact step (8) in the re-executions' fingerprints and names the
change: the out layer's weights changed between the update of step 7 and the forward pass of step 8,
outside the traced operations, in the second run. Then the data on the host changes under the same
runs, and diverge says that they could not be repeated (exit 46).

The trace is also checked against the fingerprints, one run each, for a subclassed model, a custom
``train_step`` and fit() compiled with XLA (which the trace keeps, tracing the weights only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.hosts.hostspec import HostSpec
from launcher.hosts.local import LocalHost
from launcher.runs.lifecycle import RunRequest, run_recipe
from launcher.runtime import fingerprints as fp
from launcher.verify.opdiff import read_ops
from launcher.verify.stepdiff import read_steps
from launcher.workspace import Workspace

pytestmark = [pytest.mark.docker, pytest.mark.tfimage, pytest.mark.image, pytest.mark.slow]

SCRIPT = '''"""Digits (scaled by the number in DATA/scale.txt) with a small MLP; a callback adds 0.25 to one weight of
the output layer after a given optimizer step."""
import argparse
import os

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--edit-at", type=int, default=0)
parser.add_argument("--model", default="sequential", choices=["sequential", "subclassed", "custom_step", "xla"])
args = parser.parse_args()


class Edit(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == args.edit_at:
            w = self.model.layers[-1].kernel
            delta = np.zeros(w.shape, "float32")
            delta[0, 0] = 0.25
            w.assign(w.numpy() + delta)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(32, activation="relu", name="hidden")
        self.out = keras.layers.Dense(10, activation="softmax", name="out")

    def call(self, x):
        return self.out(self.hidden(x))


class CustomStep(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": loss}


scale = float(open(os.path.join(os.environ["LAUNCHER_DATA"], "scale.txt")).read()) \\
    if os.environ.get("LAUNCHER_DATA") else 1.0
d = load_digits()
x, y = (d.data / 16.0 * scale).astype("float32"), d.target
if args.model == "subclassed":
    model = Subclassed()
else:
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
    out = keras.layers.Dense(10, activation="softmax", name="out")(hidden)
    model = (CustomStep if args.model == "custom_step" else keras.Model)(inputs, out)
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", jit_compile=args.model == "xla")
model.fit(x[:320], y[:320], batch_size=64, epochs=3, callbacks=[Edit()], verbose=2)
'''


def cli(ws: Workspace, *args: str, code: int = 0) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == code, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


@pytest.fixture(scope="module")
def edited(cpu_image: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two runs with checkpoints kept, the second edited after step 7; and diverge's answer on them."""
    ws = cpu_image["workspace"]
    root = tmp_path_factory.mktemp("edited")
    script = root / "edited" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    data = root / "data"
    data.mkdir()
    (data / "scale.txt").write_text("1.0\n")
    common = ["--data", str(data), "--trace-every", "3", "--checkpoint-every", "1", "--keep-checkpoints"]
    ids = [cli(ws, "run", str(script), *common, *extra)["data"]["runs"][0]["run_id"]
           for extra in ([], ["--", "--edit-at", "7"])]
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", "diverge", *ids])
    data_out = json.loads(res.stdout)["data"]
    return {"ws": ws, "ids": ids, "data": data, "code": res.exit_code, "json": data_out,
            "text": "\n".join(data_out.get("lines") or [data_out.get("error", res.output)])}


def test_the_runs_part_between_the_fingerprints_around_the_edit(edited: dict[str, Any]) -> None:
    ws, ids = edited["ws"], edited["ids"]
    rows = read_steps(ws.runs / ids[0] / "outputs")
    assert sorted(rows) == [0, 3, 5, 6, 9, 10, 12, 15]
    kept = sorted(p.name for p in (ws.runs / ids[0] / "outputs/checkpoints").iterdir())
    assert kept == ["epoch-0001", "epoch-0002", "epoch-0003", "latest.json"]


def test_diverge_names_the_callbacks_change_at_the_step_after_it_with_its_layer(edited: dict[str, Any]) -> None:
    assert edited["code"] == 0, edited["text"]
    d, ids = edited["json"], edited["ids"]
    assert d["window"] == [7, 9] and d["outcome"] == "localised"
    # by the update of step 8 the edit has reached the hidden layer's weights too, through the gradient
    exact = d["exact"]
    assert (exact["agree_until"], exact["parts_by"], exact["layers_differing"]) == (7, 8, ["hidden", "out"])
    first = d["first_difference"]
    assert (first["step"], first["kind"], first["layer"], first["changed_in"]) == (8, "weights", "out", ["run"]), first
    assert first["size"]["differing"] == 1 and first["size"]["max_abs_diff"] == pytest.approx(0.25, rel=1e-5)
    assert d["cause"] == "a change the code made to the weights outside the traced operations"
    assert d["candidates"] == []
    assert (f"step 8: the weights of layer out changed between the optimizer update of step 7 and the forward pass of "
            f"step 8 outside the traced operations (a callback, a constraint, a direct assignment), in {ids[1]}; "
            "1 of 320 elements of out/kernel differ") in edited["text"]
    assert "every traced operation agrees" not in edited["text"]


def test_the_reexecutions_start_from_the_checkpoint_and_repeat_their_runs(edited: dict[str, Any]) -> None:
    d, ids, ws = edited["json"], edited["ids"], edited["ws"]
    for run in ids:
        point = d["started_from"][run]
        assert (point["checkpoint"], point["step"], point["steps_total"]) == ("epoch-0001", 5, 15)
        rerun_rows = read_steps(ws.runs / d["reruns"][run] / "outputs")
        assert [s for s in sorted(rerun_rows) if s > 5] == list(range(6, 16))  # 10 steps computed, not 15
        log = (ws.runs / d["reruns"][run] / "outputs/logs/train.log").read_text()
        assert "resuming from checkpoint epoch-0001" in log
    assert [(c["steps_checked"], c["repeats"]) for c in d["checks"]] == [([6], True), ([6], True)]
    assert f"started from {ids[0]}'s checkpoint epoch-0001 (step 5, after epoch 1): steps 1..5 not re-executed, " \
           "5 of the run's 15; it took " in edited["text"]
    assert all(p["rerun_seconds"] > 0 for p in d["started_from"].values())
    assert f"repeats {ids[1]} at each step it computed up to step 6 (step 6)" in edited["text"]


def test_runs_whose_data_changed_on_the_host_are_said_not_to_repeat(edited: dict[str, Any]) -> None:
    ws, ids = edited["ws"], edited["ids"]
    (edited["data"] / "scale.txt").write_text("1.001\n")
    try:
        res = CliRunner().invoke(app, ["-w", str(ws.root), "diverge", *ids])
    finally:
        (edited["data"] / "scale.txt").write_text("1.0\n")
    assert res.exit_code == ExitCode.NOT_REPEATED, res.output
    assert "does not repeat" in res.stdout and "its weights depart at step 6" in res.stdout
    assert "the data's fingerprint" in res.stdout
    assert "stopped: a re-execution that does not repeat its run" in res.stdout
    assert "agree" not in res.stdout.splitlines()[-1]


@pytest.mark.parametrize("model", ["subclassed", "custom_step", "xla"])
def test_what_the_trace_records_is_what_the_fingerprints_show(cpu_image: dict[str, Any], tmp_path: Path,
                                                             model: str) -> None:
    """In one run traced as diverge traces, the weights the forward pass of step s reads are the fingerprint
    of step s-1, but for the layer the callback edited after step 3; after the update of s, those of step s."""
    ws = cpu_image["workspace"]
    script = tmp_path / model / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    # Keras compiles no step with XLA under op determinism (it says so and goes on without): XLA runs seeded only
    spec = RunRequest(recipe=str(script), seed=1, trace_every="1", optrace="2:5",
                   profile="seeded" if model == "xla" else "deterministic", args=["--model", model, "--edit-at", "3"])
    outcome = run_recipe(ws, spec, LocalHost(), host_spec=HostSpec())
    out = ws.runs / outcome.runs[0]["run_id"] / "outputs"
    prints, ops = read_steps(out), read_ops(out)
    info = json.loads((out / "optrace/trace.json").read_text())
    assert (info["xla"], info["operations"]) == ((True, False) if model == "xla" else (False, True))
    assert sorted(ops) == [2, 3, 4, 5]
    for step, step_ops in ops.items():
        kinds = {k for k, _, _ in step_ops.by_key}
        traced = {"weights", "updated"} if model == "xla" else {"weights", "input", "output", "grad", "updated"}
        assert kinds == traced
        for kind, at in (("weights", step - 1), ("updated", step)):
            for layer in ("hidden", "out"):
                got = fp.digest_of([r["digest"] for (k, _, n), r in step_ops.rows
                                    if k == kind and n == 0 and r.get("layer") == layer])
                edited_here = kind == "weights" and step == 4 and layer == "out"
                assert (got == prints[at]["layers"][layer]) != edited_here, (step, kind, layer)
