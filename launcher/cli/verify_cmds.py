"""`launcher verify checksums`, `launcher experiment`, `launcher report`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.markup import escape
from rich.table import Table

from launcher.cli.common import command, render, reporter, stdout, workspace_of
from launcher.cli.difftext import explanation_lines, model_lines, num
from launcher.cli.hostopts import (
    MaxParallelOpt,
    PartitionOpt,
    SchedulerOpt,
    SlurmOpt,
    placer,
    with_host,
)
from launcher.cli.params import (
    DataOpt,
    DeterminismOpt,
    EnvOpt,
    IndexCaOpt,
    ParamOpt,
    ProbesOpt,
    ScriptArgs,
    SecretEnvOpt,
    ThreadsOpt,
    TraceOpt,
    VariantOpt,
    WheelsOpt,
    complete_group,
    complete_recipe,
    complete_run,
    group,
    threads_for,
    variant_for,
)
from launcher.cli.run_cmds import print_failure
from launcher.cli.run_opts import ExperimentNodesOpt, ProcsPerNodeOpt, ReductionOpt
from launcher.hosts.hostspec import HostSpec
from launcher.images.wheelsources import check_dirs
from launcher.result import Result

if TYPE_CHECKING:
    from launcher.report.records import ReportDoc
    from launcher.verify.differences import ModelExplanation
    from launcher.verify.modeldiff import SourcedModelDiff
    from launcher.verify.verdicts import RunRecord, VerdictRecord
    from launcher.workflows.experiment import ExperimentRecord, ExperimentResult
from launcher.determinism import DEFAULT_SEED

app = typer.Typer()
verify_app = group("verify", "Compare runs bit for bit and explain the differences.")
app.add_typer(verify_app)

_STYLE = {"identical": "green", "identical-content": "green", "differs": "bold red", "missing": "yellow",
          "reference": "cyan", "unreadable": "yellow", "ignored": "dim"}
_VERDICT_STYLE = {"identical": "green", "consistent": "green", "inconclusive": "bold yellow", "differs": "bold red"}


def _short(run_id: str) -> str:
    return run_id.rsplit("-", 1)[-1] if "-" in run_id else run_id


def run_label(r: RunRecord, runs: list[RunRecord], *, full: bool = False) -> str:
    """A run's name: its replicate number and (the end of) its id where the runs are one group's replicates,
    else (runs of several groups, each numbered from 0) its id alone."""
    rid = r["run_id"] if full else _short(r["run_id"])
    return f"run #{r['replicate']} {rid}" if len({x["group"] for x in runs}) == 1 else f"run {rid}"


def _yes(flag: bool | None) -> str:
    if flag is None:
        return "[yellow]unknown[/] (not recorded)"
    return "[green]True[/]" if flag else "[bold red]False[/]"



def _print_verify(result: Result[VerdictRecord]) -> None:
    d = result.data
    runs = d["runs"]
    table = Table(title=f"verify checksums: {d.get('code_name') or d['recipe']} against {d['reference']}",
                  show_lines=False)
    table.add_column("artifact", overflow="fold")
    table.add_column("kind")
    for r in runs:
        table.add_column(run_label(r, runs), justify="center")
    for a in d["artifacts"]:
        by = {"launcher": "", "recipe": ", recipe", "--ignore": ", --ignore"}.get(a.get("ignored_by") or "", "")
        path = escape(a["path"]) if a["checked"] else f"[dim]{escape(a['path'])} (not compared{by})[/]"
        cells = []
        for r in runs:
            cell = a["runs"][r["run_id"]]
            status = cell["status"]
            if status == "missing" and cell.get("sha256"):
                status = "only here"  # the file the other run lacks; "missing" is said where it is missing
            if not a["checked"] and status in ("identical", "identical-content"):
                status = "same bytes"  # left out of the comparison: that its bytes match is all it says
            style = _STYLE.get(status, "yellow") if a["checked"] else "dim"
            cells.append(f"[{style}]{status}[/]" if style else status)
        table.add_row(path, a.get("kind", ""), *cells)
    stdout.print(table)
    for r in runs:
        stdout.print(f"code of {run_label(r, runs)}: {r.get('code', '-')}", markup=False)
    _print_not_compared(d)
    _print_evidence(d)
    if d.get("mode") == "alone":
        _print_tail(result)
        return
    c = d["checks"]
    stdout.print(f"Models all the same: {_yes(c['models']['all_same'])} "
                 f"(runs checked: {c['models']['checked']}/{c['models']['of']})")
    stdout.print(f"Initial weights all the same: {_yes(c['initial_weights']['all_same'])}")
    stdout.print(f"XY training data all the same: {_yes(c['data']['all_same'])}")
    stdout.print(f"Batches all the same: {_yes(c['batches']['all_same'])}")
    stdout.print(f"Metrics all the same: {_yes(c['metrics']['all_same'])}")
    for r in runs:
        if r["status"] == "identical" and r.get("identical_in_content"):
            stdout.print(f"\n{run_label(r, runs, full=True)}: {r['line']}", markup=False)
        if r["status"] != "differs":
            continue
        stdout.print(f"\n[bold]{run_label(r, runs, full=True)}[/]: {r['line']}")
        for line in explanation_lines(d["explanations"][r["run_id"]]):
            stdout.print(f"  {line}", markup=False)
    _print_tail(result)


def _print_not_compared(d: VerdictRecord) -> None:
    """Why files were left out or could not be read: once per who (or per file that cannot be read)."""
    for g in d.get("ignored") or []:
        names = [p.removeprefix("outputs/") for p in g["paths"]]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        differ = f"; {len(g['differ'])} differ in bytes" if g["differ"] else ""
        stdout.print(f"not compared: {shown} ({g['why']}){differ}", markup=False, style="dim")
    for a in d["artifacts"]:
        cell = next((c for c in a["runs"].values() if c["status"] == "unreadable"), None)
        if cell is not None:
            content = cell.get("content")
            unreadable, fix = (content.get("unreadable"), content.get("fix")) if content else (None, None)
            stdout.print(f"[yellow]not compared[/] {escape(a['path'])}: {escape(str(unreadable))}; "
                         f"fix: {escape(str(fix))}")


def evidence_lines(d: VerdictRecord) -> list[str]:
    """What was compared, by kind: one line per kind, and the determinism of the runs."""
    ev = d.get("evidence") or {}
    lines = []
    for kind, k in (ev.get("kinds") or {}).items():
        n = k["files"]
        files = f"{n} file{'s' if n != 1 else ''}"
        if k["outcome"] == "checked alone":
            lines.append(f"{kind}: {files}")
            continue
        parts = [f"{k[o]} {o}" for o in ("identical", "differs", "unreadable", "ignored") if k[o]]
        lines.append(f"{kind}: {files}, {k['compared']} compared: {k['outcome']} ({', '.join(parts)})")
    det = ev.get("determinism") or {}
    if det and not det.get("in_force"):
        reasons = sorted({r["reason"] for r in det["runs"].values() if not r["in_force"]})
        lines.append("determinism: not in force (" + "; ".join(reasons) + ")")
    elif det:
        lines.append("determinism: in force in every run")
    return lines


def _print_evidence(d: VerdictRecord) -> None:
    stdout.print("Compared, by kind:" if d.get("mode") != "alone" else "Held, by kind:")
    for line in evidence_lines(d):
        stdout.print(f"  {line}", markup=False)


def _print_tail(result: Result[VerdictRecord]) -> None:
    d = result.data
    runs = d["runs"]
    for r in runs:
        if r["run_status"] == "failed":
            stdout.print(f"\n[yellow]run {r['run_id']} failed (its recipe exited non-zero): its outputs may be "
                         "incomplete[/]")
    for skipped in d["skipped"]:
        stdout.print(f"\n[yellow]left out {skipped['run_id']}[/]: {skipped['reason']}", markup=True)
    style = _VERDICT_STYLE.get(d.get("verdict", ""), "green" if result.ok else "bold red")
    stdout.print(f"\n[{style}]{escape(result.summary)}[/]")


@command(verify_app, "checksums")
def checksums(
    ctx: typer.Context,
    runs: Annotated[list[str] | None, typer.Argument(
        metavar="RUN", autocompletion=complete_run,
        help="Run ids (or run directories). Default: the runs of the most recent group.")] = None,
    against: Annotated[str | None, typer.Option(
        "--against", metavar="RUN", autocompletion=complete_run,
        help="The reference run. Default: the first run.")] = None,
    group: Annotated[str | None, typer.Option(
        "--group", "-g", metavar="NAME", autocompletion=complete_group,
        help="Verify the runs of this group (e.g. one from `launcher experiment`).")
    ] = None,
    ignore: Annotated[list[str] | None, typer.Option(
        "--ignore", metavar="GLOB", help="List files matching GLOB (under outputs/; * crosses /) but do not "
        "compare them; repeatable.")] = None,
    evidence: Annotated[list[str] | None, typer.Option(
        "--evidence", metavar="GLOB", help="Files matching GLOB (under outputs/; * crosses /) hold the result of "
        "training (kind 'named evidence'): agreeing on them proves something; repeatable. A GLOB that matches no "
        "file is a usage error.")] = None,
    across_code: Annotated[bool, typer.Option(
        "--across-code", help="Compare runs of different code (another script or recipe, or an edited copy); "
        "refused otherwise. The verdict then says the difference may come from the code.")] = False,
    tolerance: Annotated[list[str] | None, typer.Option(
        "--tolerance", metavar="KEY=VALUE", help="How far probe outputs may move and still agree: probability "
        "(largest change of a class probability, default 0.001), heatmap (largest change of a Grad-CAM pixel, "
        "maps scaled to [0, 1], default 0.05), overlap (lowest IoU of the most salient regions, default 0.5), "
        "top (the salient fraction of pixels, default 0.1); repeatable.")] = None,
) -> None:
    """Compare every artifact across runs, by content where its format is known; explain every difference.

    With no RUN: the latest group, or, when it holds one run, that run against the previous run of
    the same code (runs of other code are compared only with --across-code). One RUN alone is
    checked against its manifest and its own records.
    Where the recipe records probes, a difference is also explained by its impact: probe predictions
    that flip, the largest probability change, and how far the Grad-CAM heatmaps move (--tolerance).
    Every verdict lists what it compared by kind (model, checkpoint, predictions, metrics, logs,
    records, other). Exit 0 when all runs are identical (in bytes or in content) and that proves
    something; 37 (inconclusive) when nothing differs but nothing training produced was compared
    (save the model, or name it with --evidence) or determinism was not in force; 3 (not
    reproducible) when any differ; 13 when a file is corrupt or a run contradicts its own records;
    16 for runs of different code without --across-code.
    """
    from launcher.verify.impact import Tolerances
    from launcher.verify.verdicts import verify_checksums

    tolerances = Tolerances.parse(tolerance or [])
    ws = workspace_of(ctx)
    with reporter(ctx) as rep:
        report = verify_checksums(ws, runs or None, against=against, group=group, reporter=rep,
                                  ignore=ignore or [], tolerances=tolerances, evidence=evidence or [],
                                  across_code=across_code)
    result = Result("verify checksums", report.to_dict(), report.exit_code, report.summary_line())
    render(ctx, result, _print_verify)


def _print_experiment(result: Result[ExperimentRecord]) -> None:
    d = result.data
    table = Table("group", "#", "seed", "host", "run", "result")
    for r in d["runs"]:
        outcome = "[green]ok[/]" if r["ok"] else f"[bold red]{escape(r['error'] or 'run failed')}[/]"
        table.add_row(r["group"], str(r["replicate"]), str(r["seed"]), r["host"] or "-",
                      ", ".join(r["run_ids"]) or "-", outcome)
    stdout.print(table)
    print_failure(d.get("failure"))
    for note in d.get("notes") or []:
        stdout.print(f"note: {note}", markup=False)
    for name in d["groups"].values():
        stdout.print(f"verify:  launcher verify checksums --group {name}")
    stdout.print(f"report:  launcher report {' '.join(d['groups'].values())}")
    stdout.print(result.summary, markup=False)


@command(app, "experiment")
@with_host(multiple=True)
def experiment_cmd(
    ctx: typer.Context,
    recipe: Annotated[str, typer.Argument(metavar="RECIPE", autocompletion=complete_recipe,
                                          help="A recipe name (recipes/NAME), a recipe folder or a .py script.")],
    script_args: ScriptArgs = None,
    runs: Annotated[int, typer.Option("--runs", "-n", metavar="N",
                                      help="Runs per group. The first run that fails stops the rest.")] = 5,
    seeds: Annotated[Literal["same", "different", "both"], typer.Option(
        "--seeds", help="same: one seed for every run; different: a seed per run; both: one group of each.")
    ] = "both",
    host: Sequence[HostSpec] = (),
    scheduler: SchedulerOpt = None,
    partition: PartitionOpt = None,
    slurm_opt: SlurmOpt = None,
    max_parallel: MaxParallelOpt = None,
    seed: Annotated[list[int] | None, typer.Option(
        "--seed", metavar="N", help=f"The seed of the same-seed group and the first of the different-seeds group "
        f"(default {DEFAULT_SEED}); repeat to give the different-seeds group its seeds (after them: the last + 1, "
        "+ 2, ...).")] = None,
    variant: VariantOpt = "cpu",
    determinism: DeterminismOpt = "deterministic",
    threads: ThreadsOpt = None,
    data: DataOpt = None,
    data_from: Annotated[Path | None, typer.Option(
        "--data-from", metavar="DIR", help="Dataset folder on this machine: sent to each host by content "
        "(once per host), then mounted read-only like --data.")] = None,
    param: ParamOpt = None,
    probes: ProbesOpt = None,
    trace_every: TraceOpt = None,
    env: EnvOpt = None,
    secret_env: SecretEnvOpt = None,
    find_links: WheelsOpt = None,
    ca_bundle: IndexCaOpt = None,
    nodes: ExperimentNodesOpt = None,
    procs_per_node: ProcsPerNodeOpt = None,
    reduction: ReductionOpt = "default",
) -> None:
    """Run replicates of a recipe in a same-seed and a different-seeds group, in parallel across hosts."""
    from launcher.runs import lifecycle as runs_mod
    from launcher.specs import topology, userenv
    from launcher.workflows.experiment import experiment

    chosen_probes = runs_mod.probes_option(probes)  # a bad SPEC stops here, before any host is opened
    trace = runs_mod.trace_option(trace_every)
    user_env = userenv.parse(env or [], secret_env or [])
    ws = workspace_of(ctx)
    variant = variant_for(ctx, ws, variant, recipe)
    threads = threads_for(ctx, determinism, threads)
    cluster = placer(scheduler, partition, slurm_opt, max_parallel)
    layout = topology.topology_option(nodes, procs_per_node, gpu=ws.needs_gpu(variant))

    with reporter(ctx) as rep:
        res = experiment(ws, recipe, runs, seeds, host, base_seed=seed or [DEFAULT_SEED], variant=variant,
                         profile=determinism, threads=threads, data=data,
                         data_from=str(data_from) if data_from else None,
                         params=runs_mod.parse_params(param or []), probes=chosen_probes, trace_every=trace,
                         reporter=rep,
                         placement=cluster, args=script_args or [], user_env=user_env,
                         find_links=[str(d) for d in check_dirs(find_links or ())],
                         ca_bundle=str(ca_bundle) if ca_bundle else None, topology=layout,
                         reduction=topology.reduction_option(reduction))
    render(ctx, Result("experiment", res.to_dict(), res.exit_code, _experiment_summary(res)), _print_experiment)


def _experiment_summary(res: ExperimentResult) -> str:
    n_failed = len(res.failed)
    summary = (f"{len(res.outcomes)} runs in {len(res.groups)} groups" if not n_failed
               else f"{n_failed} of {len(res.outcomes)} runs failed")
    if res.failure:
        summary += f"; {res.failure.group} {res.failure.line()} (`launcher logs {res.failure.run_id}`)"
    return summary


def _print_report(result: Result[ReportDoc]) -> None:
    from launcher.report.assemble import percent

    d = result.data
    metrics = d["metrics"]
    table = Table("group", "kind", "runs", *(f"{m} mean ± stdev" for m in metrics))
    for g in d["groups"]:
        cells = []
        for m in metrics:
            f = g["final"][m]
            plus_minus = f" ± {num(f['stdev'])}" if f["stdev"] is not None else ""
            cells.append(num(f["mean"]) + plus_minus)
        table.add_row(g["name"], g["kind"], str(len(g["runs"])), *cells)
    stdout.print(table)
    spread = d.get("seed_fixed_spread")
    if spread:
        for m, v in spread["metrics"].items():
            variance = ""
            if v["status"] == "estimate" and (interval := v["variance_ratio_interval"]) is not None:
                lo, hi = interval
                variance = f"; {percent(v['variance_ratio'])} of the variance, {percent(lo)} to {percent(hi)}"
            stdout.print(f"{m}: {v['reading']}{variance}", markup=False)
        stdout.print(spread["advice"][0].upper() + spread["advice"][1:] + ".", markup=False)
    if d.get("difference_plots") or d.get("weights_plot"):
        figures = [*d["difference_plots"].values(), *([d["weights_plot"]] if d["weights_plot"] else [])]
        stdout.print(f"Figures of the differences from each group's first run: {', '.join(figures)}", markup=False)
    for gname, comp in d["comparisons"].items():
        stdout.print(f"\nComparison results for {gname}:")
        c = comp["checks"]
        stdout.print(f"Models all the same: {_yes(c['models']['all_same'])} "
                     f"(runs checked: {c['models']['checked']}/{c['models']['of']})")
        for r in comp["runs"]:
            if r["first_difference"]:
                fd = r["first_difference"]
                stdout.print(f"- different model in run {r['run_id']} (layer {fd['layer']}, array {fd['array']})")
        stdout.print(f"XY training data all the same: {_yes(c['data']['all_same'])}")
        stdout.print(f"Batches all the same: {_yes(c['batches']['all_same'])}")
    for gname, p in (d.get("probes") or {}).items():
        flips = p["flips"]["rows"]
        which = ", ".join(str(r["index"]) for r in flips[:8]) + (", ..." if len(flips) > 8 else "")
        said = f"{len(flips)} probe example(s) flip in some run ({which})" if flips else "no prediction flips"
        stdout.print(f"\nProbes of {gname} against {p['reference']}: {said}", markup=False)
        for pr in p["runs"]:
            stdout.print(f"- {pr['run_id']}: {pr['line']}", markup=False)
        if p["pictures"]:
            stdout.print(f"Heatmaps side by side for example(s) {', '.join(str(x['index']) for x in p['pictures'])} "
                         "in index.html", markup=False)
    for note in d["notes"]:
        stdout.print(f"[dim]{note}[/]")
    stdout.print(result.summary)


@command(app, "report")
def report_cmd(
    ctx: typer.Context,
    groups: Annotated[list[str], typer.Argument(
        metavar="GROUP", autocompletion=complete_group,
        help="Group names (from `launcher experiment` or a manifest).")],
    name: Annotated[str | None, typer.Option("--name", metavar="NAME", help="Report folder name under reports/.")
                    ] = None,
) -> None:
    """Write reports/NAME/: final metrics, the seed-fixed share of the spread with its confidence interval,
    plots (metrics, differences from the reference, final weights per layer), index.html, JSON."""
    from launcher.report.assemble import write_report

    ws = workspace_of(ctx)
    with reporter(ctx) as rep:
        report = write_report(ws, groups, name, rep)
    render(ctx, Result("report", report.to_dict(), summary=f"wrote {report.directory / 'index.html'}"),
           _print_report)


@command(verify_app, "models")
def models_cmd(
    ctx: typer.Context,
    reference: Annotated[Path, typer.Argument(
        metavar="MODEL", help="A model file: canonical.npz, .weights.h5, .h5, .keras, .pt.")],
    other: Annotated[Path, typer.Argument(metavar="OTHER", help="The model file to compare with it.")],
) -> None:
    """Diff two saved models array by array (no run directories needed).

    Exit 0 when every array is bit-identical, 3 when any differs.
    """
    from launcher.verify.modeldiff import diff_models

    diff = diff_models(reference, other)
    data: SourcedModelDiff = {"source": str(other), **diff.to_dict()}
    first = diff.first_difference
    summary = ("identical: every array is bit-identical" if first is None else
               f"differs: {len(diff.differing)} of {len(diff.arrays)} arrays; first differing layer "
               f"{first.layer} array {first.array}")

    def text(result: Result[SourcedModelDiff]) -> None:
        d = result.data
        model: ModelExplanation = {
            "source": d["source"], "identical": d["identical"], "arrays_total": d["arrays_total"],
            "arrays_differing": d["arrays_differing"], "elements_total": d["elements_total"],
            "elements_differing": d["elements_differing"], "first_difference": d["first_difference"],
            "arrays": d["arrays"]}
        for line in model_lines(model):
            stdout.print(line, markup=False)
        stdout.print(result.summary)

    render(ctx, Result("verify models", data, diff.exit_code, summary), text)
