"""A build and a `rebuild --verify` leave the Docker engine with the image and nothing unreferenced
of theirs (the classic builder leaves each stage's step images behind: a 2 GB venv stage for the
TensorFlow image), and never touch an image launcher did not make; `launcher cache ls` shows what
the engine holds for launcher. On a small locked image over the bootstrapped base (fast)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import NotFound
from launcher.hosts import dockerapi
from launcher.images.build import LABEL
from launcher.workspace import Workspace

runner = CliRunner()
pytestmark = [pytest.mark.docker, pytest.mark.registry]


def _images(*filters: str) -> set[str]:
    argv = ["docker", "images", "-a", "-q", "--no-trunc"]
    for f in filters:
        argv += ["--filter", f]
    return set(subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split())


def _labels(image_id: str) -> dict[str, str] | None:
    """The image's labels; None for an image gone since it was listed (the engine is shared, and another
    build may remove a dangling image in between). Any other error is the test's."""
    try:
        return dockerapi.inspect(image_id)["Config"].get("Labels") or {}
    except NotFound:
        return None


def _launchers(labels: dict[str, str] | None) -> bool:
    return any(k.startswith(LABEL) for k in labels or {})


def test_build_and_rebuild_verify_leave_nothing_unreferenced(make_workspace: Callable[..., Workspace],
                                                            six_lock: Callable[[Workspace], Workspace],
                                                            tmp_path: Path, base_ref: str) -> None:
    ws = six_lock(make_workspace(tmp_path / "ws", recipes=False))
    (ws.recipes / "hello").mkdir()
    (ws.recipes / "hello" / "train.py").write_text("print('hello')\n")
    # a Dockerfile of its own (a fresh build, not one found by content) whose first stage is marked
    marker = uuid.uuid4().hex
    dockerfile = ws.dockerfile("cpu").read_text()
    stage = "FROM ${LAUNCHER_BASE} AS venv\n"
    assert stage in dockerfile
    ws.dockerfile("cpu").write_text(dockerfile.replace(stage, f"{stage}LABEL test.launcher.marker={marker}\n"))
    # an image someone else left dangling: not launcher's to remove
    other = subprocess.run(["docker", "build", "-q", "-"], input=f"FROM {base_ref}\nLABEL test.other={marker}\n",
                           check=True, capture_output=True, text=True).stdout.strip()
    built: dict[str, str] = {}
    try:
        dangling_before = _images("dangling=true")
        assert other in dangling_before
        res = runner.invoke(app, ["-w", str(ws.root), "--json", "build"])
        assert res.exit_code == 0, res.output
        built = json.loads(res.stdout)["data"]
        assert not built["noop"]
        res = runner.invoke(app, ["-w", str(ws.root), "--json", "rebuild", "--verify"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["data"]["image_id_matches"]

        # no step image of this Dockerfile stays, dangling or intermediate
        assert not _images(f"label=test.launcher.marker={marker}")
        # (this build's images carry its env-content, which this Dockerfile makes its own: a build of another
        # test, running beside this one, may leave its step images for a moment)
        env_content = (_labels(built["extra"]["env_image_id"]) or {})[LABEL + "env-content"]
        new = _images("dangling=true") - dangling_before
        ours = [i for i in new if (_labels(i) or {}).get(LABEL + "env-content") == env_content]
        assert not ours, ours
        # what stays is the image and its environment, both tagged; the other user's image is untouched
        assert dockerapi.inspect(built["tag"])["Id"] == built["image_id"]
        env_id = built["extra"]["env_image_id"]
        assert dockerapi.inspect(env_id)["RepoTags"]
        # the labels the check above looks for are on what launcher built: an image of its own left
        # dangling would have been found
        assert _launchers(_labels(built["image_id"])) and _launchers(_labels(env_id))
        assert other in _images("dangling=true")

        listed = runner.invoke(app, ["--json", "cache", "ls"])
        assert listed.exit_code == 0, listed.output
        engine = json.loads(listed.stdout)["data"]["engine"]
        by_id = {i["id"]: i for i in engine["images"]}
        assert by_id[built["image_id"]]["tags"] == [built["tag"]] and by_id[built["image_id"]]["kind"] == "image"
        assert by_id[env_id]["kind"] == "environment" and by_id[env_id]["variant"] == "cpu"
        assert by_id[built["image_id"]]["bytes"] > 0 and other not in by_id
        text = runner.invoke(app, ["cache", "ls"], env={"COLUMNS": "200"}).output
        assert built["tag"] in text and "in the Docker engine" in text
    finally:
        subprocess.run(["docker", "rmi", other], capture_output=True)
        for ref in (built.get("tag"), (built.get("extra") or {}).get("env_image_id")):
            if ref:
                subprocess.run(["docker", "rmi", ref], capture_output=True)
