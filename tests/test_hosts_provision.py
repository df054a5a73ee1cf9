"""`launcher provision` against the real SSH test host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from testhost import TestHost
from typer.testing import CliRunner

from launcher.cli import app

pytestmark = pytest.mark.testhost


def provision(ws: Path, th: TestHost, *extra: str) -> tuple[int, dict[str, Any], str]:
    args = ["--workspace", str(ws), "--json", "provision", "--host", th.spec, "--identity", str(th.key),
            "--known-hosts", str(th.known_hosts), "--ssh-config", "/dev/null", *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def test_provision_reports_the_facts_and_keeps_them(testhost: TestHost, tiny_workspace: Path) -> None:
    code, env, err = provision(tiny_workspace, testhost)
    assert code == 0, err
    facts = env["data"]["facts"]
    assert facts["os"] == "Debian GNU/Linux 12 (bookworm)" and facts["os_id"] == "debian"
    assert facts["cpu_cores"] == int(testhost.exec("nproc").strip())
    mem_kb = int(next(ln for ln in testhost.exec("cat", "/proc/meminfo").splitlines()
                      if ln.startswith("MemTotal")).split()[1])
    assert facts["ram_bytes"] == mem_kb * 1024 and facts["disk_free_bytes"] > 0
    assert facts["docker"]["usable"] is True
    assert facts["docker"]["server_version"] == testhost.exec(
        "docker", "version", "--format", "{{.Server.Version}}").strip()
    assert facts["nvidia"] == {"smi": False, "gpus": [], "driver": None, "container_toolkit": False}
    assert facts["docker"]["nvidia_runtime"] is False
    assert env["data"]["ready"] is True and env["data"]["plan"] == []
    saved = json.loads(Path(env["data"]["facts_file"]).read_text())
    assert saved["docker"] == facts["docker"] and Path(env["data"]["facts_file"]).is_relative_to(tiny_workspace)


def test_install_dry_run_prints_the_gpu_steps_and_changes_nothing(testhost: TestHost,
                                                                  tiny_workspace: Path) -> None:
    code, env, err = provision(tiny_workspace, testhost, "--install", "--dry-run")
    assert code == 0, err
    assert env["data"]["plan"] == [] and env["summary"] == "nothing to install"  # docker is there: idempotent
    code, env, err = provision(tiny_workspace, testhost, "--gpu", "--install", "--dry-run")
    assert code == 0, err
    commands = [s["command"] for s in env["data"]["plan"]]
    assert "apt-get install -y ubuntu-drivers-common && ubuntu-drivers install" in commands
    assert "env DEBIAN_FRONTEND=noninteractive apt-get install -y nvidia-container-toolkit" in commands
    assert commands[-2:] == ["nvidia-ctk runtime configure --runtime=docker", "systemctl restart docker"]
    assert env["data"]["executed"] == [] and env["data"]["dry_run"] is True
    assert testhost.exec("sh", "-c", "command -v nvidia-ctk || echo absent").strip() == "absent"
