"""`launcher export RUN... --to mlflow | --to tensorboard DIR`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.table import Table

from launcher.cli.common import command, render, reporter, stdout, workspace_of
from launcher.cli.params import complete_group, complete_run
from launcher.errors import UsageError
from launcher.result import Result

if TYPE_CHECKING:
    from launcher.report.exportrun import ExportRecord

app = typer.Typer()


def _print_export(result: Result[ExportRecord]) -> None:
    d = result.data
    where = "MLflow run" if d["target"] == "mlflow" else "folder"
    table = Table("run", "group", "#", "steps", "metrics", "verdict", where)
    for r in d["runs"]:
        verdict = r["verdict"]
        group_verdict, run_verdict = (verdict["verdict"], verdict["run"]) if verdict else ("none", "none")
        cell = run_verdict if run_verdict != "reference" else f"reference (group {group_verdict})"
        table.add_row(r["run_id"], r["group"], str(r["replicate"]), str(r["steps"]), ", ".join(r["metrics"]) or "-",
                      cell, r["destination"])
    stdout.print(table)
    stdout.print(result.summary, markup=False)


@command(app, "export")
def export_cmd(
    ctx: typer.Context,
    runs: Annotated[list[str] | None, typer.Argument(
        metavar="[RUN...] [DIR]", autocompletion=complete_run,
        help="Run ids (or run directories); default: the runs of the most recent group. With --to tensorboard "
        "the last argument is the log directory (or give --logdir).")] = None,
    to: Annotated[Literal["mlflow", "tensorboard"], typer.Option("--to", help="Where the runs go.")] = "mlflow",
    tracking_uri: Annotated[str | None, typer.Option(
        "--tracking-uri", metavar="URI", help="MLflow tracking URI: a server (http://127.0.0.1:5000) or a directory. "
        "Default: the file store mlruns/ in the workspace.")] = None,
    experiment: Annotated[str | None, typer.Option(
        "--experiment", metavar="NAME", help="MLflow experiment name. Default: the recipe's name.")] = None,
    logdir: Annotated[Path | None, typer.Option(
        "--logdir", metavar="DIR", help="TensorBoard log directory (the same as the last argument).")] = None,
    group: Annotated[str | None, typer.Option(
        "--group", "-g", metavar="NAME", autocompletion=complete_group, help="Export the runs of this group.")
    ] = None,
) -> None:
    """Export runs to MLflow (params, per-epoch metrics, tags, artifacts) or TensorBoard event files.

    MLflow: one MLflow run per launcher run; the image ID, lock hash, base digest and verdict are tags.

    TensorBoard: DIR/GROUP/RUN-ID/, one run per replicate, so the replicates' curves overlay.

    Needs the optional extra "export" of launcher (mlflow-skinny, tensorboard).
    """
    from launcher.report.export import TENSORBOARD, export_runs, is_run

    ws = workspace_of(ctx)
    refs = list(runs or [])
    if to == TENSORBOARD and logdir is None and refs:
        last = refs[-1]
        if is_run(ws, last):
            raise UsageError(f"the last argument {last!r} is a run, not a TensorBoard log directory",
                             "end with the directory: `launcher export RUN... --to tensorboard DIR`")
        logdir, refs = Path(last), refs[:-1]
    with reporter(ctx) as rep:
        res = export_runs(ws, refs, to, group=group, tracking_uri=tracking_uri, experiment=experiment,
                          logdir=logdir, reporter=rep)
    render(ctx, Result("export", res.to_dict(), summary=res.summary_line()), _print_export)
