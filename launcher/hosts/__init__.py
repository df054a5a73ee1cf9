"""Hosts that run containers: the local Docker engine, or a machine reached over SSH."""

from __future__ import annotations

from pathlib import Path

from launcher.hosts.base import Host, HostProcess, RemoteEntry
from launcher.hosts.hostspec import HostSpec

__all__ = ["Host", "HostProcess", "HostSpec", "RemoteEntry", "open_host"]


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
    return HostSpec(spec, trust_new_host, identity, port, ssh_config, known_hosts).open(workspace_root)
