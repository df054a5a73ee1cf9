"""Hosts that run containers: the local Docker engine, or a machine reached over SSH."""

from __future__ import annotations

from pathlib import Path

from launcher.hosts.base import Host, HostProcess, RemoteEntry
from launcher.hosts.local import LocalHost
from launcher.hosts.ssh import SSHHost

__all__ = ["Host", "HostProcess", "RemoteEntry", "open_host"]


def open_host(
    spec: str | None,
    *,
    trust_new_host: bool = False,
    identity: Path | None = None,
    port: int | None = None,
    workspace_root: Path | None = None,
    ssh_config: Path | None = None,
    known_hosts: Path | None = None,
) -> Host:
    """None (or "local") is the local Docker engine; anything else is an SSH destination."""
    if spec is None or spec == "local":
        return LocalHost(workspace_root=workspace_root)
    return SSHHost.connect(
        spec,
        trust_new_host=trust_new_host,
        identity=identity,
        port=port,
        ssh_config=ssh_config,
        known_hosts=known_hosts,
    )
