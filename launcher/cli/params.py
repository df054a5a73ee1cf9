"""How options look and complete, in one place: conventional metavars (N, PATH, [cpu|gpu]; a flag shows
none), the allowed values of a choice listed in help, shell completion of recipe names, run IDs,
variants and SSH hosts, and the option types commands share (one spelling per idea).

Every command and group gets the classes below (`command()` in common.py, `group()` here), so a
command declares its options plainly and Typer's own (--help, --install-completion) look the same.

A parameter named ``variant`` takes one of the workspace's image variants (lockfiles/NAME.in with
dockerfiles/NAME.Dockerfile), one named ``variants`` those or ``all``: help lists the variants of the
workspace at hand and completion offers them. `check_variant` is the check a command makes once it
knows its workspace.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from launcher.cli.typercompat import CLICK_USAGE_ERROR, install, typed_on_command_line
from launcher.errors import LauncherError
from launcher.records.rundir import RunDir
from launcher.workspace import VARIANTS, Workspace

ARGV = "launcher.argv"  # ctx.meta key: the root's arguments as typed (LauncherGroup.parse_args)
HELP = "launcher.help"  # ctx.meta key: set while help is being written
# Older spellings an option still accepts but help no longer shows (one spelling per idea).
HIDDEN_ALIASES = frozenset({"--profile", "--address"})


# ---------------------------------------------------------------- the workspace a completion or help is for


def _given_workspace(ctx: Any) -> Path | None:
    """--workspace as given so far: on this command, a parent, or typed after the command."""
    node = ctx
    while node is not None:
        value = (node.params or {}).get("workspace")
        if value:
            return Path(value)
        given = getattr(getattr(node, "obj", None), "workspace", None)
        if given:
            return Path(given)
        node = node.parent
    return workspace_in_argv(ctx.meta.get(ARGV) or [])


def workspace_in_argv(argv: list[str]) -> Path | None:
    """The value of -w/--workspace among the arguments (before a lone `--`), wherever it was typed."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg in ("-w", "--workspace") and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--workspace="):
            return Path(arg.partition("=")[2])
        if arg.startswith("-w") and len(arg) > 2 and not arg.startswith("--"):
            return Path(arg[2:])
    return None


def workspace_for(ctx: Any) -> Workspace | None:
    """The workspace a command line is about, or None outside one (help and completion never fail)."""
    try:
        return Workspace.discover(_given_workspace(ctx))
    except (LauncherError, OSError):
        return None


# ---------------------------------------------------------------- choices and completion


def variants(ctx: Any) -> list[str]:
    ws = workspace_for(ctx)
    found = list(ws.variants()) if ws is not None else []
    return found or list(VARIANTS)


def check_variant(ws: Workspace, variant: str, *, all_ok: bool = False) -> str:
    """The variant, if the workspace has it (Workspace.known_variant): a usage error naming those it has."""
    return ws.known_variant(variant, all_ok=all_ok)


DYNAMIC_CHOICES: dict[str, Callable[[Any], list[str]]] = {
    "variant": variants,
    "variants": lambda ctx: [*variants(ctx), "all"],
}


def complete_variant(ctx: typer.Context, incomplete: str) -> list[str]:
    return [v for v in variants(ctx) if v.startswith(incomplete)]


def complete_variants(ctx: typer.Context, incomplete: str) -> list[str]:
    return [v for v in DYNAMIC_CHOICES["variants"](ctx) if v.startswith(incomplete)]


def complete_recipe(ctx: typer.Context, incomplete: str) -> list[str]:
    """Recipe names of the workspace (a path is left to the shell's file completion)."""
    from launcher.specs.recipes import known_names

    ws = workspace_for(ctx)
    if ws is None or "/" in incomplete:
        return []
    return [n for n in known_names(ws) if n.startswith(incomplete)]


def run_ids(ws: Workspace) -> list[str]:
    """The run directories of the workspace (those with a launch record), oldest first."""
    if not ws.runs.is_dir():
        return []
    return sorted(d.name for d in ws.runs.iterdir() if RunDir(d).has_launch())


def complete_run(ctx: typer.Context, incomplete: str) -> list[str]:
    ws = workspace_for(ctx)
    if ws is None:
        return []
    return [r for r in run_ids(ws) if r.startswith(incomplete)]


def complete_group(ctx: typer.Context, incomplete: str) -> list[str]:
    """The groups of the workspace's runs (from their launch records), newest first."""
    ws = workspace_for(ctx)
    if ws is None:
        return []
    groups: list[str] = []
    for run_id in reversed(run_ids(ws)):
        launch = RunDir(ws.runs / run_id).read_launch_quiet()
        group = launch.get("group") if launch else None
        if isinstance(group, str) and group.startswith(incomplete) and group not in groups:
            groups.append(group)
    return groups


def ssh_hosts(config: Path | None = None) -> list[str]:
    """The Host aliases of an SSH config, its Include files too (by default launcher's own, with the VMs
    `launcher vm up` made, then ~/.ssh/config, as host resolution reads them), without patterns:
    `Host *` or `Host *.example.com` names no host one could type."""
    from launcher.hosts.sshconfig import config_text, own_ssh_config

    paths = [config] if config is not None else [own_ssh_config(), Path.home() / ".ssh" / "config"]
    text = ""
    for path in paths:
        with suppress(LauncherError):  # an unreadable config completes nothing; a command will say why
            text += config_text(path) if path.is_file() else ""
    names: list[str] = []
    for line in text.splitlines():
        words = line.strip().replace("=", " ", 1).split()
        if len(words) < 2 or words[0].lower() != "host":
            continue
        names += [w for w in words[1:] if not any(c in w for c in "*?!") and w not in names]
    return names


def complete_host(ctx: typer.Context, incomplete: str) -> list[str]:
    config = (ctx.params or {}).get("ssh_config")
    return [h for h in ssh_hosts(Path(config) if config else None) if h.startswith(incomplete)]


# ---------------------------------------------------------------- conventional metavars

_TYPE_METAVAR: dict[Any, str] = {int: "N", float: "NUMBER", str: "TEXT", Path: "PATH"}


def _choices(param: Any, ctx: Any) -> list[str] | None:
    dynamic = DYNAMIC_CHOICES.get(param.name or "")
    if dynamic is not None:
        return dynamic(ctx)
    desc = getattr(param, "type_descriptor", None)
    if desc is None:  # typer before 0.29: the Click type
        found = getattr(param.type, "choices", None)
        return [str(getattr(c, "value", c)) for c in found] if found is not None else None
    if desc.is_choice and desc.choices is not None:
        return [str(getattr(c, "value", c)) for c in desc.choices]
    return None


_CLICK_TYPE_METAVAR = {"integer": "N", "float": "NUMBER", "text": "TEXT", "path": "PATH"}


def _type_metavar(param: Any) -> str:
    if not hasattr(param, "type_descriptor"):  # typer before 0.29: the Click type
        return _CLICK_TYPE_METAVAR.get(getattr(param.type, "name", ""), "VALUE")
    annotation = param.type_descriptor.annotation
    args = get_args(annotation)
    if args and getattr(annotation, "__origin__", None) in (list, tuple):
        annotation = args[0]
    return _TYPE_METAVAR.get(annotation, "VALUE")


class _Argument(TyperArgument):
    """An argument shown as its name (RUN, [RUN...]) with its choices where it has some; no Python type."""

    def display_type_rich(self, ctx: Any) -> str | None:
        choices = _choices(self, ctx)
        return f"[{'|'.join(choices)}]" if choices else None

    def get_usage_pieces(self, ctx: Any) -> list[str]:
        return [] if self.hidden else [self._usage_display_name()]

    def _usage_display_name(self) -> str:
        name = self.metavar or (self.name or "").upper()
        if name.startswith("["):  # already shaped, e.g. [-- SCRIPT_ARGS...]
            return name
        if self.nargs != 1 and not name.endswith("..."):
            name += "..."
        return name if self.required else f"[{name}]"


def _shown_type(param: Any, click_type: Any, ctx: Any) -> Any:
    """typer before 0.29 shows an argument's Click type in help (`<text>`): a copy of the type that shows
    its choices, or nothing."""
    shown = copy.copy(click_type)
    choices = _choices(param, ctx)
    shown.get_metavar = lambda *args, **kwargs: f"[{'|'.join(choices)}]" if choices else ""
    shown.launcher_shown = True
    return shown


def conventional(ctx: Any, params: list[Any]) -> list[Any]:
    """Give every parameter a conventional metavar (idempotent; choices are looked up afresh). While help
    is written, an option's hidden aliases are left out of what it shows (a copy: parsing keeps them)."""
    if ctx.meta.get(HELP):
        params = [_without_hidden_aliases(p) for p in params]
    for p in params:
        if isinstance(p, TyperArgument):
            if not isinstance(p, _Argument):
                p.__class__ = _Argument  # adds methods only: the same object, shown conventionally
            if p.metavar is None:
                p.metavar = (p.name or "").upper() + ("..." if p.nargs != 1 else "")
            click_type = getattr(p, "type", None)  # typer before 0.29 gives an argument a Click type
            if click_type is not None and not getattr(click_type, "launcher_shown", False):
                setattr(p, "type", _shown_type(p, click_type, ctx))  # noqa: B010  (no attribute in typer 0.29)
        elif isinstance(p, TyperOption):
            if p.is_flag or p.count:
                p.metavar = ""  # a flag takes no value, so it shows none
                continue
            choices = _choices(p, ctx)
            if choices is not None:
                p.metavar = f"[{'|'.join(choices)}]"
            elif p.metavar is None:
                p.metavar = _type_metavar(p)
    return params


def _without_hidden_aliases(param: Any) -> Any:
    if not isinstance(param, TyperOption) or not HIDDEN_ALIASES & set(param.opts):
        return param
    shown = copy.copy(param)
    shown.opts = [o for o in param.opts if o not in HIDDEN_ALIASES]
    return shown


def _usage_error_as_json(info_name: str | None, args: list[str], parent: Any, exc: Exception, *,
                         shows_help: bool = False) -> None:
    """With --json typed, a usage error found while parsing (an unknown option, a value outside a choice)
    is also the versioned envelope on stdout, as every other error is; the message stays on stderr.
    shows_help: the command was given no arguments and answers that with its help (Click raises that as a
    usage error too), which is not an error."""
    if not isinstance(exc, CLICK_USAGE_ERROR) or shows_help:
        return
    typed = list((parent.meta.get(ARGV) if parent is not None else None) or args)
    if "--json" not in (typed[: typed.index("--")] if "--" in typed else typed):
        return
    from launcher.errors import ExitCode
    from launcher.result import error_envelope

    path = [*(parent.command_path.split()[1:] if parent is not None else []), *([info_name] if parent else [])]
    envelope = error_envelope(" ".join(path) or "launcher", ExitCode.USAGE, exc.format_message())
    sys.stdout.write(json.dumps(envelope, indent=2) + "\n")


class _Conventions:
    """What commands and groups share: the global options accepted after the command too, and a
    parse error answered as the JSON envelope under --json."""

    def get_params(self, ctx: Any) -> list[Any]:
        return install(conventional(ctx, super().get_params(ctx)))  # type: ignore[misc]

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        typed = list(args)  # parsing consumes args
        try:
            return super().make_context(info_name, args, parent=parent, **extra)  # type: ignore[misc]
        except Exception as exc:
            shows_help = not typed and bool(getattr(self, "no_args_is_help", False))
            _usage_error_as_json(info_name, typed, parent, exc, shows_help=shows_help)
            raise


class LauncherCommand(_Conventions, TyperCommand):
    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        return [item for item in super().shell_complete(ctx, incomplete) if item.value not in HIDDEN_ALIASES]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        ctx.meta[HELP] = True
        try:
            super().format_help(ctx, formatter)
        finally:
            ctx.meta[HELP] = False


class LauncherGroup(_Conventions, TyperGroup):
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta.setdefault(ARGV, list(args))  # the root's: options typed after the command included
        return super().parse_args(ctx, args)


def typed(ctx: typer.Context, name: str) -> bool:
    """Whether the parameter NAME was typed on the command line, not left to its default."""
    return typed_on_command_line(ctx, name)


def variant_for(ctx: typer.Context, ws: Workspace, variant: str, recipe: str, entry: str | None = None) -> str:
    """The image variant of a run (launcher.specs.runspec.choose_variant), its note said on stderr."""
    from launcher.specs.runspec import choose_variant

    chosen = choose_variant(ws, recipe, variant, given=typed(ctx, "variant"), entry=entry)
    if chosen.note and not getattr(ctx.obj, "quiet", False):
        typer.echo(f"note: {chosen.note}", err=True)
    return chosen.variant


def threads_for(ctx: typer.Context, profile: str, threads: int | None) -> int | None:
    """--threads for the profile: a thread count typed on the command line always counts (a wrong one is an
    error), a default one (launcher.toml, LAUNCHER_THREADS) only for the profile that takes one."""
    if threads is not None and profile != "deterministic" and not typed(ctx, "threads"):
        return None
    return threads


def group(name: str, help: str) -> typer.Typer:
    """A named command group (`launcher NAME ...`)."""
    return typer.Typer(name=name, help=help, no_args_is_help=True, cls=LauncherGroup)


# ---------------------------------------------------------------- options more than one command takes

Profile = Literal["strict", "deterministic", "seeded", "off"]  # runs/determinism.py PROFILES, in order

VariantOpt = Annotated[str, typer.Option(
    "--variant", autocompletion=complete_variant,
    help="Image variant: a NAME with lockfiles/NAME.in and dockerfiles/NAME.Dockerfile in the workspace.")]
DeterminismOpt = Annotated[Profile, typer.Option(
    "--determinism", "--profile",
    help="Determinism profile: strict (1 thread), deterministic (a fixed thread count), seeded (seeds only), "
    "off (nothing injected).")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", metavar="N",
    help="The deterministic profile's fixed intra/inter-op thread count (2 unless set; strict always runs on 1).")]
SeedOpt = Annotated[list[int] | None, typer.Option("--seed", metavar="N", help="Seed; repeat for several seeds.")]
ParamOpt = Annotated[list[str] | None, typer.Option(
    "--param", metavar="KEY=VALUE", help="A recipe parameter; repeatable.")]
ProbesOpt = Annotated[str | None, typer.Option(
    "--probes", metavar="SPEC",
    help="The probe set whose outputs and Grad-CAM the run records at the end of Keras fit(): off (none, even "
    "if recipe.toml declares \\[probes]), N (the first N validation examples), or KEY=VALUE pairs with \\[probes]' "
    "keys, e.g. count=8,gradcam=false or indices=0;3;7,layer=conv2d. Overrides a recipe's \\[probes].")]
TraceOpt = Annotated[str | None, typer.Option(
    "--trace-every", metavar="N",
    help="Step fingerprints: a digest of the weights at each epoch's end (epoch, the default), also every N "
    "optimizer steps (N), or none (off). verify uses them to say at which step two runs part; a smaller N "
    "narrows it and costs a digest of the weights every N steps.")]
CheckpointOpt = Annotated[int | None, typer.Option(
    "--checkpoint-every", metavar="N",
    help="Write a checkpoint after every N-th epoch (at epoch ends only, not mid-epoch): model and optimizer "
    "state, random states and the step, in outputs/checkpoints/ (the latest kept; --keep-checkpoints keeps each). "
    "A run stopped or killed then "
    "goes on with `launcher resume RUN` and ends with the bits of an uninterrupted run. Keras: a script with one "
    "fit() on arrays; PyTorch: a script calling "
    "launcher.runtime.api.resume_point and api.checkpoint; JAX: a loop calling api.jax_resume_point and "
    "api.jax_checkpoint. Other "
    "training is refused before it starts (exit 45).")]
KeepCheckpointsOpt = Annotated[bool, typer.Option(
    "--keep-checkpoints",
    help="With --checkpoint-every: keep every checkpoint, not only the latest, so that `launcher diverge` "
    "re-executes the run from the last one before two runs part instead of from the start.")]
DataOpt = Annotated[str | None, typer.Option(
    "--data", metavar="PATH", help="Dataset folder on the host, mounted read-only.")]
EnvOpt = Annotated[list[str] | None, typer.Option(
    "--env", metavar="NAME[=VALUE]",
    help="Pass an environment variable to the run: NAME alone passes this machine's value. Recorded with its "
    "value in the launch record and manifest; repeatable.")]
SecretEnvOpt = Annotated[list[str] | None, typer.Option(
    "--secret-env", metavar="NAME[=VALUE]",
    help="Like --env, but only the value's sha256 is recorded: the value reaches the container through an env "
    "file readable by you alone, never a command line or a log; repeatable.")]
WheelsOpt = Annotated[list[Path] | None, typer.Option(
    "--find-links", metavar="DIR",
    help="A folder of wheels (repeatable) for what no reachable index serves, for the image and for the project's "
    "own requirements (requirements.in beside the code): a wheel from it counts only when its sha256 is locked.")]
IndexCaOpt = Annotated[Path | None, typer.Option(
    "--ca-bundle", metavar="FILE",
    help="CA bundle (PEM) pip trusts for the package index (behind a TLS-intercepting proxy), when the run locks "
    "the project's requirements or downloads wheels. Default: this machine's.")]
ScriptArgs = Annotated[list[str] | None, typer.Argument(
    metavar="[-- SCRIPT_ARGS...]",
    help="Arguments for the script itself, after `--` (e.g. -- --lr 0.01); recorded and compared by verify.",
    show_default=False)]
RunArg = Annotated[str, typer.Argument(metavar="RUN", autocompletion=complete_run,
                                       help="A run id, or any unique start of it (see `launcher ps`).")]
RunsArg = Annotated[list[str] | None, typer.Argument(metavar="RUN", autocompletion=complete_run,
                                                     help="Run ids, or unique starts of them (see `launcher ps`).")]
