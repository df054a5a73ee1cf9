"""Builds for real: a small locked image on the bootstrapped base (fast), and the shared
TensorFlow CPU image built from the committed lock."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.hosts import dockerapi
from launcher.images import build as build_mod
from launcher.images.lock import parse_lock
from launcher.workspace import Workspace

runner = CliRunner()
pytestmark = [pytest.mark.docker, pytest.mark.registry]


@pytest.fixture(scope="module")
def small_ws(make_workspace: Callable[..., Workspace], six_lock: Callable[[Workspace], Workspace],
             tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    ws = six_lock(make_workspace(tmp_path_factory.mktemp("small") / "ws", recipes=False))
    (ws.recipes / "hello").mkdir()
    (ws.recipes / "hello" / "train.py").write_text("print('hello')\n")
    return ws


def docker_run(image: str, *argv: str) -> str:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", image, *argv], check=True,
                          capture_output=True, text=True).stdout


def test_build_installs_offline_from_the_lock_and_labels_the_image(small_ws: Workspace) -> None:
    res = runner.invoke(app, ["-w", str(small_ws.root), "--json", "build", "cpu"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)["data"]  # may be a no-op: builds are cached by content on this machine
    labels = dockerapi.inspect(data["tag"])["Config"]["Labels"]
    assert labels["org.launcher.lock-sha256"] == data["lock_sha256"]
    assert labels["org.launcher.base-digest"] == data["base"].partition("@")[2]
    assert labels["org.launcher.git-commit"] and labels["org.launcher.git-dirty"] in ("true", "false")
    frozen = docker_run(data["tag"], "/opt/venv/bin/python", "-m", "pip", "freeze", "--all")
    installed = {line.split("==")[0].lower(): line.split("==")[1] for line in frozen.split() if "==" in line}
    locked = {r.name: r.version for r in parse_lock(small_ws.lock_txt("cpu").read_text())}
    assert installed == locked
    assert docker_run(data["tag"], "python", "-c", "import six, launcher.runtime; print(six.__version__)").strip() \
        == locked["six"]
    record = json.loads(small_ws.build_record("cpu").read_text())
    assert record["image_id"] == data["image_id"] == dockerapi.inspect(data["tag"])["Id"]


def test_unchanged_build_is_a_noop(small_ws: Workspace) -> None:
    first = build_mod.build(small_ws, "cpu")
    again = build_mod.build(small_ws, "cpu")
    assert again.noop and again.image_id == first.image_id and again.tag == first.tag


def test_rebuild_verify_gives_the_same_image_id(small_ws: Workspace) -> None:
    build_mod.build(small_ws, "cpu")
    res = runner.invoke(app, ["-w", str(small_ws.root), "--json", "rebuild", "cpu", "--verify"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)["data"]
    assert data["tree_matches"] and data["image_id_matches"], data


def test_rebuild_verify_after_an_unbuilt_edit_names_the_changed_file(small_ws: Workspace) -> None:
    build_mod.build(small_ws, "cpu")
    script = small_ws.recipes / "hello" / "train.py"
    original = script.read_text()
    script.write_text("print('changed')\n")
    (small_ws.recipes / "hello" / "extra.py").write_text("X = 1\n")
    try:
        res = runner.invoke(app, ["-w", str(small_ws.root), "--json", "rebuild", "cpu", "--verify"])
    finally:
        script.write_text(original)
        (small_ws.recipes / "hello" / "extra.py").unlink()
    assert res.exit_code == ExitCode.IMAGE_OUT_OF_DATE, res.output
    error = json.loads(res.stdout)["data"]["error"]
    assert "recipes/hello/train.py (changed)" in error and "recipes/hello/extra.py (added)" in error, error
    assert "not reproducible" not in res.output and "Traceback" not in res.output


def test_rebuild_verify_after_an_edit_built_and_reverted_verifies_the_build_of_the_reverted_inputs(
        small_ws: Workspace) -> None:
    before = build_mod.build(small_ws, "cpu")
    script = small_ws.recipes / "hello" / "train.py"
    original = script.read_text()
    script.write_text("print('edited, built, then reverted')\n")
    try:
        edited = build_mod.build(small_ws, "cpu")  # what a run does: the workspace's record is now of the edit
    finally:
        script.write_text(original)
    assert edited.image_id != before.image_id
    res = runner.invoke(app, ["-w", str(small_ws.root), "--json", "rebuild", "cpu", "--verify"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)["data"]
    assert data["tree_matches"] and data["image_id_matches"], data
    assert data["recorded_image_id"] == data["rebuilt_image_id"] == before.image_id


def test_rebuild_verify_that_differs_names_the_paths(small_ws: Workspace) -> None:
    """A rebuild whose tree is not the recorded one (here the recorded tree is altered, as a build that picked up
    something else would have it) is not reproducible, with the paths that differ."""
    from launcher.images import tree as imagetree

    build_mod.build(small_ws, "cpu")
    tree_path = small_ws.build_record("cpu").with_suffix(".tree.json.gz")
    saved = tree_path.read_bytes()
    tree = imagetree.load_tree(tree_path)
    path = "opt/launcher/recipes/hello/train.py"
    tree[path] = tree[path].replace(" 644 ", " 755 ")
    record = json.loads(small_ws.build_record("cpu").read_text())
    record_bytes = small_ws.build_record("cpu").read_bytes()
    record["tree_digest"] = imagetree.lines_digest(tree)
    imagetree.save_tree(tree_path, tree)
    small_ws.build_record("cpu").write_text(json.dumps(record))
    try:
        res = runner.invoke(app, ["-w", str(small_ws.root), "--json", "rebuild", "cpu", "--verify"])
    finally:
        tree_path.write_bytes(saved)
        small_ws.build_record("cpu").write_bytes(record_bytes)
    assert res.exit_code == ExitCode.NOT_REPRODUCIBLE, res.output
    assert {"path": "/" + path, "change": "changed"} in json.loads(res.stdout)["data"]["changes"]


def test_tampered_hash_fails_and_tags_nothing(small_ws: Workspace, tmp_path: Path,
                                             make_workspace: Callable[..., Workspace]) -> None:
    ws = make_workspace(tmp_path / "ws", recipes=False)
    text = small_ws.lock_txt("cpu").read_text()
    six_hash = next(r for r in parse_lock(text) if r.name == "six").hashes[0]
    ws.lock_txt("cpu").write_text(text.replace(six_hash, "0" * 64))
    tag = build_mod.gather(ws, "cpu").tag
    res = runner.invoke(app, ["-w", str(ws.root), "build", "cpu"])
    assert res.exit_code in (ExitCode.CORRUPT, ExitCode.BUILD_FAILED), res.output
    assert "six" in res.output and "Traceback" not in res.output
    assert not dockerapi.image_exists(tag)
    assert not ws.build_record("cpu").exists()


def test_dockerfile_without_digest_is_refused(tmp_path: Path, make_workspace: Callable[..., Workspace]) -> None:
    ws = make_workspace(tmp_path / "ws", recipes=False)
    ws.dockerfile("cpu").write_text("FROM python:3.11-slim-bookworm\nRUN true\n")
    res = runner.invoke(app, ["-w", str(ws.root), "build", "cpu"])
    assert res.exit_code == ExitCode.PIN_MISMATCH
    assert "has no digest" in res.output
    assert not ws.build_record("cpu").exists()


def test_unknown_variant_and_missing_engine(tmp_path: Path, make_workspace: Callable[..., Workspace],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_workspace(tmp_path / "ws", recipes=False)
    res = runner.invoke(app, ["-w", str(ws.root), "build", "tpu"])
    assert res.exit_code == ExitCode.USAGE
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    dockerapi.client.cache_clear()
    try:
        res = runner.invoke(app, ["-w", str(ws.root), "build", "cpu"])
    finally:
        monkeypatch.undo()
        dockerapi.client.cache_clear()
    assert res.exit_code == ExitCode.ENGINE_UNAVAILABLE, res.output
    assert "no Docker engine answers" in res.output


@pytest.mark.tfimage
def test_tensorflow_image_runs_tensorflow_and_fwr13y(cpu_image: dict[str, Any]) -> None:
    out = docker_run(cpu_image["tag"], "python", "-c",
                     "import tensorflow as tf, fwr13y, sklearn; print(tf.__version__)")
    assert out.strip().splitlines()[-1] == "2.21.0"
    labels = dockerapi.inspect(cpu_image["tag"])["Config"]["Labels"]
    assert labels["org.launcher.variant"] == "cpu"


def test_a_build_record_round_trips_through_its_json_keys_without_noop() -> None:
    from launcher.images.buildrecord import BuildRecord

    rec = BuildRecord(variant="cpu", image_id="sha256:1", tag="t:1", content="sha256:2", base="b@sha256:3",
                      lock_sha256="4", tree_digest="sha256:5", labels={"a": "b"}, built_at="now", seconds=1.5,
                      noop=True, extra={"epoch": 0, "parts": {"lock": "4"}})
    written = rec.to_json()
    assert sorted(written) == ["base", "built_at", "content", "extra", "image_id", "labels", "lock_sha256",
                               "record_version", "seconds", "tag", "tree_digest", "variant"]
    assert written["extra"] == rec.extra and written["extra"] is not rec.extra
    back = BuildRecord.from_json({**written, "noop": True})
    assert back == BuildRecord(**{**written, "noop": False})
