"""Run folders an earlier launcher wrote (tests/fixtures/old_runs: launch records of version 1, which kept
the rendered `docker run` command line instead of the container spec) still verify, report, attest and
resume through RunDir's migration. Fast tier: the folders are committed, nothing runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hostile as h
import pytest
from runfactory import make_workspace
from typer.testing import CliRunner

from launcher.attest.check import verify_file
from launcher.attest.provenance import attest_run
from launcher.attest.signers import PemSigner, Trust
from launcher.cli import app
from launcher.records.rundir import LAUNCH_VERSION, RunDir
from launcher.runs.resume import moved_spec
from launcher.specs.container import launch_spec

FIXTURE = Path(__file__).parent / "fixtures" / "old_runs"
GROUP = "mnist_convnet-old"
RUNS = ("20261122T100000-mnist_convnet-old000", "20261122T100001-mnist_convnet-old001")
WRITTEN_AT = "/tmp/oldfix/ws/runs"  # where the earlier launcher's run folders were when it started them


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = make_workspace(tmp_path / "ws")
    for run_id in RUNS:
        shutil.copytree(FIXTURE / run_id, root / "runs" / run_id)
    return root


def test_the_fixture_is_as_the_earlier_launcher_wrote_it() -> None:
    for run_id in RUNS:
        raw = json.loads((FIXTURE / run_id / "launch.json").read_text())
        assert "record_version" not in raw and "container_spec" not in raw and raw["argv"][:2] == ["docker", "run"]


def test_an_old_launch_record_reads_as_this_version_with_its_container_spec(ws: Path) -> None:
    run = RunDir(ws / "runs" / RUNS[0])
    launch = run.read_launch()
    assert launch["record_version"] == LAUNCH_VERSION and "argv" not in launch
    spec = launch_spec(launch)
    assert spec is not None and spec.image == "sha256:" + "1" * 64
    assert spec.command[:4] == ("python", "-m", "launcher.runtime", "run")
    assert [(m.source, m.target) for m in spec.mounts] == [(f"{WRITTEN_AT}/{RUNS[0]}/outputs", "/launcher/out")]
    assert spec.env["LAUNCHER_SEED"] == "42"
    # resumed where the folder is now: the spec's mount follows it, the command stays as it ran
    moved = moved_spec(spec, {f"{WRITTEN_AT}/{RUNS[0]}/outputs": str(run.path / "outputs")}, "1000:1000")
    assert [m.source for m in moved.mounts] == [str(run.path / "outputs")]
    assert moved.env["LAUNCHER_OWNER"] == "1000:1000" and moved.command == spec.command
    # written back, it is this version's record and reads back the same
    run.write_launch(launch)
    assert json.loads(run.launch_file.read_text())["record_version"] == LAUNCH_VERSION
    assert launch_spec(run.read_launch()) == spec


def test_old_runs_verify_identical_and_report(ws: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["-w", str(ws), "-q", "--json", "verify", "checksums", "--group", GROUP])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["-w", str(ws), "-q", "report", GROUP, "--name", "old"])
    assert r.exit_code == 0, r.output
    assert (ws / "reports" / "old" / "index.html").is_file()


def test_an_old_run_is_attested_and_its_statement_verifies_against_the_folder(ws: Path, tmp_path: Path) -> None:
    run_dir = ws / "runs" / RUNS[1]
    private, public = h.pem_keys(tmp_path / "keys")
    done = attest_run(run_dir, PemSigner(private), tmp_path / "cache")
    assert done.envelope is not None
    verified = verify_file(done.envelope, Trust.of(None, [public]), run_dir)
    assert verified.files_checked > 0
