"""A run's start: check its spec, make its image and code current, place it and start it; for a group,
start its replicates and hand them to :mod:`launcher.runs.collect`, which waits, pulls and finishes them.

Its spec and code plan are in :mod:`launcher.specs.runspec`, its container in
:mod:`launcher.specs.container`, where and how it is placed in :mod:`launcher.targets.placement` (the
only way this module reaches a target), and the commands on existing runs (ps, logs, attach, stop,
clean) in :mod:`launcher.runs.control`.
A run directory ``runs/<run-id>/`` gets ``launch.json`` when the container starts, the
verified ``outputs/`` as they are pulled, and ``manifest.json`` last, so a directory
without a manifest is never mistaken for a finished run.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, cast

from launcher import memo
from launcher.determinism import SEED_ENV, THREADS_ENV
from launcher.errors import CommandFailed, UsageError
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.proc import Meanwhile
from launcher.progress import NullReporter, Reporter
from launcher.records.records import (
    BAKED,
    MOUNTED,
    CodePlan,
    DeterminismRecord,
    EnvValue,
    ImageRecord,
    LaunchRecipe,
    LaunchRecord,
    ProbesRecord,
)
from launcher.records.rundir import RunDir
from launcher.runs import rewind
from launcher.runs.collect import LogSink, RunOutcome, collect_together, pull_record, utc_now, wait_run
from launcher.runtime.checkpoint import ENV_EVERY as CHECKPOINT_ENV
from launcher.runtime.checkpoint import ENV_KEEP as CHECKPOINT_KEEP_ENV
from launcher.runtime.checkpoint import ENV_RESUME as RESUME_ENV
from launcher.runtime.optrace import ENV as OPTRACE_ENV
from launcher.runtime.steps import ENV as TRACE_ENV
from launcher.runtime.steps import EPOCH
from launcher.specs.container import ContainerJob
from launcher.specs.recipes import ParamValue, Recipe
from launcher.specs.runspec import (
    RunSpec,
    check_framework,
    check_params,
    checkpoint_option,
    image_record,
    load_recipe,
    parse_params,
    plan_code,
    probe_option,
    probes_record,
    trace_option,
)
from launcher.specs.userenv import UserEnv, new_salt
from launcher.targets.placement import Placement, placement_for, remote_outputs
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.hosts.provision import HostFacts

# what callers of a run's start also need from its spec (one import for the CLI and the experiment)
__all__ = [
    "RunSpec", "check_framework", "check_params", "checkpoint_option", "load_recipe", "new_run_id", "parse_params",
    "probe_option", "run_dir", "run_recipe", "start_run", "trace_option",
]



def new_run_id(recipe: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", recipe)[:40] or "run"
    return f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{safe}-{secrets.token_hex(3)}"


def run_dir(ws: Workspace, run_id: str) -> Path:
    """The run's folder here (launcher.records.rundir.RunDir owns its layout)."""
    return RunDir.of(ws, run_id).path


def _with_data(spec: RunSpec, placement: Placement, reporter: Reporter | None) -> RunSpec:
    """The spec with its --data-from folder sent to the target and mounted from there like --data."""
    if spec.data:
        raise UsageError(
            "--data and --data-from both given", "--data names a folder on the host, --data-from one here: pick one"
        )
    path, source = placement.send_data(Path(str(spec.data_from)).expanduser(), reporter)
    return replace(spec, data=path, data_from=None, data_source=source)


def _with_code(spec: RunSpec, placement: Placement, reporter: Reporter | None) -> RunSpec:
    """The spec with mounted code placed where the target mounts it from; baked code needs nothing."""
    plan = spec.code_plan
    if plan is None or plan.get("source") != MOUNTED or plan.get("host_path"):
        return spec
    return replace(spec, code_plan=placement.send_code(plan, reporter))


def start_run(
    ws: Workspace,
    spec: RunSpec,
    target: Host | Placement,
    reporter: Reporter | None = None,
    *,
    host_spec: HostSpec | None = None,
    facts: HostFacts | None = None,
    recipe: Recipe | None = None,
    cache_dir: Path | None = None,
    prepared: bool = False,
) -> LaunchRecord:
    """Check everything, ship the image, start the run detached; its launch record (prepared: prepare() ran)."""
    placement = placement_for(target, host_spec)
    launch, job = _launch(ws, spec, placement, reporter, facts=facts,
                          recipe=recipe, cache_dir=cache_dir, prepared=prepared)
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


def _job_env(spec: RunSpec) -> dict[str, str]:
    """The container's environment from the spec: the determinism profile (less what the user's --env
    sets in its place), the step trace, op trace and checkpoint options."""
    from launcher import determinism

    env = determinism.profile_env(spec.profile, spec.seed, spec.threads)
    for name in determinism.OVERRIDABLE_ENV & {*spec.env, *spec.secret_env}:
        del env[name]  # the user's value, recorded with the user's variables
    trace = trace_option(spec.trace_every)
    if trace != EPOCH:
        env[TRACE_ENV] = trace
    if spec.optrace:
        env[OPTRACE_ENV] = spec.optrace
    if checkpoint_option(spec.checkpoint_every):
        env[CHECKPOINT_ENV] = str(spec.checkpoint_every)
        if spec.keep_checkpoints:
            env[CHECKPOINT_KEEP_ENV] = "all"
    if spec.start_from:
        env[RESUME_ENV] = "1"  # from the checkpoint placed in its outputs (launcher.runs.rewind)
    return env


def _placed_inputs(ws: Workspace, spec: RunSpec, placement: Placement, recipe: Recipe, rep: Reporter,
                   prepared: bool) -> RunSpec:
    """The spec once the target can run it and holds its data and code."""
    if not prepared:
        placement.prepare(ws.needs_gpu(spec.variant))
    if spec.data_from:
        spec = _with_data(spec, placement, rep)
    if spec.code_plan is None:
        spec = replace(spec, code_plan=plan_code(ws, spec, recipe))
    return _with_code(spec, placement, rep)


def _job(ws: Workspace, spec: RunSpec, recipe: Recipe, plan: CodePlan, run_id: str, image: ImageRecord,
         env: dict[str, str], remote: str, params: dict[str, ParamValue], probes: ProbesRecord) -> ContainerJob:
    """The run's container (params: the recipe's, checked)."""
    data = str(PurePosixPath(spec.data)) if spec.data else None
    return ContainerJob(
        run_id=run_id,
        image_id=image["id"],
        env=env,
        host_out=remote_outputs(remote),
        recipe=recipe,
        params=params,
        data=data,
        gpu=ws.needs_gpu(spec.variant),
        host_code=plan.get("host_path"),
        code_entry=plan.get("entry") or None,
        args=tuple(spec.args),
        probes=probes["config"] if probes["source"] == "option" else None,
        no_probes=probes["source"] == "option" and probes["config"] is None,
        user_env=dict(spec.env),
        secret_env=dict(spec.secret_env),
    )


def _determinism(spec: RunSpec, env: dict[str, str]) -> DeterminismRecord:
    """The launch record's determinism: the profile, its thread count and the environment it sets."""
    return {"profile": spec.profile, "threads": int(env[THREADS_ENV]) if THREADS_ENV in env else spec.threads,
            "env": env}


def _env_record(spec: RunSpec, cache_dir: Path, run_id: str) -> dict[str, EnvValue]:
    """The user's variables as recorded: a secret by its HMAC, keyed with a salt this machine alone keeps."""
    return UserEnv(spec.env, spec.secret_env).record(new_salt(cache_dir, run_id) if spec.secret_env else None)


def _launch_recipe(spec: RunSpec, recipe: Recipe, plan: CodePlan, baked_digest: str | None,
                   code_identity: str | None) -> LaunchRecipe:
    """The launch record's recipe: what the host expects to run (the manifest records what the container
    computed)."""
    rec: LaunchRecipe = {
        "name": recipe.name,
        "framework": recipe.framework,
        "entry": plan.get("entry") or recipe.entry,
        "script": recipe.adhoc,
        "code_source": plan.get("source"),
        "git": plan.get("git") or {},
        "args": list(spec.args),
        "volatile": list(getattr(recipe.spec, "volatile", ()) or ()),
        "expected_digest": plan.get("digest") or baked_digest,
    }
    if code_identity:
        rec["identity"] = code_identity
    return rec


def _run_dir(spec: RunSpec, placement: Placement, run_id: str, data: str | None, rep: Reporter) -> str:
    """The run's directory on its target, its outputs folder holding the checkpoint it starts from, if any."""
    remote = placement.run_dir(run_id, data)
    if spec.start_from:
        rewind.place(placement.host, Path(spec.start_from["folder"]), remote_outputs(remote), rep)
    return remote


def _checkpoints_of(spec: RunSpec, launch: LaunchRecord) -> None:
    """The launch record's checkpoints: those the run writes, and the one it starts from."""
    if spec.checkpoint_every:
        launch["checkpoint"] = {"every": spec.checkpoint_every, "keep": "all" if spec.keep_checkpoints else "latest"}
    if spec.start_from:
        launch["start_from"] = spec.start_from["point"]


def _launch(
    ws: Workspace,
    spec: RunSpec,
    placement: Placement,
    reporter: Reporter | None,
    *,
    facts: HostFacts | None,
    recipe: Recipe | None,
    cache_dir: Path | None,
    prepared: bool = False,
) -> tuple[LaunchRecord, ContainerJob]:
    """Everything before the start: checks, data and code placed, the image shipped, the run directory
    made; the launch record written (a run is never started unrecorded). Returns it and the job."""
    from launcher.specs import identity

    rep = reporter or NullReporter()
    recipe = recipe or load_recipe(ws, spec.recipe, entry=spec.entry)
    params = check_params(recipe, spec.params)
    probes = probes_record(spec, recipe)
    env = _job_env(spec)
    image = spec.image.copy() if spec.image else image_record(ws, spec.variant)  # a project layer's, or the variant's
    baked_digests = image.pop("recipes", {})
    spec = _placed_inputs(ws, spec, placement, recipe, rep, prepared)
    plan = spec.code_plan
    assert plan is not None  # planned by _placed_inputs
    data = str(PurePosixPath(spec.data)) if spec.data else None
    code_identity = identity.from_plan(plan) if recipe.adhoc else None
    run_id = new_run_id(identity.slug(recipe.name, code_identity))
    remote = _run_dir(spec, placement, run_id, data, rep)
    shipped = placement.ship(image, via=spec.ship_via, reporter=rep, cache_dir=cache_dir or ws.cache_dir)
    job = _job(ws, spec, recipe, plan, run_id, image, env, remote, params, probes)
    launch: LaunchRecord = {
        "run_id": run_id,
        "group": spec.group or run_id,
        "replicate": spec.replicate,
        "host": placement.host.describe(),
        "host_options": placement.host_spec.to_record(),
        "placement": placement.record(),
        "container": job.name,
        "remote_dir": remote,
        "recipe": _launch_recipe(spec, recipe, plan, baked_digests.get(recipe.name), code_identity),
        "code": cast(CodePlan, {k: v for k, v in plan.items() if k not in ("git",)}),
        "params": params,
        "probes": probes,
        "trace": {"every": trace_option(spec.trace_every)},
        "seed": int(env[SEED_ENV]) if SEED_ENV in env else spec.seed,
        "determinism": _determinism(spec, env),
        "env": _env_record(spec, cache_dir or ws.cache_dir, run_id),
        "image": image,
        "data": data,
        "data_source": spec.data_source or ({"kind": "host", "path": data} if data else None),
        "variant": spec.variant,
        "facts": facts if facts is not None else {},
        "ship": shipped.to_dict(),
        "launched_at": utc_now(),
    }
    _checkpoints_of(spec, launch)
    RunDir(ws.runs / run_id).write_launch(launch)
    return launch, job


def _checked(ws: Workspace, spec: RunSpec, seed_list: Sequence[int | None]) -> Recipe:
    """The spec's recipe, once its options are checked: a bad param, probe set, trace, checkpoint,
    framework, profile, seed or thread count stops here, before a build or an upload."""
    from launcher import determinism

    recipe = load_recipe(ws, spec.recipe, entry=spec.entry)
    check_params(recipe, spec.params)
    probe_option(spec.probes)
    trace_option(spec.trace_every)
    checkpoint_option(spec.checkpoint_every, spec.keep_checkpoints)
    check_framework(ws, recipe, spec.variant)
    for seed in seed_list:
        determinism.profile_env(spec.profile, seed, spec.threads)
    return recipe


def _with_image(ws: Workspace, spec: RunSpec, recipe: Recipe, reporter: Reporter | None) -> RunSpec:
    """The spec with its code planned and its image current (the variant's, plus the project layer)."""
    from launcher.images import build
    from launcher.runs import project

    with Meanwhile(build.ask_ahead, ws, spec.variant):  # the engine asked about the image while git lists the code
        project.ensure_lock(ws, spec, recipe, reporter)  # before the code is planned: the lock is part of the project
        # a plan given (launcher reproduce plans a bundle's code itself, without git) is kept
        plan = spec.code_plan if spec.code_plan is not None else plan_code(ws, spec, recipe)
    spec = replace(spec, code_plan=plan)
    build.ensure_current(ws, spec.variant, recipes=plan.get("source") == BAKED, allow_build=spec.build,
                         find_links=[Path(p) for p in spec.find_links],
                         ca_bundle=Path(spec.ca_bundle) if spec.ca_bundle else None, reporter=reporter)
    return project.with_image(ws, spec, recipe, reporter)  # the variant's image plus the project layer, if any


def _group_of(spec: RunSpec, recipe: Recipe) -> str:
    """The group the runs join: --group, else a new one named by time, code and a random suffix."""
    from launcher.specs import identity

    name = identity.slug(recipe.name, identity.from_plan(spec.code_plan) if recipe.adhoc else None)
    return spec.group or f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{name}-g{secrets.token_hex(3)}"


def _one_by_one(ws: Workspace, placement: Placement, specs: Sequence[RunSpec], group: str,
                reporter: Reporter | None, begin: Callable[[RunSpec], LaunchRecord], *, on_log: LogSink | None,
                poll_s: float) -> RunOutcome:
    """Each run started (begin: start_run as the group starts its runs), waited for and pulled in turn:
    the first that fails leaves the rest unstarted."""
    outcome = RunOutcome(group=group, runs=[])
    for i, one in enumerate(specs):
        launch = begin(one)
        wait_run(ws, launch["run_id"], placement, on_log=on_log, poll_s=poll_s)
        pulled = pull_record(ws, launch["run_id"], placement, reporter)
        from launcher.runs.replicates import failure_of, is_failed  # imported while the run went (wait_run)

        outcome.runs.append(pulled)
        if is_failed(pulled):
            outcome.failure = failure_of(ws, pulled, placement, not_started=len(specs) - i - 1)
            break
    return outcome


def _facts_for_run(ws: Workspace, host: Host) -> HostFacts:
    from launcher.hosts import provision

    return provision.facts_for_run(ws, host)


def _image_facts_ready(ws: Workspace, spec: RunSpec, recipe: Recipe, placement: Placement, reporter: Reporter | None,
                       facts: HostFacts | None, prepared: bool) -> tuple[RunSpec, HostFacts]:
    """The spec with its image current, the host's fact sheet, and the target prepared (once for the group;
    prepared: by an earlier part of it), before data and code are sent. The three are independent, so the
    facts and the target's checks run while the image is checked (or built); their errors come in that
    order, as when each waited for the one before."""
    later = Meanwhile(_facts_for_run, ws, placement.host) if facts is None else None
    ready = None if prepared else Meanwhile(placement.prepare, ws.needs_gpu(spec.variant))
    with later or nullcontext(), ready or nullcontext():
        spec = _with_image(ws, spec, recipe, reporter)
        facts = later.result() if later is not None else facts
        if ready is not None:
            ready.result()
    assert facts is not None
    return spec, facts


def run_recipe(
    ws: Workspace,
    spec: RunSpec,
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
        return _run_group(ws, spec, placement_for(target, host_spec), reporter, runs=runs, seeds=seeds, on_log=on_log,
                          facts=facts, cache_dir=cache_dir, poll_s=poll_s, prepared=prepared)


def _run_group(ws: Workspace, spec: RunSpec, placement: Placement, reporter: Reporter | None, *, runs: int,
               seeds: Sequence[int | None], on_log: LogSink | None, facts: HostFacts | None, cache_dir: Path | None,
               poll_s: float, prepared: bool) -> RunOutcome:
    """run_recipe's work, once its placement is open."""
    seed_list = list(seeds) or [spec.seed]
    recipe = _checked(ws, spec, seed_list)
    spec, facts = _image_facts_ready(ws, spec, recipe, placement, reporter, facts, prepared)
    group = _group_of(spec, recipe)
    if spec.data_from:
        spec = _with_data(spec, placement, reporter)
    spec = _with_code(spec, placement, reporter)
    specs = [RunSpec(**{**asdict(spec), "seed": seed, "group": group, "replicate": spec.replicate + i})
             for i, seed in enumerate(s for s in seed_list for _ in range(runs))]  # replicates numbered across seeds
    def prepare(one: RunSpec) -> tuple[LaunchRecord, ContainerJob]:
        return _launch(ws, one, placement, reporter, facts=facts, recipe=recipe, cache_dir=cache_dir, prepared=True)

    def begin(one: RunSpec) -> LaunchRecord:
        return start_run(ws, one, placement, reporter, facts=facts, recipe=recipe, cache_dir=cache_dir, prepared=True)

    if placement.parallel:  # the target runs the group at once (a job array): start all, then collect each
        launches = _start(ws, placement, [prepare(one) for one in specs], reporter)
        if spec.detach:
            return RunOutcome(group=group, runs=list(launches), detached=True)
        outcome = collect_together(ws, placement, launches, reporter, on_log=on_log, poll_s=poll_s)
    elif spec.detach:
        launches = [begin(one) for one in specs]
        return RunOutcome(group=group, runs=list(launches), detached=True)
    else:
        outcome = _one_by_one(ws, placement, specs, group, reporter, begin, on_log=on_log, poll_s=poll_s)
    from launcher.runs.replicates import seed_override_note

    if len(set(seed_list)) > 1 and (note := seed_override_note(outcome.runs)):
        outcome.notes.append(note)
    return outcome
