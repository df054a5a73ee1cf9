"""Locking: parsing refusals (no network) and real pip-tools resolution of a small set."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, LockFailed
from launcher.images import lock
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace

runner = CliRunner()


def small_workspace(root: Path, requirements: str) -> Workspace:
    init_workspace(root)
    (root / "lockfiles" / "cpu.in").write_text(requirements)
    return Workspace.at(root)


def test_parse_lock_refuses_unpinned_requirement() -> None:
    with pytest.raises(LockFailed, match="not pinned"):
        lock.parse_lock("six>=1.0 \\\n    --hash=sha256:" + "a" * 64 + "\n")


def test_parse_lock_refuses_requirement_without_hash() -> None:
    with pytest.raises(LockFailed, match="no sha256 hash"):
        lock.parse_lock("six==1.17.0\n")


def test_parse_lock_reads_continuations_and_comments() -> None:
    text = ("# header\nsix==1.17.0 \\\n    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64
            + "\n    # via -r lockfiles/cpu.in\nPyYAML==6.0 \\\n    --hash=sha256:" + "c" * 64 + "\n")
    reqs = lock.parse_lock(text)
    assert [(r.name, r.version, len(r.hashes)) for r in reqs] == [("six", "1.17.0", 2), ("pyyaml", "6.0", 1)]


def test_pip_env_hides_local_pip_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_INDEX_URL", "file:///somewhere")
    env, drop = lock.pip_env(Path("/etc/ssl/certs/ca.pem"))
    assert env["PIP_CONFIG_FILE"] == "/dev/null"
    assert env["PIP_CERT"] == "/etc/ssl/certs/ca.pem"
    assert "PIP_FIND_LINKS" in drop and "PIP_INDEX_URL" in drop


def test_lock_refuses_a_target_that_differs_from_this_interpreter(tmp_path: Path) -> None:
    ws = small_workspace(tmp_path, "six\npip\nsetuptools\n")
    text = ws.images_lock.read_text().replace('python = "3.11"', 'python = "3.9"')
    ws.images_lock.write_text(text)
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "cpu"])
    assert res.exit_code == ExitCode.LOCK_FAILED, res.output
    assert "CPython 3.9" in res.output
    assert not ws.lock_txt("cpu").exists()


def test_unknown_variant_is_a_usage_error(tmp_path: Path) -> None:
    small_workspace(tmp_path, "six\n")
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "tpu"])
    assert res.exit_code == ExitCode.USAGE
    assert "unknown variant 'tpu'" in res.output


def test_missing_in_file_is_not_found(tmp_path: Path) -> None:
    ws = small_workspace(tmp_path, "six\n")
    ws.lock_in("gpu").unlink()
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "gpu"])
    assert res.exit_code == ExitCode.NOT_FOUND
    assert "gpu.in is missing" in res.output
    assert "Traceback" not in res.output


@pytest.mark.network
def test_real_lock_is_pinned_hashed_and_byte_stable(tmp_path: Path) -> None:
    ws = small_workspace(tmp_path, "six==1.17.0\npackaging<25\npip\nsetuptools\n")
    first = runner.invoke(app, ["-w", str(tmp_path), "--json", "lock", "--variant", "cpu"])
    assert first.exit_code == 0, first.output
    text = ws.lock_txt("cpu").read_text()
    reqs = lock.parse_lock(text)
    assert {r.name for r in reqs} >= {"six", "packaging", "pip", "setuptools"}
    assert all(r.hashes for r in reqs)
    assert "# target: CPython 3.11 on linux/amd64" in text
    assert str(tmp_path) not in text  # no local paths leak into a lockfile
    mtime = ws.lock_txt("cpu").stat().st_mtime_ns
    second = runner.invoke(app, ["-w", str(tmp_path), "--json", "lock", "--variant", "cpu"])
    assert second.exit_code == 0, second.output
    assert '"changed": false' in second.output
    assert ws.lock_txt("cpu").read_text() == text
    assert ws.lock_txt("cpu").stat().st_mtime_ns == mtime  # not even rewritten


@pytest.mark.network
def test_unresolvable_requirement_fails_cleanly(tmp_path: Path) -> None:
    ws = small_workspace(tmp_path, "six==0.0.0.404\npip\nsetuptools\n")
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "cpu"])
    assert res.exit_code == ExitCode.LOCK_FAILED, res.output
    assert "could not resolve" in res.output and "six" in res.output
    assert not ws.lock_txt("cpu").exists()
    assert not list(ws.lockfiles.glob("*.partial"))
