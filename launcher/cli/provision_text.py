"""How `launcher provision` prints a host's facts and a Slurm cluster's (the text view; --json prints the data)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from launcher.cli.common import stdout
from launcher.result import Result

if TYPE_CHECKING:
    from launcher.hosts.provision import ProvisionListing


def _size(n: int | None) -> str:
    if not n:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return str(n)


def facts_text(result: Result[ProvisionListing]) -> None:
    f = result.data["facts"]
    d, nv = f.get("docker", {}), f.get("nvidia", {})
    t = Table(show_header=False, box=None)
    t.add_row("host", Text(str(result.data["host"])))
    t.add_row("os", Text(str(f"{f.get('os')} ({f.get('arch')}, kernel {f.get('kernel')})")))
    t.add_row("cpu", Text(str(f"{f.get('cpu_model')} x {f.get('cpu_cores')}")))
    t.add_row("ram", Text(str(_size(f.get("ram_bytes")))))
    t.add_row("free disk", Text(str(_size(f.get("disk_free_bytes")))))
    docker = (
        f"{d.get('server_version')}, usable by {f.get('user')}"
        if d.get("usable")
        else ("installed, NOT usable: " + str(d.get("error", "")) if d.get("installed") else "not installed")
    )
    t.add_row("docker", Text(str(docker)))
    gpus = ", ".join(g["name"] for g in nv.get("gpus", [])) or "none"
    t.add_row("gpu", Text(str(f"{gpus} (driver {nv.get('driver')})" if nv.get("gpus") else gpus)))
    t.add_row("nvidia runtime", Text(str("yes" if d.get("nvidia_runtime") else "no")))
    stdout.print(t)
    plan = result.data["plan"]
    if plan:
        stdout.print(
            "\nto install:" if result.data["dry_run"] or not result.data["executed"] else "\ninstalled:"
        )
        for step in plan:
            stdout.print(f"  # {step['why']}\n  {step['command']}", markup=False)
    stdout.print(result.summary, markup=False)


def cluster_text(result: Result[dict[str, Any]]) -> None:  # the target's own data (targets.registry.Provisioned)
    if "ray" in result.data:
        ray_text(result)
        return
    c = result.data["cluster"]
    stdout.print(f"{c['slurm_version']} at {result.data['host']}; launcher's area {c['shared_area']} "
                 "(must be shared with the nodes)", markup=False)
    stdout.print("partitions: " + ", ".join(
        f"{p['name']}{' (default)' if p['default'] else ''} {p['state']}, {p['nodes']} nodes" for p in c["partitions"]),
        markup=False)
    reg = c.get("registry")
    t = Table("node", "cpus", "memory", "gpus", "state", "docker", "nvidia runtime", "enroot",
              *(["reaches registry"] if reg else []))
    for n in c["nodes"]:
        t.add_row(*(Text(str(x)) for x in (n["name"], n["cpus"], _size((n["memory_mb"] or 0) << 20), n["gpus"] or "-",
                                           n["state"], n.get("docker") or n.get("probe_error") or "no",
                                           "yes" if n.get("nvidia_runtime") else "no",
                                           "yes" if n.get("enroot") else "no",
                                           *([{True: "yes", False: "no"}.get(n.get("reaches_registry"), "-")]
                                             if reg else []))))
    stdout.print(t)
    stdout.print(f"pyxis (srun --container-image): {'yes' if c['pyxis'] else 'no'}", markup=False)
    s = c.get("settings") or {}
    where = (f"pushed to {s['registry']}, pulled by digest on each node" if s.get("registry")
             else f"an archive on the shared filesystem ({c['shared_area']}/images), loaded on each node")
    stdout.print(f"runs get the image: {where}; containers run by {s.get('runtime') or 'docker'}", markup=False)
    stdout.print(result.summary, markup=False)


def ray_text(result: Result[dict[str, Any]]) -> None:
    """`provision --scheduler ray`: the Ray cluster's nodes as Ray and a task on each see them, and its settings."""
    c = result.data["ray"]
    stdout.print(f"Ray {c.get('ray_version')} at {result.data['host']} (job API {c['address']}, Python {c['python']})",
                 markup=False)
    if c.get("version_note"):
        stdout.print(c["version_note"], markup=False)
    reg = c.get("registry")
    t = Table()
    for name in ("node", "address", "cpus", "gpus", "memory", "docker", "nvidia", *(["registry"] if reg else [])):
        t.add_column(name, no_wrap=name in ("node", "address", "docker"))  # what names the node stays whole
    for n in c["nodes"]:
        t.add_row(*(Text(str(x)) for x in (
            str(n["node_id"])[:8] + ("*" if n.get("head") else ""), n.get("address") or "-",
            _count(n.get("cpus")), _count(n.get("gpus")),
            _size((n.get("memory_mb") or 0) << 20), n.get("docker") or ("probe failed" if n.get("probe_error")
                                                                           else "no"),
            "yes" if n.get("nvidia_runtime") else "no",
            *([{True: "yes", False: "no"}.get(n.get("reaches_registry"), "-")] if reg else []))))
    stdout.print(t)
    stdout.print("(* the head node)", markup=False)
    for n in c["nodes"]:
        if n.get("probe_error"):
            stdout.print(f"node {str(n['node_id'])[:8]} ({n.get('address')}): its probe failed: {n['probe_error']}",
                         markup=False)
    s = c.get("settings") or {}
    where = (f"pushed to {s['registry']}, pulled by digest on each node" if s.get("registry")
             else "an archive in the head's launcher area, streamed to each node that lacks it")
    stdout.print(f"runs get the image: {where}", markup=False)
    stdout.print(result.summary, markup=False)


def _count(value: Any) -> str:
    """Ray's resource counts (floats) as a person writes them: 2, 0.5, - for none."""
    if not isinstance(value, int | float) or not value:
        return "-"
    return str(int(value)) if float(value).is_integer() else str(value)
