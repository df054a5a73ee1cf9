"""Runs belong to their code: verify compares runs of one code (Manifest.code_key) unless asked with
--across-code, then says the difference may come from the code; a bare verify compares the latest
run with the previous run of the same code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runfactory import FakeRun, edit_manifest, make_workspace, pair, write_run
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, Incompatible
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace

runner = CliRunner()


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")


def _identity(run_dir: Path, name: str) -> None:
    recipe = json.loads((run_dir / "manifest.json").read_text())["recipe"]
    edit_manifest(run_dir, recipe={**recipe, "identity": name})


def _run(ws: Workspace, n: int, code: int, group: str | None = None) -> Path:
    return write_run(ws.runs, FakeRun(run_id=f"20261122T10{n:02d}00-mnist_convnet-{n:06d}", group=group or f"run-{n}",
                                      code_version=code, started_at=f"2026-11-22T10:{n:02d}:00Z"))


def test_runs_of_different_code_are_refused_unless_across_code(ws: Workspace) -> None:
    a, b = pair(ws.runs, code_version=1)
    with pytest.raises(Incompatible, match=r"runs of different code cannot be compared: code digest \w{12} in") as err:
        verify_checksums(ws, [a.name, b.name])
    assert "--across-code" in (err.value.hint or "")
    report = verify_checksums(ws, [a.name, b.name], across_code=True)
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE
    line = report.summary_line()
    assert "the code differs" in line and line.endswith("the difference may come from the code")
    assert report.to_dict()["across_code"] is True
    r = runner.invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums", a.name, b.name])
    assert r.exit_code == ExitCode.INCOMPATIBLE == 16 and "--across-code" in r.stderr
    r = runner.invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums", a.name, b.name,
                            "--across-code"])
    assert r.exit_code == ExitCode.NOT_REPRODUCIBLE and "may come from the code" in r.stdout


def test_the_same_results_from_other_code_say_so(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    recipe = json.loads((b / "manifest.json").read_text())["recipe"]
    edit_manifest(b, recipe={**recipe, "lib_digest": "sha256:" + "9" * 64})
    with pytest.raises(Incompatible, match="recipe library digest"):
        verify_checksums(ws)
    report = verify_checksums(ws, across_code=True)
    assert report.exit_code == ExitCode.OK
    assert f"the recipe library differs (unknown in {a.name}, 999999999999 in {b.name})" in report.summary_line()
    assert "may come from the code" not in report.summary_line()


def test_two_scripts_with_one_name_are_different_code(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    _identity(a, "projA/train.py")
    _identity(b, "projB/train.py")
    with pytest.raises(Incompatible, match=r"different recipes or scripts .* ran 'projA/train.py', .* ran 'projB"):
        verify_checksums(ws, [a.name, b.name])
    report = verify_checksums(ws, [a.name, b.name], across_code=True)
    assert "the code name differs (projA/train.py in" in report.summary_line()
    assert report.to_dict()["code_name"] == "projA/train.py"
    assert report.to_dict()["runs"][1]["code_name"] == "projB/train.py"


def test_the_latest_run_is_compared_with_the_previous_run_of_its_code(ws: Workspace) -> None:
    first = _run(ws, 0, code=0)
    _run(ws, 1, code=1)  # an edited copy in between
    latest = _run(ws, 2, code=0)
    report = verify_checksums(ws)
    assert [r.manifest.run_id for r in report.runs] == [first.name, latest.name]
    assert report.selection == f"the latest run {latest.name} against the previous run of mnist_convnet, {first.name}"


def test_only_other_code_before_the_latest_run_checks_it_alone_and_says_how(ws: Workspace) -> None:
    edited = _run(ws, 0, code=1)
    latest = _run(ws, 1, code=0)
    report = verify_checksums(ws)
    assert report.mode == "alone" and report.exit_code == ExitCode.OK
    note = report.selection or ""
    assert note.startswith(f"the latest run {latest.name} checked alone: the previous run of mnist_convnet, "
                           f"{edited.name}, ran other code (code digest")
    assert f"`launcher verify checksums {edited.name} {latest.name} --across-code`" in note
    across = verify_checksums(ws, across_code=True)
    assert [r.manifest.run_id for r in across.runs] == [edited.name, latest.name]
    assert "(other code: code digest" in (across.selection or "")


def test_another_script_of_the_same_recipe_name_is_not_the_previous_run(ws: Workspace) -> None:
    other = _run(ws, 0, code=0)
    _identity(other, "myproj/mnist_convnet.py")
    latest = _run(ws, 1, code=0)
    report = verify_checksums(ws)
    assert report.mode == "alone" and report.selection == "the only run of mnist_convnet"
    assert latest.name in report.summary_line()
