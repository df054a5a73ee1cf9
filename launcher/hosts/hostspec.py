"""Which host a command talks to, as one value: built from the command line, written into a run's
launch record and read back from it, and opened into a :class:`~launcher.hosts.base.Host`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import NotRequired, TypedDict

from launcher.hosts.base import Host


class HostRecord(TypedDict):
    """A host spec as launch.json keeps it (``host_options``): the SSH destination (None: the local
    engine) and the SSH options that were given, paths as text."""

    spec: str | None
    identity: NotRequired[str]
    port: NotRequired[int]
    ssh_config: NotRequired[str]
    known_hosts: NotRequired[str]


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


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

    def to_record(self) -> HostRecord:
        """What a launch record keeps to reopen the host later (never the trust of a new key:
        a later command meets the key that was recorded then)."""
        record: HostRecord = {"spec": None if self.local else self.destination}
        if self.identity is not None:
            record["identity"] = str(self.identity)
        if self.port is not None:
            record["port"] = self.port
        if self.ssh_config is not None:
            record["ssh_config"] = str(self.ssh_config)
        if self.known_hosts is not None:
            record["known_hosts"] = str(self.known_hosts)
        return record

    @classmethod
    def from_record(cls, record: HostRecord | None) -> HostSpec:
        rec: HostRecord = record or {"spec": None}
        port = rec.get("port")
        return cls(destination=rec.get("spec"), identity=_path(rec.get("identity")),
                   port=None if port is None else int(port), ssh_config=_path(rec.get("ssh_config")),
                   known_hosts=_path(rec.get("known_hosts")))

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
