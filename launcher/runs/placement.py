"""A run's host: the options to reopen it, whether it can run the variant, and the data and code sent to it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from launcher.errors import HostNotReady, NoGpu, UsageError
from launcher.hosts import open_host
from launcher.hosts.base import Host
from launcher.hosts.engine import Engine
from launcher.progress import Reporter
from launcher.workspace import Workspace


def host_options(spec: str | None, **opts: Any) -> dict[str, Any]:
    return {
        "spec": spec,
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in opts.items() if v is not None},
    }


def reopen_host(ws: Workspace, launch: Mapping[str, Any]) -> Host:
    opts = dict(launch.get("host_options") or {"spec": None})
    spec = opts.pop("spec", None)
    kw: dict[str, Any] = {
        k: (Path(v) if k in ("identity", "ssh_config", "known_hosts") else v) for k, v in opts.items()
    }
    return open_host(spec, workspace_root=ws.root, **kw)


def gpu_ready(host: Host) -> None:
    runtimes = Engine(host).runtimes()
    smi = host.run(["nvidia-smi", "-L"], check=False)
    if smi.returncode != 0 or "GPU" not in smi.out:
        raise NoGpu(
            f"{host.name} has no NVIDIA GPU that nvidia-smi can see, so --variant gpu cannot run",
            "use --variant cpu, or a GPU host with its driver installed",
        )
    if "nvidia" not in runtimes:
        raise HostNotReady(
            f"Docker on {host.name} has no NVIDIA runtime",
            f"run `launcher provision --host {host.name} --gpu --install`",
        )


def output_owner(host: Host) -> str | None:
    """Whom the container should hand its outputs to: the host user, unless Docker there is
    rootless or remaps user namespaces. Then the container's root already writes as that user
    on the host, and a chown inside would hand the files to a subordinate ID instead."""
    opts = Engine(host).security_options()
    if opts is None or any("rootless" in o or "userns" in o for o in opts):
        return None
    return host.owner()


def place_data(host: Host, data_from: str, data: str | None,
               reporter: Reporter | None) -> tuple[str, dict[str, Any]]:
    """Resolve --data-from: the dataset is sent to the host (once per content) and mounted
    from where it landed, exactly like --data. Returns that path and the data source record."""
    if data:
        raise UsageError(
            "--data and --data-from both given", "--data names a folder on the host, --data-from one here: pick one"
        )
    from launcher.runs import datasets

    local = Path(data_from).expanduser()
    placed = datasets.place(host, local, reporter)
    return placed.path, {"kind": "sent", "local": str(local.resolve()), **placed.to_dict()}


def place_code(code_plan: Mapping[str, Any] | None, host: Host, reporter: Reporter | None) -> dict[str, Any]:
    """Put the snapshot of mounted code on the host (sent once per content); baked code needs nothing.
    Returns the code plan with where the host has the code."""
    plan = dict(code_plan or {})
    if plan.get("source") != "mounted" or plan.get("host_path"):
        return plan
    if host.kind == "local":  # the local engine mounts the snapshot where it is
        plan["host_path"], plan["sent"] = plan["local"], False
        return plan
    from launcher.runs import datasets

    placed = datasets.place(host, Path(plan["local"]), reporter, area="code",
                            name=str(plan["digest"]).removeprefix("sha256:"))
    plan["host_path"] = placed.path
    plan["sent"] = placed.sent
    return plan
