"""Where runs are placed, and how one run there is started, watched, stopped and collected.

:class:`Placement` is the seam a run target implements; :mod:`launcher.runs.lifecycle`,
:mod:`launcher.runs.collect` and :mod:`launcher.runs.control` call nothing else to reach a target.
:class:`DirectPlacement` puts containers on one host's Docker engine (the local one, or one over SSH);
a Slurm cluster is :class:`launcher.targets.slurm.SlurmPlacement`; a cloud VM launcher creates would be a
direct placement on the host it created. Each is named in the launch record by its ``kind`` and reopened from it by
:func:`launcher.targets.registry.open_placement`. The contract a target meets is in docs/design.md.
"""

from __future__ import annotations

import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

from launcher.errors import BadData, CommandFailed, DiskFull, HostNotReady, NoGpu, NotFound, NotResumable
from launcher.hosts.base import Host
from launcher.hosts.engine import Engine
from launcher.hosts.hostspec import HostSpec
from launcher.progress import Reporter
from launcher.records.records import (
    DIRECT,
    CodePlan,
    DataSource,
    ImageRecord,
    LaunchRecord,
    PlacementRecord,
    RunState,
    StartedRecord,
)
from launcher.runtime.distributed import RANKS
from launcher.specs.container import (
    RUN_LABEL,
    SECRET_ENV_FILE,
    ContainerJob,
    container_name,
    container_spec,
    env_file_text,
    launch_spec,
)
from launcher.specs.topology import Topology
from launcher.targets import nodes
from launcher.transfers.ship import ShipResult, ship_image

IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")  # an image's full ID, as `docker run` takes it

MIN_FREE_BYTES = 512 << 20
POLL_NODES_S = 0.5  # how often a run of several nodes is looked at while it runs here
REMOTE_OUT = "out"  # the run's outputs folder, inside its directory on the host


def remote_outputs(remote_dir: str) -> str:
    """The folder on the host a run started in remote_dir writes its outputs to."""
    return f"{remote_dir}/{REMOTE_OUT}"


@dataclass(frozen=True)
class ListedRun:
    run_id: str
    state: str
    status: str


class Placement(ABC):
    """A run target. ``host`` is the machine launcher talks to for it: data, code and images are
    sent there, outputs are read from there (for a cluster, its login node)."""

    kind: str = ""
    parallel: bool = False  # True: a group's runs start together (start_array); False: one after the other

    def __init__(self, host: Host, host_spec: HostSpec | None = None) -> None:
        self.host = host
        self.host_spec = host_spec or HostSpec(None if host.kind == "local" else host.name)

    @property
    def name(self) -> str:
        return self.host.name

    def node_names(self, count: int) -> list[str]:
        """The host of each of a run's ``count`` nodes, by name (one target: its own name for each)."""
        return [self.name] * count

    def topology_for(self, topology: Topology | None) -> Topology | None:
        """The run's topology as this target places it (a UsageError for one it cannot): by default as given."""
        return topology

    def more_outputs(self, launch: LaunchRecord) -> list[tuple[Host, str, str]]:
        """Outputs of the run held elsewhere than ``outputs()`` (nodes on other hosts): each as (host, folder there,
        folder under the run's outputs). None by default."""
        return []

    def rank_outputs(self, launch: LaunchRecord) -> list[tuple[int, Host, str]]:
        """Where each rank of the run writes its records, as (rank, host, folder there): rank 0 in ``outputs()``,
        rank r beside it under ranks/<r>/ (a run of one process: rank 0 alone)."""
        out = self.outputs(launch)
        return [(r, self.host, out if r == 0 else f"{out}/{RANKS}/{r}") for r in range(world_size(launch))]

    def record(self) -> PlacementRecord:  # a target's own fields (SlurmPlacement adds its own)
        """What the launch record keeps to reopen this placement (see targets/registry.py)."""
        return {"kind": self.kind}

    @classmethod
    def reopen(cls, host: Host, host_spec: HostSpec, record: PlacementRecord) -> Placement:  # record()'s
        """The placement again, from its record() and its reopened host."""
        return cls(host, host_spec)

    # -- once per group: can the target run it, and the inputs every run of the group shares
    @abstractmethod
    def prepare(self, gpu: bool) -> None:
        """Fail early (HostNotReady, NoGpu) when the target cannot run the image (``gpu``: it needs a GPU)."""

    def send_data(self, local: Path, reporter: Reporter | None) -> tuple[str, DataSource]:
        """Send a dataset folder from this machine (once per content); return where runs mount it
        from and the data source record."""
        from launcher.transfers import datasets

        placed = datasets.place(self.host, local, reporter)
        return placed.path, placed.source(local)

    def send_code(self, plan: CodePlan, reporter: Reporter | None) -> CodePlan:
        """Put the snapshot of mounted code where runs mount it from (sent once per content)."""
        from launcher.transfers import datasets

        placed = datasets.place(self.host, Path(plan["local"]), reporter, area="code",
                                name=str(plan["digest"]).removeprefix("sha256:"))
        return {**plan, "host_path": placed.path, "sent": placed.sent}

    @abstractmethod
    def ship(self, image: ImageRecord, *, via: str | None, reporter: Reporter | None,
             cache_dir: Path) -> ShipResult:
        """Make the image available where the runs start (only what the target lacks travels)."""

    # -- one run
    def run_dir(self, run_id: str, data: str | None) -> str:
        """Create the run's directory (its outputs go to <dir>/out) after checking room and data."""
        root = self.host.runs_root()
        self.host.makedirs(root)
        free = self.host.free_bytes(root)
        if free < MIN_FREE_BYTES:
            raise DiskFull(
                f"{self.name} has only {free >> 20} MiB free under {root}; a run needs at least "
                f"{MIN_FREE_BYTES >> 20} MiB",
                "free space on the host and retry",
            )
        if data and not self.host.exists(data):
            raise BadData(f"the data path {data} does not exist on {self.name}",
                          "give a path on the host that runs the recipe")
        remote = self.host.run_dir(run_id)
        self.host.makedirs(remote_outputs(remote))
        return remote

    @abstractmethod
    # start/start_array/restart answer a target's own fields for the launch record (LaunchRecord's
    # container, argv, image_ran; SlurmPlacement's slurm): each target's overrides say which
    def start(self, job: ContainerJob) -> StartedRecord:
        """Start the run detached; return what the launch record must keep about it
        (at least ``container`` and, when known, ``image_ran``: the image ID it started from)."""

    def start_array(self, jobs: Sequence[ContainerJob]) -> list[StartedRecord]:
        """Start several runs of one group together (a parallel target); by default one by one."""
        return [self.start(job) for job in jobs]

    def restart(self, launch: LaunchRecord, env: Mapping[str, str]) -> StartedRecord:
        """Start the run's container again, as it was started, with env added (``launcher resume``;
        its previous container removed first); return what start() returns. Only a direct placement can."""
        raise NotResumable(f"run {launch['run_id']} ran on a {self.kind} target: launcher resumes runs on a "
                           "Docker engine (local or over SSH) only", "start it again with `launcher run`")

    def write_secrets(self, job: ContainerJob) -> ContainerJob:
        """The job with its --secret-env values in an env file in its run directory on ``host``
        (created readable by the user alone, its text sent on stdin, never on a command line)."""
        if not job.secret_env:
            return job
        path = f"{job.run_dir}/{SECRET_ENV_FILE}"
        self.host.write_atomic(path, env_file_text(job), private=True)
        return replace(job, env_file=path)

    def remove_secrets(self, job: ContainerJob) -> None:
        if job.env_file:
            self.host.run(["rm", "-f", "--", job.env_file], check=False)

    @abstractmethod
    def state(self, launch: LaunchRecord) -> RunState | None:
        """None when the target no longer knows the run."""

    def until_ended(self, launch: LaunchRecord) -> None:
        """Return once the run has ended, or sooner: wait_run polls state() after it. By default at once."""
        return None

    @abstractmethod
    def logs(self, launch: LaunchRecord, *, follow: bool = False) -> Iterator[str]: ...

    @abstractmethod
    def stop(self, launch: LaunchRecord) -> RunState | None: ...

    def stopped_with(self, launch: LaunchRecord) -> list[str]:
        """The run ids that stop(launch) stops: the run alone, or every replicate of its job array."""
        return [str(launch["run_id"])]

    @abstractmethod
    def release(self, launch: LaunchRecord) -> None:
        """Forget the finished run on the target (its outputs stay until cleaned)."""

    @abstractmethod
    def listed(self) -> list[ListedRun]:
        """launcher's runs the target knows, with their state."""

    def outputs(self, launch: LaunchRecord) -> str:
        """The folder on ``host`` the run writes its outputs to."""
        return remote_outputs(launch["remote_dir"])

    def close(self) -> None:
        self.host.close()

    def __enter__(self) -> Placement:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class DirectPlacement(Placement):
    """Containers on one host's Docker engine: `docker run -d` there, state and logs from it."""

    kind = DIRECT

    def __init__(self, host: Host, host_spec: HostSpec | None = None) -> None:
        super().__init__(host, host_spec)
        self.engine = Engine(host)
        # containers seen ended, by name: an ended state does not change (RunState) until the container is
        # started again or removed, so the pull after a wait asks the engine once, not twice
        self._ended: dict[str, RunState] = {}
        self._options: list[str] | None = None  # the engine's security options, read by prepare()

    def prepare(self, gpu: bool) -> None:
        self._options = self.engine.require_options()
        if gpu:
            gpu_ready(self.host, self.engine)

    def output_owner(self) -> str | None:
        """Whom this host's containers hand their outputs to (output_owner, with the options prepare() read)."""
        return output_owner(self.host, self.engine, self._options)

    def send_code(self, plan: CodePlan, reporter: Reporter | None) -> CodePlan:
        if self.host.kind == "local":  # the local engine mounts the snapshot where it is
            return {**plan, "host_path": plan["local"], "sent": False}
        return super().send_code(plan, reporter)

    def ship(self, image: ImageRecord, *, via: str | None, reporter: Reporter | None,
             cache_dir: Path) -> ShipResult:
        return ship_image(self.host, image["id"], via=via, tag=image.get("tag"), reporter=reporter,
                          cache_dir=cache_dir)

    def start(self, job: ContainerJob) -> StartedRecord:
        self._ended.pop(job.name, None)
        job = self.write_secrets(replace(job, owner=self.output_owner()))
        if job.topology is not None and job.topology.nodes > 1:
            try:
                return nodes.start(self.engine, job, self.name)
            finally:
                self.remove_secrets(job)
        spec = container_spec(job)
        record: StartedRecord = {"container": job.name, "container_spec": spec.to_record()}
        try:
            started = self.engine.run(spec)
        finally:  # docker reads the file when it creates the container: the values need not stay on disk
            self.remove_secrets(job)
        if started.returncode != 0:
            raise CommandFailed(
                f"the container for {job.run_id} did not start on {self.name}: {started.last_error_line()}",
                "check the image and Docker on the host",
            )
        # started by its full ID, the container runs that very image: asking the engine would tell the same
        ran = job.image_id if IMAGE_ID.fullmatch(job.image_id) else self.engine.container_image(job.name)
        if ran is not None:
            record["image_ran"] = ran
        return record

    def restart(self, launch: LaunchRecord, env: Mapping[str, str]) -> StartedRecord:
        if nodes.containers(launch):
            self._ended.pop(self._container(launch), None)
            return nodes.restart(self.engine, launch, env, self.name)
        spec = launch_spec(launch)
        if spec is None:
            raise NotResumable(f"the launch record of {launch['run_id']} lacks the container's command",
                               "start it again with `launcher run`")
        spec = spec.with_env(env)
        self._ended.pop(self._container(launch), None)
        self.engine.rm(self._container(launch))
        started = self.engine.run(spec)
        if started.returncode != 0:
            raise CommandFailed(
                f"the container for {launch['run_id']} did not start again on {self.name}: {started.last_error_line()}",
                "check the image and Docker on the host",
            )
        record: StartedRecord = {"container": self._container(launch), "container_spec": spec.to_record()}
        ran = self.engine.container_image(self._container(launch))
        if ran is not None:
            record["image_ran"] = ran
        return record

    def _container(self, launch: LaunchRecord) -> str:
        return str(launch.get("container") or container_name(str(launch["run_id"])))

    def state(self, launch: LaunchRecord) -> RunState | None:
        name = self._container(launch)
        if name in self._ended:
            return self._ended[name]
        if nodes.containers(launch):
            state = nodes.state(self.engine, launch)
            if state is not None and state.ended:
                self._ended[name] = state
            return state
        s = self.engine.container_state(name)
        if s is None:
            return None
        running = bool(s.get("Running"))
        state = RunState(
            running=running,
            ended=not running and s.get("Status") in ("exited", "dead", "created"),
            exit_code=int(s["ExitCode"]) if isinstance(s.get("ExitCode"), int) else None,
            started_at=s.get("StartedAt"),
            finished_at=s.get("FinishedAt"),
        )
        if state.ended:
            self._ended[name] = state
        return state

    def until_ended(self, launch: LaunchRecord) -> None:
        if nodes.containers(launch):  # polled: the first node to fail stops the others (nodes.state)
            while (state := self.state(launch)) is not None and not state.ended:
                time.sleep(POLL_NODES_S)
        elif self.host.kind == "local":  # `docker wait` returns as the container exits; a host over SSH is polled
            self.engine.wait(self._container(launch))

    def logs(self, launch: LaunchRecord, *, follow: bool = False) -> Iterator[str]:
        if follow and nodes.containers(launch):  # node 0's log ends with node 0: a failed node must stop it
            threading.Thread(target=self.until_ended, args=(launch,), daemon=True).start()
        return self.engine.logs(self._container(launch), follow=follow)

    def stop(self, launch: LaunchRecord) -> RunState | None:
        if nodes.containers(launch):
            if not nodes.stop(self.engine, launch, timeout_s=10):
                raise NotFound(f"run {launch['run_id']} has no node containers on {self.name}",
                               "it may have finished already: `launcher pull RUN`")
            return self.state(launch)
        done = self.engine.stop(self._container(launch), timeout_s=10)
        if done.returncode != 0:
            raise NotFound(
                f"run {launch['run_id']} has no container on {self.name}: {done.last_error_line()}",
                "it may have finished already: `launcher pull RUN`",
            )
        return self.state(launch)

    def release(self, launch: LaunchRecord) -> None:
        self._ended.pop(self._container(launch), None)
        if nodes.containers(launch):
            nodes.remove(self.engine, nodes.containers(launch), launch.get("network"))
            return
        self.engine.rm(self._container(launch))

    def listed(self) -> list[ListedRun]:
        fmt = '{{.Label "' + RUN_LABEL + '"}}\t{{.State}}\t{{.Status}}'
        out = []
        for line in self.engine.ps_by_label(RUN_LABEL, fmt):
            rid, _, rest = line.partition("\t")
            state, _, status = rest.partition("\t")
            out.append(ListedRun(rid, state, status))
        return out


def placement_for(target: Host | Placement, host_spec: HostSpec | None = None) -> Placement:
    """A Placement as it is, or an opened host as the direct placement on it."""
    return target if isinstance(target, Placement) else DirectPlacement(target, host_spec)


def gpu_ready(host: Host, engine: Engine | None = None) -> None:
    runtimes = (engine or Engine(host)).runtimes()
    smi = host.run(["nvidia-smi", "-L"], check=False)
    if smi.returncode != 0 or "GPU" not in smi.out:
        raise NoGpu(
            f"{host.name} has no NVIDIA GPU that nvidia-smi can see, so a GPU variant cannot run there",
            "use a CPU variant (e.g. --variant cpu or torch-cpu), or a GPU host with its driver installed",
        )
    if "nvidia" not in runtimes:
        raise HostNotReady(
            f"Docker on {host.name} has no NVIDIA runtime",
            f"run `launcher provision --host {host.name} --gpu --install`",
        )


def world_size(launch: LaunchRecord) -> int:
    """The run's number of ranks (1 for a run of one process)."""
    topology = launch.get("topology")
    size = topology.get("world_size") if isinstance(topology, dict) else None
    return size if isinstance(size, int) and size > 0 else 1


def output_owner(host: Host, engine: Engine | None = None, options: list[str] | None = None) -> str | None:
    """Whom the container should hand its outputs to: the host user, unless Docker there is
    rootless or remaps user namespaces. Then the container's root already writes as that user
    on the host, and a chown inside would hand the files to a subordinate ID instead.
    options: the engine's security options when already read (Engine.require_options)."""
    opts = options if options is not None else (engine or Engine(host)).security_options()
    if opts is None or any("rootless" in o or "userns" in o for o in opts):
        return None
    return host.owner()
