"""`launcher diverge RUN_A RUN_B`: where two runs part, down to the operation, and what makes them agree.

1. The step fingerprints of both runs (launcher.verify.stepdiff.steps_diff) give the window:
   the runs agree at step S and differ at step S' (the next step recorded in both).
2. Each run is executed again from the start **in its own environment** — its image, its placement
   (host or cluster), its determinism profile, seed, thread count, code, data and arguments, as its
   launch record holds them — with the steps S+1..S' traced operation by operation
   (launcher.runtime.optrace). Nothing of the original runs is changed.
3. The two traces are compared (launcher.verify.opdiff): the first step and operation whose value
   differs, whether its input agreed, and by how much.
4. Cause: one candidate at a time (:func:`candidates`), the second run is executed again with one
   setting changed, and its trace compared with the first run's at that step. Where the runs'
   environments differ: the first run's thread count, its determinism profile, its host. Where they
   do not: deterministic ops for both when the profile was not `deterministic`, else one thread for
   both (both runs executed again). The first candidate under which the operation agrees is named as
   the cause.

Each re-execution is an ordinary run of the workspace (its own run folder, group
``diverge-<first run's tail>``), so its logs and outputs stay inspectable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypedDict

from launcher.errors import RunFailed, UsageError
from launcher.progress import NullReporter, Reporter
from launcher.runs.collect import pull_record, read_launch, wait_run
from launcher.runs.lifecycle import start_run
from launcher.runs.manifest import Manifest, load_manifest
from launcher.runs.records import LaunchRecord, placement_kind
from launcher.runs.replicates import is_failed
from launcher.runs.rundir import RunDir
from launcher.runs.runspec import RunSpec
from launcher.runs.store import resolve_run_id
from launcher.runs.targets import open_placement
from launcher.runs.userenv import is_secret
from launcher.verify import opdiff
from launcher.verify.environment import environment_diff
from launcher.verify.opdiff import OpDifference
from launcher.verify.stepdiff import StepsDiff, steps_diff, steps_phrase
from launcher.workspace import Workspace


class Setting(TypedDict, total=False):
    """The RunSpec fields a candidate changes (given to dataclasses.replace)."""

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
    steps: StepsDiff | None
    window: list[int] | None
    reruns: dict[str, str]
    first_difference: OpDifference | None
    candidates: list[CandidateRecord]
    cause: str | None


class DivergenceLines(DivergenceRecord):
    """`diverge`'s Result data: the divergence, and the lines that tell it."""

    lines: list[str]


@dataclass
class Candidate:
    name: str  # what was changed, e.g. "threads 1 (the reference's)"
    setting: Setting  # the RunSpec fields changed
    both: bool = False  # the reference is executed again under the same change (else its first trace serves)
    on_reference_host: bool = False  # the second run is executed where the reference ran
    run_id: str | None = None
    agrees: bool | None = None  # the operation agrees with the reference under it


@dataclass
class Divergence:
    reference: str
    run: str
    steps: StepsDiff | None
    window: tuple[int, int] | None = None
    reruns: dict[str, str] = field(default_factory=dict)  # original run id -> its traced re-execution
    first: OpDifference | None = None  # the traces compared (launcher.verify.opdiff.compare_traces)
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def cause(self) -> Candidate | None:
        return next((c for c in self.candidates if c.agrees), None)

    def lines(self) -> list[str]:
        out = [f"{self.run} against {self.reference}: " + (steps_phrase(self.steps) if self.steps else
                                                            "no step fingerprints")]
        if self.window is None:
            return out
        lo, hi = self.window
        out.append(f"re-executed both in their own environments, tracing steps {lo}..{hi} operation by operation: "
                   + ", ".join(f"{k} -> {v}" for k, v in self.reruns.items()))
        if self.first is not None:
            out.append(opdiff.op_phrase(self.first))
        for c in self.candidates:
            verdict = {True: "agrees", False: "still differs", None: "not traced"}[c.agrees]
            out.append(f"with {c.name}: the operation {verdict} ({c.run_id})")
        cause = self.cause
        if cause is not None:
            out.append(f"cause: {cause.name} makes step {self.first['step'] if self.first else '?'} agree")
        elif self.candidates:
            out.append("cause: not found among the settings tried (" + ", ".join(c.name for c in self.candidates)
                       + ")")
        return out

    def to_dict(self) -> DivergenceRecord:
        return {"reference": self.reference, "run": self.run, "steps": self.steps,
                "window": list(self.window) if self.window else None, "reruns": self.reruns,
                "first_difference": self.first,
                "candidates": [{"name": c.name, "setting": c.setting, "run_id": c.run_id, "agrees": c.agrees}
                               for c in self.candidates],
                "cause": self.cause.name if self.cause else None}


def respec(ws: Workspace, m: Manifest, launch: LaunchRecord, window: tuple[int, int]) -> RunSpec:
    """A run's spec again, as its launch record holds it, with the window traced op by op."""
    recipe = launch["recipe"]
    code = launch.get("code") or None
    det = m.determinism
    if recipe.get("script"):
        local = (code.get("local") or code.get("root")) if code else None
        if not local or not Path(str(local)).is_dir():
            raise UsageError(f"run {m.run_id}: its code is no longer on this machine ({local})",
                             "run the script again with `launcher run`, then diverge the new runs")
        name: str = str(Path(str(local)) / str(recipe.get("entry")))
    else:
        name = m.recipe_name
    env = launch.get("env") or {}
    plain = {k: str(v["value"]) for k, v in env.items() if isinstance(v, dict) and "value" in v}
    if any(is_secret(v) for v in env.values()):
        raise UsageError(f"run {m.run_id} was given --secret-env variables, which launcher does not keep",
                         "run both again with the same --secret-env, then diverge the new runs")
    return RunSpec(recipe=name, variant=str(launch["image"].get("variant") or launch.get("variant")),
                   seed=m.seed, profile=str(det.get("profile") or "deterministic"),
                   threads=det.get("threads") if det.get("profile") == "deterministic" else None,
                   data=launch.get("data"), params=dict(m.params),
                   args=[str(a) for a in recipe.get("args") or []],
                   group=f"diverge-{m.run_id.rsplit('-', 1)[-1]}", code_plan=code.copy() if code else None,
                   image=launch["image"].copy(), env=plain, trace_every="1",
                   optrace=f"{window[0]}:{window[1]}")


def _execute(ws: Workspace, launch: LaunchRecord, spec: RunSpec, rep: Reporter,
             on_log: Callable[[str], None] | None) -> str:
    """One re-execution, started as the original was: its recorded image and code plan as they are
    (nothing is planned, locked or built again), on its own placement."""
    with open_placement(ws, launch) as placement:
        started = start_run(ws, spec, placement, rep)
        run_id = str(started["run_id"])
        wait_run(ws, run_id, placement, on_log=on_log)
        manifest = pull_record(ws, run_id, placement, rep)
    if is_failed(manifest):
        raise RunFailed(f"the traced re-execution of {launch['run_id']} failed ({run_id})",
                        f"see its log with `launcher logs {run_id}`")
    return run_id


def _host_of(launch: LaunchRecord) -> tuple[object, object]:  # compared only: where a run ran
    return (launch.get("host_options"), placement_kind(launch, None))


def candidates(ref: Manifest, run: Manifest, ref_launch: LaunchRecord, run_launch: LaunchRecord) -> list[Candidate]:
    """The settings to try, one at a time, in this order. Where the two runs' environments differ:
    the reference's thread count, its determinism profile, its host. Where they do not: deterministic
    ops for both when the profile was not `deterministic`, else one thread for both."""
    diff = {row["key"]: row for row in environment_diff(ref, run)}
    out: list[Candidate] = []
    det = ref.determinism
    if "determinism.threads" in diff and det.get("threads") is not None:
        t = det["threads"]
        out.append(Candidate(f"threads {t} (the reference's)", {"threads": t}))
    if "determinism.profile" in diff:
        p = str(det.get("profile"))
        out.append(Candidate(f"profile {p} (the reference's)", {"profile": p, "threads": det.get("threads")}))
    if _host_of(ref_launch) != _host_of(run_launch):
        out.append(Candidate("the reference's host", {}, on_reference_host=True))
    if out:
        return out
    if det.get("profile") != "deterministic":  # the thread count is fixed by that profile alone
        out.append(Candidate("deterministic ops for both (profile deterministic)", {"profile": "deterministic"},
                             both=True))
    elif det.get("threads") != 1:
        out.append(Candidate("threads 1 for both", {"threads": 1}, both=True))
    return out


def diverge(ws: Workspace, reference: str, other: str, *, causes: bool = True,
            reporter: Reporter | None = None, on_log: Callable[[str], None] | None = None) -> Divergence:
    """See the module's text. Raises UsageError for runs that cannot be localised."""
    rep = reporter or NullReporter()
    ids = [resolve_run_id(ws, reference), resolve_run_id(ws, other)]
    if ids[0] == ids[1]:
        raise UsageError("diverge needs two different runs", "give the two run ids `launcher verify` compared")
    ms = [load_manifest(ws.runs / i) for i in ids]
    steps = steps_diff(ms[0], ms[1])
    result = Divergence(ids[0], ids[1], steps)
    if steps is None:
        raise UsageError("the runs have no step fingerprints in common (fingerprints/steps.jsonl)",
                         "run them again with this launcher (it records them by default, --trace-every N)")
    parts_by = steps["parts_by"]  # a step wherever the runs part (same False)
    if steps["same"] is not False or parts_by is None:
        return result
    window = ((steps["agree_until"] or 0) + 1, parts_by)
    result.window = window
    launches = [read_launch(ws, i) for i in ids]
    specs = [respec(ws, m, launch, window) for m, launch in zip(ms, launches, strict=True)]
    for m, launch, spec in zip(ms, launches, specs, strict=True):
        rep.note(f"re-executing {m.run_id} with steps {window[0]}..{window[1]} traced")
        result.reruns[m.run_id] = _execute(ws, launch, spec, rep, on_log)
    outs = [RunDir(ws.runs / result.reruns[i]).outputs for i in ids]
    result.first = opdiff.compare_traces(outs[0], outs[1])
    if not causes or not result.first.get("found"):
        return result
    step = int(result.first["step"])
    for cand in candidates(ms[0], ms[1], launches[0], launches[1]):
        spec = replace(specs[1], optrace=f"{step}:{step}", **cand.setting)
        rep.note(f"re-executing {ids[1]} with {cand.name}")
        cand.run_id = _execute(ws, launches[0] if cand.on_reference_host else launches[1], spec, rep, on_log)
        if cand.both:
            ref_spec = replace(specs[0], optrace=f"{step}:{step}", **cand.setting)
            ref_out = RunDir(ws.runs / _execute(ws, launches[0], ref_spec, rep, on_log)).outputs
        else:
            ref_out = outs[0]
        d = opdiff.compare_traces(ref_out, RunDir(ws.runs / cand.run_id).outputs)
        traced = step in (d.get("steps_traced") or [])
        cand.agrees = (not d.get("found")) if traced else None
        result.candidates.append(cand)
        if cand.agrees:
            break
    return result
