from __future__ import annotations

import json
from pathlib import Path

import pytest
from runfactory import (
    DEFAULT_FACTS,
    DEFAULT_FRAMEWORK,
    FakeRun,
    edit_manifest,
    flip_bit,
    make_workspace,
    pair,
    refresh_manifest,
    write_run,
)

from launcher.errors import Corrupt, ExitCode, Incompatible, NotFound, SchemaTooNew, UsageError
from launcher.records.manifest import ManifestMissing
from launcher.verify.artifacts import is_volatile
from launcher.verify.differences import CLASS_ENVIRONMENT, CLASS_INPUT, CLASS_NONDETERMINISM
from launcher.verify.environment import categorize
from launcher.verify.verdicts import SCHEMA, verify_checksums
from launcher.workspace import Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")


def test_identical_runs(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    report = verify_checksums(ws)
    assert report.identical and report.exit_code == ExitCode.OK
    assert report.reference.run_id == a.name
    data = report.to_dict()
    assert data["schema"] == SCHEMA and data["verdict"] == "identical"
    assert data["explanations"] == {}
    assert all(c["all_same"] for c in data["checks"].values())
    model_row = next(r for r in data["artifacts"] if r["path"] == "outputs/model/canonical.npz")
    assert model_row["checked"] and model_row["runs"][b.name]["status"] == "identical"
    # The logs carry timestamps and differ, but are not part of the verdict.
    log_row = next(r for r in data["artifacts"] if r["path"] == "outputs/logs/train.log")
    assert not log_row["checked"] and log_row["runs"][b.name]["status"] == "ignored"


def test_one_flipped_bit_is_named(ws: Workspace) -> None:
    _, b = pair(ws.runs)
    flip_bit(b, "dense", 1, element=3, bit=0, retrain=True)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE
    (run,) = report.differing
    model = run.explanation["model"]
    assert model["first_difference"] == {"layer": "dense", "array": "1"}
    assert model["arrays_differing"] == 1 and model["elements_differing"] == 1
    arr = next(x for x in model["arrays"] if x["status"] != "identical")
    assert 0 < arr["max_abs_diff"] < 1e-6
    # Same seed, same environment, same initial weights and batches: only training can explain it.
    assert run.explanation["classification"]["kind"] == CLASS_NONDETERMINISM
    assert run.to_dict()["first_difference"] == {"layer": "dense", "array": "1"}


def test_another_seed_is_an_input_change_naming_the_seed(ws: Workspace) -> None:
    pair(ws.runs, seed=43)
    report = verify_checksums(ws)
    (run,) = report.differing
    cls = run.explanation["classification"]
    assert cls["kind"] == CLASS_INPUT and cls["causes"] == ["seed"]
    assert "seed (42 -> 43)" in cls["line"]
    assert run.explanation["initial_weights"]["same"] is False
    assert run.explanation["batches"]["first_divergence"] == {"epoch": 0, "batch": 0}
    assert run.explanation["data"]["same"] is True
    assert {"key": "seed", "category": "seed", "reference": 42, "run": 43} in run.explanation["environment"]


def test_unseeded_dropout_is_nondeterminism_with_first_layer(ws: Workspace) -> None:
    pair(ws.runs, unseeded_dropout=True, dropout_entropy=12345)
    report = verify_checksums(ws)
    (run,) = report.differing
    exp = run.explanation
    assert exp["classification"]["kind"] == CLASS_NONDETERMINISM
    assert exp["model"]["first_difference"] == {"layer": "dense", "array": "0"}
    assert "first differing layer dense array 0" in exp["classification"]["line"]
    assert exp["initial_weights"]["same"] and exp["batches"]["same"] and exp["data"]["same"]
    assert exp["environment"] == []
    fd = exp["metrics"]["first_divergence"]
    assert fd["epoch"] == 0 and fd["metrics"]["loss"]["abs_diff"] > 0
    checks = report.to_dict()["checks"]
    assert not checks["models"]["all_same"] and checks["batches"]["all_same"] and checks["data"]["all_same"]


def test_different_hardware_is_environment_dependent(ws: Workspace) -> None:
    facts = {**DEFAULT_FACTS, "cpu_model": "AMD EPYC 7763", "user": "alice", "disk_free_bytes": 1}
    pair(ws.runs, facts=facts, unseeded_dropout=True, dropout_entropy=1)
    (run,) = verify_checksums(ws).differing
    cls = run.explanation["classification"]
    assert cls["kind"] == CLASS_ENVIRONMENT and "hardware" in cls["line"] and "cpu_model" in cls["line"]
    env = {r["key"]: r["category"] for r in run.explanation["environment"]}
    # Who ran it is shown but explains nothing; free disk space is not even shown.
    assert env == {"host.facts.cpu_model": "hardware", "host.facts.user": "info"}


def test_another_gpu_and_driver(ws: Workspace) -> None:
    gpu = {"smi": True, "gpus": [{"name": "NVIDIA H100", "driver": "550.54", "memory": "80 GiB"}],
           "driver": "550.54", "container_toolkit": True}
    other = {**gpu, "gpus": [{"name": "NVIDIA A100", "driver": "535.1", "memory": "40 GiB"}],
             "driver": "535.1"}
    framework = {**DEFAULT_FRAMEWORK, "cuda": "12.3", "cudnn": "8.9"}
    write_run(ws.runs, FakeRun(run_id="r1", facts={**DEFAULT_FACTS, "nvidia": gpu}, framework=framework))
    write_run(ws.runs, FakeRun(run_id="r2", replicate=1, facts={**DEFAULT_FACTS, "nvidia": other},
                               framework={**framework, "cudnn": "9.1"}, unseeded_dropout=True))
    (run,) = verify_checksums(ws, ["r1", "r2"]).differing
    cls = run.explanation["classification"]
    assert cls["kind"] == CLASS_ENVIRONMENT and cls["causes"] == ["hardware"]
    keys = {r["key"] for r in run.explanation["environment"]}
    assert {"host.facts.nvidia.driver", "host.facts.nvidia.gpus", "runtime.framework.cudnn"} <= keys


def test_thread_count_is_the_software_environment(ws: Workspace) -> None:
    pair(ws.runs, threads=1, unseeded_dropout=True, dropout_entropy=1)
    (run,) = verify_checksums(ws).differing
    cls = run.explanation["classification"]
    assert cls["kind"] == CLASS_ENVIRONMENT and cls["causes"] == ["software"]
    assert "determinism.threads" in cls["line"]


def test_changed_data_and_code_are_named(ws: Workspace) -> None:
    pair(ws.runs, data_version=1, code_version=1)
    with pytest.raises(Incompatible, match="different code"):  # other code: compared only when asked
        verify_checksums(ws)
    (run,) = verify_checksums(ws, across_code=True).differing
    cls = run.explanation["classification"]
    assert cls["kind"] == CLASS_INPUT and cls["causes"] == ["code", "data"]
    assert "recipe.tree_digest" in cls["line"] and "dataset fingerprint" in cls["line"]
    assert run.explanation["data"]["same"] is False


def test_corrupted_local_artifact_is_caught(ws: Workspace) -> None:
    _, b = pair(ws.runs)
    flip_bit(b, "dense", 0, update_manifest=False)  # damaged after the pull: same size, other bytes
    with pytest.raises(Corrupt, match=r"outputs/model/canonical.npz does not match its manifest"):
        verify_checksums(ws)
    (b / "outputs" / "metrics.jsonl").write_text("short\n")
    with pytest.raises(Corrupt, match="bytes, its manifest says"):
        verify_checksums(ws)
    (b / "outputs" / "metrics.jsonl").unlink()
    with pytest.raises(Corrupt, match="not in the run directory"):
        verify_checksums(ws)


def test_missing_artifact_differs(ws: Workspace) -> None:
    _, b = pair(ws.runs)
    (b / "outputs" / "weights" / "layers.json").unlink()
    refresh_manifest(b)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE
    row = next(r for r in report.artifacts if r.path == "outputs/weights/layers.json")
    assert row.cells[b.name]["status"] == "missing"


def test_bad_inputs_have_distinct_errors(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    (b / "manifest.json").unlink()
    with pytest.raises(ManifestMissing):
        verify_checksums(ws, [a.name, b.name])
    c = write_run(ws.runs, FakeRun(run_id="20261122T110000-other-cccccc", recipe="other"))
    with pytest.raises(Incompatible):
        verify_checksums(ws, [a.name, c.name])
    edit_manifest(c, schema_version=2)
    with pytest.raises(SchemaTooNew):
        verify_checksums(ws, [a.name, c.name])
    with pytest.raises(NotFound):
        verify_checksums(ws, [a.name, "no-such-run"])
    assert verify_checksums(ws, [a.name]).mode == "alone"  # one run is checked against itself
    codes = {ManifestMissing.exit_code, Incompatible.exit_code, SchemaTooNew.exit_code, Corrupt.exit_code}
    assert len(codes) == 4


def test_latest_group_and_against(ws: Workspace) -> None:
    pair(ws.runs, group="old")
    new1 = write_run(ws.runs, FakeRun(run_id="20261122T120000-mnist_convnet-111111", group="new",
                                      started_at="2026-11-22T12:00:00Z"))
    new2 = write_run(ws.runs, FakeRun(run_id="20261122T120500-mnist_convnet-222222", group="new",
                                      replicate=1, started_at="2026-11-22T12:05:00Z", seed=7))
    report = verify_checksums(ws)
    assert [r.manifest.run_id for r in report.runs] == [new1.name, new2.name]
    report = verify_checksums(ws, against=new2.name)
    assert report.reference.run_id == new2.name
    # A unique prefix of a run id is enough, and so is a path to a run directory.
    report = verify_checksums(ws, ["20261122T1200", str(new2)])
    assert [r.manifest.run_id for r in report.runs] == [new1.name, new2.name]
    with pytest.raises(UsageError, match="ambiguous"):
        verify_checksums(ws, ["20261122T12", new1.name])
    with pytest.raises(UsageError, match="not both"):
        verify_checksums(ws, [new1.name, new2.name], group="new")


def test_no_runs_at_all(ws: Workspace) -> None:
    with pytest.raises(NotFound, match="no completed runs"):
        verify_checksums(ws)


@pytest.mark.parametrize(("path", "volatile"), [
    ("outputs/_launcher/exit.json", True), ("outputs/logs/train.log", True),
    ("outputs/model/model.keras", False), ("outputs/model/canonical.npz", False),
    ("outputs/logs/train/events.out.tfevents.1.host.1.v2", False),
    ("outputs/model/model.weights.h5", False), ("outputs/metrics.jsonl", False),
])
def test_volatile_files(path: str, volatile: bool) -> None:
    assert is_volatile(path) is volatile


@pytest.mark.parametrize(("key", "category"), [
    ("seed", "seed"), ("determinism.env.PYTHONHASHSEED", "seed"),
    ("determinism.env.OMP_NUM_THREADS", "software"),
    ("recipe.tree_digest", "code"), ("image.git_commit", "info"), ("params.lr", "params"),
    ("recipe.args", "params"), ("recipe.code_source", "info"), ("recipe.git.dirty", "info"),
    ("image.runtime_digest", "software"),
    ("host.facts.gpu_model", "hardware"), ("runtime.cudnn_build", "hardware"),
    ("runtime.tensorflow", "software"),
    ("image.lock_sha256", "software"), ("host.name", "info"), ("host.address", "info"),
    ("runtime.seed", "seed"), ("runtime.env.LAUNCHER_SEED", "seed"),
    ("runtime.framework.version", "software"),
    ("host.facts.nvidia.gpus", "hardware"), ("host.facts.docker.server_version", "info"),
    ("host.facts.kernel", "software"), ("runtime.platform.machine", "hardware"),
    ("host.facts.systemd", "info"),
])
def test_categories(key: str, category: str) -> None:
    assert categorize(key) == category


def test_unrecorded_batches_and_second_fit(ws: Workspace) -> None:
    _, b = pair(ws.runs, unseeded_dropout=True, dropout_entropy=3)
    a = ws.runs / "20261122T100000-mnist_convnet-aaaaaa"
    for d in (a, b):
        lines = [
            {"epoch": 0, "digest": None, "batches": [], "unrecorded": "a tf.data pipeline"},
        ]
        (d / "outputs/fingerprints/batches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        # A second fit() restarts its epochs at 0; only the second one differs.
        rows = [{"epoch": 0, "loss": 1.0}, {"epoch": 0, "fit": 1, "loss": 0.5 if d == a else 0.25}]
        (d / "outputs/metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        refresh_manifest(d)
    report = verify_checksums(ws)
    exp = report.differing[0].explanation
    assert exp["batches"]["same"] is None and exp["batches"]["unrecorded"] == ["a tf.data pipeline"]
    assert exp["metrics"]["first_divergence"]["fit"] == 1
    assert exp["metrics"]["first_divergence"]["metrics"]["loss"] == {"reference": 0.5, "run": 0.25,
                                                                     "abs_diff": 0.25}
    assert report.checks()["batches"]["all_same"] is None


def test_incomplete_runs_of_the_group_are_left_out_and_named(ws: Workspace) -> None:
    pair(ws.runs)
    c = write_run(ws.runs, FakeRun(run_id="20261122T101000-mnist_convnet-cccccc", replicate=2,
                                   started_at="2026-11-22T10:10:00Z"))
    (c / "manifest.json").unlink()  # still running: launch.json only
    report = verify_checksums(ws)
    assert report.identical and len(report.runs) == 2
    assert [s["run_id"] for s in report.skipped] == [c.name]
    assert "not complete" in report.skipped[0]["reason"]
    assert report.to_dict()["skipped"] == report.skipped


def test_no_seed_says_so(ws: Workspace) -> None:
    a, b = pair(ws.runs, unseeded_dropout=True, dropout_entropy=9)
    edit_manifest(a, seed=None)
    edit_manifest(b, seed=None)
    (run,) = verify_checksums(ws).differing
    cls = run.explanation["classification"]
    assert cls["kind"] == CLASS_NONDETERMINISM and "no fixed seed" in cls["line"]
