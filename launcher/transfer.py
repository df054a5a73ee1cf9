"""Moving bytes to and from hosts: images out (:mod:`launcher.ship`), run outputs back (:mod:`launcher.pull`).

Kept so that ``from launcher import transfer`` and ``transfer.ship_image`` / ``transfer.pull_outputs``
still work; new code imports the module of the concept it needs.
"""

from __future__ import annotations

from launcher.hosts.engine import chain_ids
from launcher.pull import (
    PULL_SCRIPT,
    STATE_FILE,
    PullResult,
    check_remote_digests,
    classify,
    pull_outputs,
    receive_files,
    safe_relpath,
)
from launcher.ship import (
    LAYER_MAP_FILE,
    SHIP_REPO,
    ShipResult,
    rewrite_save_stream,
    ship_image,
    ship_image_via_registry,
)

__all__ = [
    "LAYER_MAP_FILE",
    "PULL_SCRIPT",
    "SHIP_REPO",
    "STATE_FILE",
    "PullResult",
    "ShipResult",
    "chain_ids",
    "check_remote_digests",
    "classify",
    "pull_outputs",
    "receive_files",
    "rewrite_save_stream",
    "safe_relpath",
    "ship_image",
    "ship_image_via_registry",
]
