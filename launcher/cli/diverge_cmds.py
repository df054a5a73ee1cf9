"""`launcher diverge RUN_A RUN_B`: the step and the operation at which two runs part, and the setting
that makes them agree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from launcher.cli.common import command, render, reporter, stdout, workspace_of
from launcher.cli.params import complete_run
from launcher.result import Result

if TYPE_CHECKING:
    from launcher.workflows.divergence import DivergenceLines

app = typer.Typer()


def _print(result: Result[DivergenceLines]) -> None:
    for line in result.data["lines"]:
        stdout.print(line, markup=False, highlight=False)


@command(app, "diverge")
def diverge_cmd(
    ctx: typer.Context,
    reference: Annotated[str, typer.Argument(metavar="RUN_A", help="The reference run (any unique part of its id).",
                                             autocompletion=complete_run)],
    other: Annotated[str, typer.Argument(metavar="RUN_B", help="The run that differs from it.",
                                         autocompletion=complete_run)],
    no_causes: Annotated[bool, typer.Option(
        "--no-causes", help="Stop at the operation; do not try settings that might make it agree.")] = False,
) -> None:
    """Find where two runs part: the step, the layer, the value, and what makes them part.

    The runs' step fingerprints (recorded by default at each epoch's end; `launcher run --trace-every N`
    for finer) give the last step at which their weights agree and the first at which they differ.
    Each run is then executed again in its own environment (its image, host, profile, seed, threads,
    code, data and arguments, as recorded), from the start or from the last checkpoint it kept before
    they part (`launcher run --checkpoint-every N --keep-checkpoints`), every step fingerprinted and the
    steps between traced value by value: the weights each forward pass reads, each layer's input and
    output, each weight's gradient, the weights after each update. Each re-execution must repeat its
    run's fingerprints up to there; one that does not stops diverge (exit 46: nothing it traced can be
    believed). Then: the exact step at which the re-executions' weights part, and the first value that
    differs, with whether its input agreed and the size of the difference; weights changed between an
    update and the next forward pass (a callback, a constraint, an edit of param.data) are named as a
    change outside the traced operations. Then, unless --no-causes, and unless the runs' inputs differ
    or their code changed the weights itself, the second run is executed again with one setting changed
    at a time (where the runs' environments differ: the reference's thread count, profile, host; else
    deterministic ops, or one thread, for both), and the setting under which the operation agrees is
    named as the cause. The re-executions are ordinary runs of the workspace (group diverge-...), left
    for inspection.

    Example: launcher diverge 1a2b3c 4d5e6f
    """
    from launcher.workflows.diverge import diverge

    ws = workspace_of(ctx)
    with reporter(ctx) as rep:
        res = diverge(ws, reference, other, causes=not no_causes, reporter=rep)
    lines = res.lines()
    data: DivergenceLines = {**res.to_dict(), "lines": lines}
    render(ctx, Result("diverge", data, exit_code=res.exit_code, summary=lines[-1]), _print)
