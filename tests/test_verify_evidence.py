"""Verdicts that fail closed: every verdict says what it compared by kind, runs that agree on nothing
training produced (or ran without determinism) are inconclusive (exit 37), a file launcher cannot
read is "not compared" and never a difference, and files left out are never "differs"."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from runfactory import FakeRun, edit_manifest, keep_only, keras_bytes, make_workspace, pair, refresh_manifest, write_run
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, UsageError
from launcher.records.manifest import load_manifest
from launcher.verify.differences import IDENTICAL_CONTENT, IGNORED, UNREADABLE
from launcher.verify.evidence import (
    KIND_CHECKPOINT,
    KIND_FIGURE,
    KIND_LOGS,
    KIND_METRICS,
    KIND_MODEL,
    KIND_NAMED,
    KIND_OTHER,
    KIND_PREDICTIONS,
    KIND_RECORDS,
    KIND_STEPS,
    classify,
    determinism_of,
    kind_of,
)
from launcher.verify.verdicts import INCONCLUSIVE, verify_checksums
from launcher.workspace import Workspace

runner = CliRunner()


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")


def _cli(ws: Workspace, *args: str) -> tuple[int, dict, str]:
    r = runner.invoke(app, ["--workspace", str(ws.root), "--quiet", "--json", "verify", "checksums", *args])
    return r.exit_code, json.loads(r.stdout) if r.stdout.strip() else {}, r.stderr


LAYERS = [("dense", [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)])]


@pytest.mark.parametrize(("path", "kind"), [
    ("outputs/model/canonical.npz", KIND_MODEL), ("outputs/weights/layers.json", KIND_MODEL),
    ("outputs/model.keras", KIND_MODEL), ("outputs/mnist_cnn.pt", KIND_MODEL), ("outputs/w.safetensors", KIND_MODEL),
    ("outputs/final.h5", KIND_MODEL), ("outputs/arrays.npy", KIND_MODEL), ("outputs/model/weights.bin", KIND_MODEL),
    ("outputs/export/saved_model.pb", KIND_MODEL), ("outputs/export/variables/variables.index", KIND_MODEL),
    ("outputs/checkpoints/epoch_3.pt", KIND_CHECKPOINT), ("outputs/ckpt/weights.h5", KIND_CHECKPOINT),
    ("outputs/training_1/cp.ckpt.index", KIND_CHECKPOINT),
    ("outputs/training_1/cp.ckpt.data-00000-of-00001", KIND_CHECKPOINT),
    ("outputs/training_1/checkpoint", KIND_CHECKPOINT), ("outputs/best_ckpt.pt", KIND_CHECKPOINT),
    ("outputs/probes/outputs.npz", KIND_PREDICTIONS), ("outputs/predictions.csv", KIND_PREDICTIONS),
    ("outputs/test_preds.npy", KIND_PREDICTIONS),
    ("outputs/metrics.jsonl", KIND_METRICS), ("outputs/history.json", KIND_METRICS),
    ("outputs/logs/fit/20261124-101010/train/events.out.tfevents.1.host.1.v2", KIND_METRICS),
    ("outputs/training_log.csv", KIND_METRICS), ("outputs/results.json", KIND_METRICS),
    ("outputs/logs/train.log", KIND_LOGS), ("outputs/output.txt", KIND_LOGS), ("outputs/logs/notes.md", KIND_LOGS),
    ("outputs/_launcher/runtime.json", KIND_RECORDS), ("outputs/fingerprints/batches.jsonl", KIND_RECORDS),
    ("outputs/args.json", KIND_OTHER), ("outputs/config.yaml", KIND_OTHER),
    ("outputs/plot.png", KIND_FIGURE), ("outputs/predict3.pdf", KIND_FIGURE), ("outputs/model/loss.svg", KIND_FIGURE),
    ("outputs/fingerprints/steps.jsonl", KIND_STEPS),
])
def test_kind_of_each_artifact(path: str, kind: str) -> None:
    assert classify([path, "outputs/export/saved_model.pb"])[path] == kind


def test_named_evidence_wins_over_every_other_kind() -> None:
    assert kind_of("outputs/args.json", named=["args.json"]) == KIND_NAMED
    assert kind_of("outputs/logs/out.txt", named=["logs/*"]) == KIND_NAMED
    assert kind_of("outputs/args.json", named=["other.json"]) == KIND_OTHER


def test_determinism_from_the_runtime_record_and_the_fallback_for_older_runs(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    assert determinism_of(load_manifest(a)).in_force  # older run: a seeding profile and a framework dict
    rt = json.loads((b / "outputs/_launcher/runtime.json").read_text())
    edit_manifest(b, runtime={**rt, "framework": None})
    old = determinism_of(load_manifest(b))
    assert not old.in_force and old.cause == "no-framework" and "no known framework was imported" in old.reason
    edit_manifest(b, runtime=rt, determinism={"profile": "off", "threads": 2, "env": {}})
    edit_manifest(b, runtime={**rt, "profile": "off"})
    off = determinism_of(load_manifest(b))
    assert not off.in_force and off.cause == "profile-off" and off.reason.startswith("profile off")
    record = {"in_force": False, "reason": "seeded only (profile seeded): op determinism off"}
    edit_manifest(b, runtime={**rt, "frameworks": ["tensorflow"], "determinism": record})
    new = determinism_of(load_manifest(b))
    assert (new.in_force, new.reason, new.cause) == (False, record["reason"], "not-applied")
    edit_manifest(b, runtime={**rt, "framework": None, "frameworks": [],
                              "determinism": {"in_force": True, "reason": "op determinism on for jax"}})
    assert determinism_of(load_manifest(b)).in_force  # the runtime's record is what counts


def test_runs_that_saved_nothing_of_training_are_inconclusive(ws: Workspace) -> None:
    """The PyTorch MNIST example's shape: no --save-model, so only the console and launcher's records."""
    a, b = pair(ws.runs)
    for d in (a, b):
        (d / "outputs/args.json").write_text('{"lr": 1.0}')
        keep_only(d, "args.json")
    report = verify_checksums(ws)
    assert report.identical and report.exit_code == ExitCode.INCONCLUSIVE == 37
    line = report.summary_line()
    assert line.startswith("inconclusive: no difference found") and "bit-identical" not in line
    assert "nothing that training produced was compared" in line and "--save-model" in line
    assert "torch.save(model.state_dict()" in line and "--evidence GLOB" in line
    code, env, _ = _cli(ws)
    data = env["data"]
    assert code == 37 and env["ok"] is False and data["verdict"] == INCONCLUSIVE
    assert [x["reason"] for x in data["inconclusive"]] == ["no-evidence"]
    assert data["evidence"]["training"] is False
    assert data["evidence"]["kinds"]["other"] == {"files": 1, "compared": 1, "identical": 1, "differs": 0,
                                                  "unreadable": 0, "ignored": 0, "outcome": "identical",
                                                  "training": False}
    assert set(data["evidence"]["kinds"]) == {"logs", "records", "other"}
    # The file that holds the result, named: now it is the evidence, and the verdict a proof.
    code, env, _ = _cli(ws, "--evidence", "args.json")
    assert code == 0 and env["data"]["verdict"] == "identical"
    assert env["data"]["evidence"]["kinds"]["named evidence"]["compared"] == 1
    assert env["data"]["evidence"]["named"] == ["args.json"]
    text = runner.invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums"])
    assert text.exit_code == 37 and "Compared, by kind:" in text.stdout and "other: 1 file, 1 compared" in text.stdout


def test_an_evidence_glob_that_matches_nothing_is_a_usage_error(ws: Workspace) -> None:
    pair(ws.runs)
    with pytest.raises(UsageError, match=r"--evidence 'model\.pt' matches no file"):
        verify_checksums(ws, evidence=["model.pt"])
    code, _, err = _cli(ws, "--evidence", "model.pt")
    assert code == ExitCode.USAGE and "'model.pt'" in err


def test_a_difference_is_still_differs_without_evidence(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d, lr in ((a, "1.0"), (b, "0.5")):
        (d / "outputs/args.json").write_text(json.dumps({"lr": lr}))
        keep_only(d, "args.json")
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE and report.verdict == "differs"
    assert report.inconclusive == []


@pytest.mark.parametrize(("profile", "framework", "words"), [
    ("off", dict, "profile off: nothing was seeded or made deterministic"),
    ("deterministic", None, "no known framework was imported"),
])
def test_identical_runs_without_determinism_are_inconclusive(ws: Workspace, profile: str, framework: object,
                                                              words: str) -> None:
    a, b = pair(ws.runs)
    for d in (a, b):
        m = json.loads((d / "manifest.json").read_text())
        rt = dict(m["runtime"], profile=profile)
        if framework is None:
            rt["framework"] = None
        edit_manifest(d, runtime=rt, determinism={**m["determinism"], "profile": profile})
    report = verify_checksums(ws)
    line = report.summary_line()
    assert report.exit_code == ExitCode.INCONCLUSIVE and report.verdict == INCONCLUSIVE
    assert line.startswith("inconclusive: identical outputs") and words in line and "bit-identical" not in line
    assert ("--determinism deterministic" in line) == (profile == "off")
    assert ("import" in line.split("fix:")[1]) == (framework is None)
    (reason,) = report.to_dict()["inconclusive"]
    assert reason["reason"] == "determinism" and reason["runs"] == [a.name, b.name]
    assert report.to_dict()["evidence"]["determinism"]["in_force"] is False


def test_one_run_without_determinism_is_named(ws: Workspace) -> None:
    _, b = pair(ws.runs)
    m = json.loads((b / "manifest.json").read_text())
    edit_manifest(b, runtime={**m["runtime"], "determinism": {"in_force": False, "reason": "profile off"}})
    (reason,) = verify_checksums(ws).inconclusive
    assert reason["runs"] == [b.name] and f"1 of 2 runs ({b.name})" in reason["line"]


def _keras_pair(ws: Workspace, *, only_keras: bool) -> tuple[Path, Path]:
    a, b = pair(ws.runs)
    for d, day in ((a, 1), (b, 2)):
        when = (2026, 11, day, 10, 0, 0)
        (d / "outputs/model.keras").write_bytes(keras_bytes(LAYERS, f"2026-11-0{day}@10:00:00", when))
        if only_keras:
            keep_only(d, "model.keras")
        else:
            refresh_manifest(d)
    return a, b


def test_keras_replicates_with_other_zip_dates_are_identical(ws: Workspace) -> None:
    _, b = _keras_pair(ws, only_keras=True)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.OK, report.summary_line()
    row = next(r for r in report.artifacts if r.path == "outputs/model.keras")
    assert row.kind == "model" and row.cells[b.name]["status"] == IDENTICAL_CONTENT


def test_a_file_launcher_cannot_read_is_not_compared_never_differs(ws: Workspace,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _, b = _keras_pair(ws, only_keras=False)
    monkeypatch.setitem(sys.modules, "h5py", None)  # an install without h5py: `import h5py` fails
    report = verify_checksums(ws)
    row = next(r for r in report.artifacts if r.path == "outputs/model.keras")
    cell = row.cells[b.name]
    assert cell["status"] == UNREADABLE and cell["content"]["fix"] == "pip install h5py"
    assert "needs the Python package h5py" in cell["content"]["unreadable"]
    # the canonical weights and the metrics were compared: the verdict holds, and names the file not compared
    assert report.exit_code == ExitCode.OK and report.verdict == "identical"
    kinds = report.evidence()["kinds"]
    assert kinds["model"]["unreadable"] == 1 and kinds["model"]["outcome"] == "partly compared"
    text = runner.invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums"])
    assert "not compared outputs/model.keras: cannot be read as keras" in " ".join(text.stdout.split())
    assert "fix: pip install h5py" in text.stdout


def test_an_unreadable_file_that_was_the_evidence_makes_it_inconclusive(ws: Workspace,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _keras_pair(ws, only_keras=True)
    monkeypatch.setitem(sys.modules, "h5py", None)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.INCONCLUSIVE
    (reason,) = report.inconclusive
    assert reason["reason"] == "no-evidence" and "could not be read: model.keras" in reason["line"]
    assert reason["fix"] == "pip install h5py"


def test_a_corrupt_model_file_in_both_runs_is_not_compared_with_the_fix(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d in (a, b):
        (d / "outputs/model.keras").write_bytes(d.name.encode())  # not a zip: cannot be read
        refresh_manifest(d)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.OK  # never "differs" because a file cannot be read
    cell = next(r for r in report.artifacts if r.path == "outputs/model.keras").cells[b.name]
    assert cell["status"] == UNREADABLE and "--ignore 'model.keras'" in cell["content"]["fix"]


def test_an_alone_run_says_when_it_holds_no_evidence(ws: Workspace) -> None:
    a = write_run(ws.runs, FakeRun(run_id="20261122T100000-mnist_convnet-aaaaaa"))
    assert "holds no evidence" not in verify_checksums(ws).summary_line()
    keep_only(a)
    report = verify_checksums(ws)
    assert report.mode == "alone" and report.exit_code == ExitCode.OK and report.verdict == "consistent"
    line = report.summary_line()
    assert "it holds no evidence of training: nothing that training produced was saved" in line
    assert report.to_dict()["evidence"]["training"] is False


def test_files_left_out_are_ignored_never_differs_and_explained_once(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d in (a, b):
        for name in ("one", "two", "three"):
            (d / f"outputs/profile_{name}.bin").write_bytes(d.name.encode())
        refresh_manifest(d)
    report = verify_checksums(ws, ignore=["profile_*.bin"])
    assert report.exit_code == ExitCode.OK
    rows = [r for r in report.artifacts if r.ignored_by == "--ignore"]
    assert len(rows) == 3 and {r.cells[b.name]["status"] for r in rows} == {IGNORED}
    groups = {g["by"]: g for g in report.to_dict()["ignored"]}
    assert set(groups) == {"launcher", "--ignore"} and len(groups["--ignore"]["differ"]) == 3
    text = runner.invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums",
                               "--ignore", "profile_*.bin"]).stdout
    assert " differs " not in text and text.count("left out with --ignore") == 1


def _event_file(wall: float) -> bytes:
    event = b"\x09" + struct.pack("<d", wall) + b"\x10\x01"  # wall_time, step 1
    return struct.pack("<Q", len(event)) + b"\0" * 4 + event + b"\0" * 4


def test_a_time_named_tensorboard_folder_pairs_and_compares_by_content(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d, stamp in ((a, "20261124-101010"), (b, "20261124-101533")):
        folder = d / "outputs/logs/fit" / stamp / "train"
        folder.mkdir(parents=True)
        (folder / f"events.out.tfevents.{stamp[-6:]}.host.1.v2").write_bytes(_event_file(float(stamp[-2:])))
        refresh_manifest(d)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.OK, report.summary_line()
    (row,) = [r for r in report.artifacts if "tfevents" in r.path]
    assert row.kind == "metrics" and row.cells[b.name]["status"] == IDENTICAL_CONTENT
    assert "20261124-101533" in row.cells[b.name]["path"]
    assert "event wall times" in report.summary_line()


def test_a_file_without_counterpart_names_the_ignore_glob(ws: Workspace) -> None:
    _, b = pair(ws.runs)
    notes = b / "outputs/logs/fit/20261124-101533/notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("only here")
    refresh_manifest(b)
    report = verify_checksums(ws)
    (run,) = report.differing
    assert "--ignore 'logs/fit/*/notes.txt'" in run.explanation["classification"]["line"]
    assert verify_checksums(ws, ignore=["logs/fit/*/notes.txt"]).exit_code == ExitCode.OK


def test_content_only_differences_are_explained_once_per_format(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d, when in ((a, "10:00"), (b, "10:05")):
        for name in ("history", "eval_results", "train_stats", "scores"):
            (d / f"outputs/{name}.json").write_text(json.dumps({"loss": 0.25, "saved_at": when}))
        refresh_manifest(d)
    report = verify_checksums(ws)
    line = report.summary_line()
    assert report.exit_code == ExitCode.OK and line.count("field saved_at") == 1
    assert "and 1 more (field saved_at)" in line
    (group,) = report.to_dict()["bytes_only"]
    assert group["format"] == "json" and len(group["paths"]) == 4 and group["volatile"] == ["field saved_at"]
