"""launcher.records.rundir owns the layout of a run's folder: no other module spells its files' names,
a run id is checked before a path is made of it, and a resumed run's pulled state is removed
manifest first (nothing half-removed looks complete)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.errors import UsageError
from launcher.records import rundir
from launcher.records.rundir import RunDir
from launcher.workspace import Workspace

PACKAGE = Path(rundir.__file__).resolve().parents[1]
# docker save archives hold a manifest.json of their own: those two modules read Docker's, not a run's
DOCKER_ARCHIVES = {"images/tree.py", "transfers/ship.py"}


def test_no_module_but_rundir_spells_the_run_folders_file_names() -> None:
    spelled = re.compile(r"""["'](launch\.json|manifest\.json|\.pulled\.json)["']""")
    found = [f"{p.relative_to(PACKAGE)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
             if str(p.relative_to(PACKAGE)) not in {"records/rundir.py", *DOCKER_ARCHIVES}
             for n, line in enumerate(p.read_text().splitlines(), 1) if spelled.search(line)]
    assert found == []


def _attribute_uses(name: str, owners: set[str]) -> list[str]:
    import ast

    return [f"{p.relative_to(PACKAGE)}:{node.lineno}" for p in sorted(PACKAGE.rglob("*.py"))
            if str(p.relative_to(PACKAGE)) not in owners
            for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Attribute) and node.attr == name]


def test_no_module_but_its_owner_reads_or_writes_a_run_record() -> None:
    """RunDir reads and writes launch.json (migrating older versions), launcher.records.manifest the manifest: any
    other module that takes the file's path would read or write it past them."""
    assert _attribute_uses("launch_file", {"records/rundir.py"}) == []
    assert _attribute_uses("manifest_file", {"records/rundir.py", "records/manifest.py"}) == []


def test_an_older_launch_record_is_read_as_this_launchers(tmp_path: Path) -> None:
    import json

    from launcher.errors import SchemaTooNew
    from launcher.hosts.containerspec import ContainerSpec, Mount

    d = RunDir(tmp_path / "20261125T080000-train-abc123")
    d.path.mkdir()
    argv = ["docker", "run", "-d", "--name", "launcher-x", "--label", "org.launcher.run=x", "-e", "LAUNCHER_SEED=1",
            "-v", "/h/out:/launcher/out", "sha256:img", "python", "-m", "launcher.runtime", "run"]
    d.launch_file.write_text(json.dumps({"run_id": d.run_id, "group": "g", "argv": argv}))  # version 1: no version
    launch = d.read_launch()
    assert launch["record_version"] == rundir.LAUNCH_VERSION and "argv" not in launch
    assert ContainerSpec.from_record(launch["container_spec"]) == ContainerSpec(
        "sha256:img", ("python", "-m", "launcher.runtime", "run"), name="launcher-x",
        labels={"org.launcher.run": "x"}, env={"LAUNCHER_SEED": "1"}, mounts=(Mount("/h/out", "/launcher/out"),),
        detach=True)
    d.write_launch(launch)
    assert json.loads(d.launch_file.read_text()) == launch  # written as the version it was read as
    d.launch_file.write_text(json.dumps({"run_id": d.run_id, "group": "g", "record_version": 99}))
    with pytest.raises(SchemaTooNew, match="version 99"):
        d.read_launch()
    assert d.read_launch_quiet() is None


def test_a_run_folder_and_its_state(tmp_path: Path) -> None:
    ws = Workspace.at(tmp_path)
    with pytest.raises(UsageError, match="is not a run id"):
        RunDir.of(ws, "../etc")
    d = RunDir.of(ws, "20261125T080000-train-abc123")
    assert d.path == ws.runs / "20261125T080000-train-abc123" and d.run_id == "20261125T080000-train-abc123"
    assert not d.is_run() and d.read_launch_quiet() is None
    d.path.mkdir(parents=True)
    d.launch_file.write_text('{"run_id": "20261125T080000-train-abc123", "group": "g"}')
    assert d.is_run() and not d.is_complete()
    assert d.read_launch_quiet() == {"run_id": "20261125T080000-train-abc123", "group": "g",
                                     "record_version": rundir.LAUNCH_VERSION}
    d.train_log.parent.mkdir(parents=True)
    d.train_log.write_text("epoch 1\n")
    d.pulled_file.write_text("{}")
    d.manifest_file.write_text("{}")
    assert d.is_complete() and d.train_log == d.path / "outputs/logs/train.log"
    d.forget_pulled()
    assert not d.is_complete() and not d.outputs.exists() and not d.pulled_file.exists()
    assert d.launch_file.is_file()  # the launch record stays: the run is started, not gone
    d.launch_file.write_text("[1, 2]")
    assert d.read_launch_quiet() is None  # not a launch record
