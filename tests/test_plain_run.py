"""`launcher env RUN`: the plain `docker run` that repeats a run without launcher, built from its records.
(Run for real, and its bits compared with the run's, in tests/test_users_code_in_image.py.)"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from runfactory import make_workspace
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import NotFound
from launcher.runs.plain import plain_run
from launcher.workspace import Workspace

RUN_ID = "20261124T101500-myproj_train.py-a1b2c3"
ENV = {"LAUNCHER_PROFILE": "deterministic", "LAUNCHER_SEED": "42", "PYTHONHASHSEED": "42",
       "TF_DETERMINISTIC_OPS": "1", "TF_NUM_INTRAOP_THREADS": "2"}


def launch_record(snapshot: Path, **changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "run_id": RUN_ID, "group": "g", "host": {"name": "local", "kind": "local"}, "variant": "cpu",
        "image": {"id": "sha256:" + "ab" * 32, "variant": "cpu"},
        "recipe": {"name": "train", "entry": "train.py", "script": True, "args": ["--epochs", "2"]},
        "code": {"source": "mounted", "local": str(snapshot), "digest": "sha256:" + "cd" * 32, "entry": "train.py"},
        "determinism": {"profile": "deterministic", "env": dict(ENV)}, "params": {}, "data": None,
    }
    record.update(changes)
    return record


def make_run(tmp_path: Path, launch: dict[str, Any], manifest: dict[str, Any] | None = None) -> Workspace:
    ws = Workspace.at(make_workspace(tmp_path / "ws"))
    d = ws.runs / launch["run_id"]
    d.mkdir(parents=True)
    (d / "launch.json").write_text(json.dumps(launch))
    if manifest is not None:
        (d / "manifest.json").write_text(json.dumps(manifest))
    return ws


def test_a_script_run_repeats_with_its_image_code_arguments_env_and_working_directory(tmp_path: Path) -> None:
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    manifest = {"image": {"id": "sha256:" + "ef" * 32}, "recipe": {"entry": "sub/train.py", "args": ["--epochs", "2"]},
                "env": {"WANDB_MODE": {"value": "offline"}, "API_TOKEN": {"sha256": "sha256:" + "0" * 64}}}
    ws = make_run(tmp_path, launch_record(snapshot), manifest)
    plain = plain_run(ws, RUN_ID[:22], out=tmp_path / "o")  # a unique prefix of the run id
    argv = plain.argv()
    assert argv[:5] == ["docker", "run", "--rm", "-w", "/launcher/out"]
    assert argv[-4:] == ["python", "/launcher/code/sub/train.py", "--epochs", "2"]
    # the script's folder linked into the working directory first, as the runtime shows it
    assert argv[-9:-5] == ["sha256:" + "ef" * 32, "sh", "-c", plain.command[2]]  # the image the run ran
    assert "for f in /launcher/code/sub/*; do" in plain.command[2] and "/launcher/data" not in plain.command[2]
    assert f"{tmp_path / 'o'}:/launcher/out" in argv and f"{snapshot}:/launcher/code:ro" in argv
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert "TF_DETERMINISTIC_OPS=1" in pairs and "PYTHONHASHSEED=42" in pairs and "WANDB_MODE=offline" in pairs
    assert "API_TOKEN" in pairs and not any(p.startswith("API_TOKEN=") for p in pairs)  # from the caller's env
    assert any("API_TOKEN" in n and "secret" in n for n in plain.notes)
    assert shlex.split(plain.shell().replace("\\\n", " ")) == argv
    assert not any("not on this machine" in n for n in plain.notes)


def test_a_baked_recipe_gets_its_params_and_a_remote_run_says_where_it_ran(tmp_path: Path) -> None:
    launch = launch_record(tmp_path, recipe={"name": "mnist_convnet", "entry": "train.py", "script": False},
                           code={"source": "image"}, params={"epochs": 2}, data="/srv/digits",
                           host={"name": "gpu-box", "kind": "ssh"})
    ws = make_run(tmp_path, launch)
    plain = plain_run(ws, RUN_ID)
    assert plain.command == ["python", "/opt/launcher/recipes/mnist_convnet/train.py"]
    assert plain.env["LAUNCHER_PARAMS"] == '{"epochs":2}' and plain.env["LAUNCHER_DATA"] == "/launcher/data"
    assert ("/srv/digits", "/launcher/data", True) in plain.mounts
    assert any("gpu-box" in n for n in plain.notes)
    assert plain.mounts[0] == (str(Path.cwd() / f"{RUN_ID}-plain"), "/launcher/out", False)


def test_the_command_prints_the_shell_line_and_json(tmp_path: Path) -> None:
    ws = make_run(tmp_path, launch_record(tmp_path / "gone"))
    runner = CliRunner()
    text = runner.invoke(app, ["-w", str(ws.root), "env", RUN_ID, "--out", str(tmp_path / "o")])
    assert text.exit_code == 0, text.output
    assert "docker run --rm" in text.output and "not on this machine" in text.output
    doc = json.loads(runner.invoke(app, ["-w", str(ws.root), "--json", "env", RUN_ID]).output)
    assert doc["ok"] and doc["data"]["argv"][0] == "docker" and doc["data"]["env"]["TF_DETERMINISTIC_OPS"] == "1"
    missing = runner.invoke(app, ["-w", str(ws.root), "env", "20991231T000000-nothing-000000"])
    assert missing.exit_code == 11 and "fix:" in missing.output


def test_a_run_folder_without_a_launch_record_is_refused(tmp_path: Path) -> None:
    ws = Workspace.at(make_workspace(tmp_path / "ws"))
    (ws.runs / RUN_ID).mkdir(parents=True)
    with pytest.raises(NotFound, match=r"launch\.json"):
        plain_run(ws, RUN_ID)
