"""`launcher provision`, `run`, `resume`, `ps`, `logs`, `attach`, `pull`, `stop`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from launcher.cli.common import command, options, render, reporter, stdout, workspace_of
from launcher.cli.hostopts import (
    MaxParallelOpt,
    PartitionOpt,
    SchedulerOpt,
    SlurmOpt,
    check_cluster_options,
    target,
    with_host,
)
from launcher.cli.params import (
    CheckpointOpt,
    DataOpt,
    DeterminismOpt,
    EnvOpt,
    IndexCaOpt,
    KeepCheckpointsOpt,
    ParamOpt,
    ProbesOpt,
    RunArg,
    RunsArg,
    ScriptArgs,
    SecretEnvOpt,
    SeedOpt,
    ThreadsOpt,
    TraceOpt,
    VariantOpt,
    WheelsOpt,
    threads_for,
    variant_for,
)
from launcher.cli.run_opts import (
    CodeDirOpt,
    DataFromOpt,
    DetachOpt,
    EntryOpt,
    GroupOpt,
    MountOpt,
    NoBuildOpt,
    NodesOpt,
    ProcsPerNodeOpt,
    RecipeArg,
    ReductionOpt,
    ReplicatesOpt,
    ShipViaOpt,
)
from launcher.errors import UsageError, run_exit_code
from launcher.hosts.hostspec import HostSpec
from launcher.result import Result

if TYPE_CHECKING:
    from launcher.hosts.provision import ProvisionListing
    from launcher.runs.control import CleanListing, PsListing
    from launcher.runs.replicates import FailureRecord
    from launcher.specs.request import RunRequest
    from launcher.workspace import Workspace
from launcher.targets import registry as targets

app = typer.Typer()

LOCAL = HostSpec()  # what a command gets without --host (@with_host passes the real value)


def _open(ctx: typer.Context, host: HostSpec) -> Any:
    return host.open(workspace_of(ctx).root if host.local else None)


@command(app, "provision")
@with_host()
def provision_cmd(
    ctx: typer.Context,
    host: HostSpec = LOCAL,
    gpu: Annotated[
        bool, typer.Option("--gpu", help="Also plan the NVIDIA driver, Container Toolkit and runtime.")
    ] = False,
    install: Annotated[bool, typer.Option("--install", help="Install what is missing (idempotent).")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the exact install commands; change nothing.")
    ] = False,
    scheduler: SchedulerOpt = None,
    registry: Annotated[
        str | None,
        typer.Option("--registry", metavar="ADDRESS", rich_help_panel="Cluster options",
                     help="With --scheduler slurm or ray: a registry the compute nodes pull from (HOST:PORT). Checked "
                     "from every node, then kept in the cluster's settings: runs push the image there and each node "
                     "pulls it by digest. `none` forgets it (the image goes by the shared filesystem, or the head, "
                     "again)."),
    ] = None,
    container_runtime: Annotated[
        Literal["docker", "pyxis"] | None,
        typer.Option("--container-runtime", rich_help_panel="Cluster options",
                     help="With --scheduler slurm: run each replicate with the node's Docker engine (default) or "
                     "with Pyxis/enroot (`srun --container-image`, needs --registry); kept in the cluster's settings."),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", metavar="URL", rich_help_panel="Cluster options",
                     help="With --scheduler ray: the cluster's job API (Ray's dashboard) as the head reaches it, "
                     "kept in the cluster's settings (default http://127.0.0.1:8265)."),
    ] = None,
) -> None:
    """Inspect a host (OS, CPU, RAM, disk, Docker, GPU) and install Docker / the NVIDIA toolkit.
    With --scheduler slurm: the cluster behind the login node (partitions, nodes, Docker on each),
    and its settings (--registry, --container-runtime). With --scheduler ray: every alive node of the Ray
    cluster behind the head (a probe task on each: Docker, NVIDIA runtime, the registry), and its settings
    (--registry, --ray-address)."""
    from launcher.cli.provision_text import cluster_text, facts_text
    from launcher.hosts import provision

    ws = workspace_of(ctx)
    request = targets.ProvisionRequest(gpu=gpu, install=install, dry_run=dry_run, registry=registry,
                                       runtime=container_runtime, address=ray_address)
    if (cluster := targets.provision(scheduler, request, lambda: _open(ctx, host))) is not None:
        render(ctx, Result("provision", cluster.data, summary=cluster.summary), cluster_text)  # the target's own
        return
    with _open(ctx, host) as h:
        done = provision.provision(ws, h, gpu=gpu, install=install, dry_run=dry_run)
    ready = done.facts["docker"].get("usable") and (not gpu or done.facts["docker"].get("nvidia_runtime"))
    if dry_run:
        summary = f"dry run: {len(done.plan)} steps would run" if done.plan else "nothing to install"
    elif install:
        summary = f"installed {len(done.executed)} steps" if done.executed else "nothing to install"
    else:
        summary = "ready" if ready else "not ready: " + ("; ".join(s.why for s in done.plan) or "see above")
    data: ProvisionListing = {"host": h.name, **done.to_dict(), "ready": bool(ready),
                              "facts_file": str(ws.host_facts(h.name))}
    render(ctx, Result("provision", data, summary=summary), facts_text)


def _run_text(result: Result[dict[str, Any]]) -> None:  # runs: RunRecord's union (manifest or launch record)
    for r in result.data["runs"]:
        if result.data["detached"]:
            stdout.print(f"{r['run_id']}  started on {r['host']['name']} (detached)", markup=False)
        else:
            n = len(r.get("artifacts", []))
            stdout.print(
                f"{r['run_id']}  {r['status']} (exit {r['exit_code']}), {n} artifacts verified", markup=False
            )
    print_failure(result.data.get("failure"))
    for note in result.data.get("notes") or []:
        stdout.print(f"note: {note}", markup=False)
    stdout.print(result.summary, markup=False)


def print_failure(failure: FailureRecord | None) -> None:
    """The failed replicate's last log lines (the summary names it, its exit code and what it stopped)."""
    if not failure:
        return
    stdout.print(f"last lines of the log of replicate #{failure['replicate']} ({failure['run_id']}):", markup=False)
    for line in failure.get("log_tail") or ["(no log)"]:
        stdout.print(f"  | {line}", markup=False, highlight=False)


@command(app, "run")
@with_host(multiple=True, repeated="give it once per node with --nodes to run one node on each host")
def run_cmd(
    ctx: typer.Context,
    recipe: RecipeArg,
    script_args: ScriptArgs = None,
    host: list[HostSpec] = [LOCAL],  # noqa: B006 - @with_host passes the real value
    variant: VariantOpt = "cpu",
    seed: SeedOpt = None,
    determinism: DeterminismOpt = "deterministic",
    threads: ThreadsOpt = None,
    data: DataOpt = None,
    data_from: DataFromOpt = None,
    param: ParamOpt = None,
    probes: ProbesOpt = None,
    trace_every: TraceOpt = None,
    checkpoint_every: CheckpointOpt = None,
    keep_checkpoints: KeepCheckpointsOpt = False,
    env: EnvOpt = None,
    secret_env: SecretEnvOpt = None,
    runs_n: ReplicatesOpt = 1,
    detach: DetachOpt = False,
    group: GroupOpt = None,
    ship_via: ShipViaOpt = None,
    no_build: NoBuildOpt = False,
    mount: MountOpt = False,
    code_dir: CodeDirOpt = None,
    entry: EntryOpt = None,
    scheduler: SchedulerOpt = None,
    partition: PartitionOpt = None,
    slurm_opt: SlurmOpt = None,
    max_parallel: MaxParallelOpt = None,
    find_links: WheelsOpt = None,
    ca_bundle: IndexCaOpt = None,
    nodes: NodesOpt = None,
    procs_per_node: ProcsPerNodeOpt = None,
    reduction: ReductionOpt = "default",
) -> None:
    """Run a recipe or a script in its pinned image on the local engine or a host over SSH, determinism injected.

    The image is rebuilt first when the workspace's code differs from it (see --no-build), and the
    manifest records the digest of the code the container executed, computed inside it. A project
    that declares its own requirements (requirements.in beside the code) runs in the variant's image
    plus one thin layer of them, locked first when requirements.lock is missing or stale.
    """
    from launcher.runs import lifecycle as runs
    from launcher.specs import topology, userenv

    chosen_probes = runs.probes_option(probes)  # a bad SPEC stops here, before the workspace is read
    trace = runs.trace_option(trace_every)
    checkpoints = runs.checkpoints_option(checkpoint_every, keep_checkpoints)
    user_env = userenv.parse(env or [], secret_env or [])
    ws = workspace_of(ctx)
    request_variant = variant_for(ctx, ws, variant, recipe, entry)
    if len(host) > 1 and nodes is None:
        nodes = len(host)  # one node on each host
    request = runs.RunRequest(
        recipe=recipe, variant=request_variant, seed=seed[0] if seed else None,
        profile=determinism, threads=threads_for(ctx, determinism, threads), data=data,
        data_from=str(data_from) if data_from else None, params=runs.parse_params(param or []), group=group,
        detach=detach, ship_via=ship_via, args=list(script_args or []), code=str(code_dir) if code_dir else None,
        entry=entry, mount=mount, build=not no_build, probes=chosen_probes, trace_every=trace,
        checkpoints=checkpoints, env=dict(user_env.plain), secret_env=dict(user_env.secret),
        find_links=_wheel_dirs(find_links), ca_bundle=str(ca_bundle) if ca_bundle else None,
        topology=topology.topology_option(nodes, procs_per_node, gpu=ws.needs_gpu(request_variant)),
        reduction=topology.reduction_option(reduction))
    _run(ctx, ws, request, host, runs_n, seed or [], (scheduler, partition, slurm_opt, max_parallel))


def _wheel_dirs(dirs: list[Path] | None) -> list[str]:
    """--find-links folders, each checked (the module that reads wheel sources only when some are given)."""
    if not dirs:
        return []
    from launcher.images import wheelsources

    return [str(d) for d in wheelsources.check_dirs(dirs)]


def _run(ctx: typer.Context, ws: Workspace, request: RunRequest, hosts: list[HostSpec], runs_n: int,
         seeds: list[int], placing: tuple[str | None, str | None, list[str] | None, int | None]) -> None:
    """run_cmd's run of the request on its host (placed by --scheduler and its options), or one node on each of
    several hosts, rendered."""
    from contextlib import ExitStack

    from launcher.runs import lifecycle as runs

    if len(hosts) > 1 and (check_cluster_options(*placing) or len({h.name for h in hosts}) != len(hosts)):
        raise UsageError("--host given several times places one node on each host: each host once, without "
                         "--scheduler", "give the login node once with --scheduler, or each node's host once")
    if len(hosts) > 1 and (request.topology is None or request.topology.nodes != len(hosts)):
        nodes = 1 if request.topology is None else request.topology.nodes
        raise UsageError(f"{len(hosts)} hosts given (--host) for a run of {nodes} node{'s' if nodes != 1 else ''}: "
                         "launcher places one node on each host", f"give --nodes {len(hosts)}, or drop --nodes")
    runs.load_recipe(ws, request.recipe, entry=request.entry)
    check_cluster_options(*placing)  # a target's option it refuses, before any host is reached
    opts = options(ctx)
    # --quiet hides progress bars, not the training log the run streams (--json keeps stdout for the JSON)
    sink = None if opts.json else (lambda line: stdout.print(line, markup=False, highlight=False))
    host = hosts[0]
    with ExitStack() as opened, reporter(ctx) as rep:
        if len(hosts) > 1:
            from launcher.targets.hostnodes import HostsPlacement

            placed: Any = HostsPlacement([opened.enter_context(_open(ctx, h)) for h in hosts], hosts)
        else:
            placed = target(opened.enter_context(_open(ctx, host)), host, *placing)
        outcome = runs.run_recipe(ws, request, placed, rep, runs=runs_n, seeds=seeds, on_log=sink, host_spec=host)
    failure = outcome.failure
    if outcome.detached:
        summary = f"group {outcome.group}: {len(outcome.runs)} runs started; `launcher pull RUN` when done"
    elif failure:
        summary = (f"group {outcome.group}: {failure.line()}; its log: "
                   f"runs/{failure.run_id}/{failure.log} (`launcher logs {failure.run_id}`)")
    else:
        n = len(outcome.runs)
        summary = f"group {outcome.group}: {n} run{'s' if n != 1 else ''} succeeded"
    data_out = {"group": outcome.group, "detached": outcome.detached, "runs": outcome.runs,
                "failure": failure.to_dict() if failure else None, "notes": outcome.notes}
    render(ctx, Result("run", data_out, exit_code=outcome.exit_code, summary=summary), _run_text)


@command(app, "resume")
@with_host()
def resume_cmd(
    ctx: typer.Context,
    run_id: RunArg,
    host: HostSpec = LOCAL,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Start and return; `launcher pull` later.")
    ] = False,
) -> None:
    """Go on with a run started with --checkpoint-every that stopped or was killed: from its latest
    checkpoint (an epoch end), in a new container started as the first one was, on the host it ran on,
    or with --host on another one (its outputs so far, image, sent data and code go there). It ends
    with the bits an uninterrupted run of the same seed ends with; the manifest lists each container
    as a segment. A PyTorch run of several processes resumes every rank from the newest checkpoint
    that all ranks hold, every node's container started again where it ran."""
    from launcher.records.store import resolve_run_id
    from launcher.runs import resume as resume_mod

    ws = workspace_of(ctx)
    run_id = resolve_run_id(ws, run_id)
    opts = options(ctx)
    sink = None if opts.json else (lambda line: stdout.print(line, markup=False, highlight=False))
    with reporter(ctx) as rep:
        out = resume_mod.resume_run(ws, run_id, rep, host=host if host.destination is not None else None, detach=detach,
                                    on_log=sink)
    last = (out.get("segments") or [{}])[-1]
    code = run_exit_code(out.get("status"), ended=not detach)
    if detach:
        summary = f"{run_id}: resumed from {last.get('resumed_from')} (detached); `launcher pull {run_id}` when done"
    else:
        resumed = [s.get("resumed_from") for s in out.get("segments") or [] if s.get("resumed_from")]
        summary = (f"{run_id}: {out.get('status')} (exit {out.get('exit_code')}) after {len(resumed) + 1} segments "
                   f"(resumed from {', '.join(resumed)}), {len(out.get('artifacts') or [])} artifacts verified")
    render(ctx, Result("resume", {"run": out}, exit_code=code, summary=summary))


@command(app, "ps")
@with_host()
def ps_cmd(
    ctx: typer.Context,
    host: HostSpec = LOCAL,
    scheduler: SchedulerOpt = None,
) -> None:
    """List runs: the workspace's run directories and, with --host, that host's run containers
    (with --scheduler slurm: the cluster's queued and running replicates)."""
    from launcher.runs import control as runcontrol

    ws = workspace_of(ctx)
    if host.local and scheduler is None:
        rows = runcontrol.list_runs(ws)
    else:
        with _open(ctx, host) as h:
            rows = runcontrol.list_runs(ws, target(h, host, scheduler, None, None, None))

    def text(result: Result[PsListing]) -> None:
        from rich.table import Column, Table
        from rich.text import Text

        if not result.data["runs"]:
            where = f" or on {host.name}" if not host.local else ""
            stdout.print(f"no runs in {ws.runs}{where} yet; start one with `launcher run RECIPE`", markup=False)
            return
        runs = result.data["runs"]
        # the unique start of each id, whole however narrow the terminal (`launcher logs` etc. take it back)
        first = Column("run", no_wrap=True, min_width=max(len(r["short_id"]) for r in runs))
        t = Table(first, "recipe or script", "code", "host", "status", "container")
        for r in runs:
            cells = (r["short_id"], r.get("code_name"), r.get("code"), r.get("host"), r["status"],
                     r.get("container_status"))
            t.add_row(*(Text(str(c or "-")) for c in cells))
        stdout.print(t)

    listing: PsListing = {"runs": rows}
    render(ctx, Result("ps", listing, summary=f"{len(rows)} runs"), text)


def _sink(ctx: typer.Context, lines: list[str]) -> Any:
    if options(ctx).json:
        return lines.append
    return lambda line: stdout.print(line, markup=False, highlight=False)


@command(app, "logs")
def logs_cmd(
    ctx: typer.Context,
    run_id: RunArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the run ends.")] = False,
) -> None:
    """Print a run's logs (from its container while it exists, else the pulled train.log)."""
    from launcher.records.store import resolve_run_id
    from launcher.runs import control as runcontrol

    lines: list[str] = []
    ws = workspace_of(ctx)
    run_id = resolve_run_id(ws, run_id)
    runcontrol.logs(ws, run_id, _sink(ctx, lines), follow=follow)
    render(ctx, Result("logs", {"run_id": run_id, "lines": lines}), lambda r: None)


@command(app, "attach")
def attach_cmd(ctx: typer.Context, run_id: RunArg) -> None:
    """Follow a detached run's logs to its end, then pull its outputs."""
    from launcher.records.store import resolve_run_id
    from launcher.runs import control as runcontrol

    lines: list[str] = []
    ws = workspace_of(ctx)
    run_id = resolve_run_id(ws, run_id)
    with reporter(ctx) as rep:
        manifest = runcontrol.attach(ws, run_id, _sink(ctx, lines), rep)
    code = run_exit_code(manifest.get("status"))
    render(ctx, Result("attach", {"manifest": manifest, "lines": lines}, exit_code=code,
                       summary=f"{run_id}: {manifest.get('status')} (exit {manifest.get('exit_code')})"))


@command(app, "pull")
def pull_cmd(
    ctx: typer.Context,
    run_id: RunArg,
    watch: Annotated[
        float | None, typer.Option("--watch", metavar="SECONDS",
                                   help="Copy back every SECONDS while the run goes, then finish.")
    ] = None,
) -> None:
    """Copy a run's outputs back, verified (resumable: verified files are skipped)."""
    from launcher.records.store import resolve_run_id
    from launcher.runs.collect import pull_run

    ws = workspace_of(ctx)
    run_id = resolve_run_id(ws, run_id)
    with reporter(ctx) as rep:
        out = pull_run(ws, run_id, reporter=rep, watch=watch)
    code = run_exit_code(out.get("status"), ended=out.get("status") != "running")
    if out.get("status") == "running":
        summary = f"{run_id} is still running; pulled {out['pulled']['transferred']} files so far"
    else:
        summary = (
            f"{run_id}: {out['status']} (exit {out['exit_code']}), {len(out['artifacts'])} artifacts verified"
        )
    render(ctx, Result("pull", {"run": out}, exit_code=code, summary=summary))


@command(app, "stop")
def stop_cmd(ctx: typer.Context, run_id: RunArg) -> None:
    """Stop a run's container (its outputs so far stay on the host: `launcher pull RUN`). A cluster run:
    cancel its whole job array, and pull every replicate's outputs and manifest."""
    from launcher.records.store import resolve_run_id
    from launcher.runs import control as runcontrol

    ws = workspace_of(ctx)
    run_id = resolve_run_id(ws, run_id)
    with reporter(ctx) as rep:
        out = runcontrol.stop(ws, run_id, rep)
    summary = f"stopped {run_id} (exit {out.get('exit_code')})"
    if out.get("runs"):
        summary = f"stopped the job array of {run_id}: " + ", ".join(
            f"{r['run_id']} {r['status']}" for r in out["runs"])
    render(ctx, Result("stop", dict(out), summary=summary))


@command(app, "clean")
@with_host()
def clean_cmd(
    ctx: typer.Context,
    run_ids: RunsArg = None,
    force: Annotated[
        bool, typer.Option("--force", help="Delete the host's copy even if the local one is not complete.")
    ] = False,
    datasets: Annotated[
        bool,
        typer.Option(
            "--datasets",
            help="Also delete the --data-from datasets on --host that no container there mounts "
            "(the next run that needs one sends it again).",
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --datasets: list, delete nothing.")] = False,
    host: HostSpec = LOCAL,
) -> None:
    """Free a host's disk: delete runs' directories and containers there once their outputs are
    pulled and still match their manifests (the local run directories stay); with --datasets,
    the datasets sent there that nothing mounts."""
    from launcher.records.store import resolve_run_id
    from launcher.runs import control as runcontrol

    if not run_ids and not datasets:
        raise UsageError("nothing to clean", "name runs (`launcher clean RUN...`) or add --datasets --host HOST")
    if datasets and host.local:
        raise UsageError("--datasets needs --host", "the local engine mounts datasets where they are")
    ws = workspace_of(ctx)
    named = [resolve_run_id(ws, ref) for ref in run_ids or []]  # every ref checked before anything is deleted
    done = []
    with reporter(ctx) as rep:
        for run_id in dict.fromkeys(named):
            done.append(runcontrol.clean(ws, run_id, force=force, reporter=rep))
    data: CleanListing = {"runs": done}
    removed = sum(d["removed"] for d in done)
    parts = [f"removed {removed} of {len(done)} run directories on their hosts; local copies kept"] if done else []
    if datasets:
        from launcher.transfers import datasets as datasets_mod

        with _open(ctx, host) as h:
            pruned = datasets_mod.prune_host(h, dry_run=dry_run)
        data["datasets"] = pruned.to_dict()
        verb = "would remove" if dry_run else "removed"
        parts.append(
            f"{verb} {len(pruned.removed)} datasets ({pruned.to_dict()['removed_bytes'] >> 20} MiB), "
            f"kept {len(pruned.kept)}"
        )
    render(ctx, Result("clean", data, summary="; ".join(parts)))
