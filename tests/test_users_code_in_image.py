"""A researcher's own project, not one of launcher's recipes, run for real in the TensorFlow CPU image.

The project's train.py imports Keras only through its own modules (a sibling module and a package),
feeds fit() in-memory arrays with shuffle=True and validation_split, and saves what it trained.
launcher must seed it and make it deterministic all the same (two runs verify identical), and what
it proves must be what the script does: the same script run by the plain `docker run` that
`launcher env` prints, without launcher, trains the same weights bit for bit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.workspace import Workspace

pytestmark = [pytest.mark.docker, pytest.mark.tfimage]

PROJECT = {
    "train.py": '''"""Digits with a small convnet; seeds itself only when asked (--seed)."""
import argparse

import numpy as np

import model_def
from digits.data import load

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--seed", type=int)
args = parser.parse_args()
if args.seed is not None:
    model_def.seed_everything(args.seed)
x, y = load()
model = model_def.build()
history = model.fit(x, y, batch_size=64, epochs=args.epochs, validation_split=0.1, shuffle=True, verbose=2)
np.savez("trained.npz", *[w.numpy() for w in model.weights])
print("val_accuracy", history.history["val_accuracy"][-1])
''',
    "model_def.py": '''import keras


def seed_everything(seed):
    keras.utils.set_random_seed(seed)


def build():
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
''',
    "digits/__init__.py": "",
    "digits/data.py": '''import numpy as np
from keras import ops  # the package imports Keras too
from sklearn.datasets import load_digits


def load():
    d = load_digits()
    x = (d.images / 16.0).astype("float32")[..., None]
    return np.asarray(ops.convert_to_numpy(x)), d.target
''',
}


def cli(ws: Workspace, *args: str, code: int = 0) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == code, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def write_project(root: Path) -> Path:
    for rel, text in PROJECT.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "train.py"


def weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as npz:
        return [npz[k] for k in sorted(npz.files, key=lambda k: int(k.split("_")[1]))]


def test_a_project_importing_keras_through_its_modules_is_seeded_and_verifies_identical(
        cpu_image: dict[str, Any], tmp_path: Path) -> None:
    ws = cpu_image["workspace"]
    script = write_project(tmp_path / "myproj")
    out = cli(ws, "run", str(script), "--runs", "2", "--", "--epochs", "2")
    runs = out["data"]["runs"]
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"]
    for m in runs:
        runtime = m["runtime"]
        assert runtime["frameworks"] == ["tensorflow"], runtime
        assert runtime["determinism"]["in_force"] is True
        assert runtime["framework"]["op_determinism"] == "fwr13y.d9m.tensorflow.enable_determinism"
        assert runtime["applied"]["keras"]["fit_recorded"] is True
        assert runtime["seed_calls"] == []  # seeded by launcher, not by itself
    dirs = [ws.runs / m["run_id"] / "outputs" for m in runs]
    assert weights(dirs[0] / "trained.npz")[0].tobytes() == weights(dirs[1] / "trained.npz")[0].tobytes()
    verdict = cli(ws, "verify", "checksums", *(m["run_id"] for m in runs))["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]
    batches = [json.loads(line) for line in (dirs[0] / "fingerprints/batches.jsonl").read_text().splitlines()]
    assert [len(b["batches"]) for b in batches] == [26, 26]  # 1,617 training digits in batches of 64


def test_the_plain_docker_run_launcher_prints_trains_the_same_weights(cpu_image: dict[str, Any],
                                                                      tmp_path: Path) -> None:
    ws = cpu_image["workspace"]
    script = write_project(tmp_path / "selfseeded")
    run = cli(ws, "run", str(script), "--", "--epochs", "3", "--seed", "1337")["data"]["runs"][0]
    assert run["runtime"]["seed_calls"] == [{"api": "keras.utils.set_random_seed", "seed": 1337}]
    plain_out = tmp_path / "plain"
    plain = cli(ws, "env", run["run_id"], "--out", str(plain_out))["data"]
    assert plain["command"][-4:] == ["--epochs", "3", "--seed", "1337"]
    done = subprocess.run(plain["argv"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (plain_out / "_launcher").exists()  # no launcher runtime in the plain run
    ours = weights(ws.runs / run["run_id"] / "outputs" / "trained.npz")
    theirs = weights(plain_out / "trained.npz")
    assert len(ours) == len(theirs) == 4
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    with np.load(ws.runs / run["run_id"] / "outputs" / "model" / "canonical.npz") as canonical:
        recorded = [canonical[k] for k in sorted(canonical.files)]
    assert [a.tobytes() for a in recorded] == [a.tobytes() for a in theirs]  # what launcher recorded, too
