"""Which host a command talks to, as one value: built from the command line, written into a run's
launch record and read back from it, and opened into a :class:`~launcher.hosts.base.Host`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.hosts.base import Host

_PATHS = ("identity", "ssh_config", "known_hosts")


@dataclass(frozen=True)
class HostSpec:
    """destination None (or "local") is the local Docker engine; anything else an SSH destination
    (HOST, USER@HOST, USER@HOST:PORT or a ~/.ssh/config alias) with its SSH options."""

    destination: str | None = None
    trust_new_host: bool = False
    identity: Path | None = None
    port: int | None = None
    ssh_config: Path | None = None
    known_hosts: Path | None = None

    @property
    def local(self) -> bool:
        return self.destination in (None, "local")

    @property
    def name(self) -> str:
        return "local" if self.local else str(self.destination)

    def to(self, destination: str | None) -> HostSpec:
        """The same SSH options for another destination (an experiment spread over hosts)."""
        return replace(self, destination=destination)

    def to_record(self) -> dict[str, Any]:
        """What a launch record keeps to reopen the host later (never the trust of a new key:
        a later command meets the key that was recorded then)."""
        record: dict[str, Any] = {"spec": None if self.local else self.destination}
        for key in ("identity", "port", "ssh_config", "known_hosts"):
            value = getattr(self, key)
            if value is not None:
                record[key] = str(value) if isinstance(value, Path) else value
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None) -> HostSpec:
        rec = dict(record or {})
        kw: dict[str, Any] = {k: Path(rec[k]) for k in _PATHS if rec.get(k) is not None}
        if rec.get("port") is not None:
            kw["port"] = int(rec["port"])
        return cls(destination=rec.get("spec"), **kw)

    def open(self, workspace_root: Path | None = None) -> Host:
        """Connect: the local engine (its run directories under workspace_root when given), or SSH."""
        if self.local:
            from launcher.hosts.local import LocalHost

            return LocalHost(workspace_root=workspace_root)
        from launcher.hosts.ssh import SSHHost

        return SSHHost.connect(
            str(self.destination),
            trust_new_host=self.trust_new_host,
            identity=self.identity,
            port=self.port,
            ssh_config=self.ssh_config,
            known_hosts=self.known_hosts,
        )
