"""A container as data: what it runs, what it sees, how it is started (`ContainerSpec`).

Every module that starts a container builds one of these; only :mod:`launcher.hosts.engine` turns it into
Docker's command line (`engine.render`). A run's launch record keeps the spec (`to_record`), so a resumed or
moved run edits its fields (its environment, its mounts), never the tokens of a rendered command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypedDict, cast


class MountRecord(TypedDict):
    source: str
    target: str
    read_only: bool


class SpecRecord(TypedDict, total=False):
    """A ContainerSpec as a launch record keeps it (keys with no value are left out)."""

    image: str
    command: list[str]
    name: str
    labels: dict[str, str]
    env: dict[str, str]
    env_from_caller: list[str]
    env_file: str
    mounts: list[MountRecord]
    network: str
    hostname: str
    platform: str
    user: str
    workdir: str
    entrypoint: str
    gpus: str
    detach: bool
    remove: bool
    stdin: bool


@dataclass(frozen=True)
class Mount:
    source: str  # a path on the container's host
    target: str  # where the container sees it
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """One container. env: NAME -> VALUE; env_from_caller: names whose value the starting process passes
    (never written down); env_file: a file on the host of NAME=VALUE lines (secrets); gpus: "all" or a
    device list; detach: started in the background; remove: removed once it ends; stdin: kept open for
    input the caller writes."""

    image: str
    command: tuple[str, ...] = ()
    name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    env_from_caller: tuple[str, ...] = ()
    env_file: str | None = None
    mounts: tuple[Mount, ...] = ()
    network: str | None = None
    hostname: str | None = None
    platform: str | None = None
    user: str | None = None
    workdir: str | None = None
    entrypoint: str | None = None
    gpus: str | None = None
    detach: bool = False
    remove: bool = False
    stdin: bool = False

    def with_env(self, env: Mapping[str, str]) -> ContainerSpec:
        """The same container with more (or other) variables."""
        return replace(self, env={**self.env, **env})

    def without_env(self, *names: str) -> ContainerSpec:
        return replace(self, env={k: v for k, v in self.env.items() if k not in names})

    def with_sources(self, moved: Mapping[str, str]) -> ContainerSpec:
        """The same container with each mount whose source is a key of moved mounted from its value instead."""
        return replace(self, mounts=tuple(replace(m, source=moved.get(m.source, m.source)) for m in self.mounts))

    def mount_at(self, target: str) -> Mount | None:
        return next((m for m in self.mounts if m.target == target), None)

    def to_record(self) -> SpecRecord:
        rec: dict[str, object] = {"image": self.image, "command": list(self.command)}
        for key, value in (("name", self.name), ("env_file", self.env_file), ("network", self.network),
                           ("hostname", self.hostname), ("platform", self.platform), ("user", self.user),
                           ("workdir", self.workdir), ("entrypoint", self.entrypoint), ("gpus", self.gpus)):
            if value is not None:
                rec[key] = value
        if self.labels:
            rec["labels"] = dict(self.labels)
        if self.env:
            rec["env"] = dict(self.env)
        if self.env_from_caller:
            rec["env_from_caller"] = list(self.env_from_caller)
        if self.mounts:
            rec["mounts"] = [{"source": m.source, "target": m.target, "read_only": m.read_only} for m in self.mounts]
        for key, flag in (("detach", self.detach), ("remove", self.remove), ("stdin", self.stdin)):
            if flag:
                rec[key] = True
        return cast(SpecRecord, rec)

    @classmethod
    def from_record(cls, rec: SpecRecord) -> ContainerSpec:
        """The spec a launch record kept (ValueError when it is not one)."""
        if not isinstance(rec, dict) or not isinstance(rec.get("image"), str):
            raise ValueError("a container spec needs its image")

        def text(key: str) -> str | None:
            value = rec.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"a container spec's {key} must be text")
            return value

        mounts = tuple(Mount(str(m["source"]), str(m["target"]), bool(m.get("read_only")))
                       for m in rec.get("mounts") or [])
        return cls(image=rec["image"], command=tuple(str(a) for a in rec.get("command") or ()), name=text("name"),
                   labels={str(k): str(v) for k, v in (rec.get("labels") or {}).items()},
                   env={str(k): str(v) for k, v in (rec.get("env") or {}).items()},
                   env_from_caller=tuple(str(n) for n in rec.get("env_from_caller") or ()),
                   env_file=text("env_file"), mounts=mounts, network=text("network"), hostname=text("hostname"),
                   platform=text("platform"), user=text("user"), workdir=text("workdir"),
                   entrypoint=text("entrypoint"), gpus=text("gpus"), detach=bool(rec.get("detach")),
                   remove=bool(rec.get("remove")), stdin=bool(rec.get("stdin")))
