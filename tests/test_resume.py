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
from launcher.runs.collect import read_launch

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


@pytest.fixture(scope="module")
def uninterrupted(cpu_image: dict[str, Any]) -> dict[str, Any]:
    """The manifest of mnist_convnet run to its end with checkpoints, on the local engine."""
    code, whole, err = cli(cpu_image["workspace"].root, *RUN)
    assert code == 0, err
    run: dict[str, Any] = whole["data"]["runs"][0]
    assert run["checkpoint"] == {"every": 1, "keep": "latest"} and len(run["segments"]) == 1
    return run


def start_and_kill(ws: Path, where: list[str], latest: Any, kill: Any) -> tuple[dict[str, Any], str]:
    """A run started detached and killed once its first checkpoint is there: its launch record and that checkpoint."""
    code, started, err = cli(ws, *RUN, "--detach", *where)
    assert code == 0, err
    launch: dict[str, Any] = started["data"]["runs"][0]
    return launch, kill_after_checkpoint(lambda: latest(launch), lambda: kill(launch))


def local_latest(launch: dict[str, Any]) -> str | None:
    path = Path(launch["remote_dir"]) / "out/checkpoints/latest.json"
    return path.read_text() if path.is_file() else None


def docker_kill(launch: dict[str, Any]) -> None:
    subprocess.run(["docker", "kill", launch["container"]], check=True, capture_output=True)


def test_a_keras_run_killed_after_a_checkpoint_resumes_to_the_bits_of_an_uninterrupted_one(
        cpu_image: dict[str, Any], uninterrupted: dict[str, Any]) -> None:
    ws = cpu_image["workspace"].root
    whole_run = uninterrupted
    launch, name = start_and_kill(ws, [], local_latest, docker_kill)
    assert not (Path(launch["remote_dir"]) / "out/model/canonical.npz").exists()
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

    code, _, err = cli(ws, "resume", run["run_id"])
    assert code == ExitCode.NOT_RESUMABLE and "finished (succeeded)" in err


def test_a_run_without_checkpoints_is_not_resumable(cpu_image: dict[str, Any]) -> None:
    ws = cpu_image["workspace"].root
    code, done, err = cli(ws, "run", "mnist_convnet", "--seed", "3", "--param", "epochs=1",
                          "--param", "train_samples=128", "--param", "test_samples=32")
    assert code == 0, err
    code, _, err = cli(ws, "resume", done["data"]["runs"][0]["run_id"])
    assert code == ExitCode.NOT_RESUMABLE
    assert "was started without --checkpoint-every" in err and "Traceback" not in err


@pytest.mark.testhost
def test_a_keras_run_killed_on_the_ssh_test_host_resumes_there(
        testhost: TestHost, cpu_image: dict[str, Any], uninterrupted: dict[str, Any]) -> None:
    ws = cpu_image["workspace"].root

    def latest(launch: dict[str, Any]) -> str:
        path = f"{launch['remote_dir']}/out/checkpoints/latest.json"
        return testhost.exec("sh", "-c", f"cat {path} 2>/dev/null || true").strip()

    launch, name = start_and_kill(ws, ssh_args(testhost), latest,
                                  lambda launch: testhost.exec("docker", "kill", launch["container"]))
    code, resumed, err = cli(ws, "resume", launch["run_id"])
    assert code == 0, err
    run = resumed["data"]["run"]
    assert [s["resumed_from"] for s in run["segments"]] == [None, name]
    assert run["segments"][0]["exit_code"] == 137 and run["host"]["name"] == launch["host"]["name"]
    assert read_launch(cpu_image["workspace"], run["run_id"])["segments"][1]["host"] == launch["host"]["name"]
    assert canonical(ws, run) == canonical(ws, uninterrupted)  # the same bits on the test host as here


@pytest.mark.testhost
def test_a_run_killed_here_resumes_on_the_ssh_test_host(
        testhost: TestHost, cpu_image: dict[str, Any], uninterrupted: dict[str, Any]) -> None:
    """--host another host: the outputs so far go there with the run (the image is there since the test above)."""
    ws = cpu_image["workspace"].root
    launch, name = start_and_kill(ws, [], local_latest, docker_kill)
    code, resumed, err = cli(ws, "resume", launch["run_id"], *ssh_args(testhost))
    assert code == 0, err
    run = resumed["data"]["run"]
    assert [(s["host"], s["resumed_from"]) for s in run["segments"]] == [("local", None), (testhost.spec, name)]
    assert run["host"]["name"] == testhost.spec and run["segments"][0]["exit_code"] == 137
    assert canonical(ws, run) == canonical(ws, uninterrupted)
    code, verdict, err = cli(ws, "verify", "checksums", uninterrupted["run_id"], run["run_id"])
    assert code == 0 and verdict["data"]["verdict"] == "identical", err


def test_a_moved_run_mounts_the_new_hosts_folders(tmp_path: Path) -> None:
    from launcher.hosts.engine import spec_from_argv
    from launcher.records.rundir import RunDir
    from launcher.runs.resume import moved_spec
    from launcher.specs.container import launch_spec

    # a launch record of an older launcher kept the rendered command line: it is read back as the spec it was
    argv = ["docker", "run", "-d", "--name", "launcher-r", "-e", "LAUNCHER_SEED=3", "-e", "LAUNCHER_OWNER=0:0",
            "-v", "/old/r/out:/launcher/out", "-v", "/data/x:/launcher/data:ro", "sha256:img", "python", "-m",
            "launcher.runtime", "run", "-v", "/old/r/out:/x"]
    record = tmp_path / "r"
    record.mkdir()
    (record / "launch.json").write_text(json.dumps({"run_id": "r", "group": "g", "argv": argv}))
    old = launch_spec(RunDir(record).read_launch())
    assert old == spec_from_argv(argv) and old is not None
    moved = moved_spec(old, {"/old/r/out": "/new/r/out", "/data/x": "/d/x"}, "1000:1000")
    assert [(m.source, m.target, m.read_only) for m in moved.mounts] == [
        ("/new/r/out", "/launcher/out", False), ("/d/x", "/launcher/data", True)]
    assert moved.env == {"LAUNCHER_SEED": "3", "LAUNCHER_OWNER": "1000:1000"}
    assert moved.command == ("python", "-m", "launcher.runtime", "run", "-v", "/old/r/out:/x")  # the command as it was
    assert moved_spec(old, {}, None).env == {"LAUNCHER_SEED": "3"}


def test_keras_training_that_cannot_resume_bitwise_is_refused_before_it_trains(
        cpu_image: dict[str, Any], tmp_path: Path) -> None:
    ws = cpu_image["workspace"].root
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(
        "import numpy as np, tensorflow as tf\n"
        "m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])\n"
        "m.compile(optimizer='sgd', loss='mse')\n"
        "data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4)), np.ones((8, 1)))).batch(4)\n"
        "m.fit(data, epochs=2, verbose=2)\n")
    code, out, err = cli(ws, "run", str(project / "train.py"), "--seed", "1", "--checkpoint-every", "1")
    assert code == ExitCode.RUN_FAILED, err
    run = out["data"]["runs"][0]
    assert run["exit_code"] == ExitCode.NOT_RESUMABLE == 45
    log = (ws / "runs" / run["run_id"] / "outputs/logs/train.log").read_text()
    assert "cannot checkpoint or resume bit for bit: fit() trains on a tf.data dataset" in log
    assert "Epoch 1/2" not in log
