"""`launcher run --checkpoint-every N` and `launcher resume RUN` for real, in the TensorFlow CPU image: mnist_convnet
(Dropout, Adadelta, Keras' shuffle) killed with `docker kill` after a checkpoint and resumed ends with the bits of
an uninterrupted run of the same seed, and verify says identical; the same on the SSH test host."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_reproduce import cli, ssh_args
from testhost import TestHost

from launcher.errors import ExitCode
from launcher.runs import lifecycle as runs

pytestmark = [pytest.mark.tfimage]

PARAMS = ["--param", "epochs=4", "--param", "train_samples=768", "--param", "test_samples=64"]
RUN = ["run", "mnist_convnet", "--seed", "3", "--checkpoint-every", "1", *PARAMS]


def kill_after_checkpoint(latest: Any, kill: Any, timeout_s: float = 300) -> str:
    """Poll latest() (the text of checkpoints/latest.json, or None) and kill() once the first checkpoint is there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = latest()
        if text:
            kill()
            return str(json.loads(text)["name"])
        time.sleep(0.1)
    raise AssertionError("no checkpoint was written")


def canonical(ws: Path, run: dict[str, Any]) -> bytes:
    return (ws / "runs" / run["run_id"] / "outputs/model/canonical.npz").read_bytes()


def test_a_keras_run_killed_after_a_checkpoint_resumes_to_the_bits_of_an_uninterrupted_one(
        cpu_image: dict[str, Any]) -> None:
    ws = cpu_image["workspace"].root
    code, whole, err = cli(ws, *RUN)
    assert code == 0, err
    whole_run = whole["data"]["runs"][0]
    assert whole_run["checkpoint"] == {"every": 1} and len(whole_run["segments"]) == 1

    code, started, err = cli(ws, *RUN, "--detach")
    assert code == 0, err
    launch = started["data"]["runs"][0]
    out = Path(launch["remote_dir"]) / "out"
    name = kill_after_checkpoint(lambda: (out / "checkpoints/latest.json").is_file()
                                 and (out / "checkpoints/latest.json").read_text(),
                                 lambda: subprocess.run(["docker", "kill", launch["container"]], check=True,
                                                        capture_output=True))
    assert not (out / "model/canonical.npz").exists()
    code, pulled, err = cli(ws, "pull", launch["run_id"])  # a killed run pulls as failed (exit 137)
    assert code == ExitCode.RUN_FAILED and pulled["data"]["run"]["exit_code"] == 137, err

    code, resumed, err = cli(ws, "resume", launch["run_id"])
    assert code == 0, err
    run = resumed["data"]["run"]
    assert run["status"] == "succeeded"
    segments = run["segments"]
    assert [s["resumed_from"] for s in segments] == [None, name] and segments[0]["exit_code"] == 137
    assert segments[1]["exit_code"] == 0 and run["started_at"] == segments[0]["started_at"]
    assert canonical(ws, run) == canonical(ws, whole_run)
    for rel in ("metrics.jsonl", "fingerprints/batches.jsonl", "fingerprints/steps.jsonl",
                "fingerprints/initial_weights.json", "weights/layers.json"):
        a, b = (ws / "runs" / r["run_id"] / "outputs" / rel for r in (whole_run, run))
        assert a.read_bytes() == b.read_bytes(), rel
    log = (ws / "runs" / run["run_id"] / "outputs/logs/train.log").read_text()
    assert f"launcher: resuming from checkpoint {name}" in log

    code, verdict, err = cli(ws, "verify", "checksums", whole_run["run_id"], run["run_id"])
    assert code == 0, err
    assert verdict["data"]["verdict"] == "identical"

    code, again, err = cli(ws, "resume", run["run_id"])
    assert code == ExitCode.NOT_RESUMABLE and "finished (succeeded)" in err
    code, _, err = cli(ws, "resume", whole_run["run_id"])
    assert code == ExitCode.NOT_RESUMABLE


def test_a_run_without_checkpoints_is_not_resumable(cpu_image: dict[str, Any]) -> None:
    ws = cpu_image["workspace"].root
    code, done, err = cli(ws, "run", "mnist_convnet", "--seed", "3", "--param", "epochs=1",
                          "--param", "train_samples=128", "--param", "test_samples=32")
    assert code == 0, err
    code, _, err = cli(ws, "resume", done["data"]["runs"][0]["run_id"])
    assert code == ExitCode.NOT_RESUMABLE
    assert "was started without --checkpoint-every" in err and "Traceback" not in err


@pytest.mark.testhost
def test_a_keras_run_killed_on_the_ssh_test_host_resumes_there(testhost: TestHost,
                                                               cpu_image: dict[str, Any]) -> None:
    ws = cpu_image["workspace"].root
    code, started, err = cli(ws, *RUN, "--detach", *ssh_args(testhost))
    assert code == 0, err
    launch = started["data"]["runs"][0]
    latest = f"{launch['remote_dir']}/out/checkpoints/latest.json"
    name = kill_after_checkpoint(
        lambda: testhost.exec("sh", "-c", f"cat {latest} 2>/dev/null || true").strip(),
        lambda: testhost.exec("docker", "kill", launch["container"]))
    code, resumed, err = cli(ws, "resume", launch["run_id"])
    assert code == 0, err
    run = resumed["data"]["run"]
    assert [s["resumed_from"] for s in run["segments"]] == [None, name]
    assert run["segments"][0]["exit_code"] == 137 and run["host"]["name"] == launch["host"]["name"]
    reference = runs.read_launch(cpu_image["workspace"], run["run_id"])
    assert reference["segments"][1]["resumed_from"] == name
    local = [m for m in (ws / "runs").glob("*/manifest.json")
             if json.loads(m.read_text()).get("checkpoint") and m.parent.name != run["run_id"]
             and json.loads(m.read_text())["status"] == "succeeded"
             and len(json.loads(m.read_text())["segments"]) == 1]
    if local:  # the uninterrupted run of the test above, same seed and params: the same bits on another host
        assert canonical(ws, run) == (local[0].parent / "outputs/model/canonical.npz").read_bytes()
