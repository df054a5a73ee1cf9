"""Two operation traces (launcher.runtime.optrace) compared: the first step and value at which they stop
agreeing, whether that operation's input still agreed, and the size of the difference.

Values pair by (kind, name, occurrence within the step), not by position: Keras' taps run as
TensorFlow schedules them, so two runs may record independent operations (the gradients) in another
order. "First" follows the reference's order within each kind, and the kinds in the order a step
computes them: the weights its forward pass reads, the layers' inputs and outputs, the gradients, the
weights after its update.

Weights that differ as a forward pass reads them although the step fingerprints (launcher.runtime.steps)
of the step before agree were changed between that step's optimizer update and this forward pass,
outside the traced operations: each run's weights are compared with its own fingerprint of the step
before (``changed_in``), which says which run changed them.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from launcher.errors import Corrupt
from launcher.runtime import fingerprints as fp
from launcher.runtime.optrace import GRAD, INFO, INPUT, OPS, OUTPUT, UPDATED, WEIGHTS
from launcher.runtime.outfiles import STEPS
from launcher.verify.jsonlines import read_json, read_jsonl

_KIND_RANK = {WEIGHTS: 0, INPUT: 1, OUTPUT: 1, GRAD: 2, UPDATED: 3}
OPERATIONS = (INPUT, OUTPUT, GRAD)  # what the trace computes inside a step, beside the weights

Key = tuple[str, str, int]  # (kind, layer or weight name, occurrence within the step)
SIDES = ("reference", "run")


class OpRow(TypedDict):
    """One row of ``optrace/ops.jsonl`` (launcher.runtime.optrace), as read here."""

    step: int
    order: int
    kind: str  # weights | input | output | grad | updated
    name: str
    digest: str
    layer: NotRequired[str]  # weights and updated: the layer, as the step fingerprints name it
    array: NotRequired[str]  # the entry of step-SSSSSS.npz that holds the value, where it was kept


@dataclass
class StepOps:
    """One step's operations: in the order recorded, each with its key, and by key."""

    rows: list[tuple[Key, OpRow]] = field(default_factory=list)
    by_key: dict[Key, OpRow] = field(default_factory=dict)


class OpSize(TypedDict, total=False):
    """How large the first difference is: the shapes where they differ, else the element counts and sizes."""

    shape: list[int]
    other_shape: list[int]
    dtype: str
    other_dtype: str
    elements: int
    differing: int
    max_abs_diff: float
    max_abs: float


class OpDifference(TypedDict):
    """Two traces compared (`launcher diverge`'s ``first_difference``): where they first differ, or
    (``found`` False) how much agreed."""

    found: bool
    step: NotRequired[int]
    kind: NotRequired[str]
    name: NotRequired[str]
    occurrence: NotRequired[int]
    layer: NotRequired[str | None]  # weights and updated: the layer the array belongs to
    input_agrees: NotRequired[bool | None]  # output: whether the layer's input agrees (None: not traced)
    forward_agrees: NotRequired[bool | None]  # grad: True (the forward pass agreed); else None
    changed_in: NotRequired[list[str] | None]  # weights: the runs ("reference", "run") whose weights moved
    # since their own step fingerprint of the step before (None: no fingerprint there to compare with)
    weights_differing: NotRequired[list[str]]  # weights and updated: the layer's arrays that differ
    operations_traced: NotRequired[bool]  # the step's layer inputs, outputs and gradients were traced
    weights_traced: NotRequired[bool]  # the weights its forward pass read were traced
    missing: NotRequired[bool]  # the run lacks the operation
    size: NotRequired[OpSize | None]
    ops_in_step: NotRequired[int]
    ops_differing_in_step: NotRequired[int]
    steps_traced: list[int]
    ops_compared: int
    steps_only_in_one: NotRequired[list[int]]


def _row(path: Path, n: int, doc: Any) -> OpRow:
    """A line of ops.jsonl checked: a re-execution's outputs are written by the code it ran."""
    ok = isinstance(doc, dict) and isinstance(doc.get("step"), int) and isinstance(doc.get("order"), int) \
        and all(isinstance(doc.get(k), str) for k in ("kind", "name", "digest"))
    if not ok:
        raise Corrupt(f"{path}: line {n} is not an operation of the trace", "run `launcher diverge` again")
    return cast(OpRow, doc)


def read_ops(outputs: Path) -> dict[int, StepOps]:
    """A run's operation trace by step (empty when it recorded none)."""
    path = outputs / OPS
    steps: dict[int, StepOps] = {}
    if not path.is_file():
        return steps
    seen: dict[tuple[int, str, str], int] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = _row(path, n, json.loads(line))
        except json.JSONDecodeError as exc:
            raise Corrupt(f"{path}: line {n} is not valid JSON ({exc.msg})", "run `launcher diverge` again") from exc
        step, kind, name = row["step"], row["kind"], row["name"]
        count = seen.get((step, kind, name), 0)
        seen[(step, kind, name)] = count + 1
        ops = steps.setdefault(step, StepOps())
        ops.rows.append(((kind, name, count), row))
        ops.by_key[(kind, name, count)] = row
    return steps


def trace_info(outputs: Path) -> dict[str, Any]:
    """The re-execution's optrace/trace.json (what its trace could observe), or {}."""
    doc = read_json(outputs / INFO)
    return doc if isinstance(doc, dict) else {}


def _array(outputs: Path, step: int, row: OpRow | None) -> Any:  # a numpy array, or None
    import numpy as np

    if row is None or "array" not in row:
        return None
    path = outputs / f"optrace/step-{step:06d}.npz"
    try:
        with zipfile.ZipFile(path) as zf, zf.open(f"{row['array']}.npy") as f:
            return np.load(io.BytesIO(f.read()), allow_pickle=False)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def _size(a: Any, b: Any) -> OpSize | None:  # two numpy arrays (or None)
    import numpy as np

    if a is None or b is None:
        return None
    if a.shape != b.shape or a.dtype != b.dtype:
        return {"shape": list(a.shape), "other_shape": list(b.shape), "dtype": a.dtype.str, "other_dtype": b.dtype.str}
    if a.dtype.kind not in "fciub":
        return {"elements": int(a.size), "differing": int(np.count_nonzero(a != b))}
    x, y = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(x - y)
    return {"elements": int(a.size), "differing": int(np.count_nonzero(a != b)),
            "max_abs_diff": float(diff.max()) if diff.size else 0.0,
            "max_abs": float(np.abs(x).max()) if x.size else 0.0}


def fingerprint_layers(outputs: Path, step: int) -> dict[str, str] | None:
    """The layer digests of the step fingerprint at ``step`` in an outputs folder, or None."""
    for row in read_jsonl(outputs / STEPS) or []:
        if row.get("step") == step and isinstance(row.get("layers"), dict):
            return cast(dict[str, str], row["layers"])
    return None


def _layer_rows(ops: StepOps, kind: str, layer: str) -> list[OpRow]:
    """The layer's arrays of that kind in the step (their first occurrence), in the order recorded."""
    return [row for (k, _, occurrence), row in ops.rows if k == kind and occurrence == 0 and row.get("layer") == layer]


def _changed_in(outputs: tuple[Path, Path], ops: tuple[StepOps, StepOps], step: int, layer: str) -> list[str] | None:
    """Which runs' weights of layer, as the forward pass of step read them, differ from their own step
    fingerprint of step-1 (the weights right after the update before it); None where one lacks it."""
    changed = []
    for side, out, step_ops in zip(SIDES, outputs, ops, strict=True):
        before = fingerprint_layers(out, step - 1)
        if before is None or layer not in before:
            return None
        read = fp.digest_of([row["digest"] for row in _layer_rows(step_ops, WEIGHTS, layer)])
        if read != before[layer]:
            changed.append(side)
    return changed


def _found(ref: Path, run: Path, step: int, key: Key, row: OpRow, a: StepOps, b: StepOps) -> OpDifference:
    """The first differing value of a step: whether its input agreed, which run changed a weight, and
    how large the difference is."""
    kind, name, occurrence = key
    other = b.by_key.get(key)
    found: OpDifference = {"found": True, "step": step, "kind": kind, "name": name, "occurrence": occurrence,
                           "missing": other is None, "size": _size(_array(ref, step, row), _array(run, step, other)),
                           "operations_traced": any(k in OPERATIONS for k, _, _ in a.by_key),
                           "weights_traced": any(k == WEIGHTS for k, _, _ in a.by_key),
                           "steps_traced": [], "ops_compared": 0}
    if kind == OUTPUT:
        ia, ib = a.by_key.get((INPUT, name, occurrence)), b.by_key.get((INPUT, name, occurrence))
        found["input_agrees"] = None if ia is None or ib is None else ia["digest"] == ib["digest"]
    if kind == GRAD:
        found["forward_agrees"] = True
    if kind in (WEIGHTS, UPDATED):
        layer = row.get("layer")
        found["layer"] = layer
        twins = {r["name"]: r["digest"] for r in (_layer_rows(b, kind, layer) if layer else [])}
        found["weights_differing"] = [r["name"] for r in (_layer_rows(a, kind, layer) if layer else [row])
                                      if twins.get(r["name"]) != r["digest"]]
        if kind == WEIGHTS and layer:
            found["changed_in"] = _changed_in((ref, run), (a, b), step, layer)
    differing = 0
    for k, v in a.by_key.items():
        twin = b.by_key.get(k)
        differing += (twin["digest"] if twin is not None else None) != v["digest"]
    found["ops_in_step"], found["ops_differing_in_step"] = len(a.rows), differing
    return found


def compare_traces(ref: Path, run: Path, from_step: int = 0) -> OpDifference:
    """Compare two runs' outputs folders' traces (from from_step on). ``found`` False when every
    traced value agrees."""
    a, b = read_ops(ref), read_ops(run)
    common = [s for s in sorted(set(a) & set(b)) if s >= from_step]
    compared = 0
    for step in common:
        rows = sorted(a[step].rows, key=lambda kr: (_KIND_RANK.get(str(kr[1]["kind"]), 4), int(kr[1]["order"])))
        for key, row in rows:
            other = b[step].by_key.get(key)
            compared += 1
            if other is not None and other["digest"] == row["digest"]:
                continue
            found = _found(ref, run, step, key, row, a[step], b[step])
            found["steps_traced"], found["ops_compared"] = common, compared
            return found
    return {"found": False, "steps_traced": common, "ops_compared": compared,
            "steps_only_in_one": sorted(set(a) ^ set(b))}


def position(d: OpDifference) -> tuple[int, int]:
    """Where in a run a found difference lies, for comparing two traces' first differences (the ranks of one run):
    its step, then its kind in the order compare_traces reads a step (the weights read first, the update last)."""
    return int(d.get("step", 1 << 30)), _KIND_RANK.get(str(d.get("kind")), 4)


def _size_phrase(d: OpDifference) -> str:
    size = d.get("size") or {}
    if "max_abs_diff" in size:
        return (f"; {size['differing']} of {size['elements']} elements of {d['name']} differ, "
                f"max |Δ| {size['max_abs_diff']:.3g} (values up to {size['max_abs']:.3g})")
    if "other_shape" in size:
        return f"; {d['name']} has shape {size['shape']} against {size['other_shape']}"
    return ""


def _whose(changed: list[str], names: tuple[str, str]) -> str:
    return " and ".join(name for side, name in zip(SIDES, names, strict=True) if side in changed)


def weights_phrase(d: OpDifference, names: tuple[str, str] = ("A", "B")) -> str:
    """The first difference is in the weights a forward pass read: changed outside the traced operations."""
    step, layer = d["step"], d.get("layer") or d["name"]
    changed = d.get("changed_in")
    if changed:
        line = (f"step {step}: the weights of layer {layer} changed between the optimizer update of step {step - 1} "
                f"and the forward pass of step {step} outside the traced operations (a callback, a constraint, a "
                f"direct assignment), in {_whose(changed, names)}")
    elif changed is None:
        line = (f"step {step}: the weights of layer {layer} differ as the forward pass of step {step} reads them "
                "(no step fingerprint of the step before to tell whether they changed outside the traced operations)")
    else:
        line = (f"step {step}: the weights of layer {layer} differ as its forward pass reads them, as they did in the "
                f"fingerprints right after step {step - 1}: the difference was born in the update of step {step - 1}, "
                "which the trace does not see (an update the loop makes by hand, without an optimizer)")
    return line + _size_phrase(d)


def op_phrase(d: OpDifference, names: tuple[str, str] = ("A", "B")) -> str:
    """One line: where the traces first differ (or how much of them agrees)."""
    if not d.get("found"):
        steps = d.get("steps_traced") or []
        if not steps:
            return "no operation was traced in both re-executions"
        return f"the traces agree on steps {steps[0]}..{steps[-1]} ({d['ops_compared']} values compared)"
    kind = d["kind"]
    if kind == WEIGHTS:
        return weights_phrase(d, names)
    if kind == UPDATED and not d.get("operations_traced"):
        return (f"step {d['step']}: the weights first differ right after its optimizer update, at {d['name']} "
                f"(layer {d.get('layer')}; the operations inside the step are not traced)" + _size_phrase(d))
    if kind == UPDATED:
        return (f"step {d['step']}: the weights it read, each layer's input and output and each gradient agree, yet "
                f"the weights of layer {d.get('layer')} differ right after its optimizer update: the update itself "
                "differs (the optimizer's state, a constraint, or code inside the step the trace does not see)"
                + _size_phrase(d))
    what = {INPUT: "the input of", OUTPUT: "the output of", GRAD: "the gradient of"}.get(kind, kind)
    line = f"step {d['step']}: {what} {d['name']} differs first"
    if kind == OUTPUT and d.get("input_agrees") is True:
        line += (" while its input and the weights agree" if d.get("weights_traced") else " while its input agrees")
        line += " (the difference is born in this layer)"
    elif kind == OUTPUT and d.get("input_agrees") is False:
        line += " (its input already differs)"
    elif kind == GRAD:
        line += " (the forward pass agrees: the difference is born in the backward pass)"
    return line + _size_phrase(d)
