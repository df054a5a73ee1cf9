"""Step fingerprints (launcher.runtime.steps): digests of the weights while training, and verify saying
at which step two runs part.

The PyTorch tests run a plain script shaped like the PyTorch examples' MNIST (its own model class,
a shuffled DataLoader, an optimizer loop, a test pass after each epoch; nothing of launcher in it)
through the real runtime on this machine, as tests/test_runtime_torch.py does; the Keras test runs
in the TensorFlow image (tests/test_runs_tf.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runfactory import adopt_outputs, make_workspace, pair
from test_runtime_torch import REPO, torch_python
from test_verify_records import conforms
from typer.testing import CliRunner

from launcher.cli import app
from launcher.determinism import profile_env
from launcher.errors import ExitCode, UsageError
from launcher.records.manifest import load_manifest
from launcher.runtime import steps
from launcher.specs.request import trace_option
from launcher.verify.stepdiff import StepsDiff, StepsStrip, steps_diff, steps_strip
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace

runner = CliRunner()

# 96 samples in batches of 16: 6 optimizer steps an epoch.
TORCH_SCRIPT = """\
import argparse, os
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--part-at", type=int, default=0, help="after this step, nudge a weight by OS noise")
parser.add_argument("--save-model", action="store_true")
args = parser.parse_args()
g = torch.Generator().manual_seed(0)
x = torch.randn(96, 8, generator=g)
y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
test = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=32)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
for epoch in range(1, args.epochs + 1):
    model.train()
    for xb, yb in train:
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        step += 1
        if step == args.part_at:
            with torch.no_grad():
                model.fc2.weight[0, 0] += (1 + os.urandom(1)[0]) * 1e-6
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(xb).argmax(1) == yb).sum()) for xb, yb in test)
    print(f"epoch {epoch}: test accuracy {correct / 32:.3f}")
if args.save_model:
    torch.save(model.state_dict(), "mnist_cnn.pt")
"""


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / steps.STEPS).read_text().splitlines()]


# ---------------------------------------------------------------- the record itself


def test_a_trace_records_step_zero_every_n_steps_and_each_epoch_end(tmp_path: Path) -> None:
    w = [np.zeros(3, np.float32)]
    layers = lambda: [("dense", w), ("dense", [np.ones(2)]), ("out", [])]  # noqa: E731
    trace = steps.StepTrace(tmp_path / "steps.jsonl", 4)
    trace.start(layers)
    for s in range(1, 11):
        w[0] = w[0] + 1
        trace.stepped(s, layers, loss=np.float32(0.5))
        if s in (5, 10):
            trace.boundary(layers, epoch=s // 5 - 1)
    rows = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 4, 5, 8, 10]
    assert [r.get("epoch") for r in rows] == [None, None, 0, None, 1]
    assert list(rows[0]["layers"]) == ["dense", "dense#2", "out"]
    assert rows[1]["loss"] == 0.5 and rows[0]["digest"] != rows[1]["digest"]
    assert rows[1]["layers"]["dense#2"] == rows[0]["layers"]["dense#2"]  # a layer that did not move


def test_off_records_nothing_and_the_option_is_checked(tmp_path: Path) -> None:
    trace = steps.StepTrace(tmp_path / "steps.jsonl", steps.parse_every("off"))
    trace.start(lambda: [("a", [np.zeros(1)])])
    trace.stepped(1, lambda: [("a", [np.zeros(1)])])
    trace.boundary(lambda: [("a", [np.zeros(1)])])
    assert not (tmp_path / "steps.jsonl").exists()
    assert [trace_option(t) for t in (None, "epoch", "OFF", "25")] == ["epoch", "epoch", "off", "25"]
    for bad in ("0", "-3", "often"):
        with pytest.raises(UsageError, match=rf"--trace-every {bad}: not a number of steps"):
            trace_option(bad)


def test_a_bad_trace_option_stops_run_before_anything_starts(tmp_path: Path) -> None:
    r = runner.invoke(app, ["--workspace", str(make_workspace(tmp_path / "ws")), "run", "mnist_convnet",
                            "--trace-every", "0"])
    assert r.exit_code == ExitCode.USAGE
    assert "--trace-every 0: not a number of steps" in r.stderr and "Traceback" not in r.stderr
    assert not any((tmp_path / "ws" / "runs").iterdir())


# ---------------------------------------------------------------- verify on made-up records


def _write_steps(run_dir: Path, rows: list[tuple[int, dict[str, str]]]) -> None:
    out = run_dir / "outputs" / steps.STEPS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"step": s, "digest": "d" + "".join(layers.values()), "layers": layers}) + "\n"
                           for s, layers in rows))


def test_verify_says_where_two_runs_part(tmp_path: Path) -> None:
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    a, b = pair(ws.runs, unseeded_dropout=True, dropout_entropy=5)
    same = {"conv": "1", "dense": "2"}
    _write_steps(a, [(0, same), (10, same), (20, same), (30, same)])
    _write_steps(b, [(0, same), (10, same), (15, same), (20, {"conv": "1", "dense": "x"}),
                     (30, {"conv": "y", "dense": "z"})])
    got = steps_diff(load_manifest(a), load_manifest(b))
    assert got is not None
    assert conforms(got, StepsDiff) == []
    assert conforms(steps_strip(load_manifest(a), load_manifest(b)), StepsStrip) == []
    assert (got["same"], got["steps_compared"], got["agree_until"], got["parts_by"]) == (False, 4, 10, 20)
    assert got["layers_differing"] == ["dense"] and got["first_layer"] == "dense" and got["layers_total"] == 2
    report = verify_checksums(ws, [a.name, b.name])
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE
    r = runner.invoke(app, ["--workspace", str(ws.root), "verify", "checksums", a.name, b.name])
    assert "training steps: weights agree up to step 10 and part by step 20 (first layer dense); 1 of 2 layers " \
           "differ there; run both again with --trace-every N (N < 10) to narrow it" in r.stdout
    r = runner.invoke(app, ["--workspace", str(ws.root), "--json", "verify", "checksums", a.name, b.name])
    doc = json.loads(r.stdout)
    assert doc["data"]["explanations"][b.name]["steps"]["parts_by"] == 20
    # the report draws it: a strip of the steps recorded in both runs, and the layers where they part
    from launcher.report.assemble import write_report

    report = write_report(ws, ["g1"])
    steps_doc = json.loads((report.directory / "report.json").read_text())["comparisons"]["g1"]["runs"][0]["steps"]
    assert steps_doc["strip"] == [{"step": 0, "agree": True}, {"step": 10, "agree": True},
                                  {"step": 20, "agree": False}, {"step": 30, "agree": False}]
    assert steps_doc["parts_by"] == 20
    assert steps_doc["layers"] == [{"layer": "conv", "agree": True}, {"layer": "dense", "agree": False}]
    page = (report.directory / "index.html").read_text()
    assert page.count('class="st"') == 4 and 'title="step 20: differ"' in page
    assert "layers at step 20, where they first differ:" in page


# ---------------------------------------------------------------- a PyTorch script launcher did not write


def _run_torch(out: Path, script: Path, *args: str, trace: str | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "TF_"))}
    env.update(profile_env("deterministic", 1))
    env["PYTHONPATH"] = str(REPO)
    if trace:
        env[steps.ENV] = trace
    argv = [torch_python(), "-m", "launcher.runtime", "run", "--script", str(script), "--out", str(out), "--", *args]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def _run_torch_twice(outs: tuple[Path, Path], script: Path, *args: str, trace: str | None = None) -> None:
    """The same run twice, side by side: most of one is Python importing torch, on one core (the bits do
    not depend on it: the profile fixes the thread count)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(_run_torch, out, script, *args, trace=trace) for out in outs]:
            future.result()


@pytest.mark.slow
def test_a_torch_script_is_fingerprinted_at_each_epoch_without_a_line_of_launcher(tmp_path: Path) -> None:
    script = tmp_path / "code" / "main.py"
    script.parent.mkdir()
    script.write_text(TORCH_SCRIPT)
    _run_torch_twice((tmp_path / "a", tmp_path / "b"), script, "--epochs", "3")
    rows = _rows(tmp_path / "a")
    # step 0, then each epoch's end (found when the test pass opens its DataLoader), named by the model's layers
    assert [(r["step"], r.get("epoch")) for r in rows] == [(0, None), (6, 0), (12, 1), (18, 2)]
    assert list(rows[0]["layers"]) == ["fc1", "fc2"]
    assert (tmp_path / "a" / steps.STEPS).read_bytes() == (tmp_path / "b" / steps.STEPS).read_bytes()
    assert len({r["digest"] for r in rows}) == 4


@pytest.mark.slow
def test_two_torch_runs_nudged_at_step_9_part_between_8_and_10(tmp_path: Path) -> None:
    script = tmp_path / "code" / "main.py"
    script.parent.mkdir()
    script.write_text(TORCH_SCRIPT)
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    ids = []
    _run_torch_twice((tmp_path / "o1", tmp_path / "o2"), script, "--part-at", "9", "--save-model", trace="2")
    for n in (1, 2):
        out = tmp_path / f"o{n}"
        run_id = f"20261125T10000{n}-main.py-00000{n}"
        adopt_outputs(ws.runs, run_id, out, recipe="main.py", seed=1, replicate=n - 1)
        ids.append(run_id)
    rows = _rows(ws.runs / ids[0] / "outputs")
    assert [r["step"] for r in rows] == [0, 2, 4, 6, 8, 10, 12]  # every 2 steps; the epoch ends fall on them
    r = runner.invoke(app, ["--workspace", str(ws.root), "--json", "verify", "checksums", *ids])
    doc = json.loads(r.stdout)
    assert r.exit_code == ExitCode.NOT_REPRODUCIBLE, r.stdout
    exp = doc["data"]["explanations"][ids[1]]
    got = exp["steps"]
    assert (got["agree_until"], got["parts_by"], got["epoch"]) == (8, 10, None)
    assert got["layers_differing"] == ["fc1", "fc2"]
    assert "weights agree up to step 8 and part by step 10" in exp["classification"]["line"]


# ---------------------------------------------------------------- operation traces (launcher diverge's runtime part)

# One thread until step 4, then the thread count launcher gave the run. The norm layer divides by a sum
# over the whole batch (16 x 4096 values), which torch splits across threads: its last bits depend on them.
THREADS_SCRIPT = """\
import os
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Norm(nn.Module):
    def forward(self, h):
        return h / h.abs().sum() * h.numel()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 4096)
        self.norm = Norm()
        self.fc2 = nn.Linear(4096, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.norm(self.fc1(x))))


torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x = torch.randn(96, 8, generator=g)
y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
for epoch in range(2):
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        step += 1
        if step == 4:
            torch.set_num_threads(int(os.environ.get("LAUNCHER_THREADS", "1")))
torch.save(model.state_dict(), "model.pt")
"""


@pytest.mark.slow
def test_a_thread_count_taking_effect_after_step_4_is_traced_to_the_norm_layer_on_step_5(tmp_path: Path) -> None:
    from launcher.runtime.optrace import ENV as OPTRACE
    from launcher.verify.opdiff import OpDifference, compare_traces, op_phrase

    script = tmp_path / "code" / "main.py"
    script.parent.mkdir()
    script.write_text(THREADS_SCRIPT)
    outs = []
    for threads in (1, 2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "TF_"))}
        env.update(profile_env("deterministic", 1, threads))
        env.update({"PYTHONPATH": str(REPO), OPTRACE: "3:6"})
        out = tmp_path / f"t{threads}"
        res = subprocess.run([torch_python(), "-m", "launcher.runtime", "run", "--script", str(script), "--out",
                              str(out)], env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        outs.append(out)
    rows = [json.loads(line) for line in (outs[0] / "optrace/ops.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [3, 4, 5, 6]
    step3 = [(r["kind"], r["name"]) for r in rows if r["step"] == 3]
    state = [("fc1", "fc1.weight"), ("fc1", "fc1.bias"), ("fc2", "fc2.weight"), ("fc2", "fc2.bias")]
    # the weights as the first forward call reads them, then each layer in the order called
    assert [(r.get("layer"), r["name"]) for r in rows if r["step"] == 3 and r["kind"] == "weights"] == state
    assert step3[4:10] == [("input", "fc1"), ("output", "fc1"), ("input", "norm"), ("output", "norm"),
                           ("input", "fc2"), ("output", "fc2")]
    assert step3[10:16] == [("input", "Net"), ("output", "Net"), ("grad", "fc2.bias"), ("grad", "fc2.weight"),
                            ("grad", "fc1.bias"), ("grad", "fc1.weight")]  # the whole model last; backward's order
    assert [(r.get("layer"), r["name"]) for r in rows if r["step"] == 3 and r["kind"] == "updated"] == state
    d = compare_traces(outs[0], outs[1])
    assert conforms(d, OpDifference) == []
    assert d["found"] and (d["step"], d["kind"], d["name"], d["input_agrees"]) == (5, "output", "norm", True), d
    assert d["size"]["differing"] > 0 and 0 < d["size"]["max_abs_diff"] < 1e-3
    assert "step 5: the output of norm differs first while its input and the weights agree" in op_phrase(d)


def test_diverge_refuses_what_it_cannot_localise_and_says_when_runs_agree(tmp_path: Path) -> None:
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    a, b = pair(ws.runs, unseeded_dropout=True, dropout_entropy=5)
    base = ["--workspace", str(ws.root), "diverge"]
    r = runner.invoke(app, [*base, a.name, a.name])
    assert r.exit_code == ExitCode.USAGE and "diverge needs two different runs" in r.stderr
    r = runner.invoke(app, [*base, a.name, b.name])  # made before step fingerprints existed
    assert r.exit_code == ExitCode.USAGE and "no step fingerprints in common" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    same = {"conv": "1", "dense": "2"}
    _write_steps(a, [(0, same), (10, same)])
    _write_steps(b, [(0, same), (10, same)])
    r = runner.invoke(app, [*base, a.name, b.name])  # nothing to re-execute
    assert r.exit_code == 0 and "weights agree at all 2 recorded steps" in r.stdout
    assert not [d for d in ws.runs.iterdir() if d.name not in (a.name, b.name)]


def test_the_causes_tried_follow_what_differs_between_the_runs(tmp_path: Path) -> None:
    from launcher.workflows.diverge import candidates

    local = {"host_options": {"spec": None}, "placement": {"kind": "direct"}}
    remote = {"host_options": {"spec": "ssh://gpu1"}, "placement": {"kind": "direct"}}

    def names(where: str, second_launch: dict[str, Any] = local, **second: Any) -> list[str]:
        a, b = pair(tmp_path / where, **second)
        return [c.name for c in candidates(load_manifest(a), load_manifest(b), local, second_launch)]

    assert names("same") == ["threads 1 for both"]  # nothing differs: one thread for both
    assert names("threads", threads=4) == ["threads 2 (the reference's)"]
    assert names("more", remote, threads=4, profile="seeded") == [
        "threads 2 (the reference's)", "profile deterministic (the reference's)", "the reference's host"]
    _, seeded = pair(tmp_path / "seeded", profile="seeded")
    both = candidates(load_manifest(seeded), load_manifest(seeded), local, local)  # both seeded, nothing differs
    assert [(c.name, c.both) for c in both] == [("deterministic ops for both (profile deterministic)", True)]


@pytest.mark.slow
def test_a_loop_that_updates_its_parameters_by_hand_is_fingerprinted_by_its_backward_calls(tmp_path: Path) -> None:
    script = tmp_path / "code" / "main.py"
    script.parent.mkdir()
    # PyTorch's word-language-model example's default: no optimizer, p.data.add_(p.grad, alpha=-lr)
    script.write_text(TORCH_SCRIPT.replace("opt.zero_grad()", "model.zero_grad()").replace(
        "opt.step()", "[p.data.add_(p.grad, alpha=-0.1) for p in model.parameters()]").replace(
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n", ""))
    assert "optim" not in script.read_text()
    _run_torch_twice((tmp_path / "a", tmp_path / "b"), script, "--save-model", trace="4")
    rows = _rows(tmp_path / "a")
    # step 0, every 4 backward calls, each epoch's end (the test pass opens its DataLoader), the last update
    assert [(r["step"], r.get("epoch")) for r in rows] == [(0, None), (4, None), (6, 0), (8, None), (12, 1)]
    assert list(rows[0]["layers"]) == ["fc1", "fc2"]
    assert (tmp_path / "a" / steps.STEPS).read_bytes() == (tmp_path / "b" / steps.STEPS).read_bytes()
    # the last row is the trained model
    import torch

    saved = torch.load(tmp_path / "a" / "mnist_cnn.pt")
    final = steps.layer_digests([("fc1", [saved["fc1.weight"], saved["fc1.bias"]]),
                                 ("fc2", [saved["fc2.weight"], saved["fc2.bias"]])])
    assert rows[-1]["layers"] == final


def test_a_loop_that_reports_its_steps_is_fingerprinted_and_traced_leaf_by_leaf(tmp_path: Path) -> None:
    """launcher.runtime.api.record_step's part (a JAX loop's, here with a plain pytree reader): a row every
    N steps and at each epoch's end, and on a diverge re-execution each leaf after each update in the window."""
    from launcher.runtime.optrace import OpTrace
    from launcher.verify.opdiff import read_ops

    def layers(params: dict[str, dict[str, Any]]) -> list[tuple[str, list[Any]]]:
        return [(f"['{k}']", list(v.values())) for k, v in params.items()]

    def leaves(params: dict[str, dict[str, Any]]) -> list[tuple[str, str, Any]]:
        return [(f"['{k}']", f"['{k}']['{n}']", a) for k, v in params.items() for n, a in v.items()]

    trace = steps.StepTrace(tmp_path / steps.STEPS, 3)
    ops = OpTrace(tmp_path, (4, 5))
    loop = steps.PytreeSteps(trace, layers, leaves, ops)
    params = {"hidden": {"b": np.zeros(2, np.float32), "w": np.ones((2, 2), np.float32)}}
    trace.start(lambda: layers(params))
    for step in range(1, 9):
        params = {"hidden": {"b": params["hidden"]["b"] + 1, "w": params["hidden"]["w"]}}
        loop.stepped(params, loss=np.float32(1.0 / step))
        if step % 4 == 0:
            loop.boundary(epoch=step // 4 - 1)
    rows = _rows(tmp_path)
    assert [(r["step"], r.get("epoch")) for r in rows] == [(0, None), (3, None), (4, 0), (6, None), (8, 1)]
    assert list(rows[0]["layers"]) == ["['hidden']"] and rows[1]["loss"] == pytest.approx(1 / 3)
    traced = read_ops(tmp_path)
    assert sorted(traced) == [4, 5]
    assert [(r["kind"], r["name"], r.get("layer")) for _, r in traced[4].rows] == [
        ("updated", "['hidden']['b']", "['hidden']"), ("updated", "['hidden']['w']", "['hidden']")]
    info = json.loads((tmp_path / "optrace/trace.json").read_text())
    assert (info["framework"], info["operations"]) == ("jax", False)
