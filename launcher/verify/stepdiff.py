"""Where two runs part, from their step fingerprints (launcher.runtime.steps): the window verify
reports, the strip the report draws, and the sentences both print."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from launcher.records.manifest import Manifest
from launcher.records.rundir import OUTPUTS
from launcher.runtime import steps as runtime_steps
from launcher.verify.jsonlines import read_jsonl

STEPS = f"{OUTPUTS}/{runtime_steps.STEPS}"  # the runtime's step fingerprints, from the run folder
_RANK_STEPS = re.compile(rf"{OUTPUTS}/ranks/[0-9]+/{re.escape(runtime_steps.STEPS)}")


def is_steps(path: str) -> bool:
    """Whether path (from the run folder) holds step fingerprints: rank 0's, or another rank's (ranks/<r>/)."""
    return path == STEPS or _RANK_STEPS.fullmatch(path) is not None


class StepRow(TypedDict):
    """One row of ``outputs/fingerprints/steps.jsonl`` (launcher.runtime.steps), as the readers here use it."""

    step: int
    epoch: NotRequired[int | None]
    digest: NotRequired[str]
    layers: NotRequired[dict[str, str]]  # layer name -> digest of its arrays' digests, in model order
    loss: NotRequired[float | None]


class LossPair(TypedDict):
    """The loss each run recorded at the parting step."""

    reference: float | None
    run: float | None


class LastSteps(TypedDict):
    """The last step each run recorded (None: none)."""

    reference: int | None
    run: int | None


class StepsDiff(TypedDict):
    """An explanation's ``steps``: where two runs' step fingerprints part (verify's JSON, `launcher diverge`).

    When they part (``same`` False) the parting keys are there; when they do not, ``last_step``.
    """

    same: bool | None  # None: no step recorded in both runs
    steps_compared: int
    agree_until: int | None
    parts_by: int | None
    epoch: NotRequired[int | None]
    layers_differing: NotRequired[list[str]]
    layers_total: NotRequired[int]
    first_layer: NotRequired[str | None]
    loss: NotRequired[LossPair | None]
    last_step: NotRequired[LastSteps]


class StripCell(TypedDict):
    """One step of the strip: whether the weights agree there (or one layer at the parting step)."""

    step: int
    agree: bool


class LayerCell(TypedDict):
    layer: str
    agree: bool


class StepsStrip(TypedDict):
    """For the report's picture: every step recorded in both runs, and the layers at the parting step."""

    strip: list[StripCell]
    parts_by: int | None
    layers: list[LayerCell]


def _full(x: Any) -> str:
    return f"{x:.10g}" if isinstance(x, float) else str(x)


def rows_by_step(rows: list[dict[str, Any]] | None) -> dict[int, StepRow]:
    """Step rows by step number (rows without an integer step left out)."""
    return {r["step"]: cast(StepRow, r) for r in rows or [] if isinstance(r.get("step"), int)}


def read_steps(outputs: Path) -> dict[int, StepRow]:
    """An outputs folder's step fingerprints by step (empty without any)."""
    return rows_by_step(read_jsonl(outputs / runtime_steps.STEPS))


def _by_step(ref: Manifest, run: Manifest) -> tuple[dict[int, StepRow], dict[int, StepRow]] | None:
    """Both runs' step rows by step number; None when either run has no step fingerprints."""
    a, b = read_jsonl(ref.file(STEPS)), read_jsonl(run.file(STEPS))
    if not a or not b:
        return None
    return rows_by_step(a), rows_by_step(b)


def _layer_names(la: Mapping[str, object], lb: Mapping[str, object]) -> list[str]:
    return list(la) + [k for k in lb if k not in la]


def steps_diff(ref: Manifest, run: Manifest) -> StepsDiff | None:
    """Where training parted, from the step fingerprints (launcher.runtime.steps): the last step
    recorded in both runs at which the weights agree, the first at which they differ, and the
    layers that differ there (in model order). None when either run has no step fingerprints."""
    rows = _by_step(ref, run)
    return None if rows is None else rows_diff(*rows)


def rows_diff(by_a: Mapping[int, StepRow], by_b: Mapping[int, StepRow]) -> StepsDiff:
    """steps_diff on two runs' step rows by step (launcher diverge compares its re-executions' so)."""
    common = sorted(set(by_a) & set(by_b))
    agree: int | None = None
    for step in common:
        ra, rb = by_a[step], by_b[step]
        if ra.get("digest") == rb.get("digest"):
            agree = step
            continue
        la, lb = ra.get("layers") or {}, rb.get("layers") or {}
        names = _layer_names(la, lb)
        layers = [k for k in names if la.get(k) != lb.get(k)]
        return {"same": False, "steps_compared": len(common), "agree_until": agree, "parts_by": step,
                "epoch": ra.get("epoch", rb.get("epoch")), "layers_differing": layers,
                "layers_total": len(names), "first_layer": layers[0] if layers else None,
                "loss": {"reference": ra.get("loss"), "run": rb.get("loss")}
                if "loss" in ra or "loss" in rb else None}
    return {"same": True if common else None, "steps_compared": len(common),
            "agree_until": agree, "parts_by": None, "last_step": {"reference": max(by_a, default=None),
                                                                  "run": max(by_b, default=None)}}


def steps_strip(ref: Manifest, run: Manifest) -> StepsStrip | None:
    """For a picture: every step recorded in both runs, whether the weights agree there, and the
    layers that differ at the first step where they do not. None without step fingerprints."""
    rows = _by_step(ref, run)
    if rows is None:
        return None
    by_a, by_b = rows
    strip: list[StripCell] = [{"step": s, "agree": by_a[s].get("digest") == by_b[s].get("digest")}
                              for s in sorted(set(by_a) & set(by_b))]
    parting = next((cell["step"] for cell in strip if not cell["agree"]), None)
    layers: list[LayerCell] = []
    if parting is not None:
        la, lb = by_a[parting].get("layers") or {}, by_b[parting].get("layers") or {}
        layers = [{"layer": k, "agree": la.get(k) == lb.get(k)} for k in _layer_names(la, lb)]
    return {"strip": strip, "parts_by": parting, "layers": layers}


def steps_phrase(steps: StepsDiff) -> str:
    """One clause: where two runs' step fingerprints part (or that they agree)."""
    if steps.get("same") is None:
        return "step fingerprints: no step recorded in both runs"
    if steps["same"]:
        return f"weights agree at all {steps['steps_compared']} recorded steps"
    first = f" (first layer {steps['first_layer']})" if steps.get("first_layer") else ""
    if steps["agree_until"] is None:
        return f"weights already differ at step {steps['parts_by']}, the first recorded in both{first}"
    return f"weights agree up to step {steps['agree_until']} and part by step {steps['parts_by']}{first}"


def steps_detail(steps: Mapping[str, Any]) -> str:
    """After where two runs part: how many layers differ there, the epoch, the loss, and the finer trace.

    ``steps`` is a :class:`StepsDiff` as read back from verify's JSON (launcher.cli.verify_cmds)."""
    if steps.get("same") is not False:
        return ""
    parts = [f"{len(steps['layers_differing'])} of {steps['layers_total']} layers differ there"]
    if steps.get("epoch") is not None:
        parts.append(f"end of epoch {steps['epoch']}")
    loss = steps.get("loss") or {}
    if loss.get("reference") is not None and loss.get("run") is not None:
        parts.append(f"loss {_full(loss['reference'])} -> {_full(loss['run'])}")
    gap = steps["parts_by"] - (steps["agree_until"] or 0)
    if gap > 1:
        parts.append("run both again with --trace-every N (N < " + str(gap) + ") to narrow it")
    return "; " + "; ".join(parts)
