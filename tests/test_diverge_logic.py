"""`launcher diverge`'s reasoning on hand-made records, without a container: the exact step from the
re-executions' fingerprints, a re-execution checked against its run before it is believed, a change
outside the traced operations named, the lines and the exit code, and where a re-execution starts
from a checkpoint (launcher.verify.repeat, launcher.workflows.divergence, launcher.runs.rewind).

The re-executions themselves are faked (``_execute`` replaced by copies of the runs with edited
fingerprints and traces): the real ones are in tests/test_diverge_in_image.py."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runfactory import make_workspace, pair
from test_verify_records import conforms
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.records.manifest import load_manifest
from launcher.runs import rewind
from launcher.runtime import checkpoint as ck
from launcher.runtime import fingerprints as fp
from launcher.runtime import optrace
from launcher.verify.opdiff import OpDifference
from launcher.verify.repeat import RepeatCheck, check_repeat, repeat_phrase
from launcher.verify.stepdiff import StepRow, rows_diff
from launcher.workflows import diverge as diverge_mod
from launcher.workflows.divergence import Divergence, DivergenceRecord
from launcher.workspace import Workspace

runner = CliRunner()


def rows(*digests: tuple[int, str, str]) -> dict[int, StepRow]:
    """Step rows from (step, digest of layer a, digest of layer b)."""
    out: dict[int, StepRow] = {}
    for step, a, b in digests:
        layers = {"dense": a, "out": b}
        out[step] = {"step": step, "digest": fp.digest_of(layers), "layers": layers}
    return out


# ---------------------------------------------------------------- a re-execution checked against its run


def test_a_reexecution_that_repeats_its_run_up_to_the_window_is_believed() -> None:
    recorded = rows((0, "a", "b"), (5, "c", "d"), (10, "e", "f"))
    again = rows((0, "a", "b"), (1, "x", "x"), (5, "c", "d"), (6, "y", "y"), (10, "e", "f"))
    check = check_repeat("A", "A2", recorded, again, computed_from=0, upto=5, parting=10)
    assert conforms(check, RepeatCheck) == []
    assert check["repeats"] and check["steps_checked"] == [0, 5] and check["parting_repeated"] is True
    assert repeat_phrase(check) == "A2 repeats A at each step it computed up to step 5 (steps 0, 5)"


def test_a_reexecution_that_departs_before_the_window_is_not_believed() -> None:
    recorded = rows((0, "a", "b"), (5, "c", "d"), (10, "e", "f"))
    again = rows((0, "a", "b"), (5, "c", "Z"), (10, "e", "Z"))
    check = check_repeat("A", "A2", recorded, again, computed_from=0, upto=5, parting=10)
    assert (check["repeats"], check["departs_at"], check["layers"]) == (False, 5, ["out"])
    check["differences"] = ["the data's fingerprint (fingerprints/dataset.json)"]
    assert repeat_phrase(check) == ("A2 does not repeat A: its weights depart at step 5 (layers out), before the "
                                    "window (the data's fingerprint (fingerprints/dataset.json) differ)")


def test_from_a_checkpoint_only_the_steps_it_computed_are_checked() -> None:
    recorded = rows((0, "a", "b"), (5, "c", "d"), (10, "e", "f"), (15, "g", "h"))
    again = rows((0, "a", "b"), (5, "c", "d"), (10, "e", "f"), (11, "i", "j"), (15, "g", "h"))
    check = check_repeat("A", "A2", recorded, again, computed_from=5, upto=10, parting=15)
    assert check["steps_checked"] == [10]
    nothing = check_repeat("A", "A2", recorded, again, computed_from=10, upto=10, parting=15)
    assert nothing["repeats"] and nothing["steps_checked"] == []
    assert "computed no step before the window" in repeat_phrase(nothing)


def test_the_exact_step_comes_from_the_reexecutions_fingerprints_at_every_step() -> None:
    a = rows((5, "c", "d"), (6, "e", "f"), (7, "g", "h"), (8, "i", "j"), (9, "k", "l"))
    b = rows((5, "c", "d"), (6, "e", "f"), (7, "g", "h"), (8, "i", "Q"), (9, "R", "S"))
    d = rows_diff(a, b)
    assert (d["agree_until"], d["parts_by"], d["first_layer"]) == (7, 8, "out")


# ---------------------------------------------------------------- the answer, its lines and exit code


def _weights_difference(changed: list[str] | None) -> OpDifference:
    return {"found": True, "step": 8, "kind": "weights", "name": "out/kernel", "occurrence": 0, "layer": "out",
            "changed_in": changed, "weights_differing": ["out/kernel"], "missing": False,
            "size": {"elements": 320, "differing": 1, "max_abs_diff": 0.001, "max_abs": 0.5},
            "steps_traced": [6, 7, 8, 9, 10], "ops_compared": 40}


def _divergence(first: OpDifference | None, *checks: RepeatCheck) -> Divergence:
    d = Divergence("A", "B", {"same": False, "steps_compared": 3, "agree_until": 5, "parts_by": 10,
                              "layers_differing": ["out"], "layers_total": 2, "first_layer": "out"},
                   window=(6, 10), reruns={"A": "A2", "B": "B2"})
    d.checks = list(checks) or [check_repeat(r, r + "2", rows((5, "c", "d")), rows((5, "c", "d")),
                                             computed_from=0, upto=5, parting=None) for r in "AB"]
    d.exact = rows_diff(rows((7, "g", "h"), (8, "i", "j")), rows((7, "g", "h"), (8, "i", "Q")))
    d.first = first
    return d


def test_a_change_outside_the_traced_operations_is_the_answer_and_no_setting_is_tried() -> None:
    d = _divergence(_weights_difference(["run"]))
    lines = d.lines()
    assert conforms(d.to_dict(), DivergenceRecord) == []
    assert "exact step: the re-executions' weights agree up to step 7 and differ from step 8 on (layers out)" \
        in lines
    assert ("step 8: the weights of layer out changed between the optimizer update of step 7 and the forward pass of "
            "step 8 outside the traced operations (a callback, a constraint, a direct assignment), in B; "
            "1 of 320 elements of out/kernel differ, max |Δ| 0.001 (values up to 0.5)") in lines
    assert lines[-1] == ("cause: a change the code made to the weights outside the traced operations (not a setting: "
                         "none was tried)")
    assert not any("every traced operation agrees" in line for line in lines)
    assert d.outcome == "localised" and d.exit_code == ExitCode.OK


def test_a_run_that_could_not_be_repeated_stops_with_its_own_exit_code() -> None:
    bad = check_repeat("B", "B2", rows((0, "a", "b"), (5, "c", "d")), rows((0, "a", "b"), (5, "c", "X")),
                       computed_from=0, upto=5, parting=10)
    good = check_repeat("A", "A2", rows((5, "c", "d")), rows((5, "c", "d")), computed_from=0, upto=5, parting=10)
    d = _divergence(None, good, bad)
    d.exact = None
    lines = d.lines()
    assert d.outcome == "not_repeated" and d.exit_code == ExitCode.NOT_REPEATED != ExitCode.OK
    assert "check: B2 does not repeat B: its weights depart at step 5 (layers out), before the window" in lines
    assert lines[-1].startswith("stopped: a re-execution that does not repeat its run computes something else")
    assert not any(line.startswith(("step ", "exact step", "cause")) for line in lines)


def test_runs_whose_parting_does_not_repeat_are_not_said_to_agree() -> None:
    checks = [check_repeat(r, r + "2", rows((5, "c", "d"), (10, "e", "f")), rows((5, "c", "d"), (10, "e", "g")),
                           computed_from=0, upto=5, parting=10) for r in "AB"]
    d = _divergence({"found": False, "steps_traced": [6, 7, 8, 9, 10], "ops_compared": 50}, *checks)
    d.exact = rows_diff(rows((8, "i", "j")), rows((8, "i", "j")))
    lines = d.lines()
    assert d.outcome == "parting_not_repeated" and d.exit_code == ExitCode.NOT_REPEATED
    assert "B2 does not repeat B's own fingerprint at step 10, where the runs part: what makes them part is not " \
           "deterministic" in lines
    assert "the traces agree on steps 6..10 (50 values compared)" in lines


# ---------------------------------------------------------------- checkpoints to start from


def _checkpointed(outputs: Path, *steps_epochs: tuple[int, int]) -> None:
    """An outputs folder with a checkpoint for each (step, epochs done), written by the runtime's own code."""
    points = ck.Checkpoints(outputs, 1, False, keep_all=True)
    (outputs / ck.STEPS).parent.mkdir(parents=True, exist_ok=True)
    for step, epochs in steps_epochs:
        fp.append_jsonl(outputs / ck.STEPS, {"step": step, "digest": f"d{step}", "layers": {}})
        fp.append_jsonl(outputs / ck.METRICS, {"epoch": epochs - 1, "loss": 1.0 / epochs})
        points.write(epochs - 1, step, "keras", lambda folder: (folder / "keras.npz").write_bytes(b"state"))


def test_every_checkpoint_is_kept_when_asked_and_the_last_before_the_parting_is_chosen(tmp_path: Path) -> None:
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    a, _ = pair(ws.runs)
    shutil.rmtree(a / "outputs/fingerprints/batches.jsonl", ignore_errors=True)
    _checkpointed(a / "outputs", (5, 1), (10, 2), (15, 3))
    assert [name for name, _ in rewind.checkpoints(a / "outputs")] == ["epoch-0001", "epoch-0002", "epoch-0003"]
    m = load_manifest(a)
    point = rewind.start_point(m, 12, 15)
    assert point is not None and (point["checkpoint"], point["step"], point["epochs"]) == ("epoch-0002", 10, 2)
    assert rewind.start_point(m, 4, 15) is None and "first checkpoint kept, epoch-0001, is at step 5" in str(
        rewind.why_none(m, 4))
    folder = rewind.prepare(m, point)
    try:
        assert json.loads((folder / ck.LATEST).read_text()) == {"name": "epoch-0002"}
        assert (folder / "checkpoints/epoch-0002/keras.npz").read_bytes() == b"state"
        assert not (folder / "checkpoints/epoch-0003").exists()
        # what the runtime does on resume: the appended files cut back to their size at the checkpoint
        found = ck.prepare_resume(folder)
        assert found[1]["step"] == 10
        assert [json.loads(line)["step"] for line in (folder / ck.STEPS).read_text().splitlines()] == [5, 10]
    finally:
        shutil.rmtree(folder)


def test_only_the_latest_checkpoint_is_kept_by_default(tmp_path: Path) -> None:
    points = ck.Checkpoints(tmp_path, 1, False)
    for epoch in range(3):
        points.write(epoch, 5 * (epoch + 1), "keras", lambda folder: None)
    assert sorted(p.name for p in (tmp_path / ck.DIR).iterdir()) == ["epoch-0003", "latest.json"]


def test_a_hostile_checkpoint_folder_is_not_taken(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    _checkpointed(out, (5, 1))
    (out / ck.DIR / "epoch-0009").symlink_to(out / ck.DIR / "epoch-0001")  # a link, not a checkpoint
    (out / ck.DIR / "../../etc").mkdir(parents=True, exist_ok=True)
    bad = out / ck.DIR / "epoch-0007"
    bad.mkdir()
    (bad / ck.STATE).write_text('{"epoch": "x"}')
    assert [name for name, _ in rewind.checkpoints(out)] == ["epoch-0001"]


def test_keep_checkpoints_without_checkpoints_is_refused(tmp_path: Path) -> None:
    r = runner.invoke(app, ["--workspace", str(make_workspace(tmp_path / "ws")), "run", "mnist_convnet",
                            "--keep-checkpoints"])
    assert r.exit_code == ExitCode.USAGE and "--keep-checkpoints without --checkpoint-every" in r.stderr


# ---------------------------------------------------------------- diverge end to end, its re-executions faked


def _traced(outputs: Path, window: range, weights: Callable[[int], float]) -> None:
    """A trace of steps in window: one layer "out" whose kernel the forward pass reads as weights(step)."""
    trace = optrace.OpTrace(outputs, (window.start, window.stop - 1))
    for step in window:
        trace.begin(step)
        trace.weights(optrace.WEIGHTS, [("out", "out/kernel", np.full(4, weights(step), np.float32))])
        trace.op(optrace.OUTPUT, "out", np.full(2, 1.0, np.float32))
    trace.end()


def kernel(value: float) -> str:
    """The digest of layer out, whose kernel holds value, in a step fingerprint."""
    return fp.digest_of([fp.array_digest(np.full(4, value, np.float32))])


def _launch(run: Path) -> None:
    launch = json.loads((run / "launch.json").read_text())
    launch.update({"image": {"id": "sha256:" + "1" * 64, "variant": "cpu"}, "recipe": {"name": "mnist_convnet"}})
    (run / "launch.json").write_text(json.dumps(launch))


@pytest.fixture
def faked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Two runs that part between steps 5 and 10, and re-executions made by edit(original, outputs)."""
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    a, b = pair(ws.runs)
    same = {"dense": "1", "out": kernel(1.0)}
    for run, last in ((a, same), (b, {"dense": "1", "out": kernel(1.5)})):
        _launch(run)
        (run / "outputs" / ck.STEPS).write_text("".join(
            json.dumps({"step": s, "digest": fp.digest_of(layers), "layers": layers}) + "\n"
            for s, layers in ((0, same), (5, same), (10, last))))
    state: dict[str, Any] = {"ws": ws, "ids": [a.name, b.name], "edit": None, "executed": []}

    def execute(ws_: Workspace, launch: dict[str, Any], spec: Any, rep: Any, on_log: Any, point: Any = None) -> str:
        rerun = f"{launch['run_id']}-rerun{len(state['executed'])}"
        shutil.copytree(ws.runs / launch["run_id"], ws.runs / rerun)
        state["edit"](launch["run_id"], ws.runs / rerun / "outputs")
        state["executed"].append((launch["run_id"], spec.optrace, spec.trace_every))
        return rerun

    monkeypatch.setattr(diverge_mod, "_execute", execute)
    return state


def _every_step(outputs: Path, layers_at: Callable[[int], dict[str, str]]) -> None:
    (outputs / ck.STEPS).write_text("".join(
        json.dumps({"step": s, "digest": fp.digest_of(layers_at(s)), "layers": layers_at(s)}) + "\n"
        for s in range(11)))


def test_diverge_names_a_change_outside_the_traced_operations_at_its_exact_step(faked: dict[str, Any]) -> None:
    ws, (a, b) = faked["ws"], faked["ids"]

    def edit(run: str, outputs: Path) -> None:  # the second run's code moved out's kernel after step 7's update
        moved = run == b
        _every_step(outputs, lambda s: {"dense": "1", "out": kernel(1.5 if moved and s >= 8 else 1.0)})
        _traced(outputs, range(6, 11), lambda s: 1.5 if moved and s >= 8 else 1.0)

    faked["edit"] = edit
    r = runner.invoke(app, ["--workspace", str(ws.root), "--json", "diverge", a, b])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)["data"]
    assert [e[1:] for e in faked["executed"]] == [("6:10", "1"), ("6:10", "1")]  # no cause tried
    assert data["outcome"] == "localised" and [c["repeats"] for c in data["checks"]] == [True, True]
    assert (data["exact"]["agree_until"], data["exact"]["parts_by"]) == (7, 8)
    first = data["first_difference"]
    assert (first["step"], first["kind"], first["layer"], first["changed_in"]) == (8, "weights", "out", ["run"])
    assert data["cause"] == "a change the code made to the weights outside the traced operations"
    text = "\n".join(data["lines"])
    assert "outside the traced operations" in text and "every traced operation agrees" not in text


def test_diverge_stops_when_a_reexecution_does_not_repeat_its_run(faked: dict[str, Any]) -> None:
    ws, (a, b) = faked["ws"], faked["ids"]

    def edit(run: str, outputs: Path) -> None:  # the reference's re-execution parts from it at step 3
        _every_step(outputs, lambda s: {"dense": "9" if run == a and s >= 3 else "1", "out": kernel(1.0)})
        (outputs / "fingerprints/dataset.json").write_text('{"digest": "sha256:other"}')

    faked["edit"] = edit
    r = runner.invoke(app, ["--workspace", str(ws.root), "diverge", a, b])
    assert r.exit_code == ExitCode.NOT_REPEATED, r.output
    assert f"does not repeat {a}: its weights depart at step 5 (layers dense), before the window (the data's " \
           "fingerprint" in r.stdout
    assert "stopped: a re-execution that does not repeat its run" in r.stdout and "cause" not in r.stdout
    assert len(faked["executed"]) == 2


def test_runs_whose_initial_weights_differ_are_not_reexecuted(tmp_path: Path) -> None:
    """Another seed: the weights differ at step 0, before any update; nothing a re-execution traces explains it."""
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    a, b = pair(ws.runs)
    for run, layers in ((a, {"dense": "1"}), (b, {"dense": "2"})):
        (run / "outputs" / ck.STEPS).write_text(json.dumps({"step": 0, "digest": layers["dense"], "layers": layers})
                                                + "\n")
    r = runner.invoke(app, ["--workspace", str(ws.root), "--json", "diverge", a.name, b.name])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)["data"]
    assert data["outcome"] == "initial" and data["window"] is None and data["reruns"] == {}
    assert "weights already differ at step 0, the first recorded in both" in data["lines"][0]
    assert data["lines"][1].startswith("nothing to re-execute: the runs part before any update, in their initial")
    assert sorted(d.name for d in ws.runs.iterdir()) == sorted([a.name, b.name])  # nothing was executed


def test_runs_whose_inputs_differ_are_localised_and_no_setting_is_tried(faked: dict[str, Any]) -> None:
    """An argument of the script differs (another learning rate): diverge says so first, shows where it first
    acts (the update of step 8, seen in the weights step 9 reads), and tries no setting."""
    from runfactory import edit_manifest

    ws, (a, b) = faked["ws"], faked["ids"]
    edit_manifest(ws.runs / b, params={"epochs": 3, "batch_size": 32, "lr": 0.5})

    def edit(run: str, outputs: Path) -> None:  # the second run's update of step 8 differs
        moved = run == b
        _every_step(outputs, lambda s: {"dense": "1", "out": kernel(1.5 if moved and s >= 8 else 1.0)})
        _traced(outputs, range(6, 11), lambda s: 1.5 if moved and s >= 9 else 1.0)

    faked["edit"] = edit
    r = runner.invoke(app, ["--workspace", str(ws.root), "--json", "diverge", a, b])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)["data"]
    assert [row["key"] for row in data["inputs"]] == ["params.lr"]
    assert data["lines"][1] == ("their inputs differ: params.lr (null against 0.5); what follows shows where that "
                                "first acts")
    first = data["first_difference"]
    assert (first["step"], first["kind"], first["changed_in"]) == (9, "weights", [])
    assert "born in the update of step 8, which the trace does not see" in "\n".join(data["lines"])
    assert data["cause"] == "their inputs differ: params.lr" and data["candidates"] == []
    assert len(faked["executed"]) == 2  # the two re-executions, no candidate
