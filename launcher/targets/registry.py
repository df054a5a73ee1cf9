"""The run targets launcher knows: a registry from a target's name to its placement, how a command's
target options are checked and the placement opened on a host, and how a run's own is reopened from
its launch record.

A target is one module: it defines its :class:`~launcher.targets.placement.Placement` and calls
:func:`register` with a :class:`Target` at import. The built-in ones are the direct placement (a
host's Docker engine, local or over SSH; an Azure VM launcher created is reached as such a host, by
its SSH alias) and the modules named in ``BUILTIN``. The CLI's ``--scheduler`` choices are
:func:`scheduler_names`, read when a command is parsed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from launcher.errors import UsageError
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.records.records import LaunchRecord, placement_kind
from launcher.targets.placement import DirectPlacement, Placement
from launcher.workspace import Workspace

# the built-in scheduled targets by name, and the module that registers each when imported (only once a
# command names one, or reopens a run placed by one: a run on one host imports none)
BUILTIN = {"slurm": "launcher.targets.slurm_target", "ray": "launcher.targets.ray_target"}
# targets no --scheduler names, imported only to reopen a run they placed: one node per host (--host repeated)
REOPENED = {"hosts": "launcher.targets.hostnodes"}


@dataclass(frozen=True)
class TargetOptions:
    """The target options a command was given (the CLI's --partition, --slurm-opt or --ray-opt, --max-parallel)."""

    partition: str | None = None
    settings: Sequence[str] = ()  # KEY=VALUE
    max_parallel: int | None = None

    def given(self) -> bool:
        return bool(self.partition or self.settings or self.max_parallel)


@dataclass(frozen=True)
class ProvisionRequest:
    """What `provision` was asked for: the host options (gpu, install, dry_run) and a target's settings
    (a registry its nodes pull from, a container runtime)."""

    gpu: bool = False
    install: bool = False
    dry_run: bool = False
    registry: str | None = None
    runtime: str | None = None
    address: str | None = None  # a Ray cluster's job API, as its head reaches it


@dataclass(frozen=True)
class Provisioned:
    data: dict[str, Any]  # what a target's provisioning reports, its own (the CLI's Result data)
    summary: str


Provision = Callable[[Callable[[], AbstractContextManager[Host]], ProvisionRequest], Provisioned]


def _no_check(options: TargetOptions) -> None:
    return None


@dataclass(frozen=True)
class Target:
    """A run target by name. ``name``: the --scheduler value and the ``kind`` launch records name
    (``placement.kind``); ``check``: a usage error for options it cannot take; ``open``: its placement
    on an opened host (default: the placement class on the host); ``scheduled``: chosen by --scheduler
    (False: the default target, chosen when none is named); ``provision``: what `provision
    --scheduler NAME` does, given a way to open the host (None: nothing beyond the host's own)."""

    placement: type[Placement]
    check: Callable[[TargetOptions], None] = _no_check
    open: Callable[[Host, HostSpec, TargetOptions], Placement] | None = None
    scheduled: bool = True
    provision: Provision | None = None

    @property
    def name(self) -> str:
        return self.placement.kind

    def place(self, host: Host, spec: HostSpec, options: TargetOptions) -> Placement:
        if self.open is not None:
            return self.open(host, spec, options)
        return self.placement(host, spec)


_REGISTRY: dict[str, Target] = {}
_loaded = False


def register(target: Target) -> Target:
    """Add a target (a module's own, at import); a second one by the same name replaces the first."""
    if not target.name:
        raise ValueError(f"{target.placement.__name__} has no kind")
    _REGISTRY[target.name] = target
    return target


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def targets() -> dict[str, Target]:
    """Every registered target by name (the built-in modules imported first)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILTIN.values():
            importlib.import_module(module)
    return dict(_REGISTRY)


def scheduler_names() -> list[str]:
    """What --scheduler may name: the built-in schedulers (without importing them) and every other scheduled
    target registered."""
    builtin = [n for n in BUILTIN if not _loaded or (n in _REGISTRY and _REGISTRY[n].scheduled)]
    return builtin + [n for n, t in _REGISTRY.items() if t.scheduled and n not in BUILTIN]


def select(scheduler: str | None, options: TargetOptions) -> Target | None:
    """The target a command's --scheduler names (None: the direct one), its options checked; a usage
    error for a scheduler nobody registered or options that do not fit together."""
    if scheduler is None and not options.given():
        return None  # the direct target, without importing the others (a run on one host starts sooner)
    names = scheduler_names()
    if scheduler is None:
        if options.given():
            raise UsageError(f"--partition, --slurm-opt/--ray-opt and --max-parallel need --scheduler "
                             f"{' or '.join(names)}",
                             f"add --scheduler {names[0] if names else 'NAME'}, or drop them")
        return None
    chosen = targets().get(scheduler)
    if chosen is None or not chosen.scheduled:
        known = (f"the one scheduler launcher drives is {names[0]}" if len(names) == 1
                 else f"the schedulers launcher drives: {', '.join(names)}")
        raise UsageError(f"unknown scheduler {scheduler!r}", known)
    chosen.check(options)
    return chosen


def place(host: Host, spec: HostSpec, scheduler: str | None, options: TargetOptions) -> Host | Placement:
    """The opened host itself (direct runs), or the placement the named target puts on it."""
    chosen = select(scheduler, options)
    return host if chosen is None else chosen.place(host, spec, options)


register(Target(DirectPlacement, scheduled=False))


def provision(scheduler: str | None, request: ProvisionRequest,
              open_host: Callable[[], AbstractContextManager[Host]]) -> Provisioned | None:
    """`provision --scheduler NAME`: the target's own provisioning; None when it is the host itself that
    is to be provisioned (no --scheduler, or a target with nothing of its own), a target's settings refused."""
    chosen = select(scheduler, TargetOptions())
    if chosen is not None and chosen.provision is not None:
        return chosen.provision(open_host, request)
    check_host_provision(request)
    return None


def check_host_provision(request: ProvisionRequest) -> None:
    """provision of one host (no --scheduler): a target's settings do not apply."""
    if request.registry or request.runtime or request.address:
        raise UsageError("--registry, --container-runtime and --ray-address are cluster settings",
                         "give them with --scheduler slurm (the login node as --host) or --scheduler ray (the head)")


def open_placement(ws: Workspace, launch: LaunchRecord) -> Placement:
    """Reopen the placement a run was started with, from its launch record (records from before
    placements were recorded are direct placements)."""
    kind = str(placement_kind(launch, DirectPlacement.kind))
    if kind in REOPENED:
        importlib.import_module(REOPENED[kind])
    chosen = targets().get(kind)
    if chosen is None:
        raise UsageError(f"run {launch.get('run_id')} was placed by {kind!r}, which this launcher does not know",
                         "use the launcher version that started it")
    spec = HostSpec.from_record(launch.get("host_options"))
    record = launch.get("placement") or {"kind": kind}
    return chosen.placement.reopen(spec.open(ws.root if spec.local else None), spec, record)
