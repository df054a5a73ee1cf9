"""A project's OS package, for real: `[system] apt = ["tree"]` in its launcher.toml and a Python requirement
beside it; `launcher run` locks both (apt in the bootstrapped base against Debian's archive, pip-tools against
PyPI), puts the .deb's files and the wheel into the one project layer, and the script calls the tool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomllib
from typer.testing import CliRunner

from launcher.cli import app
from launcher.hashing import sha256_file
from launcher.workspace import Workspace

pytestmark = [pytest.mark.docker, pytest.mark.tfimage, pytest.mark.network]

SCRIPT = '''import subprocess

from tabulate import tabulate

version = subprocess.run(["tree", "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
print(tabulate([("tree", version)], headers=["tool", "version"]))
with open("tools.txt", "w") as f:
    f.write(version + "\\n")
'''


def cli(ws: Workspace, *args: str) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_an_os_package_declared_by_a_project_is_locked_installed_and_recorded(cpu_image: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    ws = cpu_image["workspace"]
    proj = tmp_path / "toolproj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    (proj / "requirements.in").write_text("tabulate\n")
    (proj / "launcher.toml").write_text('[system]\napt = ["tree"]\n')
    run = cli(ws, "run", str(proj / "train.py"))["data"]["runs"][0]
    assert run["status"] == "succeeded", run
    lock = tomllib.loads((proj / "system.lock").read_text())
    tree = next(p for p in lock["package"] if p["name"] == "tree")
    assert tree["version"] and tree["sha256"].startswith("sha256:") and len(tree["sha256"]) == 71
    printed = (ws.runs / run["run_id"] / "outputs" / "tools.txt").read_text().strip()
    assert tree["version"].startswith(printed.lstrip("v").split("-")[0])  # the binary from the layer ran
    project = run["image"]["project"]
    assert project["system_lock_sha256"] == sha256_file(proj / "system.lock")
    assert f"tree={tree['version']}" in project["system_packages"]
    assert project["requirements_lock_sha256"] == sha256_file(proj / "requirements.lock")
    assert any(p.startswith("tabulate==") for p in project["packages"])
