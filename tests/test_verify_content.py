"""verify checksums by content: volatile bytes are not differences, a verdict never contradicts
itself, declared volatile outputs are listed only, and one run is checked against itself."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from runfactory import FakeRun, flip_bit, make_workspace, pair, refresh_manifest, write_run
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import Corrupt, ExitCode
from launcher.verify.differences import CLASS_OUTPUTS, IDENTICAL_CONTENT
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")


def _history(saved_at: str, loss: float = 0.25) -> bytes:
    return json.dumps({"loss": [0.5, loss], "saved_at": saved_at}).encode()


def _event_file(wall: float) -> bytes:
    event = b"\x09" + struct.pack("<d", wall) + b"\x10\x01"  # wall_time, step 1
    return struct.pack("<Q", len(event)) + b"\0" * 4 + event + b"\0" * 4


def test_same_content_other_bytes_is_identical_exit_0(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d, when in ((a, "10:00"), (b, "10:05")):
        (d / "outputs/history.json").write_bytes(_history(when))
        tb = d / "outputs/logs/train"
        tb.mkdir(parents=True)
        (tb / f"events.out.tfevents.{int(when[-2:])}.host.{len(when)}.v2").write_bytes(_event_file(float(when[-2:])))
        refresh_manifest(d)
    report = verify_checksums(ws)
    assert report.identical and report.exit_code == ExitCode.OK
    rows = {r.path: r for r in report.artifacts}
    assert rows["outputs/history.json"].cells[b.name]["status"] == IDENTICAL_CONTENT
    events = next(r for r in report.artifacts if "tfevents" in r.path)
    assert events.cells[b.name]["status"] == IDENTICAL_CONTENT and "path" in events.cells[b.name]  # paired by folder
    line = report.summary_line()
    assert line.startswith("identical in content") and "history.json (field saved_at)" in line
    assert "event wall times" in line
    assert report.to_dict()["runs"][1]["identical_in_content"] == ["outputs/history.json", events.path]


def test_training_identical_but_an_output_differs_is_not_nondeterminism(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d, content in ((a, b"profile one"), (b, b"profile two")):
        (d / "outputs/profile.dat").write_bytes(content)
        (d / "outputs/history.json").write_bytes(_history("10:00", 0.25 if d == a else 0.3))
        refresh_manifest(d)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE  # a metrics file differs: not an output alone
    (run,) = report.differing
    cls = run.explanation["classification"]
    assert cls["kind"] == CLASS_OUTPUTS and "nondeterminism" not in cls["line"]
    assert "history.json (metrics; json: loss[1]: 0.25 -> 0.3)" in cls["line"]
    assert "profile.dat (other; bytes" in cls["line"]
    assert "(outputs): content differs in history.json, profile.dat" in report.summary_line()


def test_declared_volatile_and_ignored_outputs_are_listed_not_compared(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d in (a, b):
        (d / "outputs/plots").mkdir()
        (d / "outputs/plots/curve.png").write_bytes(d.name.encode())
        (d / "outputs/profile.bin").write_bytes(d.name.encode())
        refresh_manifest(d)
    recipe = ws.root / "recipes/mnist_convnet"
    recipe.mkdir(parents=True)
    (recipe / "train.py").write_text("")
    (recipe / "recipe.toml").write_text('name = "mnist_convnet"\nentry = "train.py"\nvolatile = ["plots/*.png"]\n')
    assert verify_checksums(ws).exit_code == ExitCode.OUTPUT_DIFFERS  # profile.bin still compared
    report = verify_checksums(ws, ignore=["*.bin"])
    assert report.exit_code == ExitCode.OK
    rows = {r.path: r for r in report.artifacts}
    assert rows["outputs/plots/curve.png"].ignored_by == "recipe" and not rows["outputs/plots/curve.png"].checked
    assert rows["outputs/profile.bin"].ignored_by == "--ignore"
    assert rows["outputs/logs/train.log"].ignored_by == "launcher"
    line = report.summary_line()  # the log, 2 declared, 1 ignored: named, at most 3
    assert "4 files left out of the comparison differ in bytes (" in line and " and 1 more)" in line
    assert "logs/train.log" in line and "volatile" not in line
    code = CliRunner().invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums",
                                    "--ignore", "profile.bin"]).exit_code
    assert code == ExitCode.OK


def test_one_bit_changed_with_its_manifest_hash_updated_is_inconsistent(ws: Workspace) -> None:
    _, b = pair(ws.runs)
    flip_bit(b, "dense", 1, element=3, bit=0)  # the manifest is rewritten to match: integrity passes
    with pytest.raises(Corrupt, match=r"inconsistent: model/canonical.npz layer dense array 1 .* weights/layers.json"):
        verify_checksums(ws)
    with pytest.raises(Corrupt, match="inconsistent"):
        verify_checksums(ws, [b.name])  # checked alone too
    r = CliRunner().invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums", b.name])
    assert r.exit_code == ExitCode.CORRUPT == 13 and "inconsistent" in r.stderr


def test_canonical_and_layers_both_altered_disagree_with_the_native_save(ws: Workspace) -> None:
    pytest.importorskip("h5py")
    import h5py

    _, b = pair(ws.runs)
    from launcher.verify.modeldiff import load_canonical

    with h5py.File(b / "outputs/model/model.weights.h5", "w") as f:  # the native save, as training wrote it
        for wa in load_canonical(b / "outputs/model/canonical.npz"):
            f.create_dataset(f"layers/{wa.layer}/vars/{wa.array}", data=wa.value)
    refresh_manifest(b)
    alone = verify_checksums(ws, [b.name])
    assert alone.consistency[b.name]["native"]["ok"] is True
    assert ("canonical weights match weights/layers.json and its native save model/model.weights.h5"
            in alone.summary_line())  # one sentence, not a dangling "and its native save ..."
    flip_bit(b, "dense_1", 0, element=1, bit=5, retrain=True)  # canonical and layers.json agree with each other
    with pytest.raises(Corrupt, match=r"layer dense_1 array 0 is not in its native save model/model\.weights\.h5"):
        verify_checksums(ws, [b.name])


def test_one_run_alone_is_consistent(ws: Workspace) -> None:
    a = write_run(ws.runs, FakeRun(run_id="20261122T100000-mnist_convnet-aaaaaa"))
    report = verify_checksums(ws)
    assert report.mode == "alone" and report.exit_code == ExitCode.OK
    assert report.to_dict()["verdict"] == "consistent"
    assert report.selection == "the only run of mnist_convnet"
    assert report.consistency[a.name]["layers"] == {"arrays": 6, "ok": True}
    assert "checked alone" in report.summary_line()
    assert "canonical weights match weights/layers.json" in report.summary_line()
    r = CliRunner().invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums", a.name])
    assert r.exit_code == 0 and "consistent" in r.stdout


def test_two_separate_runs_bare_verify_compares_latest_with_previous(ws: Workspace) -> None:
    first = write_run(ws.runs, FakeRun(run_id="20261122T100000-mnist_convnet-aaaaaa", group="run-1"))
    write_run(ws.runs, FakeRun(run_id="20261122T090000-other-cccccc", group="run-0", recipe="other",
                               started_at="2026-11-22T09:00:00Z"))
    second = write_run(ws.runs, FakeRun(run_id="20261122T100500-mnist_convnet-bbbbbb", group="run-2",
                                        started_at="2026-11-22T10:05:00Z"))
    report = verify_checksums(ws)
    assert report.mode == "compare" and report.identical
    assert [r.manifest.run_id for r in report.runs] == [first.name, second.name]
    assert report.selection == (f"the latest run {second.name} against the previous run of mnist_convnet, "
                                f"{first.name}")
    assert report.summary_line().startswith(f"the latest run {second.name} against the previous run")
    r = CliRunner().invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums"])
    assert r.exit_code == 0 and "previous run of mnist_convnet" in r.stdout
