"""Hosts that run containers: the local Docker engine, or a machine reached over SSH."""

from __future__ import annotations

from launcher.hosts.base import Host, HostProcess, RemoteEntry, open_host

__all__ = ["Host", "HostProcess", "RemoteEntry", "open_host"]
