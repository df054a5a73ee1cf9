"""What every command shares: the global options, rendering of results, and the one
place where a LauncherError becomes a line on stderr and an exit code."""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from launcher.errors import ExitCode, LauncherError
from launcher.progress import NullReporter, Reporter, Task
from launcher.result import D, Result, error_envelope
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


@dataclass
class Options:
    workspace: Path | None = None
    json: bool = False
    debug: bool = False
    quiet: bool = False


class LazyConsole:
    """A rich Console made when first printed to: rich's import (some 30 ms) then waits for the first line a
    command prints, which for a run comes once its container has started."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr, highlight=False, soft_wrap=True)
        return self._console

    def print(self, *objects: Any, **options: Any) -> None:
        self.console.print(*objects, **options)

    @property
    def is_terminal(self) -> bool:
        return self.console.is_terminal


class RichReporter:
    """Progress bars on stderr, so stdout stays clean for --json."""

    def __init__(self, console: LazyConsole) -> None:
        self.console = console
        self._progress: Progress | None = None

    def _ensure(self) -> Progress:
        if self._progress is None:
            from launcher.cli.bars import progress  # rich's bars, imported by the first command that shows one

            self._progress = progress(self.console.console)
            self._progress.start()
        return self._progress

    def task(self, description: str, total: float | None = None, unit: str = "") -> Task:
        from launcher.cli.bars import BarTask

        p = self._ensure()
        return BarTask(p, p.add_task(description, total=total, unit=unit))

    def note(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message, highlight=False)
        else:
            self.console.print(message, highlight=False)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def options(ctx: typer.Context) -> Options:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Options) else Options()


def workspace_of(ctx: typer.Context) -> Workspace:
    opts = options(ctx)
    if opts.workspace is not None:
        return Workspace.discover(opts.workspace)
    return Workspace.discover()


stdout = LazyConsole()
stderr = LazyConsole(stderr=True)


class _NotesOnly(NullReporter):
    """No progress bars (stdout is a JSON document, stderr a log), but every note as a plain line."""

    def note(self, message: str) -> None:
        stderr.print(message, markup=False, highlight=False)


@contextmanager
def reporter(ctx: typer.Context) -> Iterator[Reporter]:
    opts = options(ctx)
    if opts.quiet:
        yield NullReporter()
        return
    if opts.json and not stderr.is_terminal:  # scripts: no progress bars, but what launcher decided
        yield _NotesOnly()
        return
    rep = RichReporter(stderr)
    try:
        yield rep
    finally:
        rep.stop()


def render(ctx: typer.Context, result: Result[D], text: Callable[[Result[D]], None] | None = None) -> None:
    """Print a result as the versioned JSON envelope or as text, then exit with its code."""
    opts = options(ctx)
    if opts.json:
        sys.stdout.write(json.dumps(result.envelope(), indent=2, sort_keys=True, default=str) + "\n")
    elif text is not None:
        text(result)
    elif result.summary:
        stdout.print(result.summary)
    if result.exit_code != ExitCode.OK:
        raise typer.Exit(int(result.exit_code))


def fail(ctx: typer.Context | None, command: str, exc: LauncherError) -> None:
    opts = options(ctx) if ctx is not None else Options()
    line = exc.one_line()
    if opts.json:
        sys.stdout.write(json.dumps(error_envelope(command, exc.exit_code, line), indent=2) + "\n")
    from rich.markup import escape  # escaped: a hint such as pip install 'launcher[export]' is text, not markup

    stderr.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)


def reflow(doc: str | None) -> str | None:
    """A docstring as help text: each paragraph's lines joined into one (the terminal wraps them), but
    paragraphs that are lists or indented (lines starting "-", "*" or a space) kept line by line."""
    if not doc:
        return doc
    out = []
    for para in inspect.cleandoc(doc).split("\n\n"):
        lines = para.split("\n")
        kept = any(line.startswith(("-", "*", " ", "\b")) for line in lines)
        out.append(para if kept else " ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def command(group: typer.Typer, name: str, *, aliases: tuple[str, ...] = (), hidden: bool = False,
            title: str | None = None) -> Callable[
        [Callable[..., Any]], Callable[..., Any]]:
    """Declare a command of `group`, guarded under its full name (`launcher recipes new` reports errors
    as "recipes new"). The one way commands are registered: each *_cmds module declares its own Typer
    and launcher/cli/__init__.py adds it, as a named group or, when it has no name, at the top level.
    aliases: older spellings that keep working, hidden from help (`recipes list` for `recipes ls`);
    hidden: a group's default command, which help describes in the group's own text; title: the name its
    errors go by, when not its full name (a default command's is its group's)."""
    from launcher.cli.params import LauncherCommand

    prefix = group.info.name if isinstance(group.info.name, str) else ""
    full = title or f"{prefix} {name}".strip()

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = global_options(guarded(full)(fn))
        text = reflow(fn.__doc__)
        for alias in aliases:
            group.command(alias, cls=LauncherCommand, hidden=True, help=text)(wrapped)
        return group.command(name, cls=LauncherCommand, help=text, hidden=hidden)(wrapped)

    return deco


QUIET_HELP = "No progress bars (a run's training log still prints)."
GLOBAL_PANEL = "Global options (also before the command)"
_GLOBALS: list[tuple[str, Any]] = [
    ("workspace", Annotated[Path | None, typer.Option(
        "--workspace", "-w", metavar="DIR", rich_help_panel=GLOBAL_PANEL,
        help="Workspace directory (default: the current directory or the nearest parent that is one).")]),
    ("json_out", Annotated[bool, typer.Option(
        "--json", rich_help_panel=GLOBAL_PANEL, help="Print a versioned JSON result on stdout.")]),
    ("debug", Annotated[bool, typer.Option(
        "--debug", rich_help_panel=GLOBAL_PANEL, help="Show tracebacks on errors.")]),
    ("quiet", Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel=GLOBAL_PANEL, help=QUIET_HELP)]),
]


def global_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Accept the global options after the command too (`launcher verify checksums --json`): they are
    added to the command's signature and merged into the root's Options before the command runs."""
    sig = inspect.signature(fn, eval_str=True)
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None if name == "workspace" else False,
                               annotation=ann) for name, ann in _GLOBALS]
    names = [p.name for p in extra]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name, None) for name in names}
        ctx = next((a for a in [*args, *kwargs.values()] if hasattr(a, "find_root")), None)
        if ctx is not None:
            root = ctx.find_root()
            opts = root.obj if isinstance(root.obj, Options) else Options()
            opts.workspace = given["workspace"] or opts.workspace
            opts.json = bool(given["json_out"]) or opts.json
            opts.debug = bool(given["debug"]) or opts.debug
            opts.quiet = bool(given["quiet"]) or opts.quiet
            root.obj = opts
        return fn(*args, **kwargs)

    params = [*sig.parameters.values(), *extra]
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**{p.name: p.annotation for p in params}, "return": sig.return_annotation}
    return wrapper


def guarded(command: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a command: LauncherError -> one line on stderr + its exit code; tracebacks only with --debug."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        import functools

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = next((a for a in [*args, *kwargs.values()] if hasattr(a, "find_root")), None)
            debug = options(ctx).debug if ctx is not None else False
            try:
                return fn(*args, **kwargs)
            except (typer.Exit, typer.Abort):
                raise
            except LauncherError as exc:
                if debug:
                    raise
                fail(ctx, command, exc)
                raise typer.Exit(int(exc.exit_code)) from None
            except KeyboardInterrupt:
                stderr.print("[bold red]error:[/] interrupted; nothing was marked complete")
                raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
            except Exception as exc:
                if debug:
                    raise
                err = LauncherError(f"internal error in `launcher {command}`: {type(exc).__name__}: {exc}",
                                    "rerun with --debug for the traceback and report it")
                fail(ctx, command, err)
                raise typer.Exit(int(ExitCode.FAILURE)) from None

        return wrapper

    return deco
