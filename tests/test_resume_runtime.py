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


DDP = Path(__file__).parent / "fixtures/ddp/train.py"


def ddp(out: Path, port: int, *extra: str) -> list[str]:
    """The DDP fixture as 4 ranks on this machine (torchrun, Gloo over loopback), 4 epochs of 6 steps through
    launcher's micro-batches (dropout keyed by the step and the micro-batch): a world above 2, where the order in
    which the ranks' gradients are added shows in the bits."""
    return [torch_python(), "-m", "launcher.runtime", "run", "--script", str(DDP), "--out", str(out),
            "--procs-per-node", "4", "--master", f"127.0.0.1:{port}", "--", "--epochs", "4", "--micro", "4", *extra]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_every_rank_resumes_from_the_checkpoint_they_all_hold_to_the_bits_of_an_uninterrupted_run(
        tmp_path: Path) -> None:
    """Rank 1 of 4 dies in epoch 3 (after every rank wrote epoch-0002), and, as if it had died while writing
    epoch-0002, its copy is taken away: the others still hold epoch-0001 beside their latest (a rank of several
    keeps the checkpoint before the latest), so all resume from epoch-0001 and end with the bits of a run never
    stopped: the whole gradient summed in parameter order (DDP's first step after the resume adds it as the run never
    stopped did), the micro-batches' dropout keyed from the checkpoint's step on."""
    from launcher.runs.resume import common_checkpoint

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    ranks_env = env(LAUNCHER_TRACE_EVERY="4", GLOO_SOCKET_IFNAME="lo")
    done = subprocess.run(ddp(whole, free_port()), env=ranks_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert checkpoint.checkpoint_names(whole) == ["epoch-0003", "epoch-0004"]  # the latest and the one before

    died = subprocess.run(ddp(cut, free_port(), "--die-rank", "1", "--die-step", "14"), env=ranks_env,
                          capture_output=True, text=True, timeout=300)
    assert died.returncode != 0 and "rank 1 dies after step 14" in (cut / "ranks/1/logs/train.log").read_text()
    rank1 = cut / "ranks/1"
    assert checkpoint.checkpoint_names(cut) == checkpoint.checkpoint_names(rank1) == ["epoch-0001", "epoch-0002"]
    (rank1 / "checkpoints/epoch-0002").rename(rank1 / "checkpoints/.epoch-0002.partial")
    (rank1 / "checkpoints/latest.json").write_text('{"name": "epoch-0001"}\n')
    held = {r: set(checkpoint.checkpoint_names(cut if r == 0 else cut / f"ranks/{r}")) for r in range(4)}
    name = common_checkpoint(held, {"run_id": "r"})  # type: ignore[typeddict-item]
    assert name == "epoch-0001"

    resumed = subprocess.run(ddp(cut, free_port(), "--die-rank", "1", "--die-step", "14"),
                             env={**ranks_env, "LAUNCHER_RESUME": "1", "LAUNCHER_RESUME_FROM": name},
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for rel in ("model.pt", "fingerprints/steps.jsonl", "ranks/1/fingerprints/steps.jsonl",
                "checkpoints/epoch-0004/torch.pt", "checkpoints/epoch-0004/state.json",
                "ranks/1/checkpoints/epoch-0004/torch.pt", "ranks/1/checkpoints/epoch-0004/rng.json"):
        assert (whole / rel).read_bytes() == (cut / rel).read_bytes(), rel
    log = (rank1 / "logs/train.log").read_text()  # a rank's log goes on across the resume
    assert "rank 1 dies after step 14" in log and "restored checkpoint epoch-0001" in log
    ends = json.loads((cut / "_launcher/ranks.json").read_text())["ranks"]
    assert [e["exit_code"] for e in ends] == [0, 0, 0, 0]

    again = subprocess.run(ddp(cut, free_port()), env={**ranks_env, "LAUNCHER_RESUME": "1",
                                                         "LAUNCHER_RESUME_FROM": "../../etc"},
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 45, again.stderr  # a name that is not a checkpoint's is no path to follow
    assert "has no checkpoint '../../etc' (checkpoints/)" in again.stderr
