"""The root's commands, each module imported when one of its commands is first looked up.

`launcher run` then imports run_cmds and what it needs, not every command module and the core under
them (a third of a second of start-up). Help, completion and anything walking the commands still see
every one of them: listing the commands loads them all, in the order `COMMANDS` gives.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

import typer
import typer.main
from typer.models import TyperInfo

from launcher.cli.params import LauncherGroup

if TYPE_CHECKING:
    from launcher.cli.typercompat import Command

# Each command (or group) of the root and the module declaring it, in the order --help lists them.
# tests/test_cli.py checks this against what the modules declare.
COMMANDS: dict[str, str] = {
    **dict.fromkeys(("init", "lock", "build", "rebuild", "base"), "images_cmds"),
    "recipes": "recipe_cmds",
    "vm": "vm_cmds",
    **dict.fromkeys(("provision", "run", "resume", "ps", "logs", "attach", "pull", "stop", "clean"), "run_cmds"),
    **dict.fromkeys(("experiment", "report", "verify"), "verify_cmds"),
    "diverge": "diverge_cmds",
    "explain": "explain_cmds",
    "env": "env_cmds",
    "export": "export_cmds",
    **dict.fromkeys(("bundle", "reproduce", "attest"), "attest_cmds"),
    "cache": "cache_cmds",
    "config": "config_cmds",
}


def declared(module: str, only: str | None = None) -> dict[str, Command]:
    """The commands and groups a cli/*_cmds.py module declares, as Click commands: its `app` added to the
    root as a named group (`launcher recipes ...`) or, nameless, its commands at the top level. only: of a
    nameless app, that command or group alone (Typer builds each command's options from its signature, a few
    milliseconds a command that `launcher run` need not spend on `ps` and `logs`)."""
    app = importlib.import_module(f"launcher.cli.{module}").app
    if only is not None and not isinstance(app.info.name, str):
        one = typer.Typer()
        one.registered_commands = [c for c in app.registered_commands if c.name == only]
        one.registered_groups = [g for g in app.registered_groups if _group_name(g) == only]
        app = one
    holder = typer.Typer()
    holder.add_typer(app, cls=LauncherGroup)
    return dict(typer.main.get_group(holder).commands)


def _group_name(info: TyperInfo) -> object:
    """The name a group added to an app goes by: given to add_typer, else its own Typer's."""
    if isinstance(info.name, str) or info.typer_instance is None:
        return info.name
    return info.typer_instance.info.name


class LazyCommands(MutableMapping[str, "Command"]):
    """A group's commands by name: a name of `COMMANDS` imports its module on first lookup."""

    def __init__(self, added: MutableMapping[str, Command]) -> None:
        self._loaded: dict[str, Command] = dict(added)
        self._imported: set[str] = set()

    def _load(self, module: str) -> None:
        if module not in self._imported:
            self._imported.add(module)
            for name, cmd in declared(module).items():
                self._loaded.setdefault(name, cmd)

    def __getitem__(self, name: str) -> Command:
        if name not in self._loaded and name in COMMANDS and COMMANDS[name] not in self._imported:
            self._loaded.update(declared(COMMANDS[name], only=name))  # the rest of its module when listed
        if name not in self._loaded and name in COMMANDS:
            self._load(COMMANDS[name])
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in COMMANDS

    def __setitem__(self, name: str, cmd: Command) -> None:
        self._loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        for module in dict.fromkeys(COMMANDS.values()):
            self._load(module)
        yield from [*COMMANDS, *(n for n in self._loaded if n not in COMMANDS)]

    def __len__(self) -> int:
        return len(COMMANDS.keys() | self._loaded.keys())


class LazyGroup(LauncherGroup):
    """The root group: its commands a `LazyCommands`, so that running one imports only its module."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(self.commands)
