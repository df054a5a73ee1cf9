"""A run of several processes and nodes before it is placed (`--nodes N --procs-per-node M`): its rank layout,
the collective backend and the settings that pin the collectives, the runtime arguments of each node, and what
the launch record and the manifest keep of it (``topology``).

Ranks are laid out node-major and fixed: node k runs global ranks ``k*M`` to ``k*M + M - 1``, local rank i being
global rank ``k*M + i``, the same in every replicate (torchrun's static rendezvous with an explicit node rank;
launcher.runtime.distributed starts it in each node's container).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from launcher.errors import UsageError
from launcher.runtime.distributed import COLLECTIVE_ENV, LAUNCHERS, MASTER_PORT
from launcher.runtime.reduction import MODES as REDUCTIONS

if TYPE_CHECKING:
    from launcher.records.ranks import RankRow, TopologyRecord

DESCRIBED = {  # launcher.runtime.distributed.LAUNCHERS' values, as the records say them
    "torchrun": "torchrun (static rendezvous, explicit node rank)",
    "tf_config": "TF_CONFIG per worker (MultiWorkerMirroredStrategy), each worker started by launcher's runtime",
    "jax_distributed": "jax.distributed.initialize per process (coordinator on node 0, CPU collectives over Gloo), "
                       "each process started by launcher's runtime",
}
FRAMEWORKS = tuple(LAUNCHERS)  # the frameworks whose ranks launcher can start
MAX_WORLD = 1024
PRIVATE = "private"  # the nodes share a network launcher made on one engine (its interface: eth0)
HOST = "host"  # one node per host, each container on its host's network (the runtime picks Gloo's interface)


@dataclass(frozen=True)
class Topology:
    nodes: int = 1
    procs_per_node: int = 1
    backend: str = "gloo"  # gloo on CPUs, nccl on GPUs
    master_port: int = MASTER_PORT
    launcher: str = "torchrun"  # how each node starts its ranks: the framework's (for_framework)
    network: str = PRIVATE  # PRIVATE: the nodes' containers on one engine's private network; HOST: one per host


    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def ranks(self) -> list[RankRow]:
        """Every rank: its node and its local rank there."""
        return [{"rank": node * self.procs_per_node + local, "node": node, "local_rank": local}
                for node in range(self.nodes) for local in range(self.procs_per_node)]

    def env(self) -> dict[str, str]:
        """The settings that pin the backend's collectives (injected into every node with the profile). Across
        hosts, Gloo's interface is the one each node routes to node 0 through, which the runtime finds there."""
        env = dict(COLLECTIVE_ENV[self.backend])
        if self.network == HOST:
            env.pop("GLOO_SOCKET_IFNAME", None)
        return env

    def for_framework(self, framework: str) -> Topology:
        """The topology with the framework's own way of starting ranks (PyTorch: torchrun; TensorFlow: TF_CONFIG)."""
        return replace(self, launcher=LAUNCHERS[framework])

    def runtime_args(self, node: int, master_addr: str, peers: list[str]) -> list[str]:
        """The runtime's arguments for one node (launcher.runtime.runner); peers: every node's address."""
        return ["--nodes", str(self.nodes), "--procs-per-node", str(self.procs_per_node), "--node-rank", str(node),
                "--master", f"{master_addr}:{self.master_port}", "--launcher", self.launcher,
                "--peers", ",".join(peers)]

    def record(self, node_hosts: list[str]) -> TopologyRecord:
        """What the launch record keeps: the layout, the backend and its settings, each node's host."""
        return {"nodes": self.nodes, "procs_per_node": self.procs_per_node, "world_size": self.world_size,
                "backend": self.backend, "launcher": DESCRIBED[self.launcher], "master_port": self.master_port,
                "ranks": self.ranks(), "collectives": self.env(), "node_hosts": node_hosts,
                "network": self.network}


def topology_option(nodes: int | None, procs_per_node: int | None, *, gpu: bool) -> Topology | None:
    """--nodes and --procs-per-node parsed: None for one process (neither given, or both 1), else the topology
    (NCCL for a GPU variant, Gloo otherwise); a count below 1 or a world too large is a UsageError."""
    n = 1 if nodes is None else nodes
    m = 1 if procs_per_node is None else procs_per_node
    for flag, value in (("--nodes", n), ("--procs-per-node", m)):
        if value < 1:
            raise UsageError(f"{flag} {value}: a run needs at least one", f"give {flag} 1 or more, or drop it")
    if n * m > MAX_WORLD:
        raise UsageError(f"--nodes {n} --procs-per-node {m}: {n * m} processes, more than {MAX_WORLD}",
                         "give fewer nodes or processes per node")
    if n == 1 and m == 1:
        return None
    return Topology(n, m, "nccl" if gpu else "gloo")


def reduction_option(text: str) -> str:
    """--reduction: default or canonical (launcher.runtime.reduction); anything else is a UsageError."""
    if text not in REDUCTIONS:
        raise UsageError(f"--reduction {text}: not one of {', '.join(REDUCTIONS)}",
                         "give --reduction canonical for gradients summed in a fixed tree, or drop it")
    return text


def check_framework(topology: Topology | None, framework: str, name: str, checkpoints: bool = False) -> None:
    """A run of several processes is started by its framework's own launcher: refuse one launcher cannot start yet,
    or checkpoints (--checkpoint-every) where launcher does not resume every rank yet (PyTorch's alone)."""
    if topology is None:
        return
    if checkpoints and framework in FRAMEWORKS and framework != "torch":
        raise UsageError(f"{name} uses {framework}: launcher checkpoints and resumes runs of several processes for "
                         "PyTorch only so far", "drop --checkpoint-every, or run it as one process")
    if framework in FRAMEWORKS:
        return
    raise UsageError(f"{name} uses {framework}: launcher starts runs of several processes for PyTorch (torchrun), "
                     "TensorFlow (TF_CONFIG) and JAX (jax.distributed) only",
                     "run it as one process (drop --nodes and --procs-per-node)")
