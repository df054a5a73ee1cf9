"""The run container's contract (design.md) as data: its name, its label, its mounts, its command,
its `docker run` argv."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.hosts.containerspec import ContainerSpec, Mount
from launcher.records.records import BAKED, MOUNTED, LaunchRecord
from launcher.runtime.distributed import RANKS
from launcher.specs.recipes import ParamValue, Recipe
from launcher.specs.topology import Topology

RUN_LABEL = "org.launcher.run"
CONTAINER_OUT = "/launcher/out"
CONTAINER_DATA = "/launcher/data"
CONTAINER_CODE = "/launcher/code"
IMAGE_RECIPES = "/opt/launcher/recipes"
OWNER_ENV = "LAUNCHER_OWNER"  # who gets the outputs when the run ends (not part of the recorded env)
SECRET_ENV_FILE = "secret.env"  # noqa: S105 - a file name: in the run's host directory, beside out/ (never pulled)


NODE_LABEL = "org.launcher.node"  # a run of several nodes: the containers of nodes 1 and on (node 0: RUN_LABEL)
NODES = "nodes"  # node k's outputs (k >= 1): nodes/<k>/ under the run's outputs


def container_name(run_id: str, node: int = 0) -> str:
    """The run's container (node 0's), or node k's of a run of several nodes."""
    return f"launcher-{run_id}" if node == 0 else f"launcher-{run_id}-node{node}"


def network_name(run_id: str) -> str:
    """The private network of a run of several nodes."""
    return f"launcher-{run_id}"


def node_outputs(host_out: str, node: int) -> str:
    """Where node k's container writes on the host: the run's outputs for node 0, nodes/<k>/ below them else."""
    return host_out if node == 0 else f"{host_out}/{NODES}/{node}"


@dataclass(frozen=True)
class ContainerJob:
    """One run's container, whatever places it: the image, the determinism env, the runtime's
    arguments and the host folders it mounts. host_code: the code folder on the host, mounted
    read-only (a plain script's project, or a recipe folder run without baking); code_entry: the
    script inside it. owner ("UID:GID"): who gets the outputs when the run ends (the container
    runs as root; the user on the host should own what it wrote); the placement sets it.
    user_env: the user's --env variables (on the command line as -e NAME=VALUE); secret_env: the
    --secret-env ones, which travel only in the env file env_file on the host (the placement writes
    it, readable by the user alone, and sets env_file)."""

    run_id: str
    image_id: str
    env: Mapping[str, str]
    host_out: str
    recipe: Recipe
    params: Mapping[str, ParamValue]
    data: str | None = None
    gpu: bool = False
    host_code: str | None = None
    code_entry: str | None = None
    args: Sequence[str] = ()
    owner: str | None = None
    probes: Mapping[str, Any] | None = None  # --probes: the probe set to record instead of recipe.toml's
    no_probes: bool = False  # --probes off: record none, whatever recipe.toml says
    user_env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    env_file: str | None = None
    topology: Topology | None = None  # several processes (--nodes, --procs-per-node); None: one
    node: int = 0  # which node's container this is (a run of several nodes)
    network: str | None = None  # the run's private network (several nodes), or "host" (one node per host)
    peers: Sequence[str] = ()  # one node per host: every node's address as the others reach it, node 0's first

    @property
    def name(self) -> str:
        return container_name(self.run_id, self.node)

    @property
    def master(self) -> str:
        """Rank 0's node as the other nodes reach it: its host's address (one node per host), its container's name
        on the private network, or this container (one node)."""
        if self.peers:
            return self.peers[0]
        return container_name(self.run_id) if self.network else "localhost"

    @property
    def run_dir(self) -> str:
        """The run's directory on the host (host_out is its out/)."""
        return self.host_out.rsplit("/", 1)[0]

    @property
    def user_env_names(self) -> list[str]:
        """The names of the user's variables, secret or not (what `launcher env RUN` may print)."""
        return sorted({*self.user_env, *self.secret_env})


def env_file_text(job: ContainerJob) -> bytes:
    """The secret variables as Docker's --env-file reads them (NAME=VALUE lines, no quoting)."""
    return "".join(f"{k}={v}\n" for k, v in sorted(job.secret_env.items())).encode("utf-8")


def runtime_argv(job: ContainerJob) -> list[str]:
    """The command the container runs: launcher's runtime with the recipe or script, its outputs and data."""
    argv = ["python", "-m", "launcher.runtime", "run"]
    if job.host_code and job.recipe.adhoc:
        argv += ["--script", f"{CONTAINER_CODE}/{job.code_entry or job.recipe.path.name}",
                 "--code-root", CONTAINER_CODE]
    elif job.host_code:
        argv += ["--recipe", CONTAINER_CODE]
    else:
        argv += ["--recipe", f"{IMAGE_RECIPES}/{job.recipe.name}"]
    argv += ["--code-source", MOUNTED if job.host_code else BAKED, "--out", CONTAINER_OUT]
    if job.data:
        argv += ["--data", CONTAINER_DATA]
    if job.no_probes:
        argv += ["--no-probes"]
    elif job.probes is not None:
        argv += ["--probes", json.dumps(dict(job.probes), sort_keys=True, separators=(",", ":"))]
    argv += ["--params", json.dumps(dict(job.params), sort_keys=True, separators=(",", ":"))]
    if job.topology is not None:
        peers = (list(job.peers) if job.peers
                 else [container_name(job.run_id, k) for k in range(job.topology.nodes)] if job.network
                 else ["localhost"])
        argv += job.topology.runtime_args(job.node, job.master, peers)
    if job.args:
        argv += ["--", *job.args]
    return argv


def mounts(job: ContainerJob) -> list[tuple[str, str, bool]]:
    """(host path, container path, read-only) for each folder the container sees."""
    out = [(node_outputs(job.host_out, job.node), CONTAINER_OUT, False)]
    if job.node != 0:  # every rank's records in the run's ranks/ folder, whichever node it ran on
        out.append((f"{job.host_out}/{RANKS}", f"{CONTAINER_OUT}/{RANKS}", False))
    if job.data:
        out.append((job.data, CONTAINER_DATA, True))
    if job.host_code:
        out.append((job.host_code, CONTAINER_CODE, True))
    return out


def launch_spec(launch: LaunchRecord) -> ContainerSpec | None:
    """The container a launch record says the run was started as (RunDir.read_launch brought an older record's
    command line to a spec); None when it kept none or it cannot be read."""
    try:
        return ContainerSpec.from_record(launch["container_spec"]) if launch.get("container_spec") else None
    except (ValueError, KeyError, TypeError):
        return None


def container_spec(job: ContainerJob, *, detach: bool = True) -> ContainerSpec:
    """The container contract of design.md as a ContainerSpec (detached, unless a batch job waits on it)."""
    if job.secret_env and not job.env_file:  # a secret's value never goes on a command line
        raise ValueError(f"run {job.run_id} has secret variables but no env file to pass them in")
    env = {**job.env, **job.user_env}
    if job.owner:
        env[OWNER_ENV] = job.owner
    return ContainerSpec(
        image=job.image_id, command=tuple(runtime_argv(job)), name=job.name,
        labels={RUN_LABEL if job.node == 0 else NODE_LABEL: job.run_id},
        env=env, env_file=job.env_file if job.secret_env else None,
        mounts=tuple(Mount(src, dst, ro) for src, dst, ro in mounts(job)), gpus="all" if job.gpu else None,
        network=job.network, detach=detach)
