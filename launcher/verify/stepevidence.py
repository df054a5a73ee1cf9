"""launcher's weight digests as evidence: two runs' step fingerprints compared as a file of the runs.

The runtime fingerprints the trained parameters while the script trains (``fingerprints/steps.jsonl``,
:mod:`launcher.runtime.steps`): step 0, each epoch's end, the script's end. A script that saves nothing
(PyTorch's regression example updates its parameters by hand and prints them) still leaves these, and
they are what training produced: two runs whose digests agree at every step recorded in both, to the
same last step, trained the same weights; two whose digests part did not.

:func:`compare_steps` answers as the other content comparers do (:class:`ContentDiff`); rows that one
run recorded and the other did not (another ``--trace-every``) are set aside. Its ``evidence`` names
what the digests prove (the last step, the module and the optimizer they cover); it is None when the
weights never moved (the digest at the last step is step 0's): then no training was observed and the
file proves nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from launcher.verify.contentlogs import ContentDiff
from launcher.verify.jsonlines import read_jsonl
from launcher.verify.stepdiff import StepRow, StepsDiff, steps_phrase

FORMAT = "weight digests"


def read_steps(path: Path) -> dict[int, StepRow]:
    """The rows of a steps.jsonl by step (rows without an integer step left out); raises ValueError when none."""
    rows = read_jsonl(path)
    by_step = {r["step"]: cast(StepRow, r) for r in rows or [] if isinstance(r.get("step"), int)}
    if not by_step:
        raise ValueError("no step rows")
    return by_step


def covers(row: StepRow) -> str:
    """What a row's digests cover: ``module Net, optimizer SGD`` (``updated by hand`` without an optimizer)."""
    raw = cast(dict[str, object], row)
    module, optimizer = raw.get("module"), raw.get("optimizer")
    parts = [f"module {module}"] if isinstance(module, str) and module else ["the model's parameters"]
    if optimizer == "by hand":
        parts.append("updated by hand")
    elif isinstance(optimizer, str) and optimizer:
        parts.append(f"optimizer {optimizer}")
    return ", ".join(parts)


def proves(rows: dict[int, StepRow]) -> str | None:
    """The phrase for what one run's digests prove (the last step and what they cover), or None when the
    weights at the last step are those of the first recorded step: no training was observed."""
    first, last = rows[min(rows)], rows[max(rows)]
    if max(rows) == min(rows) or first.get("digest") == last.get("digest"):
        return None
    return f"launcher's weight digests at step {max(rows)} ({covers(last)})"


def _parting(by_a: dict[int, StepRow], by_b: dict[int, StepRow], common: list[int]) -> StepsDiff | None:
    agree: int | None = None
    for step in common:
        ra, rb = by_a[step], by_b[step]
        if ra.get("digest") == rb.get("digest"):
            agree = step
            continue
        la, lb = ra.get("layers") or {}, rb.get("layers") or {}
        layers = [k for k in [*la, *(k for k in lb if k not in la)] if la.get(k) != lb.get(k)]
        return {"same": False, "steps_compared": len(common), "agree_until": agree, "parts_by": step,
                "first_layer": layers[0] if layers else None}
    return None


def compare_steps(a: Path, b: Path) -> ContentDiff:
    """Two runs' weight digests: the same when they agree at every step both recorded and end at the same step."""
    by_a, by_b = read_steps(a), read_steps(b)
    common = sorted(set(by_a) & set(by_b))
    what = covers(by_a[max(by_a)])
    volatile = ["rows at steps one run recorded alone (another --trace-every)"] if set(by_a) != set(by_b) else []
    if not common:
        return ContentDiff(FORMAT, False, volatile, f"no step recorded in both runs ({what})")
    parted = _parting(by_a, by_b, common)
    if parted is not None:
        return ContentDiff(FORMAT, False, volatile, f"{steps_phrase(parted)}; {what}")
    if max(by_a) != max(by_b):
        return ContentDiff(FORMAT, False, volatile,
                           f"weights agree at the {len(common)} steps recorded in both, but training ends at step "
                           f"{max(by_a)} in one run and {max(by_b)} in the other; {what}")
    return ContentDiff(FORMAT, True, volatile, evidence=proves(by_a))
