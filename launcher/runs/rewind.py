"""A re-execution that starts from a run's checkpoint instead of from the start (`launcher diverge`).

A run started with ``--checkpoint-every N --keep-checkpoints`` keeps each checkpoint in its outputs
(launcher.runtime.checkpoint); without ``--keep-checkpoints`` only the latest, which a finished run
wrote after its last epoch. To re-execute a run from a checkpoint, a folder is made here as its
outputs stood then: the checkpoint, ``latest.json`` pointing at it, and the files the run appends to
(metrics, batch and step fingerprints, which the runtime cuts back to their size at the checkpoint)
and its initial weights. It becomes the re-execution's outputs folder on its host before the
container starts with ``LAUNCHER_RESUME=1``, as `launcher resume` starts one: training goes on from
there bit for bit.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

from launcher.progress import Reporter
from launcher.records.manifest import Manifest
from launcher.records.records import StartPoint
from launcher.runtime.checkpoint import APPENDED, DIR, LATEST, STATE
from launcher.runtime.outfiles import INITIAL_WEIGHTS

if TYPE_CHECKING:
    from launcher.hosts.base import Host
    from launcher.runtime.records import CheckpointState

_NAME = re.compile(r"epoch-\d{4,}")


def checkpoints(outputs: Path) -> list[tuple[str, CheckpointState]]:
    """The checkpoints kept in an outputs folder, by step (a folder without a readable state left out)."""
    found: list[tuple[str, CheckpointState]] = []
    root = outputs / DIR
    if not root.is_dir():
        return found
    for folder in sorted(root.iterdir()):
        if not (_NAME.fullmatch(folder.name) and folder.is_dir() and not folder.is_symlink()):
            continue
        try:
            state = json.loads((folder / STATE).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and all(isinstance(state.get(k), int) for k in ("epoch", "next_epoch", "step")):
            found.append((folder.name, cast("CheckpointState", state)))
    return sorted(found, key=lambda item: item[1]["step"])


def seconds(m: Manifest) -> float | None:
    """How long a run took, from its start to its end (its manifest)."""
    return _seconds(m)


def _seconds(m: Manifest) -> float | None:
    try:
        start = datetime.fromisoformat(str(m.data["started_at"]).replace("Z", "+00:00"))
        end = datetime.fromisoformat(str(m.data["ended_at"]).replace("Z", "+00:00"))
    except (KeyError, ValueError, TypeError):
        return None
    return max((end - start).total_seconds(), 0.0)


def start_point(m: Manifest, at_most: int, steps_total: int | None) -> StartPoint | None:
    """The run's last checkpoint at or before step ``at_most``, or None (no such checkpoint kept)."""
    kept = [(name, state) for name, state in checkpoints(m.file("outputs")) if 0 < state["step"] <= at_most]
    if not kept:
        return None
    name, state = kept[-1]
    seconds = _seconds(m)
    saved = seconds * state["step"] / steps_total if seconds is not None and steps_total else None
    return {"run": m.run_id, "checkpoint": name, "step": state["step"], "epochs": state["next_epoch"],
            "steps_total": steps_total, "seconds": seconds, "seconds_saved": saved}


def why_none(m: Manifest, at_most: int) -> str | None:
    """Why a run started with checkpoints has none at or before step at_most (None: it has no checkpoints)."""
    kept = checkpoints(m.file("outputs"))
    if not kept:
        return None
    name, state = kept[0]
    only = " (it keeps its latest only: `launcher run --checkpoint-every N --keep-checkpoints` keeps each)" \
        if len(kept) == 1 else ""
    return f"{m.run_id}'s first checkpoint kept, {name}, is at step {state['step']}, after step {at_most}{only}"


def prepare(m: Manifest, point: StartPoint) -> Path:
    """A folder here holding the run's outputs as they stood at the checkpoint (the caller removes it)."""
    outputs = m.file("outputs")
    folder = Path(tempfile.mkdtemp(prefix="launcher-rewind-"))
    try:
        shutil.copytree(outputs / DIR / point["checkpoint"], folder / DIR / point["checkpoint"], symlinks=True)
        (folder / LATEST).write_text(json.dumps({"name": point["checkpoint"]}, sort_keys=True) + "\n")
        for rel in (*APPENDED, INITIAL_WEIGHTS):
            source = outputs / rel
            if source.is_file() and not source.is_symlink():
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, folder / rel)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def place(host: Host, local: Path, remote_out: str, reporter: Reporter | None) -> None:
    """The prepared folder's files put into a run's outputs folder on host (made by Placement.run_dir)."""
    from launcher.transfers import datasets

    placed = datasets.place(host, local, reporter, area="rewind")
    host.run(["cp", "-a", f"{placed.path}/.", f"{remote_out}/"])
    if host.kind != "local":
        host.run(["rm", "-rf", placed.path], check=False)
