"""Locking: parsing and refusals (no network), and real pip-tools resolution of a small set inside the
bootstrapped base image (a container of the pinned base, reaching the index with this machine's CA bundle)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, LockFailed, PinMismatch
from launcher.images import lock
from launcher.images import pins as images
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace

runner = CliRunner()


def small_workspace(root: Path, requirements: str) -> Workspace:
    init_workspace(root)
    (root / "lockfiles" / "cpu.in").write_text(requirements)
    return Workspace.at(root)


def pin_lockfile(ws: Workspace, ref: str) -> None:
    pinned = images.ImagesLock()
    for v in ("cpu", "gpu"):
        pinned.pins[v] = images.BasePin(v, ref, python="3.11", source="bootstrap")
    images.save(ws, pinned)


def test_a_dotted_variant_name_survives_images_lock(tmp_path: Path) -> None:
    """`torch-cpu-2.6` is a variant name: images.lock keeps it one section (quoted), next to the plain ones."""
    ws = small_workspace(tmp_path / "ws", "six\n")
    ref = "127.0.0.1:5000/launcher/base@sha256:" + "a" * 64
    pinned = images.ImagesLock()
    for v in ("cpu", "torch-cpu-2.6", "a.b.c"):
        pinned.pins[v] = images.BasePin(v, ref, python="3.11", source="bootstrap")
    images.save(ws, pinned)
    text = ws.images_lock.read_text()
    assert '\n[cpu]\n' in text and '\n["torch-cpu-2.6"]\n' in text
    again = images.load(ws)
    assert sorted(again.pins) == ["a.b.c", "cpu", "torch-cpu-2.6"]
    assert again.get("torch-cpu-2.6").ref == ref and again.get("a.b.c").source == "bootstrap"
    assert not images.save(ws, again)  # rendered the same: nothing rewritten


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


def test_no_pinned_base_names_bootstrap(tmp_path: Path) -> None:
    ws = small_workspace(tmp_path, "six\npip\nsetuptools\n")
    ws.images_lock.unlink()
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "cpu"])
    assert res.exit_code == ExitCode.NOT_FOUND, res.output
    assert "images.lock is missing" in res.output and "launcher base bootstrap" in res.output
    assert "Traceback" not in res.output
    assert not ws.lock_txt("cpu").exists()


def test_missing_ca_bundle_is_refused_before_anything_runs(tmp_path: Path) -> None:
    ws = small_workspace(tmp_path, "six\npip\nsetuptools\n")
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "cpu", "--ca-bundle", str(tmp_path / "no.pem")])
    assert res.exit_code == ExitCode.NOT_FOUND, res.output
    assert "CA bundle" in res.output and "no.pem does not exist" in res.output and "--ca-bundle" in res.output
    (tmp_path / "notpem.txt").write_text("hello\n")
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "cpu", "--ca-bundle",
                              str(tmp_path / "notpem.txt")])
    assert res.exit_code == ExitCode.USAGE, res.output
    assert "holds no PEM certificate" in res.output
    assert not ws.lock_txt("cpu").exists()


@pytest.mark.docker  # the docker client, pointed at no engine
def test_no_docker_engine_is_engine_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = small_workspace(tmp_path, "six\npip\nsetuptools\n")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "cpu"])
    assert res.exit_code == ExitCode.ENGINE_UNAVAILABLE, res.output
    assert "needs a Docker engine" in res.output and "Traceback" not in res.output
    assert not ws.lock_txt("cpu").exists()


def test_default_ca_bundle_prefers_pip_cert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pem = tmp_path / "proxy.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("PIP_CERT", str(pem))
    assert lock.default_ca_bundle() == pem
    monkeypatch.delenv("PIP_CERT")
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))  # a variable naming no file is skipped
    found = lock.default_ca_bundle()
    assert found is None or found.is_file()


def test_a_base_whose_python_differs_from_images_lock_is_refused() -> None:
    pin = lock.images.BasePin("cpu", "x/base@sha256:" + "a" * 64, python="3.11", platform="linux/amd64")
    assert lock._check_target({"python": "3.11.2", "implementation": "CPython", "machine": "x86_64",
                               "system": "Linux"}, pin) == ("3.11.2", "linux/amd64")
    with pytest.raises(PinMismatch, match=re.escape("runs CPython 3.13.5 on linux/arm64")):
        lock._check_target({"python": "3.13.5", "implementation": "CPython", "machine": "aarch64",
                            "system": "Linux"}, pin)


@pytest.mark.docker
def test_a_base_in_an_unreachable_registry_says_so_and_names_bootstrap(tmp_path: Path, engine: dict[str, Any]) -> None:
    ws = small_workspace(tmp_path, "six\npip\nsetuptools\n")
    pin_lockfile(ws, "127.0.0.1:9/launcher-no-such-base:x@sha256:" + "0" * 64)  # nobody listens on port 9
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "cpu"])
    assert res.exit_code == ExitCode.HOST_UNREACHABLE, res.output
    assert "its registry 127.0.0.1:9 cannot be reached" in res.output
    assert "fix: build and pin a local base with `launcher base bootstrap --start-registry`" in res.output
    assert "check that the digest" not in res.output
    assert not ws.lock_txt("cpu").exists()


@pytest.mark.docker
@pytest.mark.registry
def test_a_base_missing_from_its_registry_is_not_found(tmp_path: Path, registry_addr: str) -> None:
    ws = small_workspace(tmp_path, "six\npip\nsetuptools\n")
    pin_lockfile(ws, f"{registry_addr}/launcher-no-such-base:x@sha256:" + "0" * 64)  # the registry answers
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "cpu"])
    assert res.exit_code == ExitCode.NOT_FOUND, res.output
    assert "cannot be pulled" in res.output and f"check that the digest exists in {registry_addr}" in res.output
    assert "cannot be reached" not in res.output
    assert not ws.lock_txt("cpu").exists()


@pytest.mark.parametrize(("error", "unreachable"), [
    ('Get "https://registry.example/v2/": dial tcp: lookup registry.example on 127.0.0.53:53: no such host', True),
    ('Get "http://127.0.0.1:9/v2/": dial tcp 127.0.0.1:9: connect: connection refused', True),
    ("net/http: TLS handshake timeout", True),
    ("manifest for x@sha256:00 not found: manifest unknown: manifest unknown", False),
    ("pull access denied for x, repository does not exist or may require 'docker login'", False),
])
def test_unreachable_registry_errors_are_told_from_refusals(error: str, unreachable: bool) -> None:
    from launcher.hosts.engine import registry_unreachable

    assert registry_unreachable(error) is unreachable


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
@pytest.mark.docker
@pytest.mark.registry
def test_real_lock_is_resolved_inside_the_base_image(tmp_path: Path, base_ref: str) -> None:
    ws = small_workspace(tmp_path, "six==1.17.0\npackaging<25\npip\nsetuptools\n")
    pin_lockfile(ws, base_ref)
    first = runner.invoke(app, ["-w", str(tmp_path), "--json", "lock", "--variant", "cpu"])
    assert first.exit_code == 0, first.output
    text = ws.lock_txt("cpu").read_text()
    reqs = lock.parse_lock(text)
    assert {r.name for r in reqs} >= {"six", "packaging", "pip", "setuptools"}
    assert all(r.hashes for r in reqs)
    head = text.splitlines()[:4]
    # resolved by the base image's own interpreter (bookworm's CPython 3.11.x), not this host's
    assert re.fullmatch(r"# resolved inside the base image by CPython 3\.11\.\d+ on linux/amd64 "
                        rf"\(pip-tools {re.escape(lock.PIP_TOOLS)}\)", head[1]), head
    assert head[2] == f"# base: {base_ref}"
    six = next(r for r in reqs if r.name == "six")
    assert six.version == "1.17.0" and all(re.fullmatch("[0-9a-f]{64}", h) for h in six.hashes)
    assert str(tmp_path) not in text  # no local paths leak into a lockfile
    mtime = ws.lock_txt("cpu").stat().st_mtime_ns
    second = runner.invoke(app, ["-w", str(tmp_path), "--json", "lock", "--variant", "cpu"])
    assert second.exit_code == 0, second.output
    assert '"changed": false' in second.output
    assert ws.lock_txt("cpu").read_text() == text
    assert ws.lock_txt("cpu").stat().st_mtime_ns == mtime  # not even rewritten


@pytest.mark.network
@pytest.mark.docker
@pytest.mark.registry
def test_unresolvable_requirement_fails_cleanly(tmp_path: Path, base_ref: str) -> None:
    ws = small_workspace(tmp_path, "six==0.0.0.404\npip\nsetuptools\n")
    pin_lockfile(ws, base_ref)
    res = runner.invoke(app, ["-w", str(tmp_path), "lock", "--variant", "cpu"])
    assert res.exit_code == ExitCode.LOCK_FAILED, res.output
    assert "could not resolve" in res.output and "six" in res.output
    assert not ws.lock_txt("cpu").exists()
    assert not list(ws.lockfiles.glob("*.partial"))
