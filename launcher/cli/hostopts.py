"""The host options every host command shares, declared once (and the cluster options of run and
experiment): `@with_host()` adds --host and the SSH
options to a command and hands it one :class:`~launcher.hosts.hostspec.HostSpec` (or, with
``multiple=True``, a list of them, one per --host) in its ``host`` parameter."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from launcher.cli.params import complete_host
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.targets import registry as targets
from launcher.targets.placement import Placement

DESTINATION = "HOST, USER@HOST, USER@HOST:PORT or a ~/.ssh/config alias"
PANEL = "Host (SSH) options"


def _options(multiple: bool, repeated: str | None = None) -> list[inspect.Parameter]:
    host_help = (
        f"SSH destination: {DESTINATION}; {repeated or 'repeat to spread runs over hosts (one run per host at a time)'}"
        ". Default: the local Docker engine."
        if multiple
        else f"SSH destination: {DESTINATION}. Default: the local Docker engine."
    )
    host_type: Any = list[str] | None if multiple else str | None
    declared: list[tuple[str, Any, Any]] = [
        ("host", Annotated[host_type, typer.Option(
            "--host", "-H", metavar="HOST", help=host_help, rich_help_panel=PANEL, autocompletion=complete_host)],
         None),
        ("trust_new_host", Annotated[bool, typer.Option(
            "--trust-new-host", rich_help_panel=PANEL,
            help="Record the host key of a host not yet in known_hosts (check its fingerprint first).")], False),
        ("identity", Annotated[Path | None, typer.Option(
            "--identity", "-i", metavar="FILE", rich_help_panel=PANEL, help="Private key file for SSH.")], None),
        ("port", Annotated[int | None, typer.Option(
            "--port", "-p", metavar="PORT", rich_help_panel=PANEL,
            help="SSH port (default: from ~/.ssh/config, else 22).")], None),
        ("ssh_config", Annotated[Path | None, typer.Option(
            "--ssh-config", metavar="FILE", rich_help_panel=PANEL,
            help="SSH config file (default ~/.ssh/config).")], None),
        ("known_hosts", Annotated[Path | None, typer.Option(
            "--known-hosts", metavar="FILE", rich_help_panel=PANEL,
            help="known_hosts file (default: UserKnownHostsFile from the SSH config, else ~/.ssh/known_hosts).")],
         None),
    ]
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
            for name, ann, default in declared]


def with_host(*, multiple: bool = False,
              repeated: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the shared host options; it must declare a ``host`` parameter, which receives
    the HostSpec (a list of them with multiple=True; one local spec when no --host was given).
    repeated: what --host given several times does, for its help (multiple=True)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        if "host" not in sig.parameters:
            raise TypeError(f"{fn.__name__} has no `host` parameter for @with_host")
        own = [p for name, p in sig.parameters.items() if name != "host"]
        extra = _options(multiple, repeated)
        names = [p.name for p in extra]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in names}
            destinations = given.pop("host")
            base = HostSpec(**given)
            if multiple:
                kwargs["host"] = [base.to(d) for d in (destinations or [None])]
            else:
                kwargs["host"] = base.to(destinations)
            return fn(*args, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {**{p.name: p.annotation for p in own + extra}, "return": sig.return_annotation}
        return wrapper

    return deco


SCHEDULER_PANEL = "Cluster options"


# --scheduler's values: the targets registered when the CLI is loaded (targets/registry.py)
SchedulerName: Any = Literal.__getitem__(tuple(targets.scheduler_names()))
SchedulerOpt = Annotated[SchedulerName | None, typer.Option(
    "--scheduler", rich_help_panel=SCHEDULER_PANEL,
    help="Place the runs through the cluster's scheduler, reached at --host (Slurm: its login node, the replicates "
    "one job array; Ray: its head, the replicates one Ray job of tasks spread over the nodes); the image goes by "
    "the cluster's registry, else once to its shared filesystem (Slurm) or the head (Ray). "
    "Default: containers on --host itself.")]
PartitionOpt = Annotated[str | None, typer.Option(
    "--partition", metavar="NAME", rich_help_panel=SCHEDULER_PANEL,
    help="Slurm partition (default: the cluster's default partition).")]
SlurmOpt = Annotated[list[str] | None, typer.Option(
    "--slurm-opt", "--ray-opt", metavar="KEY=VALUE", rich_help_panel=SCHEDULER_PANEL,
    help="Slurm: an sbatch option for the job array, e.g. time=00:30:00 or gres=gpu:a100:1. Ray: each replicate's "
    "task resources, num_cpus=2, num_gpus=1 or memory=8G (default one CPU, one GPU for a GPU variant). Repeatable.")]
MaxParallelOpt = Annotated[int | None, typer.Option(
    "--max-parallel", metavar="K", rich_help_panel=SCHEDULER_PANEL,
    help="Run at most K replicates at once (Slurm: sbatch --array=0-N%K; Ray: the job submits K tasks at a time).")]


def _options_given(partition: str | None, slurm_opt: list[str] | None,
                   max_parallel: int | None) -> targets.TargetOptions:
    return targets.TargetOptions(partition=partition, settings=tuple(slurm_opt or ()), max_parallel=max_parallel)


def target(host: Host, spec: HostSpec, scheduler: str | None, partition: str | None,
           slurm_opt: list[str] | None, max_parallel: int | None) -> Host | Placement:
    """The opened host itself (direct runs), or the placement the --scheduler target puts on it."""
    return targets.place(host, spec, scheduler, _options_given(partition, slurm_opt, max_parallel))


def placer(scheduler: str | None, partition: str | None, slurm_opt: list[str] | None,
           max_parallel: int | None) -> Callable[[Host, HostSpec], Placement] | None:
    """For a command that opens several hosts: how the --scheduler target is put on each (None: direct)."""
    options = _options_given(partition, slurm_opt, max_parallel)
    chosen = targets.select(scheduler, options)
    return None if chosen is None else (lambda h, spec: chosen.place(h, spec, options))


def check_cluster_options(scheduler: str | None, partition: str | None, slurm_opt: list[str] | None,
                          max_parallel: int | None) -> bool:
    """Whether the runs go through a scheduler; a usage error for options that do not fit together."""
    return targets.select(scheduler, _options_given(partition, slurm_opt, max_parallel)) is not None
