"""`launcher export`: what MLflow's own client and TensorBoard's own reader read back.

These use complete run directories from tests/runfactory.py (schema-1 manifests, outputs
written with the runtime's own functions); tests/test_export_real_runs.py does the same on
runs the real image trained.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import need
from runfactory import FakeRun, make_workspace, pair, refresh_manifest, write_run
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.records.manifest import Manifest, load_manifest
from launcher.report.export import RUN_ID_TAG, metric_points, run_params
from launcher.verify import verdicts as verify
from launcher.workspace import Workspace

# No usage report leaves this machine from a test (MLflow sends one unless told not to).
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def _need_mlflow() -> None:
    need(importlib.util.find_spec("mlflow") is not None, "mlflow-skinny is not installed (pip install -e '.[dev]')")


def _need_tensorboard() -> None:
    need(importlib.util.find_spec("tensorboard") is not None, "tensorboard is not installed (pip install -e '.[dev]')")


def cli(ws: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    res = CliRunner().invoke(app, ["--workspace", str(ws), "--json", "--quiet", *args])
    try:
        env = json.loads(res.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {res.exit_code}): {res.stdout!r} {res.stderr!r}") from None
    return res.exit_code, env, res.stderr


def mlflow_client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def assert_mlflow_holds(client: Any, mlflow_run_id: str, m: Manifest, tmp: Path) -> None:
    """Params, every epoch of every metric, the provenance tags and every artifact, read back by MLflow."""
    got = client.get_run(mlflow_run_id)
    assert got.data.params == run_params(m)
    assert got.data.params["seed"] == str(m.seed)
    assert got.data.params["determinism_profile"] == m.determinism["profile"]
    points = metric_points(m)
    assert points, "the run has per-epoch metrics"
    names = {k for p in points for k in p.values}
    for name in names:
        history = sorted((x.step, x.value) for x in client.get_metric_history(mlflow_run_id, name))
        assert history == sorted((p.step, p.values[name]) for p in points if name in p.values), name
    rows = [json.loads(line) for line in m.file("outputs/metrics.jsonl").read_text().splitlines()]
    assert [p.step for p in points] == [r["epoch"] for r in rows]  # one fit: the step is the epoch
    tags = got.data.tags
    assert tags[RUN_ID_TAG] == m.run_id
    assert tags["launcher.image_id"] == m.image["id"]
    assert tags["launcher.lock_sha256"] == m.image["lock_sha256"]
    assert tags["launcher.base_digest"] == m.image["base_digest"]
    assert tags["launcher.determinism_profile"] == m.determinism["profile"]
    assert got.info.run_name == m.run_id
    assert got.info.status == "FINISHED"
    dest = tmp / mlflow_run_id
    dest.mkdir(parents=True)
    local = Path(client.download_artifacts(mlflow_run_id, "", str(dest)))
    for art in m.artifacts:
        assert sha256(local / art.path) == art.sha256, art.path
    assert json.loads((local / "manifest.json").read_text()) == json.loads(m.path.read_text())


def group_verdict(ws: Workspace, group: str) -> dict[str, Any]:
    return verify.verify_checksums(ws, group=group).to_dict()


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Workspace, Path, Path]:
    root = make_workspace(tmp_path / "ws")
    a, b = pair(root / "runs", unseeded_dropout=True, dropout_entropy=7)
    return Workspace.at(root), a, b


def test_mlflow_client_reads_back_params_metrics_tags_and_artifacts(
        two_runs: tuple[Workspace, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _need_mlflow()
    ws, a, b = two_runs
    code, env, err = cli(ws.root, "export", a.name, b.name, "--to", "mlflow")
    assert code == 0, err
    uri = (ws.root / "mlruns").as_uri()  # the default: a file store in the workspace
    assert env["data"]["destination"] == uri and "mlflow ui" in env["summary"]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it to open a file store
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name("mnist_convnet")
    assert exp is not None and env["data"]["experiments"] == {"mnist_convnet": exp.experiment_id}
    expected = group_verdict(ws, "g1")
    assert expected["verdict"] == "differs"
    exported = {r["run_id"]: r for r in env["data"]["runs"]}
    for run_dir in (a, b):
        m = load_manifest(run_dir)
        rid = exported[m.run_id]["destination"]
        assert_mlflow_holds(client, rid, m, tmp_path / "download")
        tags = client.get_run(rid).data.tags
        assert tags["launcher.verdict"] == expected["verdict"]
        row = next(r for r in expected["runs"] if r["run_id"] == m.run_id)
        assert tags["launcher.verdict_run"] == row["status"]
    assert "nondeterminism" in client.get_run(exported[load_manifest(b).run_id]["destination"]).data.tags[
        "launcher.verdict_line"]


def test_exporting_again_replaces_the_earlier_mlflow_run(
        two_runs: tuple[Workspace, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _need_mlflow()
    ws, a, _ = two_runs
    uri = (tmp_path / "store").as_uri()
    first = cli(ws.root, "export", a.name, "--to", "mlflow", "--tracking-uri", str(tmp_path / "store"),
                "--experiment", "mine")
    second = cli(ws.root, "export", a.name, "--to", "mlflow", "--tracking-uri", uri, "--experiment", "mine")
    assert first[0] == 0 and second[0] == 0, second[2]
    assert second[1]["data"]["runs"][0]["replaced"] is True
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name("mine")
    active = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in active] == [second[1]["data"]["runs"][0]["destination"]]
    points = metric_points(load_manifest(a))
    assert len(client.get_metric_history(active[0].info.run_id, "loss")) == len(points)  # not logged twice


def test_a_run_alone_in_its_group_has_no_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _need_mlflow()
    root = make_workspace(tmp_path / "ws")
    d = write_run(root / "runs", FakeRun(run_id="20261122T100000-mnist_convnet-cccccc", group="alone"))
    code, env, err = cli(root, "export", d.name)
    assert code == 0, err
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tags = mlflow_client((root / "mlruns").as_uri()).get_run(env["data"]["runs"][0]["destination"]).data.tags
    assert tags["launcher.verdict"] == "none" and tags["launcher.verdict_run"] == "none"
    assert "only completed run" in tags["launcher.verdict_line"]


def assert_tensorboard_holds(run_folder: Path, m: Manifest) -> None:
    """TensorBoard's own reader sees every (metric, epoch) scalar of the run, and nothing else."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_folder), size_guidance={"scalars": 0})
    acc.Reload()
    points = metric_points(m)
    names = sorted({k for p in points for k in p.values})
    assert sorted(acc.Tags()["scalars"]) == names
    for name in names:
        got = [(e.step, e.value) for e in acc.Scalars(name)]
        want = [(p.step, float(np.float32(p.values[name]))) for p in points if name in p.values]
        assert got == want, name


def test_tensorboard_reader_reads_back_every_scalar_one_folder_per_replicate(
        two_runs: tuple[Workspace, Path, Path], tmp_path: Path) -> None:
    _need_tensorboard()
    ws, a, b = two_runs
    logdir = tmp_path / "tb"
    code, env, err = cli(ws.root, "export", a.name, b.name, "--to", "tensorboard", str(logdir))
    assert code == 0, err
    assert env["data"]["destination"] == str(logdir.resolve())
    for run_dir in (a, b):
        m = load_manifest(run_dir)
        folder = logdir / m.group / m.run_id
        assert any(r["destination"] == str(folder.resolve()) for r in env["data"]["runs"])
        assert_tensorboard_holds(folder, m)
    # exported again: the earlier event files are replaced, so no scalar appears twice
    code, env, err = cli(ws.root, "export", "--group", "g1", "--to", "tensorboard", "--logdir", str(logdir))
    assert code == 0, err
    assert all(r["replaced"] for r in env["data"]["runs"])
    m = load_manifest(a)
    assert len(list((logdir / m.group / m.run_id).glob("events.out.tfevents.*"))) == 1
    assert_tensorboard_holds(logdir / m.group / m.run_id, m)


def test_a_second_fit_continues_the_steps(tmp_path: Path) -> None:
    rows = [{"epoch": 0, "loss": 1.0}, {"epoch": 1, "loss": 0.5},
            {"epoch": 0, "loss": 0.4, "fit": 1}, {"epoch": 1, "loss": 0.3, "note": "text", "fit": 1}]
    metrics = "".join(json.dumps(r) + "\n" for r in rows).encode()
    d = write_run(tmp_path, FakeRun(run_id="20261122T100000-mnist_convnet-dddddd",
                                    extra_files={"metrics.jsonl": metrics}))
    points = metric_points(load_manifest(d))
    assert [(p.step, dict(p.values)) for p in points] == [
        (0, {"loss": 1.0}), (1, {"loss": 0.5}), (2, {"loss": 0.4}), (3, {"loss": 0.3})]


def test_a_file_changed_after_the_pull_is_not_exported(two_runs: tuple[Workspace, Path, Path],
                                                       tmp_path: Path) -> None:
    _need_mlflow()
    ws, a, _ = two_runs
    (a / "outputs" / "metrics.jsonl").write_text('{"epoch": 0, "loss": 9.0}\n')
    store = tmp_path / "store"
    code, env, err = cli(ws.root, "export", a.name, "--tracking-uri", str(store))
    assert code == ExitCode.CORRUPT, err
    assert "metrics.jsonl" in env["summary"]
    meta = list(store.glob("*/*/meta.yaml"))  # a run the export created and then dropped is marked deleted
    assert all("lifecycle_stage: active" not in p.read_text() for p in meta)
    refresh_manifest(a)


def test_a_missing_package_names_the_extra_in_one_line(two_runs: tuple[Workspace, Path, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ws, a, _ = two_runs
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    code, env, _ = cli(ws.root, "export", a.name, "--to", "mlflow")
    assert code == ExitCode.MISSING_EXTRA
    assert "mlflow-skinny" in env["summary"] and "launcher[export]" in env["summary"]
    for name in ("tensorboard", "tensorboard.summary.writer.event_file_writer"):
        monkeypatch.setitem(sys.modules, name, None)
    code, env, _ = cli(ws.root, "export", a.name, "--to", "tensorboard", str(tmp_path / "tb"))
    assert code == ExitCode.MISSING_EXTRA and "launcher[export]" in env["summary"]
    assert not (tmp_path / "tb").exists()


def test_a_missing_package_exits_without_a_traceback_in_a_real_process(two_runs: tuple[Workspace, Path, Path]
                                                                       ) -> None:
    ws, a, _ = two_runs
    code = ("import sys; sys.modules['mlflow'] = None; sys.modules['mlflow.tracking'] = None; "
            "from launcher.cli import main; sys.argv = ['launcher'] + sys.argv[1:]; main()")
    done = subprocess.run([sys.executable, "-c", code, "--workspace", str(ws.root), "export", a.name],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.MISSING_EXTRA, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "launcher[export]" in lines[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_no_tracking_server_fails_fast_with_its_code(two_runs: tuple[Workspace, Path, Path]) -> None:
    _need_mlflow()
    ws, a, _ = two_runs
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, env, _ = cli(ws.root, "export", a.name, "--tracking-uri", f"http://127.0.0.1:{port}")
    assert code == ExitCode.HOST_UNREACHABLE
    assert "no MLflow tracking server answers" in env["summary"]


def test_tensorboard_needs_a_directory_after_the_runs(two_runs: tuple[Workspace, Path, Path]) -> None:
    ws, a, b = two_runs
    code, env, _ = cli(ws.root, "export", a.name, b.name, "--to", "tensorboard")
    assert code == ExitCode.USAGE and "is a run, not a TensorBoard log directory" in env["summary"]
    code, env, _ = cli(ws.root, "export", a.name, "--to", "wandb")
    assert code == ExitCode.USAGE and "'wandb' is not one of 'mlflow', 'tensorboard'" in env["summary"]
