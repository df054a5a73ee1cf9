"""Explanations of differing runs and model diffs as text lines, for `launcher verify`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.verify.stepdiff import steps_detail, steps_phrase

if TYPE_CHECKING:
    from launcher.verify.differences import Explanation, ModelExplanation

MAX_ARRAY_LINES = 12


def num(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def full(x: Any) -> str:
    return f"{x:.10g}" if isinstance(x, float) else str(x)



def model_lines(model: ModelExplanation) -> list[str]:
    """A model diff (an explanation's, or `verify models`') as text lines."""
    if "error" in model:
        return [f"model ({model['source']}): could not diff: {model['error']}"]
    lines: list[str] = []
    first = model.get("first_difference")
    head = (f"model ({model['source']}): {model['arrays_differing']} of {model['arrays_total']} "
            f"arrays differ, {model['elements_differing']} of {model['elements_total']} elements")
    lines.append(head if first else f"model ({model['source']}): all arrays identical")
    shown = 0
    differing = [a for a in model["arrays"] if a["status"] != "identical"]
    for a in differing:
        if shown == MAX_ARRAY_LINES:
            lines.append(f"  and {len(differing) - shown} more arrays differ (all of them in --json)")
            break
        shown += 1
        detail = {"differs": f"{a['differing']} of {a['total']} elements, max abs diff "
                             f"{num(a['max_abs_diff'])}, max rel diff {num(a['max_rel_diff'])}",
                  "shape": f"shape/dtype {a['shape']} {a['dtype']} vs {a['other_shape']}",
                  "missing": "in one model only"}.get(a["status"], a["status"])
        is_first = first is not None and (a["layer"], a["array"]) == (first["layer"], first["array"])
        mark = "first differing: " if is_first else ""
        lines.append(f"  {mark}layer {a['layer']} array {a['array']}: {detail}")
    return lines


def explanation_lines(exp: Explanation) -> list[str]:
    """The explanation of one differing run as indented text lines."""
    lines: list[str] = []
    for f in exp.get("files") or []:
        content = f.get("content")
        hint = f"; to leave it out: --ignore '{f['ignore']}'" if f.get("ignore") else ""
        what = (f"in one run only{hint}" if f["status"] == "missing" else (content and content.get("difference"))
                or "bytes differ (format not compared by content)")
        lines.append(f"file {f['path']}: {what}")
    model = exp.get("model")
    if model is not None:
        lines += model_lines(model)
    lines += _training_lines(exp)
    impact = exp.get("impact")
    if impact is not None:
        from launcher.verify.impact import impact_lines

        lines += impact_lines(impact)
    env = exp.get("environment")
    if env:
        lines.append("inputs and environment: " + "; ".join(
            f"{r['key']} {r['reference']!r} -> {r['run']!r} [{r['category']}]" for r in env[:12])
            + (f"; and {len(env) - 12} more" if len(env) > 12 else ""))
    elif env is not None:
        lines.append("environment: identical (same image, seed, profile, threads, host hardware)")
    return lines


def _training_lines(exp: Explanation) -> list[str]:
    """An explanation's lines on how training went: initial weights, data, batches, steps, metrics."""
    lines: list[str] = []
    init = exp.get("initial_weights")
    if init is not None:
        if init["same"]:
            lines.append("initial weights: identical (the runs started from the same weights)")
        else:
            ifd = init.get("first_difference")
            layer, array = (ifd["layer"], ifd["array"]) if ifd else (None, None)
            lines.append(f"initial weights: differ from the start ({init['arrays_differing']} arrays; "
                         f"first layer {layer} array {array})")
    data = exp.get("data")
    if data is not None:
        lines.append("training data: identical" if data["same"] else
                     "training data: differs (" + (", ".join(data["entries_differing"]) or "digest") + ")")
    batches = exp.get("batches")
    if batches is not None:
        if batches["same"] is None:
            lines.append("batches: not recorded (" + "; ".join(batches.get("unrecorded", [])) + ")")
        elif batches["same"]:
            lines.append(f"batches: identical in all {batches['epochs_compared']} epochs")
        else:
            where = batches["first_divergence"]
            at = f"; first at epoch {where['epoch']} batch {where['batch']}" if where is not None else ""
            lines.append(f"batches: differ in epochs {batches['epochs_differing']}{at}")
    steps = exp.get("steps")
    if steps is not None:
        lines.append("training steps: " + steps_phrase(steps) + steps_detail(steps))
    metrics = exp.get("metrics")
    if metrics is not None:
        fd = metrics.get("first_divergence")
        if fd is None:
            lines.append("metrics: identical in every epoch")
        else:
            parts = [f"{k} {full(v['reference'])} -> {full(v['run'])}"
                     + (f" (|Δ| {num(v['abs_diff'])})" if "abs_diff" in v else "")
                     for k, v in fd["metrics"].items()]
            lines.append(f"metrics: first diverge at epoch {fd['epoch']}: " + ", ".join(parts))
    return lines
