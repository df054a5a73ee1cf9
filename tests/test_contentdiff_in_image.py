"""Files written by the real libraries in the TensorFlow image, compared by content on the host:
Keras .keras/.h5/.weights.h5 saves of the same weights at different times, SavedModel exports,
a TensorBoard writer run twice; each pair identical in content, and one weight changed named.
And the user-script case: a plain Keras script run twice with `launcher run train.py --runs 2`,
saving model.keras and a history JSON in its working directory, verifies identical (exit 0)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.verify.content import compare_files, compare_savedmodel

pytestmark = [pytest.mark.docker, pytest.mark.tfimage]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "contentdiff"


@pytest.fixture(scope="module")
def saves(cpu_image: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("saves")
    res = subprocess.run(["docker", "run", "--rm", "--label", "org.launcher.test=contentdiff",
                          "-v", f"{out}:/out", "-v", f"{FIXTURES}:/fixtures:ro", cpu_image["id"],
                          "python", "/fixtures/write_saves.py", "/out"],
                         capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


@pytest.mark.parametrize(("suffix", "fmt", "layer"), [
    (".keras", "keras", "dense_1"),  # a .keras archive names layers by class inside model.weights.h5
    (".h5", "hdf5", "head"),  # the legacy full-model HDF5 save keeps the layer names
    (".weights.h5", "hdf5", "dense_1"),
])
def test_keras_saves_at_different_times(saves: Path, suffix: str, fmt: str, layer: str) -> None:
    a, b, c = (saves / f"{t}{suffix}" for t in "abc")
    same = compare_files(a, b)
    assert same is not None and same.format == fmt and same.same, same
    if suffix == ".keras":
        assert a.read_bytes() != b.read_bytes()
        assert "zip entry dates" in same.volatile and "metadata.json field date_saved" in same.volatile
    changed = compare_files(a, c)
    assert changed is not None and not changed.same
    assert changed.first_difference == {"layer": layer, "array": "0"}, changed


def test_savedmodel_exports(saves: Path) -> None:
    same = compare_savedmodel(saves / "a_savedmodel", saves / "b_savedmodel")
    assert same.same, same
    assert (saves / "a_savedmodel/saved_model.pb").read_bytes() != (saves / "b_savedmodel/saved_model.pb").read_bytes()
    assert "saved_model.pb (not compared)" in same.volatile
    changed = compare_savedmodel(saves / "a_savedmodel", saves / "c_savedmodel")
    assert not changed.same and changed.first_difference is not None
    assert changed.model is not None and changed.model.first_difference is not None
    assert changed.model.first_difference.differing == 2  # the two bumped elements of the head kernel


def test_tensorboard_writer_run_twice(saves: Path) -> None:
    a, b, c = (next((saves / f"tb_{t}").glob("events.out.tfevents.*")) for t in "abc")
    assert a.name != b.name
    same = compare_files(a, b)
    assert same is not None and same.same and "event wall times" in same.volatile, same
    changed = compare_files(a, c)
    assert changed is not None and not changed.same
    assert changed.difference is not None and "step 2, tag loss" in changed.difference


USER_SCRIPT = '''\
import json

import numpy as np
from sklearn.datasets import load_digits
import keras

digits = load_digits()
x = digits.data[:256].astype("float32") / 16.0
y = digits.target[:256]
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, epochs=2, batch_size=32, verbose=2)
model.save("model.keras")
with open("history.json", "w") as f:
    json.dump(history.history, f)
'''


def test_user_script_run_twice_verifies_identical(cpu_image: dict[str, Any], tmp_path: Path) -> None:
    ws = cpu_image["workspace"]
    script = tmp_path / "user_train.py"
    script.write_text(USER_SCRIPT)
    runner = CliRunner()
    r = runner.invoke(app, ["--workspace", str(ws.root), "--json", "--quiet", "run", str(script), "--runs", "2"])
    assert r.exit_code == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = json.loads(r.stdout)["data"]["runs"]
    ids = [m["run_id"] for m in runs]
    assert len(ids) == 2
    paths = {a["path"] for a in runs[0]["artifacts"]}
    assert {"outputs/model.keras", "outputs/history.json"} <= paths
    v = runner.invoke(app, ["--workspace", str(ws.root), "--json", "--quiet", "verify", "checksums", *ids])
    data = json.loads(v.stdout)["data"]
    assert v.exit_code == 0, data["summary"]
    rows = {a["path"]: a for a in data["artifacts"]}
    cell = rows["outputs/model.keras"]["runs"][ids[1]]
    assert cell["status"] in ("identical", "identical-content")
    if cell["status"] == "identical-content":
        assert "identical in content" in data["summary"] and "model.keras" in data["summary"]
