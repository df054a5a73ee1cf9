"""A run target added by this one module: it defines its placement and registers it, and launcher's
run life, --scheduler's checks and the reopening of a run's placement reach it through the registry
(targets/registry.py). Its runs "happen" as tests/fakeplacement.py's do; it records how often the group
was prepared and keeps a label (given as --partition) in its launch record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fakeplacement import FakePlacement, Script

from launcher.errors import UsageError
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.targets.placement import Placement
from launcher.targets.registry import Target, TargetOptions, register


class ToyPlacement(FakePlacement):
    kind = "toy"

    def __init__(self, host: Host, host_spec: HostSpec | None = None, *, label: str | None = None) -> None:
        Placement.__init__(self, host, host_spec)
        self.script = Script()
        self.jobs, self.argvs, self.env_files, self.stopped, self.states = [], [], {}, [], {}
        self.label = label
        self.prepared = 0

    def prepare(self, gpu: bool) -> None:
        self.prepared += 1

    def record(self) -> dict[str, Any]:
        return {**super().record(), "label": self.label}

    @classmethod
    def reopen(cls, host: Host, host_spec: HostSpec, record: Mapping[str, Any]) -> Placement:
        return cls(host, host_spec, label=record.get("label"))


def check(options: TargetOptions) -> None:
    if options.settings or options.max_parallel:
        raise UsageError("the toy target takes only a label (--partition)", "drop the others")


TARGET = register(Target(ToyPlacement, check=check,
                         open=lambda host, spec, options: ToyPlacement(host, spec, label=options.partition)))
