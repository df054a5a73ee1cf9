"""`launcher config`: the defaults in force and where each comes from; and the one place they become
the command line's defaults (Click's default_map)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from launcher import config as config_mod
from launcher.cli.common import command, render, stdout
from launcher.cli.params import workspace_for
from launcher.result import Result

if TYPE_CHECKING:
    from launcher.config import ConfigRecord

app = typer.Typer()


# click's default_map: a command's parameter -> its default (a list for a parameter taking several values),
# a group's command -> its own map
DefaultMap = dict[str, "DefaultMap | config_mod.SettingValue | list[config_mod.SettingValue]"]


def default_map(group: Any, defaults: dict[str, config_mod.SettingValue], only: str | None = None) -> DefaultMap:
    """Click's default_map for every command under group (or its command `only` alone) that has a parameter a
    setting defaults (a parameter that takes several values, like experiment's --host, gets a list)."""
    out: DefaultMap = {}
    commands = getattr(group, "commands", {})
    for name in [only] if only is not None else list(commands):
        cmd = commands[name]
        if hasattr(cmd, "commands"):
            sub = default_map(cmd, defaults)
            if sub:
                out[name] = sub
            continue
        mine: DefaultMap = {p.name: ([defaults[p.name]] if getattr(p, "multiple", False) else defaults[p.name])
                for p in cmd.params if p.name in defaults}
        if mine:
            out[name] = mine
    return out


def apply_defaults(ctx: typer.Context) -> None:
    """Make launcher.toml's and LAUNCHER_*'s values the defaults of this command line (BadConfig if one
    is refused). The command line's own values still win: Click uses a default only for what was not given."""
    cfg = config_mod.resolve(workspace_for(ctx))
    # the invoked command's alone: walking every command would import every command module (cli/lazy.py)
    ctx.default_map = default_map(ctx.command, cfg.defaults(), ctx.invoked_subcommand)


def _text(result: Result[ConfigRecord]) -> None:
    from rich.table import Table
    from rich.text import Text

    d = result.data
    where = d["file"] or "none (not in a workspace)"
    state = "" if not d["file"] else (" (read)" if d["file_exists"] else " (not present)")
    stdout.print(f"file: {where}{state}", markup=False)
    table = Table("setting", "value", "from", "option", "variable", box=None)
    for s in d["settings"]:
        origin = {"environment": s["env"], "file": config_mod.FILE, "built-in": "built-in",
                  config_mod.USER: s["origin"]}[s["source"]]
        value = "-" if s["value"] is None else s["value"]  # a setting with no built-in value (the keys)
        table.add_row(*(Text(str(x)) for x in (s["key"], value, origin, s["option"], s["env"])))
    stdout.print(table)
    for note in d["ignored"].values():
        stdout.print(f"ignored: {note}", markup=False)
    stdout.print(result.summary, markup=False)


@command(app, "config")
def config_cmd(ctx: typer.Context) -> None:
    """Show the defaults in force (host, variant, determinism, threads, signing_key, allowed_signers) and where
    each comes from.

    They come from the command line, else the environment (LAUNCHER_HOST, LAUNCHER_VARIANT,
    LAUNCHER_DETERMINISM, LAUNCHER_THREADS, LAUNCHER_SIGNING_KEY, LAUNCHER_ALLOWED_SIGNERS), else the workspace's
    launcher.toml (\\[defaults] host, variant, determinism, threads, signing_key), else launcher's own.
    `--host local` overrides a default host. Whom attest verify and reproduce trust (allowed_signers) is never
    read from a workspace: LAUNCHER_ALLOWED_SIGNERS, else your own ~/.config/launcher/allowed_signers.
    """
    cfg = config_mod.resolve(workspace_for(ctx))
    summary = "precedence: command line > environment > launcher.toml > built-in"
    render(ctx, Result("config", cfg.to_dict(), summary=summary), _text)
