"""`launcher verify checksums`, `launcher experiment`, `launcher report`."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from launcher.cli.common import guarded, render, reporter, stdout, workspace_of
from launcher.result import Result

verify_app = typer.Typer(name="verify", help="Compare runs bit for bit and explain the differences.",
                         no_args_is_help=True)

MAX_ARRAY_LINES = 12
_STYLE = {"identical": "green", "differs": "bold red", "missing": "yellow", "reference": "cyan"}


def _short(run_id: str) -> str:
    return run_id.rsplit("-", 1)[-1] if "-" in run_id else run_id


def _num(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _full(x: Any) -> str:
    return f"{x:.10g}" if isinstance(x, float) else str(x)


def _yes(flag: bool | None) -> str:
    if flag is None:
        return "[yellow]unknown[/] (not recorded)"
    return "[green]True[/]" if flag else "[bold red]False[/]"


def explanation_lines(exp: dict[str, Any]) -> list[str]:
    """The explanation of one differing run as indented text lines."""
    lines: list[str] = []
    model = exp.get("model")
    if model is not None and "error" in model:
        lines.append(f"model ({model['source']}): could not diff: {model['error']}")
    elif model is not None:
        first = model.get("first_difference")
        head = (f"model ({model['source']}): {model['arrays_differing']} of {model['arrays_total']} "
                f"arrays differ, {model['elements_differing']} of {model['elements_total']} elements")
        lines.append(head if first else f"model ({model['source']}): all arrays identical")
        shown = 0
        differing = [a for a in model["arrays"] if a["status"] != "identical"]
        for a in differing:
            if shown == MAX_ARRAY_LINES:
                lines.append(f"  and {len(differing) - shown} more arrays differ (all of them in --json)")
                break
            shown += 1
            detail = {"differs": f"{a['differing']} of {a['total']} elements, max abs diff "
                                 f"{_num(a['max_abs_diff'])}, max rel diff {_num(a['max_rel_diff'])}",
                      "shape": f"shape/dtype {a['shape']} {a['dtype']} vs {a['other_shape']}",
                      "missing": "in one model only"}.get(a["status"], a["status"])
            is_first = bool(first) and (a["layer"], a["array"]) == (first["layer"], first["array"])
            mark = "first differing: " if is_first else ""
            lines.append(f"  {mark}layer {a['layer']} array {a['array']}: {detail}")
    init = exp.get("initial_weights")
    if init is not None:
        if init["same"]:
            lines.append("initial weights: identical (the runs started from the same weights)")
        else:
            f = init.get("first_difference") or {}
            lines.append(f"initial weights: differ from the start ({init['arrays_differing']} arrays; "
                         f"first layer {f.get('layer')} array {f.get('array')})")
    data = exp.get("data")
    if data is not None:
        lines.append("training data: identical" if data["same"] else
                     "training data: differs (" + (", ".join(data["entries_differing"]) or "digest") + ")")
    batches = exp.get("batches")
    if batches is not None:
        if batches["same"] is None:
            lines.append("batches: not recorded (" + "; ".join(batches.get("unrecorded", [])) + ")")
        elif batches["same"]:
            lines.append(f"batches: identical in all {batches['epochs_compared']} epochs")
        else:
            fd = batches["first_divergence"]
            lines.append(f"batches: differ in epochs {batches['epochs_differing']}; first at epoch "
                         f"{fd['epoch']} batch {fd['batch']}")
    metrics = exp.get("metrics")
    if metrics is not None:
        fd = metrics.get("first_divergence")
        if fd is None:
            lines.append("metrics: identical in every epoch")
        else:
            parts = [f"{k} {_full(v['reference'])} -> {_full(v['run'])}"
                     + (f" (|Δ| {_num(v['abs_diff'])})" if "abs_diff" in v else "")
                     for k, v in fd["metrics"].items()]
            lines.append(f"metrics: first diverge at epoch {fd['epoch']}: " + ", ".join(parts))
    env = exp.get("environment") or []
    if env:
        lines.append("environment: " + "; ".join(
            f"{r['key']} {r['reference']!r} -> {r['run']!r} [{r['category']}]" for r in env[:12])
            + (f"; and {len(env) - 12} more" if len(env) > 12 else ""))
    else:
        lines.append("environment: identical (same image, seed, profile, threads, host hardware)")
    return lines


def _print_verify(result: Result) -> None:
    d = result.data
    runs = d["runs"]
    table = Table(title=f"verify checksums: {d['recipe']} against {d['reference']}", show_lines=False)
    table.add_column("artifact", overflow="fold")
    for r in runs:
        table.add_column(f"#{r['replicate']} {_short(r['run_id'])}", justify="center")
    for a in d["artifacts"]:
        path = a["path"] if a["checked"] else f"[dim]{a['path']} (not compared)[/]"
        cells = []
        for r in runs:
            status = a["runs"][r["run_id"]]["status"]
            style = _STYLE.get(status, "") if a["checked"] else "dim"
            cells.append(f"[{style}]{status}[/]" if style else status)
        table.add_row(path, *cells)
    stdout.print(table)
    c = d["checks"]
    stdout.print(f"Models all the same: {_yes(c['models']['all_same'])} "
                 f"(runs checked: {c['models']['checked']}/{c['models']['of']})")
    stdout.print(f"Initial weights all the same: {_yes(c['initial_weights']['all_same'])}")
    stdout.print(f"XY training data all the same: {_yes(c['data']['all_same'])}")
    stdout.print(f"Batches all the same: {_yes(c['batches']['all_same'])}")
    stdout.print(f"Metrics all the same: {_yes(c['metrics']['all_same'])}")
    for r in runs:
        if r["status"] != "differs":
            continue
        stdout.print(f"\n[bold]run #{r['replicate']} {r['run_id']}[/]: {r['line']}")
        for line in explanation_lines(d["explanations"][r["run_id"]]):
            stdout.print(f"  {line}", markup=False)
    style = "green" if result.ok else "bold red"
    stdout.print(f"\n[{style}]{result.summary}[/]")


@verify_app.command("checksums")
@guarded("verify checksums")
def checksums(
    ctx: typer.Context,
    runs: Annotated[list[str] | None, typer.Argument(
        help="Run ids (or run directories). Default: the runs of the most recent group.")] = None,
    against: Annotated[str | None, typer.Option(
        "--against", help="The reference run. Default: the first run.")] = None,
) -> None:
    """Compare every artifact's sha256 across runs; explain every difference.

    Exit 0 when all runs are bit-identical, 3 (not reproducible) when any differ.
    """
    from launcher.verify import verify_checksums

    ws = workspace_of(ctx)
    with reporter(ctx) as rep:
        report = verify_checksums(ws, runs or None, against=against, reporter=rep)
    result = Result("verify checksums", report.to_dict(), report.exit_code, report.summary_line())
    render(ctx, result, _print_verify)


def register(app: typer.Typer) -> None:
    app.add_typer(verify_app)
