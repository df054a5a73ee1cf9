"""The run commands in-process: `ps` prints the unique start of each run id and commands take it back,
--env mistakes are one-line usage errors before anything runs, a failed replicate ends `run` with exit 6
naming it and showing its log's last lines, `experiment` passes `-- ARGS`, and recipes' declared
ranges hold on the host."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fakeplacement import FakePlacement, Script, make_project, make_workspace
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.hosts.hostspec import HostSpec
from launcher.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def cli(ws: Workspace, *args: str, **env: str) -> Any:
    return runner.invoke(app, ["--workspace", str(ws.root), *args], env=env or None)


def one_line_error(res: Any) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    return str(lines[0])


def _launched(ws: Workspace, run_id: str, *, pulled_log: str | None = None) -> None:
    d = ws.runs / run_id
    (d / "outputs" / "logs").mkdir(parents=True)
    launch = {"run_id": run_id, "group": "g", "host": {"name": "local", "kind": "local"},
              "host_options": HostSpec().to_record(), "placement": {"kind": "direct"},
              "recipe": {"name": "train", "identity": "myproj/train.py"}, "launched_at": "2026-11-24T10:00:00Z"}
    (d / "launch.json").write_text(json.dumps(launch))
    if pulled_log is not None:
        (d / "outputs" / "logs" / "train.log").write_text(pulled_log)


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "cache"))  # the CLI's workspace finds its cache from it
    return make_workspace(tmp_path)


def test_ps_prints_unique_starts_that_logs_takes_back(ws: Workspace) -> None:
    for rid in ("20261124T101500-myproj_train.py-1a2b3c", "20261124T101500-myproj_train.py-1a9f00"):
        _launched(ws, rid, pulled_log=f"log of {rid[-6:]}\n")
    res = cli(ws, "--json", "ps")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["data"]["runs"]
    assert [r["short_id"] for r in rows] == ["20261124T101500-myproj_train.py-1a2",
                                             "20261124T101500-myproj_train.py-1a9"]
    assert rows[0]["run_id"] == "20261124T101500-myproj_train.py-1a2b3c"
    assert rows[0]["code_name"] == "myproj/train.py"
    text = cli(ws, "ps", COLUMNS="60").stdout  # a narrow terminal squeezes the other columns, never the id
    assert all(r["short_id"] + " " in text for r in rows)
    for ref in (rows[1]["short_id"], "1a9f", "1a9f00"):
        res = cli(ws, "logs", ref)
        assert res.exit_code == 0 and "log of 1a9f00" in res.stdout, res.output
    res = cli(ws, "logs", "1a")
    assert res.exit_code == ExitCode.USAGE and "1a2b3c" in one_line_error(res)


@pytest.mark.parametrize(("args", "says"), [
    (["--env", "PYTHONHASHSEED=1"], "determinism profile"),
    (["--secret-env", "LAUNCHER_SEED=4"], "LAUNCHER_SEED"),
    (["--env", "SURELY_UNSET_HERE_123"], "is not set here"),
])
def test_env_mistakes_stop_run_and_experiment_with_exit_2(ws: Workspace, tmp_path: Path, args: list[str],
                                                          says: str) -> None:
    script = str(make_project(tmp_path))
    for command in (["run", script], ["experiment", script]):
        res = cli(ws, *command, *args)
        assert res.exit_code == ExitCode.USAGE
        line = one_line_error(res)
        assert says in line and "fix:" in line
    assert not any(ws.runs.iterdir())


@pytest.fixture
def fake_target(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> FakePlacement:
    from launcher.cli import run_cmds
    from launcher.hosts import provision
    from launcher.images import build

    target = FakePlacement(ws, Script(exit_codes={0: 7}))
    monkeypatch.setattr(run_cmds, "target", lambda *a: target)
    monkeypatch.setattr(build, "ensure_current", lambda *a, **kw: None)
    monkeypatch.setattr(provision, "facts_for_run", lambda *a: {})
    return target


def test_a_failed_replicate_ends_run_with_exit_6_naming_it_and_its_log(ws: Workspace, tmp_path: Path,
                                                                       fake_target: FakePlacement) -> None:
    res = cli(ws, "run", str(make_project(tmp_path)), "--runs", "3", "--env", "MODE=fast")
    assert res.exit_code == ExitCode.RUN_FAILED, res.output
    assert len(fake_target.jobs) == 1
    run_id = fake_target.jobs[0].run_id
    out = res.stdout
    assert f"replicate #0 (run {run_id}) failed with exit 7; 2 later replicates not started" in out
    assert "  | ModuleNotFoundError: No module named 'missing0'" in out and "  | replicate 0 line 14" in out
    assert "replicate 0 line 4\n" not in out.split("last lines of the log")[1]  # only the last 10 lines
    fake_target.script.exit_codes = {2: 7}  # the fake's third run: the second replicate of the next command
    res = cli(ws, "--json", "run", str(make_project(tmp_path)), "--runs", "2")
    data = json.loads(res.stdout)["data"]
    assert res.exit_code == ExitCode.RUN_FAILED and data["failure"]["exit_code"] == 7
    assert data["failure"]["replicate"] == 1 and data["failure"]["not_started"] == 0
    assert [r["status"] for r in data["runs"]] == ["succeeded", "failed"]


def test_experiment_passes_script_arguments_after_a_double_dash(ws: Workspace, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.workflows import experiment as experiment_mod

    seen: dict[str, Any] = {}

    def fake(ws_: Any, recipe: str, runs: int, seeds: str, hosts: Any, **kw: Any) -> Any:
        seen.update(kw, recipe=recipe)
        return experiment_mod.ExperimentResult(recipe, {})

    monkeypatch.setattr(experiment_mod, "experiment", fake)
    script = str(make_project(tmp_path))
    res = cli(ws, "experiment", script, "--runs", "2", "--env", "MODE=x", "--", "--lr", "0.1", "--epochs", "2")
    assert res.exit_code == 0, res.output
    assert seen["args"] == ["--lr", "0.1", "--epochs", "2"] and dict(seen["user_env"].plain) == {"MODE": "x"}


@pytest.mark.parametrize(("recipe", "param", "lowest"), [
    ("catsdogs_convnet", "pdim", 78),  # four conv+pool stages and a last conv (all "valid"): 78 -> 1x1
    ("mini_xception", "pdim", 5),  # one 5x5 "valid" conv, then "same" padding throughout
])
def test_a_recipes_declared_minimum_is_refused_below_on_the_host(ws: Workspace, recipe: str, param: str,
                                                                 lowest: int) -> None:
    shutil.copytree(REPO / "recipes" / recipe, ws.recipes / recipe)
    res = cli(ws, "run", recipe, "--param", f"{param}={lowest - 1}", "--no-build")
    assert res.exit_code == ExitCode.USAGE
    line = one_line_error(res)
    assert f"{param}" in line and f">= {lowest}" in line
    assert not any(ws.runs.iterdir())
