"""Changes to the weights outside the traced operations (launcher.runtime.optrace, launcher.verify.opdiff):
a plain PyTorch loop that edits ``param.data`` after a known step, traced as `launcher diverge` traces
its re-executions, on this machine's PyTorch (as tests/test_step_trace.py does).

The loop's first input feature is always zero, so the weight it edits never acts on the forward pass:
every layer's input, output and gradient agrees between an edited and an unedited run, while the
weights (and so the step fingerprints) differ from the step after the edit on. Only the weights the
forward pass reads show it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_runtime_torch import REPO, torch_python
from test_verify_records import conforms

from launcher.determinism import profile_env
from launcher.runtime import optrace, steps
from launcher.verify.opdiff import OpDifference, compare_traces, op_phrase, read_ops

pytestmark = [pytest.mark.slow]

# 64 samples in batches of 16: 4 optimizer steps an epoch, 2 epochs.
EDIT_SCRIPT = """\
import argparse
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
parser.add_argument("--edit-at", type=int, default=0, help="after this optimizer step, add 0.25 to one weight")
parser.add_argument("--column", type=int, default=0, help="the input feature the edited weight reads")
args = parser.parse_args()
g = torch.Generator().manual_seed(0)
x = torch.randn(64, 8, generator=g)
x[:, 0] = 0  # the first feature is always zero: a weight reading it never acts
y = (x[:, 1] > 0).long() + (x[:, 2] > 0).long()
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
for epoch in range(2):
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True):
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        step += 1
        if step == args.edit_at:
            model.fc1.weight.data[0, args.column] += 0.25
"""


def traced_run(out: Path, script: Path, *args: str, window: str = "2:6") -> Path:
    """The script run by the runtime as a diverge re-execution runs: every step fingerprinted, the window traced."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "TF_"))}
    env.update(profile_env("deterministic", 1, 1))
    env.update({"PYTHONPATH": str(REPO), steps.ENV: "1", optrace.ENV: window})
    argv = [torch_python(), "-m", "launcher.runtime", "run", "--script", str(script), "--out", str(out), "--", *args]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def edited(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One unedited run, and runs editing a dead weight (column 0) and a live one (column 1) after step 3."""
    root = tmp_path_factory.mktemp("edited")
    script = root / "code" / "main.py"
    script.parent.mkdir()
    script.write_text(EDIT_SCRIPT)
    return {"plain": traced_run(root / "plain", script),
            "dead": traced_run(root / "dead", script, "--edit-at", "3", "--column", "0"),
            "live": traced_run(root / "live", script, "--edit-at", "3", "--column", "1")}


def fingerprints(out: Path) -> dict[int, dict[str, str]]:
    rows = [json.loads(line) for line in (out / steps.STEPS).read_text().splitlines()]
    return {r["step"]: r["layers"] for r in rows}


def test_the_fingerprints_part_at_the_step_after_the_edit(edited: dict[str, Path]) -> None:
    plain, dead = fingerprints(edited["plain"]), fingerprints(edited["dead"])
    assert sorted(plain) == list(range(9)) and sorted(dead) == list(range(9))
    assert [s for s in plain if plain[s] != dead[s]] == [4, 5, 6, 7, 8]
    assert plain[4]["fc2"] == dead[4]["fc2"] and plain[4]["fc1"] != dead[4]["fc1"]  # only fc1 moved


def test_an_edit_the_forward_pass_never_feels_is_named_not_called_agreement(edited: dict[str, Path]) -> None:
    """The false assurance: every layer's input, output and gradient agrees, the weights do not."""
    d = compare_traces(edited["plain"], edited["dead"])
    assert d["found"], op_phrase(d)
    assert conforms(d, OpDifference) == []
    line = op_phrase(d, ("plain", "edited"))
    assert "agree" not in line.split(";")[0], line
    assert (d["step"], d["kind"], d["layer"], d["name"]) == (4, "weights", "fc1", "fc1.weight"), d
    assert d["changed_in"] == ["run"] and d["weights_differing"] == ["fc1.weight"]
    assert (d["size"]["elements"], d["size"]["differing"]) == (128, 1)
    assert d["size"]["max_abs_diff"] == pytest.approx(0.25, rel=1e-6)
    assert line.startswith("step 4: the weights of layer fc1 changed between the optimizer update of step 3 and "
                           "the forward pass of step 4 outside the traced operations (a callback, a constraint, a "
                           "direct assignment), in edited; 1 of 128 elements of fc1.weight differ, "
                           "max |Δ| 0.25"), line


def test_an_edit_the_forward_pass_feels_is_named_before_the_layer_it_changes(edited: dict[str, Path]) -> None:
    """Not "the output of fc1 differs while its input agrees (born in this layer)": its weights were edited."""
    d = compare_traces(edited["plain"], edited["live"])
    assert (d["step"], d["kind"], d["layer"], d["changed_in"]) == (4, "weights", "fc1", ["run"]), d
    reverse = compare_traces(edited["live"], edited["plain"])  # the edited run as the reference
    assert reverse["changed_in"] == ["reference"]


def test_a_loop_that_updates_by_hand_is_traced_and_its_edit_is_found_in_its_update(tmp_path: Path) -> None:
    """No optimizer (the update is the loop's own code, as in PyTorch's word-language-model example): the edit
    after step 3 belongs to step 3's update, which no hook sees; the traces say so at step 4."""
    script = tmp_path / "code" / "main.py"
    script.parent.mkdir()
    script.write_text(EDIT_SCRIPT.replace("opt.zero_grad()", "model.zero_grad()").replace(
        "opt.step()", "[p.data.add_(p.grad, alpha=-0.1) for p in model.parameters()]").replace(
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n", ""))
    plain = traced_run(tmp_path / "plain", script)
    edited = traced_run(tmp_path / "edited", script, "--edit-at", "3", "--column", "1")
    prints = [fingerprints(out) for out in (plain, edited)]
    assert next(s for s in prints[0] if prints[0][s] != prints[1][s]) == 3  # the fingerprint after step 3's update
    d = compare_traces(plain, edited)
    assert (d["step"], d["kind"], d["layer"], d["changed_in"]) == (4, "weights", "fc1", []), d
    assert "born in the update of step 3, which the trace does not see" in op_phrase(d)
    ops = read_ops(edited)
    assert sorted(ops) == [2, 3, 4, 5, 6]  # steps begin as each backward returns
    assert {k for k, _, _ in ops[3].by_key} == {"weights", "input", "output", "grad"}


def test_what_the_trace_records_is_what_the_fingerprints_show(edited: dict[str, Path]) -> None:
    """In each run, the weights the forward pass of step s reads are the fingerprint of step s-1 (but
    after the edit), and the weights after the update of step s are the fingerprint of step s."""
    from launcher.runtime import fingerprints as fp

    for name, out in edited.items():
        prints, ops = fingerprints(out), read_ops(out)
        assert sorted(ops) == [2, 3, 4, 5, 6]
        for step, step_ops in ops.items():
            for kind, at in (("weights", step - 1), ("updated", step)):
                for layer in ("fc1", "fc2"):
                    got = fp.digest_of([r["digest"] for (k, _, _), r in step_ops.rows
                                        if k == kind and r.get("layer") == layer])
                    edited_here = name != "plain" and kind == "weights" and step == 4 and layer == "fc1"
                    assert (got == prints[at][layer]) != edited_here, (name, step, kind, layer)
