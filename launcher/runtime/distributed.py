"""A run of several processes (and several nodes), inside each node's container: the framework's own launcher
started with a fixed rank layout, each rank's records kept apart, each rank's end recorded.

The host starts one container per node (launcher.targets.placement); in each, ``python -m launcher.runtime run
--nodes N --procs-per-node M --node-rank K --master ADDR:PORT`` starts PyTorch's torchrun with a static
rendezvous and that explicit node rank (never elastic rank assignment), so global rank ``K*M + local rank``
is the same in every replicate. Each rank runs ``launcher.runtime.child`` (the profile and the hooks applied
before the script's first line). Rank 0 writes its records where a one-process run writes them (the outputs
folder), rank r > 0 under ``ranks/<r>/`` (the run's own ranks/ folder, mounted into every node), its console output into
``ranks/<r>/logs/train.log``; each rank ends by writing ``_launcher/rank.json`` there (its exit code), which a
rank killed from outside never writes.

Standard library only, like the rest of the runtime.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "LAUNCHER_DISTRIBUTED"  # set by the node's runner for each rank it starts: "torchrun"
RANKS = "ranks"
RANK_JSON = "_launcher/rank.json"
MASTER_PORT = 29500

# What pins the collectives' order, per backend (the host injects it with the profile and records it).
# Gloo: the interface of the node's private network. NCCL: one algorithm, the Simple protocol, a fixed channel
# count, NVLink SHARP and CollNet off (their reductions are not ordered), cuBLAS's deterministic workspace.
COLLECTIVE_ENV = {
    "gloo": {"GLOO_SOCKET_IFNAME": "eth0"},
    "nccl": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "4",
             "NCCL_NVLS_ENABLE": "0", "NCCL_COLLNET_ENABLE": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
}


@dataclass(frozen=True)
class Layout:
    """One node's place in the run: N nodes of M processes, this node's rank, and rank 0's node address."""

    nodes: int
    procs_per_node: int
    node_rank: int
    master_addr: str
    master_port: int = MASTER_PORT

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def global_ranks(self) -> range:
        """The ranks this node runs."""
        first = self.node_rank * self.procs_per_node
        return range(first, first + self.procs_per_node)


def parse_master(text: str) -> tuple[str, int]:
    """--master ADDR[:PORT] as (address, port); ValueError for a bad port."""
    addr, sep, port = text.rpartition(":")
    if not sep:
        return text, MASTER_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--master {text}: the port is not a number from 1 to 65535")
    return addr, int(port)


def torchrun_argv(python: str, layout: Layout, entry: str, args: list[str]) -> list[str]:
    """torchrun with a static rendezvous and this node's rank, each rank running launcher's child."""
    return [python, "-m", "torch.distributed.run",
            "--nnodes", str(layout.nodes), "--nproc-per-node", str(layout.procs_per_node),
            "--node-rank", str(layout.node_rank), "--rdzv-backend", "static",
            "--master-addr", layout.master_addr, "--master-port", str(layout.master_port),
            "--max-restarts", "0", "--monitor-interval", "0.5",
            "-m", "launcher.runtime.child", entry, *args]


def rank_out(out: Path, rank: int) -> Path:
    """Where rank writes its records: the outputs folder for rank 0, ranks/<rank>/ below it for the others."""
    return out if rank == 0 else out / RANKS / str(rank)


def this_rank() -> int | None:
    """This process's global rank when the node's runner started it as one rank of several, else None."""
    if not os.environ.get(ENV):
        return None
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None


def enter_rank(rank: int) -> None:
    """Before the hooks: the rank's records under its own folder; a rank beyond 0 writes its console output to
    its own log (rank 0's is the node's console, teed by the runner)."""
    out = rank_out(Path(os.environ.get("LAUNCHER_OUT", "out")), rank)
    for sub in ("logs", "_launcher", "fingerprints"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    os.environ["LAUNCHER_OUT"] = str(out)
    if rank != 0:
        fd = os.open(out / "logs/train.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def leave_rank(rank: int, code: int) -> None:
    """The rank's end, in its own folder."""
    out = Path(os.environ.get("LAUNCHER_OUT", "out"))
    doc = {"rank": rank, "local_rank": _int_env("LOCAL_RANK"), "node_rank": _int_env("GROUP_RANK"),
           "world_size": _int_env("WORLD_SIZE"), "exit_code": code, "ended_at": round(time.time(), 3)}
    tmp = out / (RANK_JSON + ".tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True) + "\n")
    os.replace(tmp, out / RANK_JSON)


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.lstrip("-").isdigit() else None


# torchrun's summary of a failed worker: "  rank      : 3 (local_rank: 1)" then "  exitcode  : -9 (pid: 77)"
_FAILED = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n.*?exitcode\s*:\s*(-?\d+)", re.S)


def node_ranks(out: Path, layout: Layout, console: str) -> list[dict[str, int | float | None]]:
    """Each rank of this node and how it ended: its own record (its exit code and when it ended), else torchrun's
    summary of its failure (a rank killed from outside: no time), else None (stopped before it could say)."""
    said = {int(r): int(c) for r, c in _FAILED.findall(console)}
    rows: list[dict[str, int | float | None]] = []
    for rank in layout.global_ranks():
        code: int | None = None
        ended: float | None = None
        try:
            doc = json.loads((rank_out(out, rank) / RANK_JSON).read_text())
            code = int(doc["exit_code"])
            ended = float(doc["ended_at"]) if isinstance(doc.get("ended_at"), (int, float)) else None
        except (OSError, ValueError, KeyError, TypeError):
            code = said.get(rank)
        if code is not None and code < 0:
            code = 128 - code  # killed by a signal, as a shell says it
        rows.append({"rank": rank, "node": layout.node_rank, "exit_code": code, "ended_at": ended})
    return rows
