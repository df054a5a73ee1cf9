"""The Ray target: `--scheduler ray` places a group's replicates as one Ray job through the cluster's head node
(:class:`launcher.targets.ray.RayPlacement`). Its options (--ray-opt, --max-parallel) are checked here, and
`provision --scheduler ray` (every alive node probed by a Ray job of its own, the cluster's settings recorded) is
this target's provisioning."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from launcher.errors import RegistryUnavailable, SchedulerDown, UsageError
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.hosts.scripts import ray_job
from launcher.hosts.scripts import text as host_script
from launcher.targets.ray import (
    DEFAULT_ADDRESS,
    RAY_AREA,
    RayPlacement,
    RaySettings,
    call,
    find_python,
    parse_ray_opts,
    read_settings,
    write_settings,
)
from launcher.targets.registry import Provisioned, ProvisionRequest, Target, TargetOptions, register

PROBE_TIMEOUT_S = 180.0


def check(options: TargetOptions) -> None:
    if options.partition:
        raise UsageError("--partition is a Slurm option", "drop it (Ray places the tasks on any node that fits)")
    if options.max_parallel is not None and options.max_parallel < 1:
        raise UsageError(f"--max-parallel must be at least 1, not {options.max_parallel}", "give a positive number")
    parse_ray_opts(options.settings)


def open_on(host: Host, spec: HostSpec, options: TargetOptions) -> RayPlacement:
    return RayPlacement(host, spec, resources=parse_ray_opts(options.settings), max_parallel=options.max_parallel)


def cluster_facts(head: Host, settings: RaySettings, registry: str | None) -> dict[str, Any]:
    """Every alive node as Ray sees it (ID, address, CPUs, GPUs, memory) and as a task on it sees it (its Docker
    engine, the NVIDIA runtime, whether it reaches the registry): a Ray job of its own, through the job API."""
    python, version = find_python(head, settings)
    address = settings.get("address") or DEFAULT_ADDRESS
    folder = head.area(RAY_AREA, f"probe-{time.strftime('%Y%m%dT%H%M%S')}")
    head.makedirs(folder)
    script, out = f"{folder}/probe.py", f"{folder}/facts.json"
    head.write_atomic(script, host_script("ray_job.py").encode())
    args = ["probe", out]
    if registry:
        where, _, port = registry.rpartition(":")
        args += [where, port] if port.isdigit() else [registry, "443"]
    job_id = f"{ray_job.JOB_PREFIX}probe-{folder.rsplit('-', 1)[-1]}"
    call(head, python, "submit", address, job_id, script, *args)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = call(head, python, "status", address, job_id)
        if status.get("status") in ray_job.TERMINAL:
            break
        time.sleep(1.0)
    text = head.read_text(out)
    head.run(["rm", "-rf", "--", folder], check=False)
    if not text:
        raise SchedulerDown(f"the probe job on the Ray cluster at {head.name} ended {status.get('status') or 'late'} "
                            f"without facts: {status.get('message') or 'no message'}",
                            "check the cluster (`ray status` on the head)")
    import json

    facts: dict[str, Any] = json.loads(text)
    facts.update(python=python, address=address, registry=registry, settings=dict(settings))
    if facts.get("ray_version") != version:
        facts["version_note"] = f"the head's Python has Ray {version}, the cluster runs {facts.get('ray_version')}"
    return facts


def provision(open_host: Callable[[], AbstractContextManager[Host]], request: ProvisionRequest) -> Provisioned:
    """The cluster behind the head: its fact sheet, and its settings recorded when given."""
    if request.gpu or request.install or request.dry_run or request.runtime:
        raise UsageError("--gpu, --install, --dry-run and --container-runtime are not Ray cluster settings",
                         "provision each node by its own --host, or drop them")
    if request.address and not request.address.startswith(("http://", "https://")):
        raise UsageError(f"--ray-address {request.address!r} is not the job API's URL",
                         "give it as the head reaches Ray's dashboard, e.g. http://127.0.0.1:8265")
    with open_host() as h:
        settings = read_settings(h)
        if request.address:
            settings["address"] = request.address
        registry = None if request.registry == "none" else (request.registry or settings.get("registry"))
        facts = cluster_facts(h, settings, registry)
        if request.registry or request.address:
            if request.registry == "none":
                settings.pop("registry", None)
            elif request.registry:
                cut = [str(n.get("address")) for n in facts["nodes"] if not n.get("reaches_registry")]
                if cut or not facts["nodes"]:
                    raise RegistryUnavailable(
                        f"{', '.join(cut) or 'no node'} cannot reach registry {request.registry} (nothing was changed)",
                        "give an address every node reaches (their firewall, DNS), or let the image go from the head "
                        "(no --registry)")
                settings["registry"] = request.registry
            settings["python"] = str(facts["python"])
            write_settings(h, settings)
            facts["settings"] = dict(settings)
    usable = [n for n in facts["nodes"] if n.get("docker")]
    summary = (f"Ray {facts.get('ray_version')}: {len(facts['nodes'])} nodes alive, {len(usable)} with a usable "
               f"Docker engine" + ("" if len(usable) == len(facts["nodes"]) else "; runs need Docker on every node"))
    return Provisioned({"host": h.name, "ray": facts}, summary)


TARGET = register(Target(RayPlacement, check=check, open=open_on, provision=provision))
