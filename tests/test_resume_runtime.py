"""Checkpoints and bitwise resume in the runtime, on the host without a container (launcher.runtime.checkpoint):
mnist_torch killed with SIGKILL after its first checkpoint and resumed ends with the same bytes as an
uninterrupted run; a torch script that does not use the checkpoint api is refused before it trains.

Needs an interpreter with torch (see tests/test_runtime_torch.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_runtime_torch import REPO, torch_python

from launcher.determinism import profile_env
from launcher.runtime import checkpoint

PARAMS = json.dumps({"epochs": 4, "train_samples": 256, "test_samples": 64, "device": "cpu"})
COMPARED = ("fingerprints/initial_weights.json", "fingerprints/batches.jsonl", "fingerprints/steps.jsonl",
            "metrics.jsonl", "weights/layers.json", "model/canonical.npz", "model/model.pt",
            "checkpoints/latest.json", "checkpoints/epoch-0004/torch.pt", "checkpoints/epoch-0004/state.json",
            "checkpoints/epoch-0004/rng.json")


def argv(out: Path, target: list[str]) -> list[str]:
    return [torch_python(), "-m", "launcher.runtime", "run", *target, "--out", str(out)]


def env(**extra: str) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "TF_"))}
    full.update(profile_env("deterministic", 5))
    full.update({"PYTHONPATH": str(REPO), "LAUNCHER_CHECKPOINT_EVERY": "1", **extra})
    return full


def recipe(out: Path) -> list[str]:
    return argv(out, ["--recipe", str(REPO / "recipes/mnist_torch"), "--params", PARAMS])


@pytest.mark.slow
def test_mnist_torch_killed_after_a_checkpoint_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    # the uninterrupted run goes on beside the one that is killed (its bits are fixed by the profile)
    uninterrupted = subprocess.Popen(recipe(whole), env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
    try:
        # the runtime and its child in one process group, killed together as `docker kill` kills a container
        proc = subprocess.Popen(recipe(cut), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.monotonic() + 300
        while checkpoint.read_latest(cut) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        output, _ = uninterrupted.communicate(timeout=600)
    finally:
        uninterrupted.kill()
    assert uninterrupted.returncode == 0, output[-6000:]
    assert sorted(p.name for p in (whole / "checkpoints").iterdir()) == ["epoch-0004", "latest.json"]
    folder, state = checkpoint.read_latest(cut)  # type: ignore[misc]
    assert state["next_epoch"] < 4 and not (cut / "model/canonical.npz").exists()

    resumed = subprocess.run(recipe(cut), env=env(LAUNCHER_RESUME="1"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming from checkpoint {folder.name}" in resumed.stdout
    for rel in COMPARED:
        assert (whole / rel).read_bytes() == (cut / rel).read_bytes(), rel
    log = (cut / "logs/train.log").read_text()
    assert log.count("launcher: exit code 0") == 1 and f"resuming from checkpoint {folder.name}" in log

    again = subprocess.run(recipe(cut), env=env(LAUNCHER_RESUME="1"), capture_output=True, text=True, timeout=600)
    assert again.returncode == 45 and "finished (exit code 0): there is nothing to resume" in again.stderr


@pytest.mark.slow
def test_a_torch_script_without_the_checkpoint_api_is_refused_before_it_trains(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("import torch\nm = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "m(torch.ones(1, 2)).sum().backward()\nopt.step()\nprint('trained')\n")
    done = subprocess.run(argv(tmp_path / "out", ["--script", str(script)]), env=env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 45, done.stdout[-2000:] + done.stderr[-2000:]
    assert "api.resume_point" in done.stdout and "trained" not in done.stdout


def test_resume_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    done = subprocess.run(recipe(tmp_path / "out"), env=env(LAUNCHER_RESUME="1"), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 45
    assert "has no checkpoint (checkpoints/latest.json): the run stopped before its first one" in done.stderr
