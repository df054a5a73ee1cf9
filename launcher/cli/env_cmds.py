"""`launcher env RUN`: the plain `docker run` that repeats a run without launcher."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from launcher.cli.common import command, render, stdout, workspace_of
from launcher.cli.params import RunArg
from launcher.result import Result

if TYPE_CHECKING:
    from launcher.runs.plain import PlainShell

app = typer.Typer()


def _print(result: Result[PlainShell]) -> None:
    d = result.data
    stdout.print(f"# {d['run_id']} without launcher: the same image, code, data, arguments and environment",
                 markup=False)
    stdout.print(d["shell"], markup=False, soft_wrap=True)
    for note in d["notes"]:
        stdout.print(f"# note: {note}", markup=False)


@command(app, "env")
def env_cmd(
    ctx: typer.Context,
    run_id: RunArg,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", metavar="DIR", help="The folder the plain run writes to, mounted at /launcher/out (its "
        "working directory). Default: ./RUN-plain.")] = None,
) -> None:
    """Print the exact environment and `docker run` line that repeat a run without launcher.

    The same image (by ID), the code the run mounted (or the recipe baked into the image), its data,
    its script arguments, its working directory (/launcher/out) and every variable it was given: the
    determinism profile's (PYTHONHASHSEED, TF_DETERMINISTIC_OPS, thread counts...) and yours (--env).
    The script starts with the image's Python and nothing of launcher around it: nothing is seeded,
    hooked or recorded. A script that seeds itself ends with the same weights as the run did, which is
    how you check that launcher's recording changed nothing of the training.

    Example: launcher env 20261124T101500-myproj_train-a1b2c3 --out /tmp/plain > plain.sh
    """
    from launcher.runs.plain import plain_run

    res = plain_run(workspace_of(ctx), run_id, out)
    data: PlainShell = {**res.to_dict(), "shell": res.shell()}
    render(ctx, Result("env", data, summary=f"{res.run_id}: docker run of {res.command[1]} in {res.image[:19]}"),
           _print)
