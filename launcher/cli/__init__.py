"""The `launcher` command line: a thin Typer layer over the library.

Each command parses options, calls one core function and renders its Result.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from launcher import __version__
from launcher.cli import config_cmds
from launcher.cli.common import QUIET_HELP, Options, fail
from launcher.cli.lazy import LazyGroup
from launcher.cli.params import ARGV
from launcher.errors import LauncherError

app = typer.Typer(
    name="launcher",
    help=(
        "Reproducible ML training runs, proven.\n\n"
        "Lock your Python dependencies (`launcher lock`), build a digest-pinned image "
        "(`launcher build`), run a recipe on the local Docker engine or a GPU VM over SSH "
        "with every determinism switch injected (`launcher run RECIPE --host IP`), then "
        "compare the results bit for bit (`launcher verify checksums`)."
    ),
    no_args_is_help=True,
    cls=LazyGroup,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"launcher {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    workspace: Annotated[Path | None, typer.Option(
        "--workspace", "-w", metavar="DIR", help="Workspace directory (holds lockfiles/, dockerfiles/, recipes/). "
        "Default: the current directory or the nearest parent that is one.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print a versioned JSON result on stdout.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    ctx.obj = Options(workspace=workspace, json=json_out, debug=debug, quiet=quiet)
    try:
        config_cmds.apply_defaults(ctx)  # launcher.toml and LAUNCHER_* as the defaults of what follows
    except LauncherError as exc:
        if debug or "--debug" in _options_typed(ctx):
            raise
        ctx.obj.json = json_out or "--json" in _options_typed(ctx)
        fail(ctx, ctx.invoked_subcommand or "launcher", exc)
        raise typer.Exit(int(exc.exit_code)) from None


def _options_typed(ctx: typer.Context) -> list[str]:
    """The arguments as typed, up to a lone `--` (global options may follow the command)."""
    argv = list(ctx.meta.get(ARGV) or [])
    return argv[: argv.index("--")] if "--" in argv else argv


# Each module declares its commands on its own Typer: a named one is a group (`launcher recipes ...`), a
# nameless one adds its commands at the top level. The root imports a module when one of its commands is
# looked up (cli/lazy.py's COMMANDS, in the order of the chain, as --help lists them).


def _terminate(signum: int, frame: object) -> None:
    # Turn SIGTERM into the same path as Ctrl-C so temporary files are cleaned up and
    # nothing is left looking complete.
    raise KeyboardInterrupt


def main() -> NoReturn:
    """The `launcher` command: the app, then out without tearing the interpreter down (see _last_exit)."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except SystemExit as exc:
        _leave(exc.code)
    _leave(0)


def _leave(code: object) -> NoReturn:
    """Exit with code: a code that is neither an int nor None is said on stderr and exits 1, as sys.exit
    does. The interpreter then joins the threads left, runs the exit functions (temporary files removed,
    logs flushed), and _last_exit ends the process after them."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    _EXIT_CODE.append(code if isinstance(code, int) else 0 if code is None else 1)
    raise SystemExit(_EXIT_CODE[-1])


_EXIT_CODE: list[int] = []  # the code main() leaves with; empty when launcher.cli is imported and not run


def _last_exit() -> None:
    """The last exit function: once main() has left, flush the output and end the process with its code,
    skipping the interpreter's teardown of its ~800 modules (some 50 ms of nothing after every command's
    last line). Registered when this module is imported, before any exit function of a command (the
    interpreter runs them last registered first, so each of those has run by now)."""
    if not _EXIT_CODE:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(_EXIT_CODE[-1])


atexit.register(_last_exit)
