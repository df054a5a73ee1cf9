"""Experiments: replicate runs of one recipe in a same-seed and/or a different-seeds group,
run in parallel across hosts with one run per host at a time.

The scheduler (:func:`run_parallel`) knows nothing about runs: it hands jobs to one worker
thread per host, so tests drive it with a fake launch function.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, cast

from launcher.determinism import DEFAULT_SEED
from launcher.errors import ExitCode, HostUnreachable, LauncherError, UsageError
from launcher.hosts.hostspec import HostSpec
from launcher.progress import NullReporter, Reporter
from launcher.records.records import CANCELLED, FAILED, LaunchRecord, RunRecord
from launcher.runs.replicates import Failure, FailureRecord, seed_override_note
from launcher.runtime.steps import EPOCH
from launcher.specs.recipes import ParamValue
from launcher.specs.topology import Topology
from launcher.specs.userenv import UserEnv
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.specs.request import ProbesOption, RunRequest

SEED_MODES = ("same", "different", "both")
SAME_SEED = "same-seed"
DIFFERENT_SEEDS = "different-seeds"

J = TypeVar("J")
H = TypeVar("H")


@dataclass(frozen=True)
class PlannedRun:
    group: str
    kind: str  # same-seed | different-seeds
    replicate: int
    seed: int


def plan(recipe: str, runs: int, seeds: str = "both", base_seed: int | Sequence[int] = DEFAULT_SEED,
         stamp: str | None = None) -> list[PlannedRun]:
    """The runs of an experiment, the two groups interleaved so both make progress together.
    base_seed: the same-seed group's seed and the first of the different-seeds group; several seeds
    are the different-seeds group's own, continued by the last + 1, + 2, ... when it has more runs."""
    if runs < 1:
        raise UsageError(f"--runs must be at least 1, not {runs}")
    if seeds not in SEED_MODES:
        raise UsageError(f"--seeds must be one of {', '.join(SEED_MODES)}, not {seeds!r}")
    given = [base_seed] if isinstance(base_seed, int) else list(base_seed) or [DEFAULT_SEED]
    diff_seeds = given[:runs] + [given[-1] + k for k in range(1, runs - len(given) + 1)]
    stamp = stamp or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    same = [PlannedRun(f"{recipe}-{stamp}-{SAME_SEED}", SAME_SEED, i, given[0]) for i in range(runs)]
    diff = [PlannedRun(f"{recipe}-{stamp}-{DIFFERENT_SEEDS}", DIFFERENT_SEEDS, i, diff_seeds[i])
            for i in range(runs)]
    if seeds == "same":
        return same
    if seeds == "different":
        return diff
    return [job for pair in zip(same, diff, strict=True) for job in pair]


@dataclass
class Outcome(Generic[J]):
    job: J
    host: str | None = None
    value: Any = None
    error: str | None = None
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.host is not None


def run_parallel(jobs: Sequence[J], hosts: Sequence[H], launch: Callable[[J, H], Any],
                 name_of: Callable[[H], str] = str,
                 on_done: Callable[[Outcome[J]], None] | None = None,
                 stop_when: Callable[[Outcome[J]], str | None] | None = None) -> list[Outcome[J]]:
    """Run every job on some host: one worker per host, so each host runs one job at a time.

    A job that raises is recorded and the worker goes on with the next; a host that turns out
    unreachable stops taking jobs and the others take over the rest. Jobs no host could take
    are returned with host None. Once stop_when gives a reason for a finished job, no job is
    started any more (those already going finish); the rest are returned with host None and
    "not started: <reason>". Results come back in the order of ``jobs``.
    """
    if not hosts:
        raise UsageError("no host to run on", "give --host (or none for the local engine)")
    outcomes: list[Outcome[J]] = [Outcome(job) for job in jobs]
    lock = threading.Lock()
    pending = list(range(len(jobs)))
    pending.reverse()  # pop() from the end takes jobs in order
    stopped: list[str] = []

    def take() -> int | None:
        with lock:
            return pending.pop() if pending and not stopped else None

    def finished(out: Outcome[J]) -> None:
        with lock:  # one job at a time says whether it stops the rest
            reason = stop_when(out) if stop_when is not None and not stopped else None
            if reason:
                stopped.append(reason)
        if on_done is not None:
            on_done(out)

    def worker(host: H) -> None:
        while (i := take()) is not None:
            out = outcomes[i]
            out.host = name_of(host)
            try:
                out.value = launch(jobs[i], host)
            except LauncherError as exc:
                out.error, out.exit_code = exc.one_line(), int(exc.exit_code)
                if isinstance(exc, HostUnreachable):
                    finished(out)
                    return
            except Exception as exc:  # one broken run must not take the others down
                out.error, out.exit_code = f"{type(exc).__name__}: {exc}", int(ExitCode.FAILURE)
            finished(out)

    threads = [threading.Thread(target=worker, args=(h,), name=f"launcher-host-{k}", daemon=True)
               for k, h in enumerate(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in pending:
        if stopped:
            outcomes[i].error, outcomes[i].exit_code = f"not started: {stopped[0]}", int(ExitCode.RUN_FAILED)
        else:
            outcomes[i].error = "not started: no host was left to run it"
            outcomes[i].exit_code = int(ExitCode.HOST_UNREACHABLE)
    return outcomes


class ExperimentRun(TypedDict):
    """One planned run of an experiment as its Result data has it: the plan, where it ran, how it ended."""

    group: str
    kind: str
    replicate: int
    seed: int
    host: str | None
    run_ids: list[str]
    error: str | None
    exit_code: int | None
    ok: bool


class ExperimentRecord(TypedDict):
    """The `experiment` command's Result data."""

    recipe: str
    code_name: str
    groups: dict[str, str]
    failure: FailureRecord | None
    notes: list[str]
    runs: list[ExperimentRun]


@dataclass
class ExperimentResult:
    recipe: str
    groups: dict[str, str]  # kind -> group name
    outcomes: list[Outcome[PlannedRun]] = field(default_factory=list)
    code_name: str | None = None  # a plain script's project/path (specs.identity); None: the recipe's name
    failure: Failure | None = None  # the first replicate that failed, and what it stopped
    notes: list[str] = field(default_factory=list)  # warnings about the experiment as a whole (for the CLI)

    @property
    def failed(self) -> list[Outcome[PlannedRun]]:
        return [o for o in self.outcomes if not o.ok or _run_failed(o.value)]

    @property
    def exit_code(self) -> ExitCode:
        if not self.failed:
            return ExitCode.OK
        first = self.failed[0]
        return ExitCode(first.exit_code) if first.exit_code is not None else ExitCode.RUN_FAILED

    def to_dict(self) -> ExperimentRecord:
        return {
            "recipe": self.recipe,
            "code_name": self.code_name or self.recipe,
            "groups": self.groups,
            "failure": self.failure.to_dict() if self.failure else None,
            "notes": list(self.notes),
            "runs": [{"group": o.job.group, "kind": o.job.kind, "replicate": o.job.replicate, "seed": o.job.seed,
                      "host": o.host, "run_ids": _run_ids(o.value), "error": o.error,
                      "exit_code": o.exit_code, "ok": o.ok and not _run_failed(o.value)}
                     for o in self.outcomes],
        }


def _records(value: Any) -> list[RunRecord]:
    """The runs of an Outcome's value (what the launch callable answered: a RunOutcome, or {"runs": [...]})."""
    runs = value.get("runs") if isinstance(value, dict) else getattr(value, "runs", value)
    return [cast(RunRecord, r) for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def _run_ids(value: Any) -> list[str]:
    return [str(r["run_id"]) for r in _records(value) if "run_id" in r]


def _run_failed(value: Any) -> bool:
    return any(dict(r).get("status") in (FAILED, CANCELLED) for r in _records(value))


def _launch_with_runs(ws: Workspace, base: Any, reporter: Reporter) -> Callable[[PlannedRun, Any], Any]:
    from launcher.runs import lifecycle as runs

    ready: set[tuple[int, str]] = set()  # (host, group): its target was prepared for the group there

    def launch(job: PlannedRun, host: tuple[HostSpec, Any]) -> Any:
        host_spec, handle = host
        spec = replace(base, seed=job.seed, group=job.group, replicate=job.replicate, detach=False)
        key = (id(handle), job.group)
        out = runs.run_recipe(ws, spec, handle, reporter, runs=1, seeds=[job.seed], host_spec=host_spec,
                              prepared=key in ready)
        ready.add(key)
        return out

    return launch


def experiment(ws: Workspace, recipe: str, runs: int, seeds: str = "both",
               hosts: Sequence[HostSpec] = (), *, base_seed: int | Sequence[int] = DEFAULT_SEED,
               variant: str = "cpu",
               profile: str = "deterministic",
               threads: int | None = None, data: str | None = None, data_from: str | None = None,
               params: dict[str, ParamValue] | None = None,
               probes: ProbesOption | None = None,
               trace_every: str = EPOCH,
               args: Sequence[str] = (),
               user_env: UserEnv | None = None,
               find_links: Sequence[str] = (), ca_bundle: str | None = None,
               reporter: Reporter | None = None,
               launch: Callable[[PlannedRun, Any], Any] | None = None,
               stamp: str | None = None,
               placement: Callable[[Any, HostSpec], Any] | None = None,
               topology: Topology | None = None, reduction: str = "default") -> ExperimentResult:
    """Plan the groups, open every host (failing early if one is unreachable), run, collect.
    probes, trace_every: --probes and --trace-every, parsed (launcher.specs.request: probes_option, trace_option);
    args: the script's own arguments (after `--`), as `run` takes them; user_env: --env/--secret-env;
    find_links, ca_bundle: --find-links folders and --ca-bundle for the project's lock and wheels; topology,
    reduction: --nodes/--procs-per-node and --reduction, each run's layout (on the host that runs it).
    The first replicate that fails stops the experiment: no replicate is started after it (those going
    on other hosts finish; a cluster's job arrays are cancelled); ExperimentResult.failure says which."""
    from launcher.runs import lifecycle as runs_mod

    rep = reporter or NullReporter()
    env = user_env or UserEnv()
    base = runs_mod.RunRequest(recipe=recipe, variant=variant, profile=profile, threads=threads, data=data,
                               data_from=data_from, params=dict(params or {}), probes=probes,
                               trace_every=trace_every, args=list(args), env=dict(env.plain),
                               secret_env=dict(env.secret), find_links=list(find_links), ca_bundle=ca_bundle,
                               topology=topology, reduction=reduction)
    name, code_name = recipe, None
    if launch is None:  # a wrong param or image stops here, before any progress is drawn
        base, name, code_name = _prepared(ws, base, rep)
    jobs = plan(name, runs, seeds, base_seed, stamp)
    groups = {job.kind: job.group for job in jobs}
    specs = list(dict.fromkeys(hosts)) or [HostSpec()]
    result = ExperimentResult(recipe, groups, code_name=code_name)
    task = rep.task(f"experiment {code_name or recipe}: {len(jobs)} runs on {len(specs)} hosts", total=len(jobs))

    def done(out: Outcome[PlannedRun]) -> None:
        task.advance()
        status = "ok" if out.ok and not _run_failed(out.value) else f"failed: {out.error or 'run failed'}"
        rep.note(f"{out.job.group} #{out.job.replicate} (seed {out.job.seed}) on {out.host}: {status}")

    def stop_when(out: Outcome[PlannedRun]) -> str | None:  # called for one job at a time, until it says stop
        failure = getattr(out.value, "failure", None)
        if not isinstance(failure, Failure):
            return None
        result.failure = failure
        return f"{failure.group} {failure.line()}"

    try:
        if launch is not None:
            result.outcomes = run_parallel(jobs, specs, launch, _host_name, done, stop_when)
        else:
            _on_hosts(ws, base, jobs, specs, placement, result, rep, done, stop_when)
    finally:
        task.close()
    _conclude(result, seeds)
    return result


def _prepared(ws: Workspace, base: RunRequest, rep: Reporter) -> tuple[RunRequest, str, str | None]:
    """The base request checked (params, framework) and its project prepared once for every run (the
    request then names the image with the project layer); with the name its groups carry and a plain
    script's code name."""
    from launcher.runs import lifecycle as runs_mod
    from launcher.runs import project
    from launcher.specs import identity
    from launcher.specs.runspec import code_identity

    loaded = runs_mod.load_recipe(ws, base.recipe)
    runs_mod.check_params(loaded, dict(base.params))
    runs_mod.check_framework(ws, loaded, base.variant)
    if project.declares(base, loaded):  # its lock and image, once for every run (not in each thread)
        image = project.prepare(ws, base, loaded, rep)
        if image is not None:
            base = replace(base, image=image)
    code_name = code_identity(base, loaded)
    return base, identity.slug(loaded.name, code_name), code_name


def _on_hosts(ws: Workspace, base: RunRequest, jobs: Sequence[PlannedRun], specs: Sequence[HostSpec],
              placement: Callable[[Any, HostSpec], Any] | None, result: ExperimentResult, rep: Reporter,
              done: Callable[[Outcome[PlannedRun]], None],
              stop_when: Callable[[Outcome[PlannedRun]], str | None]) -> None:
    """Open every host (failing early if one is unreachable) and run the jobs there: spread over the
    hosts, or as a cluster's job arrays; the outcomes (and a cluster's failure) into result."""
    with ExitStack() as stack:
        opened = [(s, stack.enter_context(s.open(ws.root if s.local else None))) for s in specs]
        if placement is not None:  # a cluster: each group is one job array; the scheduler spreads it
            if len(opened) != 1:
                raise UsageError("a cluster is reached through one login node", "give --host once")
            spec, host = opened[0]
            result.outcomes, result.failure = _on_cluster(ws, base, jobs, placement(host, spec), spec.name,
                                                          rep, done)
        else:
            fn = _launch_with_runs(ws, base, rep)
            result.outcomes = run_parallel(jobs, opened, fn, lambda h: _host_name(h[0]), done, stop_when)


def _conclude(result: ExperimentResult, seeds: str) -> None:
    """What the runs tell as a whole: how many a failure left unstarted; whether the different-seeds
    runs really had different seeds (a script that seeds itself overrides launcher's seed)."""
    if result.failure is not None:
        unstarted = sum(1 for o in result.outcomes if o.host is None and o.exit_code == ExitCode.RUN_FAILED)
        result.failure = replace(result.failure, not_started=unstarted)
    if seeds in ("different", "both"):
        manifests = [r for o in result.outcomes if o.job.kind == DIFFERENT_SEEDS for r in _records(o.value)]
        note = seed_override_note(manifests)
        if note:
            result.notes.append(note)


def _on_cluster(ws: Workspace, base: Any, jobs: Sequence[PlannedRun], target: Any, name: str,
                reporter: Reporter, done: Callable[[Outcome[PlannedRun]], None]
                ) -> tuple[list[Outcome[PlannedRun]], Failure | None]:
    """Submit each group as one job array (detached), then wait for and pull every replicate; the first
    that fails cancels the arrays (runs.collect.collect_together)."""
    from launcher.runs import lifecycle as runs
    from launcher.runs.collect import collect_together

    outcomes = [Outcome(job, host=name) for job in jobs]
    started: dict[int, LaunchRecord] = {}
    for kind in (SAME_SEED, DIFFERENT_SEEDS):
        idx = [i for i, job in enumerate(jobs) if job.kind == kind]
        if not idx:
            continue
        spec = replace(base, group=jobs[idx[0]].group, replicate=0, detach=True)
        try:
            sub = runs.run_recipe(ws, spec, target, reporter, runs=1, seeds=[jobs[i].seed for i in idx],
                                  host_spec=target.host_spec)
        except LauncherError as exc:
            for i in idx:
                outcomes[i].error, outcomes[i].exit_code = exc.one_line(), int(exc.exit_code)
                done(outcomes[i])
            continue
        # detached: run_recipe's runs are the launch records
        started.update(zip(idx, [cast(LaunchRecord, launch) for launch in sub.runs], strict=True))
    by_run = {launch["run_id"]: i for i, launch in started.items()}

    def failed_pull(run_id: str, exc: LauncherError) -> None:
        out = outcomes[by_run[run_id]]
        out.error, out.exit_code = exc.one_line(), int(exc.exit_code)
        done(out)

    collected = collect_together(ws, target, [started[i] for i in sorted(started)], reporter,
                                      on_error=failed_pull)
    for manifest in collected.runs:
        out = outcomes[by_run[manifest["run_id"]]]
        out.value = {"runs": [manifest]}
        done(out)
    return outcomes, collected.failure


def _host_name(spec: Any) -> str:
    return spec.name if isinstance(spec, HostSpec) else "local" if spec is None else str(spec)
