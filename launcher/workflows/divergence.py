"""`launcher diverge`'s answer (launcher.workflows.diverge): what was re-executed and checked, the exact step,
the first value that differs, the cause tried, the lines that tell it, and its exit code.

The order of the lines is the order of the reasoning: where the runs' own step fingerprints part; the
re-executions, and where each started; whether each repeats its run up to there (else nothing more
is said); what the trace could observe; the first step at which the re-executions' weights differ;
the first traced value that differs, and whether it is a change made outside the traced operations;
then the settings tried.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TypedDict

from launcher.errors import ExitCode
from launcher.records.records import StartPoint
from launcher.runtime.optrace import WEIGHTS
from launcher.verify import opdiff
from launcher.verify.environment import EnvironmentRow
from launcher.verify.opdiff import OpDifference
from launcher.verify.repeat import RepeatCheck, repeat_phrase
from launcher.verify.stepdiff import StepsDiff, steps_phrase

LOCALISED, NOT_REPEATED, AGREE, PARTING_NOT_REPEATED = "localised", "not_repeated", "agree", "parting_not_repeated"
INITIAL = "initial"  # the runs differ at step 0, before any update
OUTSIDE = "a change the code made to the weights outside the traced operations"


class Setting(TypedDict, total=False):
    """The RunRequest fields a candidate changes (given to dataclasses.replace)."""

    threads: int | None
    profile: str


class CandidateRecord(TypedDict):
    name: str
    setting: Setting
    run_id: str | None
    agrees: bool | None


class DivergenceRecord(TypedDict):
    """``launcher diverge``'s answer (its JSON output)."""

    reference: str
    run: str
    outcome: str | None  # localised | initial | not_repeated | parting_not_repeated | agree (None: they do not part)
    steps: StepsDiff | None
    window: list[int] | None
    reruns: dict[str, str]
    started_from: dict[str, StartPoint]  # run id -> the checkpoint its re-execution started from
    not_from_checkpoint: list[str]  # why a run started with checkpoints was re-executed from the start
    checks: list[RepeatCheck]
    trace: dict[str, object]  # the re-executions' optrace/trace.json: what the trace could observe
    exact: StepsDiff | None  # the re-executions' step fingerprints compared
    first_difference: OpDifference | None
    candidates: list[CandidateRecord]
    inputs: list[EnvironmentRow]  # what verify would name as the runs' differing inputs (code, data, seed, params)
    cause: str | None
    rank: int | None  # runs of several processes: the rank whose weights part first (its records traced)


class DivergenceLines(DivergenceRecord):
    """`diverge`'s Result data: the divergence, and the lines that tell it."""

    lines: list[str]


@dataclass
class Candidate:
    name: str  # what was changed, e.g. "threads 1 (the reference's)"
    setting: Setting  # the RunRequest fields changed
    both: bool = False  # the reference is executed again under the same change (else its first trace serves)
    on_reference_host: bool = False  # the second run is executed where the reference ran
    run_id: str | None = None
    agrees: bool | None = None  # the operation agrees with the reference under it


def outside_change(first: OpDifference | None) -> bool:
    """The first difference is a change a run's code made to its weights between an update and the next
    forward pass (launcher.verify.opdiff's changed_in): no setting explains it."""
    return bool(first and first.get("found") and first.get("kind") == WEIGHTS and first.get("changed_in"))


def _short(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _values(ref: object, run: object) -> str:
    """Two values of one input; of two lists (a script's arguments), only the part that differs."""
    if not (isinstance(ref, list) and isinstance(run, list)):
        return f"{_short(ref)} against {_short(run)}"
    head = 0
    while head < min(len(ref), len(run)) and ref[head] == run[head]:
        head += 1
    tail = 0
    while tail < min(len(ref), len(run)) - head and ref[-1 - tail] == run[-1 - tail]:
        tail += 1
    parts = [[str(x) for x in v[head:len(v) - tail]] for v in (ref, run)]
    return "where they differ: " + ", ".join(f"{_short(' '.join(p)) if p else 'nothing'} in the {side}"
                                             for p, side in zip(parts, ("reference", "run"), strict=True))


def inputs_phrase(rows: list[EnvironmentRow]) -> str:
    """The inputs in which two runs differ, each with both values (shortened)."""
    return ", ".join(f"{r['key']} ({_values(r['reference'], r['run'])})" for r in rows[:3]) + \
        (f" and {len(rows) - 3} more" if len(rows) > 3 else "")


@dataclass
class Divergence:
    reference: str
    run: str
    steps: StepsDiff | None
    window: tuple[int, int] | None = None
    reruns: dict[str, str] = field(default_factory=dict)  # original run id -> its traced re-execution
    started_from: dict[str, StartPoint] = field(default_factory=dict)
    not_from_checkpoint: list[str] = field(default_factory=list)
    checks: list[RepeatCheck] = field(default_factory=list)
    trace: dict[str, object] = field(default_factory=dict)
    exact: StepsDiff | None = None
    first: OpDifference | None = None  # the traces compared (launcher.verify.opdiff.compare_traces)
    candidates: list[Candidate] = field(default_factory=list)
    inputs: list[EnvironmentRow] = field(default_factory=list)  # the inputs that differ: code, data, seed, params
    rank: int | None = None  # runs of several processes: the rank whose weights part first (None: one process)

    @property
    def cause(self) -> str | None:
        if outside_change(self.first):
            return OUTSIDE
        if self.inputs and self.outcome == LOCALISED:
            return "their inputs differ: " + ", ".join(r["key"] for r in self.inputs)
        return next((c.name for c in self.candidates if c.agrees), None)

    @property
    def outcome(self) -> str | None:
        if self.window is None:
            return INITIAL if self.steps and self.steps["same"] is False and self.steps["parts_by"] == 0 else None
        if self.checks and not all(c["repeats"] for c in self.checks):
            return NOT_REPEATED
        found = self.first is not None and self.first.get("found")
        if found or (self.exact is not None and self.exact["same"] is False):
            return LOCALISED
        if any(c["parting_repeated"] is False for c in self.checks):
            return PARTING_NOT_REPEATED
        return AGREE if self.first is not None else None

    @property
    def exit_code(self) -> ExitCode:
        """OK when the runs do not part or the parting is localised; NOT_REPEATED when a re-execution does
        not repeat its run, or the parting does not repeat (nothing it traced can be believed)."""
        return ExitCode.NOT_REPEATED if self.outcome in (NOT_REPEATED, PARTING_NOT_REPEATED, AGREE) else ExitCode.OK

    def lines(self) -> list[str]:
        whose = f" (rank {self.rank}, the first rank whose weights part)" if self.rank else ""
        out = [f"{self.run} against {self.reference}{whose}: " + (steps_phrase(self.steps) if self.steps else
                                                                  "no step fingerprints")]
        if self.inputs:
            out.append(f"their inputs differ: {inputs_phrase(self.inputs)}"
                       + ("; what follows shows where that first acts" if self.window else ""))
        if self.outcome == INITIAL:
            out.append("nothing to re-execute: the runs part before any update, in their initial weights, which "
                       "come from the seed, the data and the code, not from a training step"
                       + ("" if self.inputs else " (`launcher verify checksums` names which of them differ)"))
        if self.window is None:
            return out
        out += self._execution_lines()
        if self.outcome == NOT_REPEATED:
            out.append("stopped: a re-execution that does not repeat its run computes something else than the run "
                       "did (nondeterminism, or an environment that cannot be recreated), so nothing it traces says "
                       "where the runs part; make the runs repeatable (the determinism profile, --threads, the same "
                       "data and image), run them again, then diverge the new runs")
            return out
        out += self._finding_lines()
        return out

    def _execution_lines(self) -> list[str]:
        lo, hi = self.window or (0, 0)
        out = [f"re-executed both in their own environments, each step fingerprinted and steps {lo}..{hi} traced "
               "value by value: " + ", ".join(f"{k} -> {v}" for k, v in self.reruns.items())]
        for run, point in self.started_from.items():
            out.append(start_phrase(self.reruns.get(run, "?"), point))
        out += [f"{reason}: re-executed from the start" for reason in self.not_from_checkpoint]
        out += ["check: " + repeat_phrase(c) for c in self.checks]
        if self.trace and not self.trace.get("operations", True):
            out.append(f"what the trace saw: the weights ({self.trace.get('weights')}), not the operations inside a "
                       "step")
        return out

    def _finding_lines(self) -> list[str]:
        out: list[str] = []
        if self.exact is not None:
            whose = f" of rank {self.rank}" if self.rank is not None else ""
            out.append(f"exact step: the re-executions' weights{whose} " + exact_phrase(self.exact))
        names = (self.reference, self.run)
        if self.first is not None:
            out.append(opdiff.op_phrase(self.first, names))
        out += [f"{c['rerun']} does not repeat {c['run']}'s own fingerprint at step {c['parting']}, where the "
                "runs part: what makes them part is not deterministic"
                for c in self.checks if c["parting_repeated"] is False]
        if self.outcome == AGREE:
            out.append("the parting did not repeat: both re-executions agree at every step and every traced value "
                       "of the window")
        for c in self.candidates:
            verdict = {True: "agrees", False: "still differs", None: "not traced"}[c.agrees]
            out.append(f"with {c.name}: the operation {verdict} ({c.run_id})")
        if outside_change(self.first):
            out.append(f"cause: {OUTSIDE} (not a setting: none was tried)")
        elif self.inputs and self.cause is not None:
            out.append(f"cause: {self.cause} (no setting was tried)")
        elif self.cause is not None:
            out.append(f"cause: {self.cause} makes step {self.first['step'] if self.first else '?'} agree")
        elif self.candidates:
            out.append("cause: not found among the settings tried (" + ", ".join(c.name for c in self.candidates)
                       + ")")
        return out

    def to_dict(self) -> DivergenceRecord:
        return {"reference": self.reference, "run": self.run, "outcome": self.outcome, "steps": self.steps,
                "window": list(self.window) if self.window else None, "reruns": self.reruns,
                "started_from": self.started_from, "not_from_checkpoint": self.not_from_checkpoint,
                "checks": self.checks, "trace": self.trace, "exact": self.exact, "first_difference": self.first,
                "candidates": [{"name": c.name, "setting": c.setting, "run_id": c.run_id, "agrees": c.agrees}
                               for c in self.candidates],
                "inputs": self.inputs, "cause": self.cause, "rank": self.rank}


def exact_phrase(d: StepsDiff) -> str:
    """Where the re-executions' fingerprints (every step of the window) part."""
    if d["same"] is not False:
        return "agree at every step recorded in both"
    layers = d.get("layers_differing") or []
    first = f" (layers {', '.join(layers)})" if 0 < len(layers) <= 4 else \
        f" ({len(layers)} layers, first {layers[0]})" if layers else ""
    if d["agree_until"] is None:
        return f"already differ at step {d['parts_by']}{first}"
    return f"agree up to step {d['agree_until']} and differ from step {d['parts_by']} on{first}"


def start_phrase(rerun: str, p: StartPoint) -> str:
    """Where a re-execution started, and what that saved."""
    line = (f"{rerun} started from {p['run']}'s checkpoint {p['checkpoint']} (step {p['step']}, after epoch "
            f"{p['epochs']}): steps 1..{p['step']} not re-executed")
    if p.get("steps_total"):
        line += f", {p['step']} of the run's {p['steps_total']}"
    took, run = p.get("rerun_seconds"), p.get("seconds")
    if took is not None and run is not None:
        line += f"; it took {took:.0f} s, the run {run:.0f} s from the start"
    return line
