"""A user's own Keras script that logs with tf.summary and Keras' TensorBoard callback, run with
`launcher run path/train.py --runs 2` on the local engine in the real TensorFlow image (issue 12,
item 5: TensorBoard is in the image locks), then those real runs exported (item 6) and read
back by MLflow's client and TensorBoard's reader."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_export import assert_mlflow_holds, assert_tensorboard_holds, cli, mlflow_client
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.integrity import check_integrity
from launcher.records.manifest import Manifest, load_manifest
from launcher.verify import verdicts as verify
from launcher.workspace import Workspace

pytestmark = [pytest.mark.docker, pytest.mark.tfimage]

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

SCRIPT = '''"""My training script: no seeds, no launcher calls; TensorBoard logs next to the model."""
import numpy as np
import tensorflow as tf

data = np.random.default_rng(0)  # the dataset; the model itself is not seeded
x = data.standard_normal((256, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")

model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(8, activation="relu"),
                             tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
model.fit(x[:192], y[:192], validation_data=(x[192:], y[192:]), epochs=3, batch_size=32, verbose=2,
          callbacks=[tf.keras.callbacks.TensorBoard(log_dir="tb/keras")])

writer = tf.summary.create_file_writer("tb/custom")
with writer.as_default():
    for step in range(3):
        tf.summary.scalar("custom/value", step * 0.5, step=step)
writer.flush()
model.save("model.keras")
'''

EPOCHS = 3


@pytest.fixture(scope="module")
def real_runs(cpu_image: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    ws = cpu_image["workspace"].root
    code_dir = tmp_path_factory.mktemp("usercode")
    script = code_dir / "train.py"
    script.write_text(SCRIPT)
    res = CliRunner().invoke(app, ["--workspace", str(ws), "--json", "--quiet", "run", str(script), "--runs", "2"])
    assert res.exit_code == 0, (res.stdout[-3000:], res.stderr[-3000:])
    env = json.loads(res.stdout)
    runs = [load_manifest(ws / "runs" / r["run_id"]) for r in env["data"]["runs"]]
    assert len(runs) == 2 and runs[0].group == runs[1].group
    return runs


def _tensor_values(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    assert tag in acc.Tags()["tensors"], (folder, acc.Tags())
    return [(e.step, float(make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


def test_tf_summary_and_the_keras_tensorboard_callback_work_in_the_image_and_come_back(
        real_runs: list[Manifest]) -> None:
    from test_export import _need_tensorboard

    _need_tensorboard()
    for m in real_runs:
        log = m.file("outputs/logs/train.log").read_text()
        assert "TensorBoard is not installed" not in log and m.status == "succeeded", log[-2000:]
        events = [a.path for a in m.artifacts if "/events.out.tfevents." in a.path]
        for folder in ("outputs/tb/keras/train/", "outputs/tb/keras/validation/", "outputs/tb/custom/"):
            assert any(p.startswith(folder) for p in events), (folder, events)
        check_integrity([m])  # the event files came back whole, as the manifest hashed them
        assert _tensor_values(m.file("outputs/tb/custom"), "custom/value") == [(0, 0.0), (1, 0.5), (2, 1.0)]
        # the callback's curves are the ones launcher recorded from the same fit()
        rows = [json.loads(line) for line in m.file("outputs/metrics.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in rows] == list(range(EPOCHS))
        for sub, prefix in (("train", ""), ("validation", "val_")):
            for metric in ("loss", "accuracy"):
                got = _tensor_values(m.file(f"outputs/tb/keras/{sub}"), f"epoch_{metric}")
                assert [s for s, _ in got] == list(range(EPOCHS))
                np.testing.assert_allclose([v for _, v in got], [r[prefix + metric] for r in rows], rtol=1e-6)


def test_real_runs_export_to_mlflow_and_tensorboard_and_read_back(
        real_runs: list[Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_export import _need_mlflow, _need_tensorboard

    _need_mlflow()
    _need_tensorboard()
    ws = real_runs[0].run_dir.parent.parent
    ids = [m.run_id for m in real_runs]
    store = tmp_path / "mlruns"
    code, env, err = cli(ws, "export", *ids, "--to", "mlflow", "--tracking-uri", str(store))
    assert code == 0, err
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow_client(store.as_uri())
    expected = verify.verify_checksums(Workspace.at(ws), group=real_runs[0].group).to_dict()
    exported = {r["run_id"]: r for r in env["data"]["runs"]}
    for m in real_runs:
        rid = exported[m.run_id]["destination"]
        assert_mlflow_holds(client, rid, m, tmp_path / "download")
        tags = client.get_run(rid).data.tags
        assert tags["launcher.verdict"] == expected["verdict"] and tags["launcher.verdict"] != "none"
        assert set(exported[m.run_id]["metrics"]) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    logdir = tmp_path / "tb"
    code, env, err = cli(ws, "export", *ids, "--to", "tensorboard", str(logdir))
    assert code == 0, err
    for m in real_runs:
        assert_tensorboard_holds(logdir / m.group / m.run_id, m)
