"""On the local engine, with real containers of the tiny image: the user's --env and --secret-env reach a
plain script (the secret by an env file, never in a record), its runs are named by its project, and a
replicate that fails stops the rest of `run --runs N`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode

pytestmark = [pytest.mark.docker, pytest.mark.registry]

SCRIPT = """import json, os, sys
json.dump({k: os.environ.get(k) for k in ("MODE", "TOKEN", "FROM_HERE")}, open("env.json", "w"))
print("seen", sorted(k for k in ("MODE", "TOKEN", "FROM_HERE") if k in os.environ))
if os.environ.get("FAIL"):
    raise SystemExit(int(os.environ["FAIL"]))
"""


def cli(ws: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["--workspace", str(ws), "--json", "--quiet", *args])
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def test_user_env_reaches_a_real_container_and_a_failed_replicate_stops_the_rest(
        tiny_workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "envproj"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT)
    monkeypatch.setenv("FROM_HERE", "this machine's")
    code, out, err = cli(tiny_workspace, "run", str(project / "train.py"), "--env", "MODE=a b", "--env", "FROM_HERE",
                         "--secret-env", "TOKEN=hunter2 s3cr3t")
    assert code == 0, (out, err)
    m = out["data"]["runs"][0]
    run_dir = tiny_workspace / "runs" / m["run_id"]
    seen = json.loads((run_dir / "outputs" / "env.json").read_text())
    assert seen == {"MODE": "a b", "TOKEN": "hunter2 s3cr3t", "FROM_HERE": "this machine's"}
    assert m["env"]["MODE"] == {"value": "a b"} and m["env"]["FROM_HERE"] == {"value": "this machine's"}
    assert set(m["env"]["TOKEN"]) == {"hmac"}  # keyed with the run's salt, which stays in this machine's cache
    assert m["recipe"]["identity"] == "envproj/train.py" and "-envproj_train.py-" in m["run_id"]
    for root in (tiny_workspace / "runs", tiny_workspace / ".launcher" / "host-runs"):
        for path in root.rglob("*"):
            if path.is_file() and path.name != "env.json":  # the script itself wrote that one
                assert b"s3cr3t" not in path.read_bytes(), path

    code, out, err = cli(tiny_workspace, "run", str(project / "train.py"), "--runs", "3", "--env", "FAIL=3")
    assert code == ExitCode.RUN_FAILED, (out, err)
    failure = out["data"]["failure"]
    assert (failure["replicate"], failure["exit_code"], failure["not_started"]) == (0, 3, 2)
    assert "seen []" in failure["log_tail"] and failure["log_tail"][-1] == "launcher: exit code 3"
    assert len(out["data"]["runs"]) == 1 and len(list((tiny_workspace / "runs").iterdir())) == 2
    code, ps, _ = cli(tiny_workspace, "ps")
    failed = next(r for r in ps["data"]["runs"] if r["run_id"] == failure["run_id"])
    assert failed["status"] == "failed" and failed["code_name"] == "envproj/train.py"
    code, logs, _ = cli(tiny_workspace, "logs", failure["run_id"][-6:])
    assert code == 0 and "seen []" in logs["data"]["lines"]
