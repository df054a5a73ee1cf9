"""Two operation traces (launcher.runtime.optrace) compared: the first step and operation at which
they stop agreeing, whether that operation's input still agreed, and the size of the difference.

Operations pair by (kind, layer name, occurrence within the step), not by position: Keras' taps
run as TensorFlow schedules them, so two runs may record independent operations (the gradients)
in another order. "First" follows the reference's order, forward operations before gradients.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from launcher.errors import Corrupt
from launcher.runtime.optrace import OPS

_KIND_RANK = {"input": 0, "output": 0, "grad": 1}

Key = tuple[str, str, int]  # (kind, layer or weight name, occurrence within the step)


class OpRow(TypedDict):
    """One row of ``optrace/ops.jsonl`` (launcher.runtime.optrace), as read here."""

    step: int
    order: int
    kind: str  # input | output | grad
    name: str
    digest: str
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
    input_agrees: NotRequired[bool | None]  # output: whether the layer's input agrees (None: not traced)
    forward_agrees: NotRequired[bool | None]  # grad: True (the forward pass agreed); else None
    missing: NotRequired[bool]  # the run lacks the operation
    size: NotRequired[OpSize | None]
    ops_in_step: NotRequired[int]
    ops_differing_in_step: NotRequired[int]
    steps_traced: list[int]
    ops_compared: int
    steps_only_in_one: NotRequired[list[int]]


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
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise Corrupt(f"{path}: line {n} is not valid JSON ({exc.msg})", "run `launcher diverge` again") from exc
        step, kind, name = int(doc["step"]), str(doc["kind"]), str(doc["name"])
        row = cast(OpRow, doc)
        count = seen.get((step, kind, name), 0)
        seen[(step, kind, name)] = count + 1
        ops = steps.setdefault(step, StepOps())
        ops.rows.append(((kind, name, count), row))
        ops.by_key[(kind, name, count)] = row
    return steps


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


def _found(ref: Path, run: Path, step: int, key: Key, row: OpRow, a: StepOps, b: StepOps) -> OpDifference:
    """The first differing operation of a step: whether its input agreed, and how large the difference is."""
    kind, name, occurrence = key
    other = b.by_key.get(key)
    inp = None
    if kind == "output":
        pair_key = ("input", name, occurrence)
        ia, ib = a.by_key.get(pair_key), b.by_key.get(pair_key)
        inp = None if ia is None or ib is None else ia["digest"] == ib["digest"]
    forward_agrees = kind == "grad"
    differing = 0
    for k, v in a.by_key.items():
        twin = b.by_key.get(k)
        differing += (twin["digest"] if twin is not None else None) != v["digest"]
    return {"found": True, "step": step, "kind": kind, "name": name, "occurrence": occurrence,
            "input_agrees": inp, "forward_agrees": forward_agrees or None,
            "missing": other is None,
            "size": _size(_array(ref, step, row), _array(run, step, other)),
            "ops_in_step": len(a.rows), "ops_differing_in_step": differing,
            "steps_traced": [], "ops_compared": 0}


def compare_traces(ref: Path, run: Path) -> OpDifference:
    """Compare two runs' outputs folders' traces. ``found`` False when every traced op agrees."""
    a, b = read_ops(ref), read_ops(run)
    common = sorted(set(a) & set(b))
    compared = 0
    for step in common:
        rows = sorted(a[step].rows, key=lambda kr: (_KIND_RANK.get(str(kr[1]["kind"]), 2), int(kr[1]["order"])))
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


def op_phrase(d: OpDifference) -> str:
    """One line: where the traces first differ (or that they agree)."""
    if not d.get("found"):
        steps = d.get("steps_traced") or []
        if not steps:
            return "no operation was traced in both re-executions"
        return f"every traced operation agrees on steps {steps[0]}..{steps[-1]} ({d['ops_compared']} operations)"
    what = {"input": "the input of", "output": "the output of", "grad": "the gradient of"}[d["kind"]]
    line = f"step {d['step']}: {what} {d['name']} differs first"
    if d["kind"] == "output" and d.get("input_agrees") is True:
        line += " while its input agrees (the difference is born in this layer)"
    elif d["kind"] == "output" and d.get("input_agrees") is False:
        line += " (its input already differs)"
    elif d["kind"] == "grad":
        line += " (the forward pass agrees: the difference is born in the backward pass)"
    size = d.get("size") or {}
    if "max_abs_diff" in size:
        line += (f"; {size['differing']} of {size['elements']} elements, max |Δ| {size['max_abs_diff']:.3g} "
                 f"(values up to {size['max_abs']:.3g})")
    return line
