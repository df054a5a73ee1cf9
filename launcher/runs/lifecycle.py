"""A run's start: its request planned once (:func:`launcher.runs.plan.plan_run`: image, code, data, group,
replicates resolved into a ``ResolvedRun``), then each replicate's container and launch record built from
that plan alone and started; for a group, its replicates handed to :mod:`launcher.runs.collect`, which
waits, pulls and finishes them.

The request is :class:`launcher.specs.request.RunRequest`, its container :mod:`launcher.specs.container`,
where and how it is placed :mod:`launcher.targets.placement` (the only way this module reaches a target),
and the commands on existing runs (ps, logs, attach, stop, clean) are in :mod:`launcher.runs.control`.
A run directory ``runs/<run-id>/`` gets ``launch.json`` when the container starts, the
verified ``outputs/`` as they are pulled, and ``manifest.json`` last, so a directory
without a manifest is never mistaken for a finished run.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, cast

from launcher import memo
from launcher.determinism import SEED_ENV, THREADS_ENV
from launcher.errors import CommandFailed, UsageError
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.progress import NullReporter, Reporter
from launcher.records.records import CodePlan, DeterminismRecord, EnvValue, LaunchRecipe, LaunchRecord
from launcher.records.rundir import RunDir
from launcher.runs import rewind
from launcher.runs.collect import LogSink, RunOutcome, collect_together, pull_record, utc_now, wait_run
from launcher.runs.plan import Replicate, ResolvedRun, plan_run
from launcher.runtime.checkpoint import ENV_EVERY as CHECKPOINT_ENV
from launcher.runtime.checkpoint import ENV_KEEP as CHECKPOINT_KEEP_ENV
from launcher.runtime.checkpoint import ENV_RESUME as RESUME_ENV
from launcher.runtime.optrace import ENV as OPTRACE_ENV
from launcher.runtime.reduction import ENV as REDUCTION_ENV
from launcher.runtime.steps import ENV as TRACE_ENV
from launcher.runtime.steps import EPOCH
from launcher.specs.container import ContainerJob
from launcher.specs.request import RunRequest, checkpoints_option, probes_option, trace_option
from launcher.specs.runspec import check_framework, check_params, load_recipe, parse_params
from launcher.specs.topology import Topology
from launcher.specs.userenv import UserEnv, new_salt
from launcher.targets.placement import Placement, placement_for, remote_outputs
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.hosts.provision import HostFacts

# what callers of a run's start also need from its request (one import for the CLI and the experiment)
__all__ = [
    "ResolvedRun", "RunRequest", "check_framework", "check_params", "checkpoints_option", "load_recipe",
    "new_run_id", "parse_params", "plan_run", "probes_option", "run_dir", "run_recipe", "start_run",
    "trace_option",
]


def new_run_id(recipe: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", recipe)[:40] or "run"
    return f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{safe}-{secrets.token_hex(3)}"


def run_dir(ws: Workspace, run_id: str) -> Path:
    """The run's folder here (launcher.records.rundir.RunDir owns its layout)."""
    return RunDir.of(ws, run_id).path


def start_run(
    ws: Workspace,
    request: RunRequest,
    target: Host | Placement,
    reporter: Reporter | None = None,
    *,
    host_spec: HostSpec | None = None,
    facts: HostFacts | None = None,
    cache_dir: Path | None = None,
) -> LaunchRecord:
    """Start one run as a run recorded it (a diverge re-execution: its image and code plan as they are,
    nothing locked or built; plan_run's recorded), detached; its launch record."""
    placement = placement_for(target, host_spec)
    run = plan_run(ws, request, placement, reporter, facts=facts, recorded=True)
    launch, job = _launch(ws, run, run.replicates[0], placement, reporter, cache_dir=cache_dir)
    return _start(ws, placement, [(launch, job)], reporter)[0]


def _start(ws: Workspace, placement: Placement, launches: Sequence[tuple[LaunchRecord, ContainerJob]],
           reporter: Reporter | None) -> list[LaunchRecord]:
    """Start prepared runs together (their launch records already written); record what the target says."""
    rep = reporter or NullReporter()
    try:
        started = placement.start_array([job for _, job in launches])
    except CommandFailed as exc:
        for launch, _ in launches:
            launch["start_error"] = exc.message
            RunDir(ws.runs / launch["run_id"]).write_launch(launch)
        raise
    out: list[LaunchRecord] = []
    for (launch, _), record in zip(launches, started, strict=True):
        # the target's own fields (container, argv, image_ran, slurm: LaunchRecord's last keys)
        launch = cast(LaunchRecord, {**launch, **record})
        RunDir(ws.runs / launch["run_id"]).write_launch(launch)
        rep.note(f"started {launch['run_id']} on {placement.name}")
        out.append(launch)
    return out


def _job_env(request: RunRequest, seed: int | None, topology: Topology | None = None) -> dict[str, str]:
    """The container's environment: the determinism profile with the replicate's seed (less what the user's
    --env sets in its place), the step trace, op trace and checkpoint options."""
    from launcher import determinism

    env = determinism.profile_env(request.profile, seed, request.threads)
    for name in determinism.OVERRIDABLE_ENV & {*request.env, *request.secret_env}:
        del env[name]  # the user's value, recorded with the user's variables
    if request.trace_every != EPOCH:
        env[TRACE_ENV] = request.trace_every
    if request.optrace:
        env[OPTRACE_ENV] = request.optrace
    if request.checkpoints:
        env[CHECKPOINT_ENV] = str(request.checkpoints.every)
        if request.checkpoints.keep_all:
            env[CHECKPOINT_KEEP_ENV] = "all"
    if request.start_from:
        env[RESUME_ENV] = "1"  # from the checkpoint placed in its outputs (launcher.runs.rewind)
    if topology is not None:  # what pins the collectives, on every node (as the target places them)
        env.update(topology.env())
    if request.reduction != "default":
        env[REDUCTION_ENV] = request.reduction
    return env


def _job(ws: Workspace, run: ResolvedRun, run_id: str, env: dict[str, str], remote: str) -> ContainerJob:
    """One replicate's container (env: its environment, remote: its directory on the target)."""
    request, probes = run.request, run.probes
    return ContainerJob(
        run_id=run_id,
        image_id=run.image["id"],
        env=env,
        host_out=remote_outputs(remote),
        recipe=run.recipe,
        params=dict(run.params),
        data=run.data,
        gpu=ws.needs_gpu(request.variant),
        host_code=run.code.get("host_path"),
        code_entry=run.code.get("entry") or None,
        args=tuple(request.args),
        probes=probes["config"] if probes["source"] == "option" else None,
        no_probes=probes["source"] == "option" and probes["config"] is None,
        user_env=dict(request.env),
        secret_env=dict(request.secret_env),
        topology=run.topology,
    )


def _determinism(request: RunRequest, env: dict[str, str]) -> DeterminismRecord:
    """The launch record's determinism: the profile, its thread count and the environment it sets."""
    return {"profile": request.profile,
            "threads": int(env[THREADS_ENV]) if THREADS_ENV in env else request.threads, "env": env}


def _env_record(request: RunRequest, cache_dir: Path, run_id: str) -> dict[str, EnvValue]:
    """The user's variables as recorded: a secret by its HMAC, keyed with a salt this machine alone keeps."""
    return UserEnv(request.env, request.secret_env).record(
        new_salt(cache_dir, run_id) if request.secret_env else None)


def _launch_recipe(run: ResolvedRun) -> LaunchRecipe:
    """The launch record's recipe: what the host expects to run (the manifest records what the container
    computed)."""
    recipe, plan = run.recipe, run.code
    rec: LaunchRecipe = {
        "name": recipe.name,
        "framework": recipe.framework,
        "entry": plan.get("entry") or recipe.entry,
        "script": recipe.adhoc,
        "code_source": plan.get("source"),
        "git": plan.get("git") or {},
        "args": list(run.request.args),
        "volatile": list(getattr(recipe.spec, "volatile", ()) or ()),
        "expected_digest": plan.get("digest") or run.baked_digest,
    }
    if run.code_identity:
        rec["identity"] = run.code_identity
    return rec


def _run_dir(request: RunRequest, placement: Placement, run_id: str, data: str | None, rep: Reporter) -> str:
    """The run's directory on its target, its outputs folder holding the checkpoint it starts from, if any."""
    remote = placement.run_dir(run_id, data)
    if request.start_from:
        rewind.place(placement.host, Path(request.start_from["folder"]), remote_outputs(remote), rep)
    return remote


def _checkpoints_of(request: RunRequest, launch: LaunchRecord) -> None:
    """The launch record's checkpoints: those the run writes, and the one it starts from."""
    if request.checkpoints:
        launch["checkpoint"] = {"every": request.checkpoints.every,
                                "keep": "all" if request.checkpoints.keep_all else "latest"}
    if request.start_from:
        launch["start_from"] = request.start_from["point"]


def _launch(ws: Workspace, run: ResolvedRun, one: Replicate, placement: Placement, reporter: Reporter | None, *,
            cache_dir: Path | None) -> tuple[LaunchRecord, ContainerJob]:
    """One replicate of the planned run before its start: the run directory made, the image shipped, the
    launch record written (a run is never started unrecorded). Returns it and the job."""
    from launcher.specs import identity

    rep = reporter or NullReporter()
    request = run.request
    env = _job_env(request, one.seed, run.topology)
    run_id = new_run_id(identity.slug(run.recipe.name, run.code_identity))
    remote = _run_dir(request, placement, run_id, run.data, rep)
    shipped = placement.ship(run.image, via=request.ship_via, reporter=rep, cache_dir=cache_dir or ws.cache_dir)
    job = _job(ws, run, run_id, env, remote)
    launch: LaunchRecord = {
        "run_id": run_id,
        "group": run.group,
        "replicate": one.number,
        "host": placement.host.describe(),
        "host_options": placement.host_spec.to_record(),
        "placement": placement.record(),
        "container": job.name,
        "remote_dir": remote,
        "recipe": _launch_recipe(run),
        "code": cast(CodePlan, {k: v for k, v in run.code.items() if k not in ("git",)}),
        "params": dict(run.params),
        "probes": run.probes,
        "trace": {"every": request.trace_every},
        "seed": int(env[SEED_ENV]) if SEED_ENV in env else one.seed,
        "determinism": _determinism(request, env),
        "env": _env_record(request, cache_dir or ws.cache_dir, run_id),
        "image": run.image.copy(),
        "data": run.data,
        "data_source": run.data_source,
        "variant": request.variant,
        "facts": run.facts,
        "ship": shipped.to_dict(),
        "launched_at": utc_now(),
    }
    _checkpoints_of(request, launch)
    if run.topology is not None:
        launch["topology"] = run.topology.record(placement.node_names(run.topology.nodes))
    RunDir(ws.runs / run_id).write_launch(launch)
    return launch, job


def _one_by_one(ws: Workspace, placement: Placement, run: ResolvedRun, reporter: Reporter | None,
                begin: Callable[[Replicate], LaunchRecord], *, on_log: LogSink | None, poll_s: float) -> RunOutcome:
    """Each replicate started (begin), waited for and pulled in turn: the first that fails leaves the
    rest unstarted."""
    outcome = RunOutcome(group=run.group, runs=[])
    for i, one in enumerate(run.replicates):
        launch = begin(one)
        wait_run(ws, launch["run_id"], placement, on_log=on_log, poll_s=poll_s)
        pulled = pull_record(ws, launch["run_id"], placement, reporter)
        from launcher.runs.replicates import failure_of, is_failed  # imported while the run went (wait_run)

        outcome.runs.append(pulled)
        if is_failed(pulled):
            outcome.failure = failure_of(ws, pulled, placement, not_started=len(run.replicates) - i - 1)
            break
    return outcome


def run_recipe(
    ws: Workspace,
    request: RunRequest,
    target: Host | Placement,
    reporter: Reporter | None = None,
    *,
    runs: int = 1,
    seeds: Sequence[int | None] = (),
    on_log: LogSink | None = None,
    host_spec: HostSpec | None = None,
    facts: HostFacts | None = None,
    cache_dir: Path | None = None,
    poll_s: float = 1.0,
    prepared: bool = False,
) -> RunOutcome:
    """Run the recipe `runs` times for each seed (one group), waiting and pulling unless detached.
    The first replicate that fails stops the rest (see runs.replicates): those not started are not
    started, those a parallel target already runs are stopped; RunOutcome.failure says which.

    target: an opened host (its runs placed directly on its Docker engine) or any Placement;
    host_spec: how to reopen the host later (recorded in each launch record)."""
    if runs < 1:
        raise UsageError(f"--runs must be at least 1, not {runs}", "drop --runs or give a positive number")
    with memo.kept():  # git's and the engine's answers asked once by the steps before a start
        placement = placement_for(target, host_spec)
        run = plan_run(ws, request, placement, reporter, runs=runs, seeds=seeds, facts=facts, prepared=prepared)
        return _run_group(ws, run, placement, reporter, on_log=on_log, cache_dir=cache_dir, poll_s=poll_s)


def _run_group(ws: Workspace, run: ResolvedRun, placement: Placement, reporter: Reporter | None, *,
               on_log: LogSink | None, cache_dir: Path | None, poll_s: float) -> RunOutcome:
    """run_recipe's work, once the run is planned: its replicates started, then collected unless detached."""
    def prepare(one: Replicate) -> tuple[LaunchRecord, ContainerJob]:
        return _launch(ws, run, one, placement, reporter, cache_dir=cache_dir)

    def begin(one: Replicate) -> LaunchRecord:
        return _start(ws, placement, [prepare(one)], reporter)[0]

    if placement.parallel:  # the target runs the group at once (a job array): start all, then collect each
        launches = _start(ws, placement, [prepare(one) for one in run.replicates], reporter)
        if run.request.detach:
            return RunOutcome(group=run.group, runs=list(launches), detached=True)
        outcome = collect_together(ws, placement, launches, reporter, on_log=on_log, poll_s=poll_s)
    elif run.request.detach:
        launches = [begin(one) for one in run.replicates]
        return RunOutcome(group=run.group, runs=list(launches), detached=True)
    else:
        outcome = _one_by_one(ws, placement, run, reporter, begin, on_log=on_log, poll_s=poll_s)
    from launcher.runs.replicates import inconsistency_notes, seed_override_note

    if len({one.seed for one in run.replicates}) > 1 and (note := seed_override_note(outcome.runs)):
        outcome.notes.append(note)
    outcome.notes.extend(inconsistency_notes(outcome.runs))
    return outcome
