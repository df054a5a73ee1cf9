"""A param value the recipe does not allow stops `launcher run` before anything is built, shipped,
recorded or started: on the local engine and over SSH (the tiny image, with the repository's
mnist_convnet recipe copied into its workspace)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from testhost import TestHost
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.specs.container import RUN_LABEL
from launcher.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
ALLOWED = "(allowed: digits, mnist)"


def cli(ws: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["--workspace", str(ws), *args])
    return result.exit_code, result.stdout, result.stderr


def with_mnist(ws: Path) -> Path:
    shutil.copytree(REPO / "recipes" / "mnist_convnet", ws / "recipes" / "mnist_convnet",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return ws


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def run_containers_since(since: float, docker: list[str]) -> list[str]:
    """The run IDs of run containers created since ``since`` (engine events: a container that was
    created and removed again is seen too)."""
    out = subprocess.run([*docker, "events", "--since", f"{since:.0f}", "--until", f"{time.time() + 1:.0f}",
                          "--filter", "type=container", "--filter", "event=create", "--filter", f"label={RUN_LABEL}",
                          "--format", "{{json .Actor.Attributes}}"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return [json.loads(line).get(RUN_LABEL, "") for line in out.splitlines() if line.strip()]


def build_record(ws: Path) -> str:
    return Workspace.at(ws).build_record("cpu").read_text()


@pytest.mark.docker
def test_a_wrong_param_value_on_the_local_engine_is_exit_2_and_nothing_starts(tiny_workspace: Path) -> None:
    ws = with_mnist(tiny_workspace)
    record = build_record(ws)
    since = time.time() - 1
    code, _, err = cli(ws, "run", "mnist_convnet", "--param", "dataset=digitz", "--seed", "1")
    assert code == ExitCode.USAGE, err
    line = one_line(err)
    assert "recipe mnist_convnet: param dataset=digitz selects no dataset of the recipe " + ALLOWED in line
    assert "fix: use an allowed value, e.g. --param dataset=digits" in line
    code, _, err = cli(ws, "run", "mnist_convnet", "--param", "epochs=abc")
    assert code == ExitCode.USAGE and "param epochs=abc is not an integer (allowed: an integer >= 1)" in one_line(err)
    code, _, err = cli(ws, "experiment", "mnist_convnet", "--runs", "2", "--param", "dataset=digitz")
    assert code == ExitCode.USAGE and ALLOWED in err.splitlines()[-1] and "Traceback" not in err
    code, _, err = cli(ws, "run", "tiny", "--param", "size_kb=lots")  # a plain default's type is checked too
    assert code == ExitCode.USAGE and "param size_kb=lots is not an integer (allowed: any integer)" in one_line(err)
    # nothing recorded, built or started
    assert not (ws / "runs").exists()
    assert not (ws / ".launcher" / "host-runs").exists() or not any((ws / ".launcher" / "host-runs").iterdir())
    assert build_record(ws) == record  # the image out of date with the new recipe was not rebuilt either
    started = [r for r in run_containers_since(since, ["docker"]) if "mnist_convnet" in r or "-tiny-" in r]
    assert not started, started


@pytest.mark.testhost
def test_a_wrong_param_value_over_ssh_is_exit_2_and_nothing_is_shipped_or_started(
        testhost: TestHost, tiny_workspace: Path, tiny_image: dict[str, Any]) -> None:
    ws = with_mnist(tiny_workspace)
    testhost.exec("docker", "rmi", "-f", tiny_image["id"], check=False)
    runs_before = testhost.exec("sh", "-c", "ls /root/.launcher/runs 2>/dev/null || true")
    since = time.time() - 1
    host = ["--host", testhost.spec, "--identity", str(testhost.key), "--known-hosts", str(testhost.known_hosts),
            "--ssh-config", "/dev/null"]
    code, _, err = cli(ws, "run", "mnist_convnet", *host, "--param", "dataset=digitz")
    assert code == ExitCode.USAGE, err
    assert "param dataset=digitz selects no dataset of the recipe " + ALLOWED in one_line(err)
    code, _, err = cli(ws, "run", "mnist_convnet", *host, "--param", "learning_rate=-1")
    assert code == ExitCode.USAGE, err
    assert "param learning_rate=-1 is out of range (allowed: a number >= 0.0)" in one_line(err)
    # nothing shipped (the image is still absent there), no run directory there or here, no container
    gone = testhost.exec("sh", "-c", f"docker image inspect {tiny_image['id']} >/dev/null 2>&1 && echo present || "
                         "echo absent")
    assert gone.strip() == "absent"
    assert testhost.exec("sh", "-c", "ls /root/.launcher/runs 2>/dev/null || true") == runs_before
    assert not (ws / "runs").exists()
    started = run_containers_since(since, ["docker", "exec", testhost.container, "docker"])
    assert not [r for r in started if "mnist_convnet" in r], started


@pytest.mark.docker
def test_quiet_hides_progress_bars_but_not_the_training_log(tiny_workspace: Path) -> None:
    code, out, err = cli(tiny_workspace, "--quiet", "run", "tiny", "--seed", "5")
    assert code == 0, out + err
    assert "tiny: seed 5" in out and "step 2 value" in out and "tiny: done" in out  # the run's own log
    assert "━" not in out + err  # no bar
    code, out, _ = cli(tiny_workspace, "ps")
    assert code == 0 and "tiny" in out
