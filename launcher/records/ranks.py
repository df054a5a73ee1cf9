"""A run of several processes as its records hold it (``topology`` of launch.json and manifest.json): the rank
layout and the settings of its collectives as launched (launcher.specs.topology), and what the pulled outputs say
afterwards: how each rank ended (each node's ``_launcher/ranks.json``, launcher.runtime.distributed), the first
rank that failed with its log's last lines, and whether the data-parallel ranks held the same weights at every
step they recorded (rank 0's step fingerprints against each other rank's: Megatron's cross-replica check, made
automatic)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NotRequired, TypedDict

from launcher.runtime.distributed import RANKS, rank_out
from launcher.runtime.outfiles import RANKS_JSON, STEPS

NODES = "nodes"
SIGTERM_EXIT = 143  # a rank stopped because another failed
LOG_LINES = 12


class RankRow(TypedDict):
    """One rank of a run of several processes: its global rank, its node, its local rank there."""

    rank: int
    node: int
    local_rank: int


class RankEnd(TypedDict):
    """How one rank ended (the node's ``_launcher/ranks.json``): its exit code, None where it was stopped
    before it could record one; when it recorded its end (seconds since the epoch), None where it could not."""

    rank: int
    node: int
    exit_code: int | None
    ended_at: float | None


class RankFailure(TypedDict):
    """The rank that failed first: where it ran, its exit code, the last lines of its log."""

    rank: int
    node: int
    exit_code: int
    log: str  # its log's path under the run folder
    last_lines: list[str]


class RankInconsistency(TypedDict):
    """Data-parallel ranks that hold different weights at a recorded step (rank 0's against this rank's)."""

    rank: int
    step: int | None
    epoch: int | None


class TopologyRecord(TypedDict):
    """``topology`` of launch.json and manifest.json (launcher.specs.topology): the rank layout, the backend
    and the settings that pin its collectives; the manifest adds how each rank ended, the first that failed and
    whether the data-parallel ranks agreed."""

    nodes: int
    procs_per_node: int
    world_size: int
    backend: str
    launcher: str
    master_port: int
    ranks: list[RankRow]
    collectives: dict[str, str]
    node_hosts: list[str]
    network: NotRequired[str]  # "private" (one engine's network) or "host" (one node per host); older: private
    ended: NotRequired[list[RankEnd]]
    failed: NotRequired[RankFailure | None]
    inconsistent: NotRequired[RankInconsistency | None]


def node_out(outputs: Path, node: int) -> Path:
    """Node k's outputs among the run's pulled outputs."""
    return outputs if node == 0 else outputs / NODES / str(node)


def rank_folder(outputs: Path, rank: int) -> Path:
    """Where rank's records are among the pulled outputs (ranks/<r>/ whichever node ran it; rank 0's at the top)."""
    return rank_out(outputs, rank)


def rank_ends(outputs: Path, topology: TopologyRecord) -> list[RankEnd]:
    """How every rank ended, as its node recorded it (exit code None where its node recorded nothing)."""
    said: dict[int, tuple[int | None, float | None]] = {}
    for node in range(topology["nodes"]):
        try:
            doc = json.loads((node_out(outputs, node) / RANKS_JSON).read_text())
            rows = doc["ranks"] if isinstance(doc, dict) and isinstance(doc.get("ranks"), list) else []
        except (OSError, ValueError):
            rows = []
        for row in rows:
            if isinstance(row, dict) and isinstance(row.get("rank"), int):
                code, ended = row.get("exit_code"), row.get("ended_at")
                said[row["rank"]] = (code if isinstance(code, int) else None,
                                     float(ended) if isinstance(ended, (int, float)) else None)
    return [{"rank": r["rank"], "node": r["node"], "exit_code": said.get(r["rank"], (None, None))[0],
             "ended_at": said.get(r["rank"], (None, None))[1]} for r in topology["ranks"]]


def first_failure(outputs: Path, ends: list[RankEnd], run_folder: Path) -> RankFailure | None:
    """The rank that failed first, with its log's last lines: one killed by a signal other than the stop its node
    sends (it could record nothing: SIGKILL, SIGSEGV, the kernel's out-of-memory killer), else the one whose own
    record ended first (a rank that raised; the others then fail in their collectives), else any that failed."""
    failed = [e for e in ends if e["exit_code"] not in (0, None)]
    if not failed:
        return None
    killed = [e for e in failed if e["ended_at"] is None and (e["exit_code"] or 0) > 128
              and e["exit_code"] != SIGTERM_EXIT]
    recorded = sorted((e for e in failed if e["ended_at"] is not None), key=lambda e: e["ended_at"] or 0.0)
    end = (killed or recorded or failed)[0]
    log = rank_folder(outputs, end["rank"]) / "logs/train.log"
    try:
        lines = log.read_text(errors="replace").splitlines()[-LOG_LINES:]
    except OSError:
        lines = []
    code = end["exit_code"]
    assert code is not None
    return {"rank": end["rank"], "node": end["node"], "exit_code": code,
            "log": str(log.relative_to(run_folder)) if log.is_relative_to(run_folder) else str(log),
            "last_lines": lines}


def _steps(path: Path) -> list[tuple[int | None, int | None, str]]:
    out: list[tuple[int | None, int | None, str]] = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("digest"), str):
            step, epoch = row.get("step"), row.get("epoch")
            out.append((step if isinstance(step, int) else None, epoch if isinstance(epoch, int) else None,
                        row["digest"]))
    return out


def inconsistency(outputs: Path, topology: TopologyRecord) -> RankInconsistency | None:
    """The first rank whose weights differ from rank 0's at a step both recorded (data-parallel ranks hold the same
    weights after every step), with that step; None when all agree or none recorded steps."""
    reference = _steps(outputs / STEPS)
    if not reference:
        return None
    for row in topology["ranks"][1:]:
        theirs = _steps(rank_folder(outputs, row["rank"]) / STEPS)
        for (step, epoch, digest), (_, _, other) in zip(reference, theirs, strict=False):
            if digest != other:
                return {"rank": row["rank"], "step": step, "epoch": epoch}
    return None


def completed(launch_topology: TopologyRecord, outputs: Path, run_folder: Path) -> TopologyRecord:
    """The manifest's topology: the launch record's, with how each rank ended, the first failure and the
    cross-rank check."""
    topology: TopologyRecord = {**launch_topology}
    ends = rank_ends(outputs, launch_topology)
    topology["ended"] = ends
    topology["failed"] = first_failure(outputs, ends, run_folder)
    topology["inconsistent"] = inconsistency(outputs, launch_topology)
    return topology


__all__ = ["RANKS", "RankEnd", "RankFailure", "RankInconsistency", "RankRow", "TopologyRecord", "completed"]
