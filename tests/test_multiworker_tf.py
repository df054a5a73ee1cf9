"""TensorFlow's MultiWorkerMirroredStrategy, for real in the TensorFlow image: a custom training loop
(tests/fixtures/tf_workers/train.py) as 1 node of 2 workers twice, and as 2 nodes of 1 worker (two containers on a
private network), each worker started by launcher's runtime with its TF_CONFIG; verified identical."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app

pytestmark = [pytest.mark.tfimage]
SCRIPT = Path(__file__).parent / "fixtures/tf_workers/train.py"


def cli(root: Path, *args: str) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(root), "--json", "--quiet", *args])
    assert res.exit_code == 0, res.stdout[-4000:]
    return json.loads(res.stdout)["data"]


def test_two_tensorflow_workers_verify_identical_on_one_node_and_on_two(cpu_image: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    root = cpu_image["workspace"].root
    project = tmp_path / "tfworkers"
    project.mkdir()
    shutil.copy(SCRIPT, project / "train.py")
    one_node = cli(root, "run", str(project / "train.py"), "--procs-per-node", "2", "--runs", "2")["runs"]
    (two_nodes,) = cli(root, "run", str(project / "train.py"), "--nodes", "2")["runs"]
    runs = [*one_node, two_nodes]
    for run in runs:
        topology = run["topology"]
        assert run["status"] == "succeeded" and topology["world_size"] == 2
        assert topology["launcher"].startswith("TF_CONFIG per worker")
        assert [e["exit_code"] for e in topology["ended"]] == [0, 0]
        log = (root / "runs" / run["run_id"] / "outputs/logs/train.log").read_text()
        assert "worker 0 of 2: saved" in log and "epoch 1: loss" in log
    assert (root / "runs" / two_nodes["run_id"] / "outputs/ranks/1/logs/train.log").is_file()
    verdict = cli(root, "verify", "checksums", *(r["run_id"] for r in runs))
    assert verdict["verdict"] == "identical", verdict["summary"]
    assert "outputs/weights.npz" in {a["path"] for a in verdict["artifacts"] if a["checked"]}
