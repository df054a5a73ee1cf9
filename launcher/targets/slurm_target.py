"""The Slurm target: `--scheduler slurm` places a group's replicates as one job array through the
cluster's login node (:class:`launcher.targets.slurm.SlurmPlacement`). Its options (--partition,
--slurm-opt, --max-parallel) are checked here, and `provision --scheduler slurm` (the cluster's fact
sheet and settings) is this target's provisioning."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from launcher.errors import UsageError
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.targets.cluster import cluster_facts, configure, parse_slurm_opts
from launcher.targets.registry import Provisioned, ProvisionRequest, Target, TargetOptions, register
from launcher.targets.slurm import SlurmPlacement


def check(options: TargetOptions) -> None:
    if options.max_parallel is not None and options.max_parallel < 1:
        raise UsageError(f"--max-parallel must be at least 1, not {options.max_parallel}", "give a positive number")
    parse_slurm_opts(options.settings)


def open_on(host: Host, spec: HostSpec, options: TargetOptions) -> SlurmPlacement:
    return SlurmPlacement(host, spec, partition=options.partition, options=parse_slurm_opts(options.settings),
                          max_parallel=options.max_parallel)


def provision(open_host: Callable[[], AbstractContextManager[Host]], request: ProvisionRequest) -> Provisioned:
    """The cluster behind the login node: its fact sheet, and its settings recorded when given."""
    if request.gpu or request.install or request.dry_run:
        raise UsageError("--gpu, --install and --dry-run are for one host",
                         "provision each node by its own --host, or drop them")
    registry = request.registry
    with open_host() as h:
        facts = cluster_facts(h, registry=None if registry == "none" else registry)
        if registry or request.runtime:
            facts["settings"] = configure(h, facts, registry=registry, runtime=request.runtime)
    usable = [n for n in facts["nodes"] if n.get("docker")]
    summary = (f"{len(facts['nodes'])} nodes, {len(usable)} with a usable Docker engine"
               + ("" if len(usable) == len(facts["nodes"]) else "; runs need Docker on every node"))
    return Provisioned({"host": h.name, "cluster": facts}, summary)


TARGET = register(Target(SlurmPlacement, check=check, open=open_on, provision=provision))
