"""A variant beyond cpu/gpu, for real: the PyTorch CPU image built from lockfiles/torch-cpu.txt, mnist_torch
run in it twice (its recipe names the variant) and verified bit-identical, and a scaffolded torch recipe
run end to end. PyTorch's CPU wheel comes only from download.pytorch.org, which these machines cannot
reach; the test hands the wheel in from a folder (--find-links), where its locked sha256 is checked."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from typer.testing import CliRunner

from launcher.cli import app
from launcher.images.lock import parse_lock
from launcher.workspace import Workspace

pytestmark = [pytest.mark.tfimage]
WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def cli(ws: Workspace, *args: str) -> dict:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def torch_wheels() -> Path:
    folder = Path(os.environ.get("LAUNCHER_TEST_WHEELS", "/opt/wheels"))
    need((folder / WHEEL).is_file(), f"no {WHEEL} in {folder} (set LAUNCHER_TEST_WHEELS to a folder holding it; "
         "download.pytorch.org serves it)")
    return folder


def test_the_committed_torch_lock_pins_the_official_cpu_wheel(repo_workspace: Workspace) -> None:
    text = repo_workspace.lock_txt("torch-cpu").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu\n" in text
    torch = {r.name: r for r in parse_lock(text)}["torch"]
    # the sha256 download.pytorch.org/whl/cpu lists for this wheel
    assert torch.version == "2.13.0+cpu"
    assert torch.hashes == ("6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b",)
    gpu = {r.name: r for r in parse_lock(repo_workspace.lock_txt("torch-gpu").read_text())}
    assert gpu["torch"].version == "2.13.0" and any(n.startswith("nvidia-") for n in gpu)
    assert not repo_workspace.needs_gpu("torch-cpu") and repo_workspace.needs_gpu("torch-gpu")


@pytest.fixture(scope="module")
def torch_ws(make_workspace: Callable[[Path], Workspace], torch_wheels: Path,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, dict[str, Any]]:
    """A workspace with the torch-cpu image built from the committed lock (the wheel from a folder)."""
    ws = make_workspace(tmp_path_factory.mktemp("torchws") / "ws")
    built = cli(ws, "build", "--variant", "torch-cpu", "--find-links", str(torch_wheels))["data"]
    return ws, built


def test_mnist_torch_in_the_torch_cpu_image_twice_is_bit_identical(torch_ws: tuple[Workspace, dict[str, Any]]) -> None:
    ws, built = torch_ws
    assert built["labels"]["org.launcher.variant"] == "torch-cpu"
    # no --variant: mnist_torch's recipe.toml says torch-cpu
    cli(ws, "run", "mnist_torch", "--runs", "2", "--seed", "7", "--param", "epochs=2",
        "--param", "batch_size=32", "--param", "learning_rate=1.0")
    manifests = [json.loads(p.read_text()) for p in sorted(ws.runs.glob("*mnist_torch*/manifest.json"))]
    assert len(manifests) == 2
    for m in manifests:
        assert m["status"] == "succeeded" and m["image"]["variant"] == "torch-cpu"
        assert m["image"]["id"] == built["image_id"]
        assert m["runtime"]["framework"]["version"] == "2.13.0+cpu"
    verdict = cli(ws, "verify", "checksums", *(m["run_id"] for m in manifests))["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]
    epochs = [json.loads(line) for line in (ws.runs / manifests[0]["run_id"] / "outputs" / "metrics.jsonl")
              .read_text().splitlines() if line.strip()]
    assert epochs[-1]["val_accuracy"] > 0.5  # it learned (chance is 0.1)

    # a recipe made with `recipes new --framework torch` names the torch image and runs there as it is
    cli(ws, "recipes", "new", "tiny_torch", "--framework", "torch")
    assert 'variant = "torch-cpu"' in (ws.recipes / "tiny_torch" / "recipe.toml").read_text()
    out = cli(ws, "run", "tiny_torch", "--param", "epochs=1")
    assert out["ok"], out
    made = json.loads(next((ws.runs).glob("*tiny_torch*/manifest.json")).read_text())
    assert made["status"] == "succeeded" and made["image"]["variant"] == "torch-cpu"


# The shape of the PyTorch examples' MNIST script: argparse, a convnet, no seed of its own, the test
# accuracy printed, and the model saved only with --save-model. (Digits from scikit-learn: no downloads.)
EXAMPLE_SHAPED = '''import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        x = self.drop(F.relu(self.conv(x)))
        return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


def main():
    parser = argparse.ArgumentParser(description="digits, the MNIST example's way")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--save-model", action="store_true", default=False)
    args = parser.parse_args()
    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target)
    train = torch.utils.data.TensorDataset(x[:1500], y[:1500])
    loader = torch.utils.data.DataLoader(train, batch_size=64, shuffle=True)
    model = Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        model.train()
        for data, target in loader:
            opt.zero_grad()
            F.nll_loss(model(data), target).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        correct = model(x[1500:]).argmax(1).eq(y[1500:]).sum().item()
    print(f"Test set: Accuracy: {correct}/{len(y) - 1500}")
    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == "__main__":
    main()
'''


def test_a_script_that_saves_nothing_is_proven_by_its_weight_digests_and_saving_the_model_too(
        torch_ws: tuple[Workspace, dict[str, Any]], tmp_path: Path) -> None:
    ws, _ = torch_ws
    script = tmp_path / "mnist_example" / "main.py"
    script.parent.mkdir()
    script.write_text(EXAMPLE_SHAPED)
    for profile, code in (("off", 3), ("deterministic", 0)):
        # no --variant: the script imports torch, which the default cpu image lacks; torch-cpu has it
        runs = cli(ws, "run", str(script), "--runs", "2", "--determinism", profile,
                   "--", "--epochs", "1")["data"]["runs"]
        assert all(r["runtime"]["frameworks"] == ["torch"] and r["image"]["variant"] == "torch-cpu" for r in runs)
        res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", "verify", "checksums",
                                       *(r["run_id"] for r in runs)])
        doc = json.loads(res.stdout)
        assert res.exit_code == code, (profile, doc["summary"])
        if profile == "off":  # unseeded, the trained weights differ: their digests show it (they once hid it)
            assert "differ from" in doc["summary"] and "by launcher's weight digests (nondeterminism)" in doc["summary"]
            assert "weights already differ at step 0" in doc["summary"] and "module Net" in doc["summary"]
        else:  # launcher fingerprinted the trained weights: those digests are what training produced
            assert doc["summary"].startswith("identical by launcher's weight digests at step "), doc["summary"]
            assert "(module Net, optimizer " in doc["summary"]
    saved = cli(ws, "run", str(script), "--runs", "2", "--variant", "torch-cpu", "--",
                "--epochs", "1", "--save-model")["data"]["runs"]
    verdict = cli(ws, "verify", "checksums", *(r["run_id"] for r in saved))["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]


def test_diverge_names_the_step_the_layer_and_the_thread_count_in_the_torch_image(
        torch_ws: tuple[Workspace, dict[str, Any]], tmp_path: Path) -> None:
    from test_step_trace import THREADS_SCRIPT  # one thread until step 4, then the run's thread count

    ws, _ = torch_ws
    script = tmp_path / "threads_late" / "main.py"
    script.parent.mkdir()
    script.write_text(THREADS_SCRIPT)
    ids = [cli(ws, "run", str(script), "--threads", t, "--trace-every", "2")["data"]["runs"][0]["run_id"]
           for t in ("1", "2")]
    d = cli(ws, "diverge", *ids)["data"]
    assert (d["steps"]["agree_until"], d["steps"]["parts_by"]) == (4, 6), d["steps"]
    first = d["first_difference"]
    assert d["window"] == [5, 6] and (first["step"], first["kind"], first["name"]) == (5, "output", "norm"), first
    assert first["input_agrees"] is True and 0 < first["size"]["max_abs_diff"] < 1e-3
    assert d["cause"] == "threads 1 (the reference's)" and [c["agrees"] for c in d["candidates"]] == [True]
    assert "cause: threads 1 (the reference's) makes step 5 agree" in d["lines"]


@pytest.mark.docker
@pytest.mark.image
@pytest.mark.slow
def test_diverge_names_an_edit_of_param_data_outside_the_traced_operations_in_the_torch_image(
        torch_ws: tuple[Workspace, dict[str, Any]], tmp_path: Path) -> None:
    """A plain loop adds 0.25 to one weight of fc1 with param.data after optimizer step 3, a weight whose input
    is always zero: no layer's input, output or gradient ever differs, the weights do from step 4 on."""
    from test_diverge_outside import EDIT_SCRIPT

    ws, _ = torch_ws
    script = tmp_path / "edited" / "main.py"
    script.parent.mkdir()
    script.write_text(EDIT_SCRIPT)
    ids = [cli(ws, "run", str(script), "--trace-every", "2", *extra)["data"]["runs"][0]["run_id"]
           for extra in ([], ["--", "--edit-at", "3"])]
    d = cli(ws, "diverge", *ids)["data"]
    assert (d["steps"]["agree_until"], d["steps"]["parts_by"], d["window"]) == (2, 4, [3, 4]), d["steps"]
    assert [c["repeats"] for c in d["checks"]] == [True, True]
    assert (d["exact"]["agree_until"], d["exact"]["parts_by"], d["exact"]["first_layer"]) == (3, 4, "fc1")
    first = d["first_difference"]
    assert (first["step"], first["kind"], first["name"], first["changed_in"]) == (4, "weights", "fc1.weight",
                                                                                  ["run"]), first
    assert first["size"]["differing"] == 1 and first["size"]["max_abs_diff"] == pytest.approx(0.25, rel=1e-6)
    assert d["cause"] == "a change the code made to the weights outside the traced operations" and not d["candidates"]
    assert ("step 4: the weights of layer fc1 changed between the optimizer update of step 3 and the forward pass of "
            "step 4 outside the traced operations (a callback, a constraint, a direct assignment), in " + ids[1]
            + "; 1 of 128 elements of fc1.weight differ, max |Δ| 0.25") in "\n".join(d["lines"])


def test_mnist_torch_killed_in_its_container_resumes_to_the_bits_of_an_uninterrupted_run(
        torch_ws: tuple[Workspace, dict[str, Any]]) -> None:
    """`run --checkpoint-every 1`, `docker kill` after the first checkpoint, `resume`: the same model bytes
    as the same run uninterrupted (mnist_torch calls api.resume_point and api.checkpoint)."""
    import subprocess
    import time

    ws, _ = torch_ws
    run = ["run", "mnist_torch", "--seed", "7", "--checkpoint-every", "1", "--param", "epochs=3",
           "--param", "batch_size=32", "--param", "train_samples=512", "--param", "test_samples=64"]
    whole = cli(ws, *run)["data"]["runs"][0]
    launch = cli(ws, *run, "--detach")["data"]["runs"][0]
    latest = Path(launch["remote_dir"]) / "out/checkpoints/latest.json"
    deadline = time.monotonic() + 300
    while not latest.is_file():
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.05)
    subprocess.run(["docker", "kill", launch["container"]], check=True, capture_output=True)
    assert not (Path(launch["remote_dir"]) / "out/model/canonical.npz").exists()
    name = json.loads(latest.read_text())["name"]
    resumed = cli(ws, "resume", launch["run_id"])["data"]["run"]
    assert resumed["status"] == "succeeded"
    assert [s["resumed_from"] for s in resumed["segments"]] == [None, name]
    assert resumed["segments"][0]["exit_code"] == 137
    for rel in ("model/canonical.npz", "model/model.pt", "metrics.jsonl", "fingerprints/batches.jsonl"):
        a, b = (ws.runs / r["run_id"] / "outputs" / rel for r in (whole, resumed))
        assert a.read_bytes() == b.read_bytes(), rel
    verdict = cli(ws, "verify", "checksums", whole["run_id"], resumed["run_id"])["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]
