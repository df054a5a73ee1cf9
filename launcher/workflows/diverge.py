"""`launcher diverge RUN_A RUN_B`: where two runs part, down to the step, the layer and the operation, and
what makes them agree.

1. The step fingerprints of both runs (launcher.verify.stepdiff.steps_diff) give the window:
   the runs agree at step S and differ at step S' (the next step recorded in both).
2. Each run is executed again **in its own environment** — its image, its placement (host or cluster),
   its determinism profile, seed, thread count, code, data and arguments, as its launch record holds
   them — every step fingerprinted and the steps S+1..S' traced value by value
   (launcher.runtime.optrace). It starts from the start, or from the run's last checkpoint at or
   before step S where the run kept one (launcher.runs.rewind). Nothing of the original runs is changed.
3. Each re-execution is checked against its run (launcher.verify.repeat): its step fingerprints must
   be the run's at every step it computed up to S. One that is not computes something else than the
   run did, and diverge stops there (exit NOT_REPEATED).
4. The re-executions' own fingerprints, taken at every step, give the exact step at which their weights
   part; their traces (launcher.verify.opdiff) the first value that differs: the weights a forward pass
   read (changed outside the traced operations since the update before), a layer's input or output, a
   gradient, or the weights after an update.
5. Cause: for an operation, one candidate at a time (:func:`candidates`), the second run is executed
   again with one setting changed, and its trace compared with the first run's at that step. Where the
   runs' environments differ: the first run's thread count, its determinism profile, its host. Where
   they do not: deterministic ops for both when the profile was not `deterministic`, else one thread
   for both (both runs executed again). The first candidate under which the operation agrees is named
   as the cause. A change to the weights outside the traced operations is the code's own doing: no
   setting is tried.

Each re-execution is an ordinary run of the workspace (its own run folder, group
``diverge-<first run's tail>``), so its logs and outputs stay inspectable. The answer and its lines
are in launcher.workflows.divergence.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from launcher.errors import RunFailed, UsageError
from launcher.hosts import provision
from launcher.progress import NullReporter, Reporter
from launcher.records.manifest import Manifest, load_manifest
from launcher.records.records import LaunchRecord, StartPoint, placement_kind
from launcher.records.rundir import RunDir
from launcher.records.store import resolve_run_id
from launcher.runs import rewind
from launcher.runs.collect import pull_record, read_launch, wait_run
from launcher.runs.lifecycle import start_run
from launcher.runs.replicates import is_failed
from launcher.runtime.distributed import MASTER_PORT, rank_out
from launcher.runtime.reduction import ENV as REDUCTION_ENV
from launcher.specs.request import RunRequest
from launcher.specs.topology import Topology
from launcher.specs.userenv import is_secret
from launcher.targets.registry import open_placement
from launcher.verify import opdiff
from launcher.verify.classification import INPUT_CATEGORIES
from launcher.verify.environment import environment_diff
from launcher.verify.repeat import check_repeat, environment_changes
from launcher.verify.stepdiff import StepsDiff, read_steps, rows_diff, steps_diff
from launcher.workflows.divergence import (
    Candidate,
    CandidateRecord,
    Divergence,
    DivergenceLines,
    DivergenceRecord,
    Setting,
    outside_change,
)
from launcher.workspace import Workspace

__all__ = ["Candidate", "CandidateRecord", "Divergence", "DivergenceLines", "DivergenceRecord", "Setting",
           "candidates", "diverge", "respec"]


def respec(ws: Workspace, m: Manifest, launch: LaunchRecord, window: tuple[int, int]) -> RunRequest:
    """A run's request again, as its launch record holds it, every step fingerprinted and the window traced."""
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
    topo = launch.get("topology")
    layout = Topology(int(topo["nodes"]), int(topo["procs_per_node"]), str(topo["backend"]),
                      int(topo.get("master_port") or MASTER_PORT)) if topo else None
    reduction = str((det.get("env") or {}).get(REDUCTION_ENV) or "default")
    return RunRequest(recipe=name, variant=str(launch["image"].get("variant") or launch.get("variant")),
                      seed=m.seed, profile=str(det.get("profile") or "deterministic"),
                      threads=det.get("threads") if det.get("profile") == "deterministic" else None,
                      data=launch.get("data"), params=dict(m.params),
                      args=[str(a) for a in recipe.get("args") or []],
                      group=f"diverge-{m.run_id.rsplit('-', 1)[-1]}", code_plan=code.copy() if code else None,
                      image=launch["image"].copy(), env=plain, trace_every="1",
                      optrace=f"{window[0]}:{window[1]}", topology=layout, reduction=reduction)


def _execute(ws: Workspace, launch: LaunchRecord, request: RunRequest, rep: Reporter,
             on_log: Callable[[str], None] | None, point: StartPoint | None = None) -> str:
    """One re-execution, started as the original was: its recorded image and code plan as they are
    (nothing is planned, locked or built again), on its own placement; from the checkpoint point names."""
    folder = rewind.prepare(load_manifest(ws.runs / point["run"]), point) if point is not None else None
    try:
        if folder is not None and point is not None:
            request = replace(request, start_from={"folder": str(folder), "point": point})
        with open_placement(ws, launch) as placement:
            facts = provision.facts_for_run(ws, placement.host)  # the host as it is now, compared with the run's
            started = start_run(ws, request, placement, rep, facts=facts)
            run_id = str(started["run_id"])
            wait_run(ws, run_id, placement, on_log=on_log)
            manifest = pull_record(ws, run_id, placement, rep)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    if is_failed(manifest):
        raise RunFailed(f"the traced re-execution of {launch['run_id']} failed ({run_id})",
                        f"see its log with `launcher logs {run_id}`")
    return run_id


def _host_of(launch: LaunchRecord) -> tuple[object, object]:  # compared only: where a run ran
    return (launch.get("host_options"), placement_kind(launch, None))


def _ranks(ms: list[Manifest]) -> range:
    """The ranks both runs had (one process each: rank 0 alone)."""
    worlds = []
    for m in ms:
        topology: Mapping[str, Any] | None = m.data.get("topology")
        worlds.append(int((topology or {}).get("world_size") or 1))
    return range(min(worlds))


def _parting(ms: list[Manifest]) -> tuple[int | None, StepsDiff | None]:
    """Where the runs' own step fingerprints part: rank 0's for runs of one process (rank None); for runs of
    several, the rank whose weights part first (the earliest step by which a rank's part; the lowest rank of
    those), with the window from the last step every rank agreed at."""
    ranks = _ranks(ms)
    if len(ranks) < 2:
        return None, steps_diff(ms[0], ms[1])
    diffs = {r: rows_diff(*(read_steps(rank_out(m.file("outputs"), r)) for m in ms)) for r in ranks}
    parted = {r: d for r, d in diffs.items() if d["same"] is False and d["parts_by"] is not None}
    if not parted:
        return 0, diffs[0]
    first = min(parted, key=lambda r: (parted[r]["parts_by"], r))
    agreed = [d["agree_until"] for d in parted.values() if d["parts_by"] == parted[first]["parts_by"]]
    return first, {**parted[first], "agree_until": min((a for a in agreed if a is not None), default=None)}


def _first_rank(outs: list[Path], ranks: range, recorded: int) -> int:
    """The rank whose re-executed weights part first (every step fingerprinted; the recorded one when none do).
    Ranks whose weights part at the same step (a data-parallel all-reduce passes one rank's difference on within
    the step) are told apart by their traces: the rank whose first differing value comes first in the step (the
    weights its forward pass read, before any gradient) is where the runs part; else the lowest rank."""
    exact = {r: rows_diff(*(read_steps(rank_out(out, r)) for out in outs)) for r in ranks}
    parted = {r: d["parts_by"] for r, d in exact.items() if d["same"] is False and d["parts_by"] is not None}
    if not parted:
        return recorded
    step = min(parted.values())
    tied = sorted(r for r, s in parted.items() if s == step)
    if len(tied) == 1:
        return tied[0]
    where = {}
    for r in tied:
        found = opdiff.compare_traces(rank_out(outs[0], r), rank_out(outs[1], r))
        where[r] = opdiff.position(found) if found.get("found") else (1 << 30, 9)
    return min(tied, key=lambda r: (where[r], r))


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


def _start_points(ws: Workspace, result: Divergence, ms: list[Manifest], launches: list[LaunchRecord],
                  agree_until: int) -> list[StartPoint | None]:
    """Where each re-execution starts: the run's last checkpoint at or before the last agreeing step, where
    it was started with --checkpoint-every and kept one; else from the start (and why, in the result)."""
    points: list[StartPoint | None] = []
    for m, launch in zip(ms, launches, strict=True):
        point = None
        checkpoint = launch.get("checkpoint")
        if checkpoint and checkpoint.get("every") and launch.get("topology"):
            result.not_from_checkpoint.append(f"{m.run_id} ran as several processes, whose re-executions start "
                                              "from the start (every rank from its own checkpoint is not done yet)")
        elif checkpoint and checkpoint.get("every"):
            rows = read_steps(m.file("outputs"))
            point = rewind.start_point(m, agree_until, max(rows, default=None))
            if point is None and (why := rewind.why_none(m, agree_until)):
                result.not_from_checkpoint.append(why)
        if point is not None:
            result.started_from[m.run_id] = point
        points.append(point)
    return points


def _reexecute(ws: Workspace, result: Divergence, ms: list[Manifest], launches: list[LaunchRecord],
               requests: list[RunRequest], rep: Reporter, on_log: Callable[[str], None] | None) -> list[Path]:
    """Both runs executed again, each checked against its run; their outputs folders."""
    assert result.window is not None and result.steps is not None
    agree_until = result.steps["agree_until"] or 0
    points = _start_points(ws, result, ms, launches, agree_until)
    for m, launch, request, point in zip(ms, launches, requests, points, strict=True):
        where = f" from its checkpoint {point['checkpoint']} (step {point['step']})" if point else ""
        rep.note(f"re-executing {m.run_id}{where} with steps {result.window[0]}..{result.window[1]} traced")
        result.reruns[m.run_id] = _execute(ws, launch, request, rep, on_log, point)
    reruns = [RunDir(ws.runs / result.reruns[m.run_id]).outputs for m in ms]
    if result.rank is not None:  # every rank fingerprinted every step now: the first to part, exactly
        result.rank = _first_rank(reruns, _ranks(ms), result.rank)
    rank = result.rank or 0
    outs = []
    for m, point, rerun_out in zip(ms, points, reruns, strict=True):
        rerun = result.reruns[m.run_id]
        out = rank_out(rerun_out, rank)
        if point is not None:
            result.started_from[m.run_id] = {**point, "rerun_seconds": rewind.seconds(load_manifest(ws.runs / rerun))}
        check = check_repeat(m.run_id, rerun, read_steps(rank_out(m.file("outputs"), rank)), read_steps(out),
                             computed_from=point["step"] if point else 0, upto=agree_until,
                             parting=result.steps["parts_by"])
        if not check["repeats"]:
            check["differences"] = environment_changes(m, load_manifest(ws.runs / rerun))
        result.checks.append(check)
        outs.append(out)
    return outs


def _try_causes(ws: Workspace, result: Divergence, ms: list[Manifest], launches: list[LaunchRecord],
                requests: list[RunRequest], outs: list[Path], rep: Reporter,
                on_log: Callable[[str], None] | None) -> None:
    """One setting at a time until the operation agrees (see :func:`candidates`)."""
    assert result.first is not None
    step = int(result.first["step"])
    points: list[StartPoint | None] = []
    for m in ms:  # where each re-execution started, as the launch record keeps it
        point = result.started_from.get(m.run_id)
        points.append(cast(StartPoint, {k: v for k, v in point.items() if k != "rerun_seconds"}) if point else None)
    for cand in candidates(ms[0], ms[1], launches[0], launches[1]):
        request = replace(requests[1], optrace=f"{step}:{step}", **cand.setting)
        rep.note(f"re-executing {ms[1].run_id} with {cand.name}")
        cand.run_id = _execute(ws, launches[0] if cand.on_reference_host else launches[1], request, rep, on_log,
                               points[1])
        if cand.both:
            ref_request = replace(requests[0], optrace=f"{step}:{step}", **cand.setting)
            ref_out = rank_out(RunDir(ws.runs / _execute(ws, launches[0], ref_request, rep, on_log, points[0])).outputs,
                               result.rank or 0)
        else:
            ref_out = outs[0]
        d = opdiff.compare_traces(ref_out, rank_out(RunDir(ws.runs / cand.run_id).outputs, result.rank or 0))
        traced = step in (d.get("steps_traced") or [])
        cand.agrees = (not d.get("found")) if traced else None
        result.candidates.append(cand)
        if cand.agrees:
            break


def diverge(ws: Workspace, reference: str, other: str, *, causes: bool = True,
            reporter: Reporter | None = None, on_log: Callable[[str], None] | None = None) -> Divergence:
    """See the module's text. Raises UsageError for runs that cannot be localised."""
    rep = reporter or NullReporter()
    ids = [resolve_run_id(ws, reference), resolve_run_id(ws, other)]
    if ids[0] == ids[1]:
        raise UsageError("diverge needs two different runs", "give the two run ids `launcher verify` compared")
    ms = [load_manifest(ws.runs / i) for i in ids]
    rank, steps = _parting(ms)
    result = Divergence(ids[0], ids[1], steps, rank=rank)
    result.inputs = [row for row in environment_diff(ms[0], ms[1]) if row["category"] in INPUT_CATEGORIES]
    if steps is None:
        raise UsageError("the runs have no step fingerprints in common (fingerprints/steps.jsonl)",
                         "run them again with this launcher (it records them by default, --trace-every N)")
    parts_by = steps["parts_by"]  # a step wherever the runs part (same False)
    if steps["same"] is not False or parts_by is None or parts_by == 0:
        return result  # they agree, or their initial weights differ: no training step to trace
    result.window = ((steps["agree_until"] or 0) + 1, parts_by)
    launches = [read_launch(ws, i) for i in ids]
    requests = [respec(ws, m, launch, result.window) for m, launch in zip(ms, launches, strict=True)]
    outs = _reexecute(ws, result, ms, launches, requests, rep, on_log)
    if not all(c["repeats"] for c in result.checks):
        return result
    result.trace = dict(opdiff.trace_info(outs[0]))
    result.exact = rows_diff(read_steps(outs[0]), read_steps(outs[1]))
    result.first = opdiff.compare_traces(outs[0], outs[1])
    if causes and result.first.get("found") and not outside_change(result.first) and not result.inputs:
        _try_causes(ws, result, ms, launches, requests, outs, rep, on_log)
    return result
