"""Where two runs part, from their step fingerprints (launcher.runtime.steps): the window verify
reports, the strip the report draws, and the sentences both print."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.runs.manifest import Manifest
from launcher.verify.jsonlines import read_jsonl

STEPS = "outputs/fingerprints/steps.jsonl"


def _full(x: Any) -> str:
    return f"{x:.10g}" if isinstance(x, float) else str(x)


def explain_steps(ref: Manifest, run: Manifest) -> dict[str, Any] | None:
    """Where training parted, from the step fingerprints (launcher.runtime.steps): the last step
    recorded in both runs at which the weights agree, the first at which they differ, and the
    layers that differ there (in model order). None when either run has no step fingerprints."""
    a, b = read_jsonl(ref.file(STEPS)), read_jsonl(run.file(STEPS))
    if not a or not b:
        return None
    by_a = {r["step"]: r for r in a if isinstance(r.get("step"), int)}
    by_b = {r["step"]: r for r in b if isinstance(r.get("step"), int)}
    common = sorted(set(by_a) & set(by_b))
    agree: int | None = None
    for step in common:
        ra, rb = by_a[step], by_b[step]
        if ra.get("digest") == rb.get("digest"):
            agree = step
            continue
        la, lb = ra.get("layers") or {}, rb.get("layers") or {}
        names = list(la) + [k for k in lb if k not in la]
        layers = [k for k in names if la.get(k) != lb.get(k)]
        return {"same": False, "steps_compared": len(common), "agree_until": agree, "parts_by": step,
                "epoch": ra.get("epoch", rb.get("epoch")), "layers_differing": layers,
                "layers_total": len(names), "first_layer": layers[0] if layers else None,
                "loss": {"reference": ra.get("loss"), "run": rb.get("loss")}
                if "loss" in ra or "loss" in rb else None}
    return {"same": True if common else None, "steps_compared": len(common),
            "agree_until": agree, "parts_by": None, "last_step": {"reference": max(by_a, default=None),
                                                                  "run": max(by_b, default=None)}}


def steps_strip(ref: Manifest, run: Manifest) -> dict[str, Any] | None:
    """For a picture: every step recorded in both runs, whether the weights agree there, and the
    layers that differ at the first step where they do not. None without step fingerprints."""
    a, b = read_jsonl(ref.file(STEPS)), read_jsonl(run.file(STEPS))
    if not a or not b:
        return None
    by_a = {r["step"]: r for r in a if isinstance(r.get("step"), int)}
    by_b = {r["step"]: r for r in b if isinstance(r.get("step"), int)}
    strip = [{"step": s, "agree": by_a[s].get("digest") == by_b[s].get("digest")}
             for s in sorted(set(by_a) & set(by_b))]
    parting = next((cell["step"] for cell in strip if not cell["agree"]), None)
    layers: list[dict[str, Any]] = []
    if parting is not None:
        la, lb = by_a[parting].get("layers") or {}, by_b[parting].get("layers") or {}
        layers = [{"layer": k, "agree": la.get(k) == lb.get(k)} for k in list(la) + [k for k in lb if k not in la]]
    return {"strip": strip, "parts_by": parting, "layers": layers}


def steps_phrase(steps: Mapping[str, Any]) -> str:
    """One clause: where two runs' step fingerprints part (or that they agree)."""
    if steps.get("same") is None:
        return "step fingerprints: no step recorded in both runs"
    if steps["same"]:
        return f"weights agree at all {steps['steps_compared']} recorded steps"
    first = f" (first layer {steps['first_layer']})" if steps.get("first_layer") else ""
    if steps["agree_until"] is None:
        return f"weights already differ at step {steps['parts_by']}, the first recorded in both{first}"
    return f"weights agree up to step {steps['agree_until']} and part by step {steps['parts_by']}{first}"


def steps_detail(steps: dict[str, Any]) -> str:
    """After where two runs part: how many layers differ there, the epoch, the loss, and the finer trace."""
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
