"""A Slurm cluster as a run target, reached through its login node over SSH.

The replicates of a group become one job array. launcher's area on the login node
(``~/.launcher``: run directories, datasets, code snapshots, images) must be on the filesystem
the compute nodes share with it, as a home directory on a cluster is. The image reaches the nodes
in one of two ways, never by a tag:

- through a registry the nodes can pull from (the default once ``provision --registry`` has
  recorded one in the cluster's settings, ``~/.launcher/cluster.json``): launcher pushes the image
  from here (only the layers the registry lacks) and each task pulls it by manifest digest;
- through the shared filesystem (air-gapped clusters, and ``--ship-via shared``): the image travels
  once as a `docker save` archive named by its image ID under ``~/.launcher/images/``.

Either way each array task fetches the image only when its node lacks that image ID, checks that the
image it is about to run has the pinned ID, runs the same container as a direct run (docs/design.md),
and writes ``task.json`` (exit code, node, job and array index) and the node's fact sheet into its
run directory. launcher reads those, squeue, and sacct where the cluster keeps accounting, to know
a replicate's state. On clusters whose nodes run containers through Pyxis/enroot rather than a
Docker engine (settings ``"runtime": "pyxis"``), each task runs ``srun --container-image`` with the
image pinned by digest instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

from launcher.errors import (
    CommandFailed,
    Corrupt,
    SlurmRefused,
    UnknownPartition,
    UsageError,
)
from launcher.hosts import engine
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.hosts.scripts import text as host_script
from launcher.progress import Reporter
from launcher.records.records import (
    ImageRecord,
    ImageSource,
    LaunchRecord,
    PlacementRecord,
    RunState,
    SlurmJob,
    SlurmRunInfo,
    StartedRecord,
)
from launcher.runtime.distributed import RANKS
from launcher.specs.container import ContainerJob, container_spec, mounts, node_outputs, runtime_argv
from launcher.specs.topology import HOST, Topology
from launcher.targets.cluster import (
    DOCKER_RUNTIME,
    PYXIS_RUNTIME,
    RUNTIMES,
    ClusterSettings,
    read_settings,
    require_slurm,
)
from launcher.targets.placement import ListedRun, Placement
from launcher.transfers.ship import REGISTRY_SOURCE, ShipResult, push_for_nodes, save_to_archive

if TYPE_CHECKING:
    from launcher.hosts.provision import HostFacts, NoFacts

JOB_NAME = "launcher"
# the files the task script (hosts/scripts/slurm_task.sh) writes into the run's folder, by these names
TASK_FILE = "task.json"
NODE_FACTS = "node-facts.txt"
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")
SHARED_VIA = "shared"  # --ship-via shared: the image archive on the shared filesystem, even with a registry set
REGISTRY_VIA = REGISTRY_SOURCE  # the image source of tasks that pull from the cluster's registry by digest
SLURM_AREA = "slurm"  # launcher's area on the login node for job arrays: one folder per array, and JOBS
JOBS = "jobs"  # under SLURM_AREA: a file per submitted job ID naming its array's folder
RUNS_TABLE = "runs.txt"  # in an array's folder: "INDEX RUN_ID" per task
TASK_ARGS = "task.args"  # the task script's values, NUL-separated (hosts/scripts/slurm_task.sh reads them)
TASK_SCRIPT = "task.sh"  # hosts/scripts/slurm_task.sh, written into each run's folder
NODES_SCRIPT = "nodes.sh"  # hosts/scripts/slurm_nodes.sh, a run of several nodes: one task.sh on each node
NODE_ARGS = "task-node{}.args"  # a run of several nodes: node K's task values
ARRAY_SCRIPT = "array.sh"  # hosts/scripts/slurm_array.sh, written into the array's folder and given to sbatch
ARRAY_TASKS = "tasks"  # the task script of each array index, NUL-separated (slurm_array.sh reads them)
# sacct states of a task that ended without writing task.json (killed before or outside its script)
CANCELLED_STATES = ("CANCELLED", "PREEMPTED", "REVOKED", "DEADLINE")


class TaskResult(TypedDict):
    """The run folder's task.json, written by hosts/scripts/slurm_task.sh when its task ends."""

    exit_code: int
    status: str
    node: str
    job_id: str
    array_index: str
    partition: str
    image_ran: str
    error: str
    ended_at: str
    nodes: NotRequired[str]  # a run of several nodes (slurm_nodes.sh): the job's nodes, comma-separated


def pyxis_image(ref: str) -> str:
    """REGISTRY/REPO@DIGEST as Pyxis/enroot name it: REGISTRY#REPO@DIGEST (a bare name means Docker Hub)."""
    name, _, digest = ref.partition("@")
    registry, _, repo = name.partition("/")
    return f"{registry}#{repo}@{digest}"


def pyxis_srun_argv(job: ContainerJob, ref: str) -> list[str]:
    """The container contract of design.md as one `srun` step under Pyxis: the image pinned by digest,
    the same mounts and the runtime's command; the determinism environment is exported by the task
    script and named in --container-env so it overrides the image's own values."""
    binds = ",".join(f"{host}:{inside}" + (":ro" if ro else "") for host, inside, ro in mounts(job))
    argv = ["srun", "--ntasks=1", f"--container-image={pyxis_image(ref)}", f"--container-mounts={binds}",
            "--no-container-mount-home", "--container-workdir=/"]
    names = sorted({*job.env, *job.user_env_names})
    if names:
        argv.append("--container-env=" + ",".join(names))
    return [*argv, *runtime_argv(job)]


class SlurmPlacement(Placement):
    """Replicates as a Slurm job array, each task a container on its node's Docker engine. The launch
    records and values of the Placement interface keep the types placement.py gives them."""

    kind = "slurm"
    parallel = True

    def __init__(self, host: Host, host_spec: HostSpec | None = None, *, partition: str | None = None,
                 options: Mapping[str, str] | None = None, max_parallel: int | None = None) -> None:
        super().__init__(host, host_spec)
        self.partition = partition
        self.options = dict(options or {})
        self.max_parallel = max_parallel
        self.settings: ClusterSettings = {}
        self.image_source: ImageSource = {"kind": SHARED_VIA}  # where the tasks get the image
        self._topology: Topology | None = None  # a run of several nodes (topology_for): one job of N nodes each

    @classmethod
    def reopen(cls, host: Host, host_spec: HostSpec, record: PlacementRecord) -> Placement:
        placement = cls(host, host_spec, partition=record.get("partition"), options=record.get("options") or {},
                        max_parallel=record.get("max_parallel"))
        source = record.get("image_source")
        placement.image_source = cast(ImageSource, dict(source)) if isinstance(source, Mapping) and isinstance(
            source.get("kind"), str) else {"kind": SHARED_VIA}
        placement.settings = {"runtime": str(record.get("runtime") or DOCKER_RUNTIME)}
        return placement

    @property
    def runtime(self) -> str:
        return str(self.settings.get("runtime") or DOCKER_RUNTIME)

    def record(self) -> PlacementRecord:
        return {"kind": self.kind, "partition": self.partition, "options": self.options,
                "max_parallel": self.max_parallel, "image_source": self.image_source, "runtime": self.runtime}

    def topology_for(self, topology: Topology | None) -> Topology | None:
        """A run of several nodes: one job of N nodes, each node's container on its node's network (Docker on the
        nodes; Pyxis runs one process per task and is refused)."""
        if topology is None or topology.nodes == 1:
            return topology
        self._topology = replace(topology, network=HOST)
        return self._topology

    def node_names(self, count: int) -> list[str]:
        """Not known before the job runs: Slurm allocates the nodes (the manifest's placement names them)."""
        return [f"{self.name}: node {k} of the Slurm job" for k in range(count)]

    # -- checks before anything is sent
    def prepare(self, gpu: bool) -> None:
        require_slurm(self.host)
        if self.partition:
            listed = self.host.run(["sinfo", "-h", "-o", "%P"], check=False)
            names = {p.strip().rstrip("*") for p in listed.out.split()}
            if self.partition not in names:
                raise UnknownPartition(
                    f"the cluster has no partition {self.partition!r} (it has: {', '.join(sorted(names)) or 'none'})",
                    "pick one of those with --partition, or drop --partition for the default",
                )
        self.settings = read_settings(self.host)
        if self.runtime not in RUNTIMES:
            raise UsageError(f"the cluster's settings name an unknown container runtime {self.runtime!r}",
                             "run `launcher provision --scheduler slurm --container-runtime docker|pyxis`")
        if self._topology is not None and self.runtime == PYXIS_RUNTIME:
            raise UsageError("runs of several nodes on a cluster whose nodes run containers through Pyxis are not "
                             "supported yet", "give --nodes 1 (one node, several --procs-per-node), or run on a "
                             "cluster with Docker on its nodes")
        if self.options or self.max_parallel or self._topology is not None:
            self._test_submit(gpu)  # a job of N nodes: refused now where the partition has fewer

    def _sbatch_options(self, n: int, gpu: bool, topology: Topology | None = None) -> list[str]:
        """The sbatch options of an n-task array (without output paths), on its command line:
        array, partition, GPUs, --slurm-opt; a run of several nodes: each task N nodes, one task on each."""
        limit = f"%{self.max_parallel}" if self.max_parallel else ""
        opts = [f"--job-name={JOB_NAME}", f"--array=0-{n - 1}{limit}"]
        if topology is not None and topology.nodes > 1:  # whole nodes: each node's ranks listen on its ports
            opts += [f"--nodes={topology.nodes}", "--ntasks-per-node=1"]
            if "exclusive" not in self.options and "oversubscribe" not in self.options:
                opts.append("--exclusive")
        if self.partition:
            opts.append(f"--partition={self.partition}")
        gpus_given = any(k in self.options for k in ("gpus-per-task", "gpus-per-node", "gres"))
        if gpu and not gpus_given and topology is not None and topology.nodes > 1:
            opts.append(f"--gpus-per-node={topology.procs_per_node}")
        elif gpu and not gpus_given:
            opts.append("--gpus-per-task=1")
        opts += [f"--{k}={v}" if v else f"--{k}" for k, v in sorted(self.options.items())]
        return opts

    def _test_submit(self, gpu: bool) -> None:
        """Let sbatch judge the --slurm-opt values before anything is shipped (`--test-only` submits nothing)."""
        done = self.host.run(["sbatch", "--test-only", *self._sbatch_options(1, gpu, self._topology),
                              "--output=/dev/null", "--wrap=true"], check=False)
        if done.returncode != 0:
            fix = ("correct or drop the --slurm-opt (or --max-parallel) value it names; "
                   "`sbatch --help` on the login node lists the options")
            if self._topology is not None:
                fix = f"give --nodes no more than the partition's nodes (`sinfo` on the login node), or {fix}"
            raise SlurmRefused(
                f"sbatch on {self.name} refuses the job: {done.last_error_line() or 'no reason given'}", fix)

    # -- the image, once, on the shared filesystem
    def image_archive(self, image_id: str) -> str:
        return self.host.area("images", f"{image_id.removeprefix('sha256:')}.tar")  # shared with the nodes

    def ship(self, image: ImageRecord, *, via: str | None, reporter: Reporter | None,
             cache_dir: Path) -> ShipResult:
        registry = None if via == SHARED_VIA else (via or self.settings.get("registry"))
        if registry:  # pushed from here, once per placement; every task pulls it by manifest digest
            shipped, self.image_source = push_for_nodes(str(image["id"]), registry, self.image_source, reporter)
            return shipped
        if self.runtime == PYXIS_RUNTIME:
            raise UsageError("Pyxis runs images from a registry; this cluster has none set",
                             "run `launcher provision --scheduler slurm --registry ADDRESS`, or give --ship-via")
        self.image_source = {"kind": SHARED_VIA}
        image_id = str(image["id"])
        archive = self.image_archive(image_id)
        if self.host.exists(archive):
            return ShipResult(image_id=image_id, skipped=True)
        return save_to_archive(self.host, image_id, archive, reporter, where=f"{self.name}'s shared filesystem")

    # -- the job array
    def start(self, job: ContainerJob) -> StartedRecord:
        return self.start_array([job])[0]

    def _task_args(self, job: ContainerJob, owner: str | None) -> bytes:
        """The values of the task script (hosts/scripts/slurm_task.sh, written as task.sh) for one
        job, NUL-separated as it reads them from task.args: nothing of them is written into code."""
        if self.runtime == PYXIS_RUNTIME:
            # the secrets stay in their file, exported on the node from there (never in task.args)
            exported = {**job.env, **job.user_env}
            exports = [f"{k}={v}" for k, v in sorted(exported.items())]
            command = pyxis_srun_argv(job, self.image_source["ref"])
        else:
            exports = []
            command = engine.render(container_spec(replace(job, owner=owner), detach=False))
        if self.image_source.get("kind") == REGISTRY_VIA:
            source_kind, source = REGISTRY_VIA, self.image_source["ref"]
        else:
            source_kind, source = SHARED_VIA, self.image_archive(job.image_id)
        fields = [self.runtime, job.image_id, job.name, job.env_file or "", source_kind, source,
                  host_script("facts.sh"), str(len(exports)), *exports, *command]
        return b"".join(f.encode() + b"\0" for f in fields)

    def _node_args(self, job: ContainerJob, owner: str | None) -> list[bytes]:
        """Each node's task values of a run of several nodes (task-node<K>.args): node K's container on its node's
        network, the nodes named @NODE<J>@ (slurm_task.sh puts the job's node names in their place)."""
        assert job.topology is not None
        names = tuple(f"@NODE{j}@" for j in range(job.topology.nodes))
        return [self._task_args(replace(job, node=k, network="host", peers=names), owner)
                for k in range(job.topology.nodes)]

    def _nodes(self, job: ContainerJob) -> int:
        return job.topology.nodes if job.topology is not None else 1

    def start_array(self, jobs: Sequence[ContainerJob]) -> list[StartedRecord]:
        """Submit the jobs as one array: task i runs jobs[i] (a run of N nodes: N nodes, one task on each).
        Returns each job's launch fields."""
        owner = self.host.owner()  # the same user runs the tasks on every node; it gets the outputs
        key = jobs[0].run_id
        array_dir = self.host.area(SLURM_AREA, key)
        self.host.makedirs(array_dir)
        jobs = [self.write_secrets(job) for job in jobs]  # read on the node when the task runs, then removed
        run_dirs = [job.run_dir for job in jobs]
        scripts = []
        for job, run_dir in zip(jobs, run_dirs, strict=True):
            self._write(f"{run_dir}/{TASK_SCRIPT}", host_script("slurm_task.sh"))
            if self._nodes(job) > 1:
                for k, args in enumerate(self._node_args(job, owner)):
                    self.host.makedirs(node_outputs(job.host_out, k))
                    self._write(f"{run_dir}/{NODE_ARGS.format(k)}", args)
                self.host.makedirs(f"{job.host_out}/{RANKS}")
                self._write(f"{run_dir}/{NODES_SCRIPT}", host_script("slurm_nodes.sh"))
                scripts.append(f"{run_dir}/{NODES_SCRIPT}")
            else:
                self._write(f"{run_dir}/{TASK_ARGS}", self._task_args(job, owner))
                scripts.append(f"{run_dir}/{TASK_SCRIPT}")
        self._write(f"{array_dir}/{ARRAY_TASKS}", b"".join(path.encode() + b"\0" for path in scripts))
        self._write(f"{array_dir}/{ARRAY_SCRIPT}", host_script("slurm_array.sh"))
        self._write(f"{array_dir}/{RUNS_TABLE}", "".join(f"{i} {job.run_id}\n" for i, job in enumerate(jobs)))
        opts = [*self._sbatch_options(len(jobs), any(job.gpu for job in jobs), jobs[0].topology),
                f"--output={array_dir}/task-%a.log", "--open-mode=append"]
        done = self.host.run(["sbatch", "--parsable", *opts, f"{array_dir}/{ARRAY_SCRIPT}", array_dir], check=False)
        job_id = done.out.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            raise SlurmRefused(f"sbatch refused the job array on {self.name}: {done.last_error_line()}",
                               "check the partition and --slurm-opt values against the cluster's limits")
        self._write(self.host.area(SLURM_AREA, JOBS, job_id), key + "\n")
        placed: list[SlurmJob] = [{"job_id": job_id, "array_index": i, "array_size": len(jobs),
                                   "log": f"{array_dir}/task-{i}.log", "run_dir": run_dir}
                                  for i, run_dir in enumerate(run_dirs)]
        return [{"container": job.name, "slurm": slurm} for job, slurm in zip(jobs, placed, strict=True)]

    def _write(self, path: str, data: str | bytes) -> None:
        self.host.write_atomic(path, data.encode() if isinstance(data, str) else data)

    # -- watching and collecting
    @staticmethod
    def _slurm(launch: LaunchRecord) -> SlurmJob:
        rec = launch.get("slurm")
        if not isinstance(rec, Mapping):
            raise UsageError(f"run {launch.get('run_id')} has no Slurm job in its launch record",
                             "it was not started on a cluster")
        missing = [k for k in ("job_id", "array_index", "log", "run_dir") if k not in rec]
        if missing:
            raise Corrupt(f"run {launch.get('run_id')}'s launch record names its Slurm job without "
                          f"{', '.join(missing)}", "the run's launch.json was changed by hand; stop the job with "
                          "scancel on the login node")
        return rec

    def _task(self, s: SlurmJob) -> TaskResult | None:
        text = self.host.read_text(f"{s['run_dir']}/{TASK_FILE}")
        if not text:
            return None
        try:
            rec = json.loads(text)
        except ValueError:
            return None
        return cast(TaskResult, rec) if isinstance(rec, dict) else None

    def _queued(self, s: SlurmJob) -> str | None:
        done = self.host.run(["squeue", "-h", "-j", f"{s['job_id']}_{s['array_index']}", "-o", "%T"], check=False)
        states = [x for x in done.out.split() if x]
        if not states:  # squeue names a pending array by its job id alone until tasks split off
            done = self.host.run(["squeue", "-h", "-r", "-j", str(s["job_id"]), "-o", "%K %T"], check=False)
            for line in done.out.splitlines():
                idx, _, state = line.partition(" ")
                if idx.strip() == str(s["array_index"]):
                    states = [state.strip()]
        return states[0] if states else None

    def state(self, launch: LaunchRecord) -> RunState | None:
        s = self._slurm(launch)
        task = self._task(s)
        if task is None:
            queued = self._queued(s)
            if queued in ACTIVE:
                return RunState(running=True, ended=False)
            task = self._task(s)  # it may have ended between the two reads
        if task is None:
            return self._ended_unseen(s)
        info = self._slurm_info(s)
        info.update({"node": task.get("node"), "job_id": task.get("job_id"), "array_index": task.get("array_index"),
                     "partition": task.get("partition"), "error": task.get("error")})
        if task.get("nodes"):
            info["nodes"] = [n for n in str(task.get("nodes")).split(",") if n]
        info["node_facts"] = self._node_facts(s)
        code = task.get("exit_code")
        return RunState(running=False, ended=True, exit_code=int(code) if isinstance(code, int) else None,
                        finished_at=task.get("ended_at"), status=str(task.get("status") or "") or None,
                        image_ran=task.get("image_ran") or None, info=info)

    def _node_facts(self, s: SlurmJob) -> HostFacts | NoFacts:
        """The fact sheet the task wrote of its node ({} where it wrote none)."""
        facts_text = self.host.read_text(f"{s['run_dir']}/{NODE_FACTS}") or ""
        from launcher.hosts.provision import parse_facts

        return parse_facts(facts_text) if facts_text.strip() else {}

    def accounting(self, s: SlurmJob) -> dict[str, str] | None:
        """What sacct says of the task (state, exit code, node), or None where the cluster keeps no accounting."""
        done = self.host.run(["sacct", "-n", "-P", "-X", "-j", f"{s['job_id']}_{s['array_index']}",
                              "-o", "State,ExitCode,NodeList"], check=False)
        rows = [line.split("|") for line in done.out.splitlines() if line.count("|") >= 2]
        if done.returncode != 0 or not rows:
            return None
        state, code, node = rows[-1][:3]
        return {"state": state.strip(), "exit_code": code.strip(), "node": node.strip()}

    def _ended_unseen(self, s: SlurmJob) -> RunState:
        """A task that left the queue without writing task.json: killed before its script ran, or with its node.
        sacct says which where the cluster keeps accounting; without it the replicate counts as cancelled."""
        info = self._slurm_info(s)
        acct = self.accounting(s)
        if acct is None:
            info["error"] = ("left the queue before it ran (cancelled, or lost with its node; this cluster keeps "
                             "no accounting, so sacct cannot say which)")
            return RunState(running=False, ended=True, exit_code=None, status="cancelled", info=info)
        state = acct["state"].split()[0] if acct["state"] else "UNKNOWN"
        info.update({"node": acct["node"] if acct["node"] not in ("", "None assigned") else None,
                     "error": f"Slurm says {acct['state'] or 'nothing'} (exit {acct['exit_code'] or '?'}) "
                              "and the task wrote no result"})
        status = "cancelled" if state in CANCELLED_STATES else "failed"
        code, _, _sig = acct["exit_code"].partition(":")
        return RunState(running=False, ended=True, exit_code=int(code) if code.isdigit() and status == "failed"
                        else None, status=status, info=info)

    def _slurm_info(self, s: SlurmJob) -> SlurmRunInfo:
        return {"kind": self.kind, "job_id": s["job_id"], "array_index": s["array_index"], "partition": self.partition,
                "image_source": self.image_source, "runtime": self.runtime}

    def logs(self, launch: LaunchRecord, *, follow: bool = False) -> Iterator[str]:
        path = str(self._slurm(launch)["log"])
        offset = 0

        def since() -> str:  # the log from byte `offset` on (nothing while the task has not started)
            return self.host.run(["sh", "-c", 'test -f "$1" && tail -c +"$2" "$1" || true', "sh", path,
                                  str(offset + 1)], check=False).out

        while True:
            state = self.state(launch) if follow else None
            chunk = since()  # read after the state: a task seen ended has written all its log
            offset += len(chunk.encode())
            yield from chunk.splitlines(keepends=True)
            if not follow or state is None or state.ended:
                return
            time.sleep(1.0)

    def stop(self, launch: LaunchRecord) -> RunState | None:
        """Cancel the whole job array the run belongs to (every replicate of its group)."""
        job_id = str(self._slurm(launch)["job_id"])
        done = self.host.run(["scancel", job_id], check=False)
        if done.returncode != 0:
            raise CommandFailed(f"scancel {job_id} failed on {self.name}: {done.last_error_line()}",
                                "check the job with squeue on the login node")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = self.state(launch)
            if state is None or state.ended:
                return state
            time.sleep(1.0)
        return self.state(launch)

    def _array_runs(self, job_id: str) -> dict[str, str]:
        """Array index -> run id of a job array this launcher submitted (from its RUNS_TABLE)."""
        key = (self.host.read_text(self.host.area(SLURM_AREA, JOBS, job_id)) or "").strip()
        table = (self.host.read_text(self.host.area(SLURM_AREA, key, RUNS_TABLE)) or "") if key else ""
        return dict(row.split(" ", 1) for row in table.splitlines() if " " in row)

    def stopped_with(self, launch: LaunchRecord) -> list[str]:
        ids = list(self._array_runs(str(self._slurm(launch)["job_id"])).values())
        return ids or [str(launch["run_id"])]

    def release(self, launch: LaunchRecord) -> None:
        """Nothing to forget: Slurm drops finished jobs itself; the task's files go with `clean`."""

    def listed(self) -> list[ListedRun]:
        done = self.host.run(["squeue", "-h", "-r", "-n", JOB_NAME, "-o", "%F %K %T %N"], check=False)
        names: dict[str, dict[str, str]] = {}
        out = []
        for line in done.out.splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            job_id, idx, state = parts[0], parts[1], parts[2]
            if job_id not in names:
                names[job_id] = self._array_runs(job_id)
            run_id = names[job_id].get(idx)
            if run_id:
                node = parts[3] if len(parts) > 3 else "-"
                out.append(ListedRun(run_id, state.lower(), f"job {job_id}_{idx} on {node}"))
        return out
