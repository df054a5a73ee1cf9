"""`launcher verify checksums` in-process through the real app, plus one subprocess smoke test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runfactory import (
    FakeRun,
    edit_manifest,
    flip_bit,
    keep_only,
    make_workspace,
    pair,
    refresh_manifest,
    write_run,
)
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode

runner = CliRunner()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws")


def _invoke(root: Path, *args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, ["--workspace", str(root), "--quiet", *args])
    return r.exit_code, r.stdout, r.stderr


def test_identical_exit_0_and_table(root: Path) -> None:
    pair(root / "runs")
    code, out, _ = _invoke(root, "verify", "checksums")
    assert code == ExitCode.OK
    assert "outputs/model/canonical.npz" in out and "identical" in out
    assert "Models all the same: True" in out and "Batches all the same: True" in out


def test_identical_runs_prove_only_what_they_recorded(root: Path) -> None:
    """Runs that recorded no batch order or initial weights (a plain script) are byte-identical, but
    verify says those checks are unknown rather than passed."""
    for run_dir in pair(root / "runs"):
        (run_dir / "outputs" / "fingerprints" / "batches.jsonl").unlink()
        (run_dir / "outputs" / "fingerprints" / "initial_weights.json").unlink()
        refresh_manifest(run_dir)
    code, out, _ = _invoke(root, "verify", "checksums")
    assert code == ExitCode.OK and "identical" in out
    assert "Models all the same: True" in out and "Metrics all the same: True" in out
    assert "Batches all the same: unknown (not recorded)" in out
    assert "Initial weights all the same: unknown (not recorded)" in out


def test_flipped_bit_exit_3_names_layer(root: Path) -> None:
    _, b = pair(root / "runs")
    flip_bit(b, "conv2d", 0, element=5, bit=3, retrain=True)
    code, out, _ = _invoke(root, "verify", "checksums")
    assert code == ExitCode.NOT_REPRODUCIBLE == 3
    assert "Models all the same: False" in out
    assert "first differing: layer conv2d array 0: 1 of 36 elements" in out
    assert "nondeterminism in training" in out


def test_json_schema(root: Path) -> None:
    a, b = pair(root / "runs", seed=43)
    code, out, _ = _invoke(root, "--json", "verify", "checksums", a.name, b.name)
    assert code == ExitCode.NOT_REPRODUCIBLE
    env = json.loads(out)
    assert env["schema"] == "launcher.result/v1" and env["command"] == "verify checksums"
    assert env["exit_code"] == 3 and env["ok"] is False
    data = env["data"]
    assert data["schema"] == "launcher.verify.verdicts/v1"
    assert set(data) == {"schema", "verdict", "mode", "selection", "reference", "recipe", "summary", "integrity",
                         "consistency", "checks", "runs", "artifacts", "explanations", "not_compared", "skipped",
                         "code_name", "across_code", "inconclusive", "evidence", "bytes_only", "ignored"}
    assert set(data["evidence"]) == {"kinds", "training", "named", "determinism"}
    assert data["verdict"] == "differs" and data["reference"] == a.name
    assert set(data["checks"]) == {"models", "initial_weights", "data", "batches", "metrics"}
    run = data["runs"][1]
    assert set(run) == {"run_id", "group", "replicate", "seed", "recipe", "code_name", "run_status", "status",
                        "classification", "line", "first_difference", "identical_in_content", "code"}
    assert run["classification"] == "input-change" and "seed" in run["line"]
    exp = data["explanations"][b.name]
    assert set(exp) == {"classification", "model", "initial_weights", "data", "batches", "steps", "metrics",
                        "environment", "files", "impact"}
    assert exp["impact"] is None  # these runs recorded no probes
    for row in data["artifacts"]:
        assert set(row) == {"path", "kind", "checked", "ignored_by", "reference_sha256", "runs"}
        assert set(row["runs"]) == {a.name, b.name}


@pytest.mark.parametrize(("setup", "code", "words"), [
    ("no-manifest", ExitCode.NOT_FOUND, "not complete"),
    ("newer-schema", ExitCode.SCHEMA_TOO_NEW, "schema version 2"),
    ("two-recipes", ExitCode.INCOMPATIBLE, "different recipes"),
    ("corrupt", ExitCode.CORRUPT, "does not match its manifest"),
    ("unknown-run", ExitCode.NOT_FOUND, "no run"),
])
def test_bad_input_one_line_error(root: Path, setup: str, code: ExitCode, words: str) -> None:
    a, b = pair(root / "runs")
    names = [a.name, b.name]
    if setup == "no-manifest":
        (b / "manifest.json").unlink()
    elif setup == "newer-schema":
        edit_manifest(b, schema_version=2)
    elif setup == "two-recipes":
        c = write_run(root / "runs", FakeRun(run_id="20261122T110000-other-cccccc", recipe="other"))
        names = [a.name, c.name]
    elif setup == "corrupt":
        flip_bit(b, "dense", 0, update_manifest=False)
    else:
        names = [a.name, "nope"]
    exit_code, out, err = _invoke(root, "verify", "checksums", *names)
    assert exit_code == code
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0]
    assert "Traceback" not in out + err


def test_subprocess_smoke(root: Path) -> None:
    pair(root / "runs")
    p = subprocess.run([sys.executable, "-m", "launcher", "--workspace", str(root), "--json", "verify",
                        "checksums"], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["data"]["verdict"] == "identical"


def _keys(obj: object, out: set[str]) -> set[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            # Dynamic keys: run ids, metric names and check names are data, not schema.
            if not (k.startswith("2026") or k in ("loss", "accuracy")):
                out.add(k)
            _keys(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _keys(v, out)
    return out


def test_every_json_field_is_documented(root: Path) -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "verify-json.md").read_text()
    assert "launcher.verify.verdicts/v1" in doc
    seen: set[str] = set()
    for kw in ({"seed": 43}, {"unseeded_dropout": True, "dropout_entropy": 1}, {"data_version": 1}, {"profile": "off"},
               {}):
        for d in (root / "runs").iterdir():
            for p in sorted(d.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            d.rmdir()
        runs = pair(root / "runs", **kw)
        extra: list[str] = []
        if not kw:  # saved nothing of training, a file identical in content only, one unreadable, one named
            for d in runs:
                (d / "outputs/history.json").write_text(json.dumps({"loss": 1.0, "time": d.name}))
                (d / "outputs/broken.keras").write_bytes(d.name.encode())
                (d / "outputs/args.json").write_text("{}")
                keep_only(d, "history.json", "broken.keras", "args.json")
            extra = ["--evidence", "args.json", "--ignore", "history.json"]
            _, out, _ = _invoke(root, "--json", "verify", "checksums")
            _keys(json.loads(out), seen)
            _, out, _ = _invoke(root, "--json", "verify", "checksums", runs[0].name)
            _keys(json.loads(out), seen)
        _, out, _ = _invoke(root, "--json", "verify", "checksums", *extra)
        _keys(json.loads(out), seen)
    undocumented = sorted(k for k in seen if f"`{k}`" not in doc)
    assert undocumented == [], undocumented


def test_a_failed_run_is_left_out_of_its_group_and_flagged_when_named(root: Path) -> None:
    a, b = pair(root / "runs")
    edit_manifest(b, status="failed", exit_code=1)
    code, out, _ = _invoke(root, "verify", "checksums")  # the latest group: a failure is not a result
    assert code == 0
    assert f"left out {b.name}: failed (exit 1); not a result, so not compared" in out
    code, out, _ = _invoke(root, "verify", "checksums", a.name, b.name)  # named: compared, and flagged
    assert f"run {b.name} failed (its recipe exited non-zero)" in out
    edit_manifest(a, status="cancelled", exit_code=143)
    code, _, err = _invoke(root, "verify", "checksums")
    assert code == ExitCode.RUN_FAILED
    assert "ended cancelled or failed (2 runs): nothing to compare" in err


def test_verify_models_command(root: Path) -> None:
    a, b = pair(root / "runs")
    ma, mb = a / "outputs/model/canonical.npz", b / "outputs/model/canonical.npz"
    code, out, _ = _invoke(root, "verify", "models", str(ma), str(mb))
    assert code == 0 and "identical: every array is bit-identical" in out
    flip_bit(b, "dense_1", 1, element=2, bit=30, retrain=True)
    code, out, _ = _invoke(root, "verify", "models", str(ma), str(mb))
    assert code == 3
    assert "first differing: layer dense_1 array 1: 1 of 10 elements" in out
    code, out, _ = _invoke(root, "--json", "verify", "models", str(ma), str(mb))
    assert json.loads(out)["data"]["first_difference"] == {"layer": "dense_1", "array": "1"}
    code, _, err = _invoke(root, "verify", "models", str(ma), str(root / "nope.npz"))
    assert code == ExitCode.NOT_FOUND and "no model file" in err


def test_table_names_runs_of_several_groups_by_id_and_unchecked_rows_by_bytes(root: Path) -> None:
    """Runs of two groups are each replicate 0 of its own: the table names them by id, not "#0" twice. A file
    left out of the comparison is shown as what is known of it: the same bytes, or ignored."""
    a = write_run(root / "runs", FakeRun(run_id="20261122T100000-mnist_convnet-aaaaaa", group="g1", replicate=0))
    b = write_run(root / "runs", FakeRun(run_id="20261122T100500-mnist_convnet-bbbbbb", group="g2", replicate=0,
                                         started_at="2026-11-22T10:05:00Z"))
    code, out, _ = _invoke(root, "verify", "checksums", a.name, b.name)
    assert code == ExitCode.OK, out
    assert "run aaaaaa" in out and "run bbbbbb" in out and "#0" not in out
    row = {name: next(line for line in out.splitlines() if name in line)
           for name in ("outputs/logs/train.log", "outputs/_launcher/runtime.json", "outputs/metrics.jsonl")}
    assert "ignored" in row["outputs/logs/train.log"]  # differs (times), left out
    assert "same bytes" in row["outputs/_launcher/runtime.json"] and "identical" not in row[
        "outputs/_launcher/runtime.json"]
    assert "identical" in row["outputs/metrics.jsonl"]  # compared
    assert "files left out of the comparison differ in bytes (_launcher/exit.json, logs/train.log)" in out
    c = write_run(root / "runs", FakeRun(run_id="20261122T101000-mnist_convnet-cccccc", group="g2", replicate=1,
                                         started_at="2026-11-22T10:10:00Z"))
    code, out, _ = _invoke(root, "verify", "checksums", b.name, c.name)  # one group's replicates: numbered
    assert code == ExitCode.OK and "run #0 bbbbbb" in out and "run #1 cccccc" in out
