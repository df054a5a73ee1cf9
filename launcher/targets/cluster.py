"""A Slurm cluster as a whole, seen from its login node: its settings on the shared filesystem
(``~/.launcher/cluster.json``: the registry the nodes pull from, the container runtime), its fact
sheet (partitions, nodes, what each node can run), the configuration `launcher provision --scheduler
slurm` records, and the --slurm-opt values a run passes to sbatch. Runs on it: targets/slurm.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NotRequired, TypedDict, cast

from launcher.errors import NoScheduler, SchedulerDown, UsageError
from launcher.hosts.base import Host
from launcher.hosts.scripts import text as host_script

SETTINGS_FILE = "cluster.json"
DOCKER_RUNTIME = "docker"  # each node's Docker engine runs the task's container (the default)
PYXIS_RUNTIME = "pyxis"  # srun --container-image, through Pyxis/enroot
RUNTIMES = (DOCKER_RUNTIME, PYXIS_RUNTIME)


class ClusterSettings(TypedDict, total=False):
    """The cluster's settings, ``~/.launcher/cluster.json`` on its shared filesystem: the registry the
    nodes pull from and the container runtime, each absent until provision records it."""

    registry: str
    runtime: str  # one of RUNTIMES; "docker" when absent


class PartitionFacts(TypedDict):
    """A partition as sinfo lists it."""

    name: str
    default: bool
    state: str
    nodes: int | None
    time_limit: str


class NodeFacts(TypedDict):
    """A compute node: sinfo's view, then what node_probe.sh saw on it (not probed while down or drained)."""

    name: str
    cpus: int | None
    memory_mb: int | None
    gpus: str
    state: str
    docker: str | None  # the engine's version; None where there is none or it was not probed
    nvidia_runtime: NotRequired[bool]
    enroot: NotRequired[bool]
    reaches_registry: NotRequired[bool]  # only where a registry was probed
    probe_error: NotRequired[str]


class ClusterFacts(TypedDict):
    """The cluster's fact sheet (``cluster_facts``), the ``cluster`` of `provision --scheduler slurm`'s output."""

    slurm_version: str
    partitions: list[PartitionFacts]
    nodes: list[NodeFacts]
    pyxis: bool
    shared_area: str
    registry: str | None
    settings: ClusterSettings


def parse_slurm_opts(items: Sequence[str]) -> dict[str, str]:
    """--slurm-opt KEY=VALUE (repeatable) -> {KEY: VALUE}; each becomes sbatch's `--KEY=VALUE`."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("--")
        if not key or not key.replace("-", "").isalnum():
            raise UsageError(f"--slurm-opt {item!r} is not KEY=VALUE", "e.g. --slurm-opt time=00:30:00")
        if key in ("array", "output", "error", "job-name", "parsable", "wrap"):
            raise UsageError(f"--slurm-opt {key} is set by launcher", "drop it (use --runs for the array size)")
        out[key] = value if sep else ""
    return out


def read_settings(login: Host) -> ClusterSettings:
    """The cluster's settings, kept on its shared filesystem so every client of the cluster sees them:
    {"registry": ADDRESS the nodes pull from, "runtime": "docker" | "pyxis"}."""
    text = login.read_text(login.area(SETTINGS_FILE)) or ""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(data.get(k, ""), str) for k in ("registry", "runtime")):
        return {}
    return cast(ClusterSettings, data)


def write_settings(login: Host, settings: ClusterSettings) -> None:
    text = json.dumps(settings, indent=2, sort_keys=True) + "\n"
    login.write_atomic(login.area(SETTINGS_FILE), text.encode())


def require_slurm(login: Host) -> None:
    """Refuse a host that is no Slurm login node (no sbatch) or whose controller does not answer."""
    version = login.run(["sbatch", "--version"], check=False)
    if version.returncode != 0:
        raise NoScheduler(
            f"{login.name} has no Slurm client (sbatch): {version.last_error_line() or 'not found'}",
            "give the cluster's login node as --host, or drop --scheduler slurm",
        )
    ping = login.run(["scontrol", "ping"], check=False)
    if ping.returncode != 0 or "UP" not in ping.out:
        raise SchedulerDown(
            f"the Slurm controller does not answer from {login.name}: "
            f"{(ping.out.strip() or ping.last_error_line()).splitlines()[-1:] or ['no answer']}",
            "check slurmctld on the cluster (`scontrol ping` on the login node)",
        )


def cluster_facts(login: Host, *, registry: str | None = None) -> ClusterFacts:
    """The cluster's fact sheet, from its login node: Slurm version, partitions, nodes (CPUs, memory,
    GPUs, state), and for each node, from a one-task job on it, its Docker engine, Pyxis/enroot and
    whether it reaches the registry (the one given, else the one in the cluster's settings)."""
    require_slurm(login)  # the same refusals as a run: no sbatch, no controller
    version = login.run(["sinfo", "--version"], check=False).out.strip()
    parts: list[PartitionFacts] = []
    for line in login.run(["sinfo", "-h", "-o", "%P|%a|%D|%l"], check=False).out.splitlines():
        name, avail, count, limit = ([*line.split("|"), "", "", "", ""])[:4]
        parts.append({"name": name.rstrip("*"), "default": name.endswith("*"), "state": avail,
                      "nodes": int(count) if count.isdigit() else None, "time_limit": limit})
    nodes: dict[str, NodeFacts] = {}
    for line in login.run(["sinfo", "-h", "-N", "-o", "%N|%c|%m|%G|%t"], check=False).out.splitlines():
        name, cpus, mem, gres, state = ([*line.split("|"), "", "", "", "", ""])[:5]
        nodes.setdefault(name, {"name": name, "cpus": int(cpus) if cpus.isdigit() else None,
                                "memory_mb": int(mem) if mem.isdigit() else None,
                                "gpus": "" if gres in ("(null)", "") else gres, "state": state, "docker": None})
    settings = read_settings(login)
    registry = registry or settings.get("registry")
    probe = ["sh", "-c", host_script("node_probe.sh"), "sh"]
    if registry:
        where, _, port = str(registry).rpartition(":")
        where, port = (where, port) if port.isdigit() else (str(registry), "443")
        probe += [where, port]
    for name, node in nodes.items():
        if node["state"].rstrip("*~#") not in ("idle", "mix", "alloc"):
            node["docker"] = None  # down or drained: not probed
            continue
        done = login.run(["srun", "-N1", "-n1", "-w", name, "--time=1", *probe], check=False, timeout=120)
        kv = dict(x.split("=", 1) for x in done.out.split() if "=" in x)
        node["docker"] = kv.get("docker") or None
        node["nvidia_runtime"] = "nvidia" in kv.get("runtimes", "")
        node["enroot"] = kv.get("enroot") == "1"
        if registry:
            node["reaches_registry"] = kv.get("registry") == "1"
        if done.returncode != 0 and not kv:
            node["probe_error"] = done.last_error_line()
    pyxis = "--container-image" in login.run(["srun", "--help"], check=False).out
    return {"slurm_version": version, "partitions": parts, "nodes": list(nodes.values()), "pyxis": pyxis,
            "shared_area": login.area(), "registry": registry, "settings": settings}


def configure(login: Host, facts: ClusterFacts, *, registry: str | None, runtime: str | None) -> ClusterSettings:
    """Record the cluster's registry and container runtime in its settings, once every node that can
    run work was seen to reach the registry. registry "none" forgets it (the shared filesystem again)."""
    from launcher.errors import RegistryUnavailable

    settings = facts["settings"].copy()
    if registry == "none":
        settings.pop("registry", None)
    elif registry:
        probed = [n for n in facts["nodes"] if "reaches_registry" in n]
        cut = [n["name"] for n in probed if not n["reaches_registry"]]
        if cut or not probed:
            raise RegistryUnavailable(
                f"{', '.join(cut) or 'no node'} cannot reach registry {registry} (nothing was changed)",
                "give an address the compute nodes reach (their firewall, DNS), or leave the image on the "
                "shared filesystem (no --registry)",
            )
        settings["registry"] = registry
    if runtime:
        if runtime not in RUNTIMES:
            raise UsageError(f"unknown container runtime {runtime!r}", f"use one of: {', '.join(RUNTIMES)}")
        if runtime == PYXIS_RUNTIME and not facts.get("pyxis"):
            raise UsageError("the cluster's srun has no --container-image (no Pyxis plugin)",
                             "keep --container-runtime docker")
        if runtime == PYXIS_RUNTIME and not settings.get("registry"):
            raise UsageError("Pyxis runs images from a registry; this cluster has none set",
                             "give --registry ADDRESS with --container-runtime pyxis")
        settings["runtime"] = runtime
    write_settings(login, settings)
    return settings
