"""The run targets launcher knows, by the ``kind`` a launch record names, and reopening a run's own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.errors import UsageError
from launcher.hosts.spec import HostSpec
from launcher.runs.placement import DirectPlacement, Placement
from launcher.runs.slurm import SlurmPlacement
from launcher.workspace import Workspace

KINDS: dict[str, type[Placement]] = {DirectPlacement.kind: DirectPlacement, SlurmPlacement.kind: SlurmPlacement}


def open_placement(ws: Workspace, launch: Mapping[str, Any]) -> Placement:
    """Reopen the placement a run was started with, from its launch record (records from before
    placements were recorded are direct placements)."""
    kind = str((launch.get("placement") or {}).get("kind") or DirectPlacement.kind)
    cls = KINDS.get(kind)
    if cls is None:
        raise UsageError(f"run {launch.get('run_id')} was placed by {kind!r}, which this launcher does not know",
                         "use the launcher version that started it")
    spec = HostSpec.from_record(launch.get("host_options"))
    return cls.reopen(spec.open(ws.root if spec.local else None), spec, launch.get("placement") or {})
