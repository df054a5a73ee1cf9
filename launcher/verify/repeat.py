"""Whether a re-execution repeats the run it stands for: its step fingerprints against the run's, at
each step both recorded that the re-execution computed itself, up to the last step at which the two
runs compared agree.

`launcher diverge` believes what a re-execution traces only when it repeats its run up to there: a
re-execution whose weights depart from its run's before the window computes something other than the
run did (nondeterminism, or an environment that cannot be recreated: data changed on the host, another
image), and nothing it traces tells where the run parted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from launcher.records.manifest import Manifest
from launcher.verify.environment import environment_diff
from launcher.verify.jsonlines import read_json
from launcher.verify.stepdiff import StepRow

DATASET = "outputs/fingerprints/dataset.json"


class RepeatCheck(TypedDict):
    """One re-execution checked against its run (`launcher diverge`'s ``checks``)."""

    run: str
    rerun: str
    computed_from: int  # the re-execution computed the steps after this one (0: from the start; else its checkpoint's)
    upto: int  # the last step checked: the last at which the two runs compared agree
    steps_checked: list[int]
    repeats: bool  # its weights are the run's at every step checked
    departs_at: int | None  # the first step checked at which they are not
    layers: list[str]  # the layers that differ there
    parting: int | None  # the step by which the two runs part
    parting_repeated: bool | None  # the re-execution's weights are the run's there too (None: not recorded in both)
    differences: list[str]  # where it does not repeat: what differs between its environment and the run's


def check_repeat(run: str, rerun: str, recorded: Mapping[int, StepRow], again: Mapping[int, StepRow], *,
                 computed_from: int, upto: int, parting: int | None) -> RepeatCheck:
    """The re-execution's step fingerprints (again) against its run's (recorded) at the steps both hold
    in computed_from < step <= upto (step 0, the initial weights, too when it ran from the start)."""
    low = -1 if computed_from == 0 else computed_from
    steps = [s for s in sorted(set(recorded) & set(again)) if low < s <= upto]
    departs: int | None = None
    layers: list[str] = []
    for s in steps:
        if recorded[s].get("digest") != again[s].get("digest"):
            departs = s
            la, lb = recorded[s].get("layers") or {}, again[s].get("layers") or {}
            layers = [k for k in [*la, *(k for k in lb if k not in la)] if la.get(k) != lb.get(k)]
            break
    repeated = None
    if parting is not None and parting in recorded and parting in again:
        repeated = recorded[parting].get("digest") == again[parting].get("digest")
    return {"run": run, "rerun": rerun, "computed_from": computed_from, "upto": upto, "steps_checked": steps,
            "repeats": departs is None, "departs_at": departs, "layers": layers, "parting": parting,
            "parting_repeated": repeated, "differences": []}


def environment_changes(run: Manifest, rerun: Manifest) -> list[str]:
    """What differs between a run's environment and its re-execution's that could change the bits: the
    environment keys verify would name (not what a re-execution records differently on purpose), and
    the data's fingerprint."""
    out = [row["key"] for row in environment_diff(run, rerun) if row["category"] != "info"]
    data = [read_json(m.run_dir / DATASET) for m in (run, rerun)]
    digests = [d.get("digest") if isinstance(d, dict) else None for d in data]
    if digests[0] != digests[1]:
        out.insert(0, "the data's fingerprint (fingerprints/dataset.json)")
    return out


def repeat_phrase(check: RepeatCheck) -> str:
    """One clause on one re-execution: whether, and how far, it repeats its run."""
    start = "from the start" if check["computed_from"] == 0 else f"from step {check['computed_from']}"
    steps = check["steps_checked"]
    if check["repeats"]:
        if not steps:
            return (f"{check['rerun']} ({start}) computed no step before the window to check against "
                    f"{check['run']}")
        return (f"{check['rerun']} repeats {check['run']} at each step it computed up to step {check['upto']} "
                f"({'step' if len(steps) == 1 else 'steps'} {_steps(steps)})")
    differs = f" ({', '.join(check['differences'][:3])} differ)" if check["differences"] else ""
    return (f"{check['rerun']} does not repeat {check['run']}: its weights depart at step {check['departs_at']} "
            f"(layers {', '.join(check['layers']) or '?'}), before the window{differs}")


def _steps(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps) if len(steps) <= 6 else f"{steps[0]}, {steps[1]}, ..., {steps[-1]}"

