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
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from launcher.runtime.outfiles import RANKS_JSON

if TYPE_CHECKING:
    import subprocess

ENV = "LAUNCHER_DISTRIBUTED"  # set by the node's runner for each rank it starts: its launcher's name
RANKS = "ranks"
RANK_JSON = "_launcher/rank.json"
MASTER_PORT = 29500
STOPPED = 128 + signal.SIGTERM  # a rank stopped because another failed
TF_PORT = 20000  # worker i of a node listens on TF_PORT + i (TensorFlow's collective ops, over gRPC)
# How each framework's ranks are started: PyTorch's own launcher; TensorFlow has none, so the runner starts each
# worker with its TF_CONFIG (MultiWorkerMirroredStrategy reads it)
LAUNCHERS = {"torch": "torchrun", "tensorflow": "tf_config", "jax": "jax_distributed"}
JAX_COORDINATOR = "LAUNCHER_JAX_COORDINATOR"  # node 0's address:port for jax.distributed.initialize

# What pins the collectives' order, per backend (the host injects it with the profile and records it).
# Gloo: the interface of the node's private network. NCCL: one algorithm, the Simple protocol, a fixed channel
# count, NVLink SHARP and CollNet off (their reductions are not ordered), cuBLAS's deterministic workspace.
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
COLLECTIVE_ENV = {
    "gloo": {GLOO_IFNAME: "eth0"},
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


def tf_config(layout: Layout, peers: list[str], rank: int) -> str:
    """TF_CONFIG of one worker: every worker's address (node by node, port TF_PORT + local rank) and its index."""
    workers = [f"{peers[node]}:{TF_PORT + local}" for node in range(layout.nodes)
               for local in range(layout.procs_per_node)]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}},
                      separators=(",", ":"))


def worker_env(layout: Layout, peers: list[str], local: int, launcher: str = "tf_config") -> dict[str, str]:
    """What the runner gives process `local` of this node it starts itself: its ranks, as torchrun names them, and
    TensorFlow's TF_CONFIG, or JAX's coordinator (launcher.runtime.frameworks.fw_jax initializes it)."""
    rank = layout.node_rank * layout.procs_per_node + local
    env = {ENV: launcher, "RANK": str(rank), "LOCAL_RANK": str(local), "GROUP_RANK": str(layout.node_rank),
           "WORLD_SIZE": str(layout.world_size), "LOCAL_WORLD_SIZE": str(layout.procs_per_node)}
    if launcher == "jax_distributed":
        env[JAX_COORDINATOR] = f"{peers[0]}:{layout.master_port}"
    else:
        env["TF_CONFIG"] = tf_config(layout, peers, rank)
    return env


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
    if rank != 0:  # a resumed run's rank goes on with its log (LAUNCHER_RESUME, launcher.runtime.checkpoint)
        again = os.O_APPEND if os.environ.get("LAUNCHER_RESUME") == "1" else os.O_TRUNC
        fd = os.open(out / "logs/train.log", os.O_WRONLY | os.O_CREAT | again, 0o644)
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


def node_ranks(out: Path, layout: Layout, console: str,
               codes: dict[int, int] | None = None) -> list[dict[str, int | float | None]]:
    """Each rank of this node and how it ended: its own record (its exit code and when it ended), else its process's
    exit status (codes: ranks the runner started itself) or torchrun's summary of its failure (a rank killed from
    outside: no time), else None (stopped before it could say)."""
    said = {int(r): int(c) for r, c in _FAILED.findall(console)}
    said.update(codes or {})
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


class Console(Protocol):
    """The node's console (launcher.runtime.runner.Tee): what it writes is shown and kept in its log."""

    tail: bytes

    def write(self, data: bytes) -> None: ...

    def say(self, line: str) -> None: ...


def run_node(layout: Layout, launcher: str, peers: list[str], entry: str, args: list[str], env: dict[str, str],
             out: Path, console: Console) -> int:
    """This node's ranks started, rank 0's console (on node 0) teed, until they end; each rank's end recorded in
    _launcher/ranks.json. Its exit status: torchrun's, or the first of its workers' to fail."""
    import subprocess  # only in the node's runner: a rank's interpreter does not pay for it

    ranks = layout.global_ranks()
    how = {"torchrun": f"rendezvous at {layout.master_addr}:{layout.master_port} (torchrun, static)",
           "tf_config": "TensorFlow workers (TF_CONFIG)",
           "jax_distributed": f"JAX processes, coordinator at {peers[0]}:{layout.master_port}"}.get(launcher, launcher)
    console.say(f"node {layout.node_rank} of {layout.nodes}: ranks {ranks.start} to {ranks.stop - 1} of "
                f"{layout.world_size}, {how}")
    if layout.nodes > 1 and GLOO_IFNAME not in env:  # nodes on their hosts' networks: the interface to node 0
        found = interface_towards(peers[0] if launcher != "torchrun" else layout.master_addr)
        if found:
            env = {**env, GLOO_IFNAME: found}
            console.say(f"Gloo over {found}, the interface towards node 0")
    codes: dict[int, int] = {}
    if launcher == "torchrun":
        procs = {ranks.start: subprocess.Popen(torchrun_argv(sys.executable, layout, entry, args),
                                               env={**env, ENV: "torchrun"}, cwd=str(out.resolve()),
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)}
        rc = _watch(procs, console, ranks.start)
    else:
        procs = {}
        for local in range(layout.procs_per_node):
            rank = ranks.start + local
            procs[rank] = subprocess.Popen([sys.executable, "-m", "launcher.runtime.child", entry, *args],
                                           env={**env, **worker_env(layout, peers, local, launcher)},
                                           cwd=str(out.resolve()),
                                           stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                           stderr=subprocess.STDOUT)
        rc = _watch(procs, console, 0)
        codes = {rank: _shell_code(p.returncode) for rank, p in procs.items() if p.returncode is not None}
    rows = node_ranks(out, layout, console.tail.decode("utf-8", "replace"), codes)
    doc = {"nodes": layout.nodes, "procs_per_node": layout.procs_per_node, "node_rank": layout.node_rank,
           "launcher": launcher, "ranks": rows}
    tmp = out / (RANKS_JSON + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out / RANKS_JSON)
    failed = [r for r in rows if r["exit_code"] not in (0, None)]
    if failed:  # the first to fail on its own, not one stopped for it (SIGTERM's 143), when there is one
        row = next((r for r in failed if r["exit_code"] != STOPPED), failed[0])
        console.say(f"rank {row['rank']} (node {row['node']}) ended with exit code {row['exit_code']}")
    return _shell_code(rc)


def interface_towards(addr: str) -> str | None:
    """The name of this machine's network interface whose IPv4 address routes to addr (a node on its host's network
    finds Gloo's interface so); None when it cannot tell."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((addr, 9))  # no packet is sent: the kernel picks the route and the source address
            local = probe.getsockname()[0]
        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:  # SIOCGIFADDR: the interface's address
                    packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                except OSError:
                    continue
            if socket.inet_ntoa(packed[20:24]) == local:
                return name
    except OSError:
        return None
    return None


def _shell_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def _watch(procs: dict[int, subprocess.Popen[bytes]], console: Console, teed: int) -> int:
    """Wait for the node's processes, the console of the one ``teed`` shown as it comes (if it runs here), signals
    passed on to all; the first to fail stops the others. The exit status: the first failure's, else 0."""
    import threading

    first: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    def watch() -> None:
        while None in [p.poll() for p in procs.values()]:  # every one polled (any() would stop at the first)
            failed = [p.returncode for p in procs.values() if p.returncode not in (None, 0)]
            if failed and not first:
                first.append(failed[0])
                forward(signal.SIGTERM, None)
            time.sleep(0.2)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        stream = procs[teed].stdout if teed in procs else None
        if stream is not None:
            for chunk in iter(lambda: stream.read1(1 << 16), b""):  # type: ignore[attr-defined]
                console.write(chunk)
        for proc in procs.values():
            proc.wait()
        watcher.join()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    codes = [p.returncode for p in procs.values()]
    return first[0] if first else next((c for c in codes if c != 0), 0)
