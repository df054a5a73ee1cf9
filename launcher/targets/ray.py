"""A Ray cluster as a run target, reached through its head node over SSH.

The replicates of a group become one Ray job, submitted through Ray's job API on the head (the dashboard's address
as the head reaches it, ``http://127.0.0.1:8265`` unless the cluster's settings say otherwise). Its driver
(hosts/scripts/ray_job.py) makes each replicate one Ray task with the resources it needs (one CPU, a GPU for a GPU
variant, or what --ray-opt gives) and Ray's SPREAD strategy across the nodes. Nothing is assumed shared between the
nodes: a task fetches what its node lacks from the head (the image by its ID: pulled by digest from the cluster's
registry, else the archive launcher left in the head's area, loaded once per node; the dataset, the code and the
secrets from the head's area), checks the image ID, runs the same container as a direct run, streams its log to
the head, and sends its outputs back as one hashed stream the head checks before unpacking them into the run's
folder. launcher then pulls the run from the head like any other, with the same verification.

The head keeps launcher's files in its area (``~/.launcher``): the cluster's settings (``ray.json``), one folder
per group under ``ray/`` (job.json, the driver, the table of its runs) and each run's folder (outputs, task.log,
placed.json, node-facts.txt, task.json).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from launcher.errors import CommandFailed, Corrupt, NoScheduler, SchedulerDown, UsageError
from launcher.hosts import engine
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.hosts.scripts import ray_job
from launcher.hosts.scripts import text as host_script
from launcher.progress import Reporter
from launcher.records.records import (
    ImageRecord,
    ImageSource,
    LaunchRecord,
    PlacementRecord,
    RayRunInfo,
    RayTask,
    RunState,
    StartedRecord,
)
from launcher.runtime.distributed import RANKS
from launcher.specs.container import NODES, ContainerJob, container_spec
from launcher.specs.topology import HOST, Topology
from launcher.targets.placement import REMOTE_OUT, ListedRun, Placement
from launcher.transfers.ship import REGISTRY_SOURCE, ShipResult, push_for_nodes, save_to_archive

if TYPE_CHECKING:
    from launcher.hosts.provision import HostFacts, NoFacts

SETTINGS_FILE = "ray.json"  # in the head's area: the cluster's settings
DEFAULT_ADDRESS = "http://127.0.0.1:8265"  # the job API (Ray's dashboard) as the head reaches it
RAY_AREA = "ray"  # in the head's area: a folder per group, and JOBS
JOBS = "jobs"  # under RAY_AREA: a file per submitted Ray job naming its group's folder
RUNS_TABLE = "runs.txt"  # in a group's folder: "INDEX RUN_ID" per task
DRIVER = "driver.py"  # in a group's folder: hosts/scripts/ray_job.py, the job's entry point
HEAD_VIA = "head"  # the image source of tasks that load the archive from the head's area
REGISTRY_VIA = REGISTRY_SOURCE
RESOURCES = ("num_cpus", "num_gpus", "memory")  # what --ray-opt may set, per replicate
ACTIVE = ("PENDING", "RUNNING")
IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a run ID, as a group's folder is named
STOP_WAIT_S = 45.0
STATUS_TTL_S = 2.0


class RaySettings(TypedDict, total=False):
    """The cluster's settings, ``~/.launcher/ray.json`` on the head: the registry the nodes pull from, the job API's
    address as the head reaches it, and the Python on the head that has Ray."""

    registry: str
    address: str
    python: str


class TaskResult(TypedDict, total=False):
    """A run folder's task.json, written by the driver as the run's task ends."""

    exit_code: int | None
    status: str
    node: str | None
    node_id: str | None
    task_id: str | None
    job_id: str
    image_ran: str
    error: str
    ended_at: str


def parse_ray_opts(items: Sequence[str]) -> dict[str, float]:
    """--ray-opt KEY=VALUE (repeatable) -> each replicate's task resources: num_cpus, num_gpus, memory (bytes, or
    with a K, M, G suffix)."""
    out: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition("=")
        key = key.strip().removeprefix("--").replace("-", "_")
        if key not in RESOURCES:
            raise UsageError(f"--ray-opt {item!r}: {key or 'nothing'} is not a task resource launcher sets",
                             f"give one of {', '.join(RESOURCES)}, e.g. --ray-opt num_cpus=2")
        scale = 1
        text = value.strip()
        if key == "memory" and text[-1:].upper() in ("K", "M", "G"):
            scale = 1 << {"K": 10, "M": 20, "G": 30}[text[-1].upper()]
            text = text[:-1]
        try:
            number = float(text) * scale
        except ValueError:
            number = -1.0
        if number < 0:
            raise UsageError(f"--ray-opt {item!r} is not a number", f"e.g. --ray-opt {key}=1")
        out[key] = number
    return out


def read_settings(head: Host) -> RaySettings:
    text = head.read_text(head.area(SETTINGS_FILE)) or ""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        return {}
    return cast(RaySettings, {k: v for k, v in data.items() if k in ("registry", "address", "python")
                              and isinstance(v, str) and v})


def write_settings(head: Host, settings: RaySettings) -> None:
    head.write_atomic(head.area(SETTINGS_FILE), (json.dumps(settings, indent=2, sort_keys=True) + "\n").encode())


def find_python(head: Host, settings: RaySettings) -> tuple[str, str]:
    """The Python on the head that has Ray, and Ray's version: the settings' one, else the one the `ray` command on
    the head's PATH runs, else python3. NoScheduler where none has Ray with its job API."""
    found = head.run(["sh", "-c", 'r=$(command -v ray) && head -n 1 "$r" | sed -n "s/^#![[:space:]]*//p"'],
                     check=False).out.strip()
    words = found.split()
    if words and words[0].endswith("/env"):  # #!/usr/bin/env [-S] python3
        words = [w for w in words[1:] if not w.startswith("-")]
    candidates = [c for c in (settings.get("python"), words[0] if words else None, "python3") if c]
    for python in dict.fromkeys(candidates):
        done = head.run([python, "-c", "import ray, ray.job_submission; print(ray.__version__)"], check=False)
        if done.returncode == 0 and done.out.strip():
            return python, done.out.strip().splitlines()[-1]
    raise NoScheduler(f"{head.name} has no Ray with its job API (tried {', '.join(dict.fromkeys(candidates))})",
                      "install ray[default] on the head and start it (`ray start --head`), or give the cluster's "
                      "head as --host")


def call(head: Host, python: str, *args: str, timeout: float = 60) -> Any:
    """One command of ray_job.py on the head; its JSON answer. SchedulerDown when the job API does not answer."""
    done = head.run([python, "-c", host_script("ray_job.py"), *args], check=False, timeout=timeout)
    lines = done.out.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if done.returncode != 0 or answer is None or (isinstance(answer, dict) and "error" in answer):
        why = (answer or {}).get("error") if isinstance(answer, dict) else None
        raise SchedulerDown(f"Ray's job API at {args[1] if len(args) > 1 else '?'} does not answer on {head.name}: "
                            f"{why or done.last_error_line() or 'no answer'}",
                            "check the cluster (`ray status` on the head), or set its address with "
                            "`launcher provision --scheduler ray --ray-address URL`")
    return answer


class RayPlacement(Placement):
    """Replicates as one Ray job of tasks spread over the cluster's nodes (module docstring)."""

    kind = "ray"
    parallel = True

    def __init__(self, host: Host, host_spec: HostSpec | None = None, *,
                 resources: Mapping[str, float] | None = None, max_parallel: int | None = None) -> None:
        super().__init__(host, host_spec)
        self.resources = dict(resources or {})
        self.max_parallel = max_parallel
        self.settings: RaySettings = {}
        self.python = ""
        self.image_source: ImageSource = {"kind": HEAD_VIA}
        self._status: dict[str, tuple[float, dict[str, Any]]] = {}  # a Ray job's last status, by submission ID
        self._settings_read = False

    @classmethod
    def reopen(cls, host: Host, host_spec: HostSpec, record: PlacementRecord) -> Placement:
        placement = cls(host, host_spec, resources=record.get("resources") or {},
                        max_parallel=record.get("max_parallel"))
        source = record.get("image_source")
        if isinstance(source, Mapping) and isinstance(source.get("kind"), str):
            placement.image_source = cast(ImageSource, dict(source))
        return placement

    def record(self) -> PlacementRecord:
        return {"kind": self.kind, "resources": self.resources, "max_parallel": self.max_parallel,
                "image_source": self.image_source}

    def topology_for(self, topology: Topology | None) -> Topology | None:
        """A run of several nodes: Ray reserves its nodes together (a placement group, one node each), each node's
        container on its node's network, node 0's address given to the others."""
        if topology is None or topology.nodes == 1:
            return topology
        return replace(topology, network=HOST)

    def node_names(self, count: int) -> list[str]:
        """Not known before Ray places them (the manifest's placement names them)."""
        return [f"{self.name}: node {k} of the Ray placement group" if count > 1 else f"{self.name}: a node Ray picks"
                for k in range(count)]

    def _read_settings(self) -> RaySettings:
        """The cluster's settings on the head (read once)."""
        if self._settings_read is False:
            self.settings = read_settings(self.host)
            self._settings_read = True
        return self.settings

    @property
    def address(self) -> str:
        return self._read_settings().get("address") or DEFAULT_ADDRESS

    def _ready(self) -> str:
        """The head's Python that has Ray, checked (found once): what runs the driver a group is submitted as."""
        if not self.python:
            self.python, _ = find_python(self.host, self._read_settings())
        return self.python

    def _call(self, *args: str, timeout: float = 60) -> Any:
        """A question to the job API (its REST interface, the standard library: any Python on the head will do; the
        one that has Ray once known)."""
        python = self.python or self._read_settings().get("python") or "python3"
        return call(self.host, python, *args, timeout=timeout)

    # -- checks before anything is sent
    def prepare(self, gpu: bool) -> None:
        self._ready()
        self._call("list", self.address)  # the job API answers
        if gpu and "num_gpus" not in self.resources:
            self.resources["num_gpus"] = 1.0

    # -- the image: pushed to the cluster's registry, else once into the head's area
    def image_archive(self, image_id: str) -> str:
        return self.host.area("images", f"{image_id.removeprefix('sha256:')}.tar")

    def ship(self, image: ImageRecord, *, via: str | None, reporter: Reporter | None,
             cache_dir: Path) -> ShipResult:
        image_id = str(image["id"])
        registry = None if via == HEAD_VIA else (via or self.settings.get("registry"))
        if registry:
            shipped, self.image_source = push_for_nodes(image_id, registry, self.image_source, reporter)
            return shipped
        self.image_source = {"kind": HEAD_VIA}
        archive = self.image_archive(image_id)
        if self.host.exists(archive) or engine.Engine(self.host).has_image(image_id):
            # there already; or the head's own engine has that image ID: a node that lacks it gets it saved there
            return ShipResult(image_id=image_id, skipped=True)
        return save_to_archive(self.host, image_id, archive, reporter, where=f"the Ray head {self.name}")

    # -- the group as one Ray job
    def start(self, job: ContainerJob) -> StartedRecord:
        return self.start_array([job])[0]

    def _relative(self, path: str | None) -> str | None:
        """A path in the head's area relative to it (what a node fetches into its own area); None for one outside
        it (a path every node is taken to have)."""
        root = self.host.area().rstrip("/") + "/"
        return path[len(root):] if path and path.startswith(root) else None

    def _task(self, job: ContainerJob) -> dict[str, Any]:
        """One replicate's task for the driver: each node's container argv with the node's area, its run folder,
        owner and (several nodes) the nodes' addresses as marks; the inputs its nodes fetch from the head's area."""
        def node_path(path: str | None) -> str | None:
            rel = self._relative(path)
            return f"{ray_job.AREA_MARK}/{rel}" if rel is not None else path

        if self._relative(job.host_out) is None:
            raise CommandFailed(f"the run's folder {job.run_dir} is outside launcher's area on {self.name}",
                                "check the head's launcher area")
        secret = f"{ray_job.RUN_MARK}/{job.env_file.rsplit('/', 1)[-1]}" if job.env_file else None
        on_node = replace(job, host_out=f"{ray_job.RUN_MARK}/{REMOTE_OUT}", data=node_path(job.data),
                          host_code=node_path(job.host_code), env_file=secret, owner=ray_job.OWNER_MARK)
        count = job.topology.nodes if job.topology is not None else 1
        nodes = []
        for k in range(count):
            node_job = on_node if count == 1 else replace(
                on_node, node=k, network=HOST, peers=tuple(ray_job.NODE_MARK.format(j) for j in range(count)))
            make = [] if k == 0 else [f"{REMOTE_OUT}/{NODES}/{k}", f"{REMOTE_OUT}/{RANKS}"]
            nodes.append({"container": node_job.name, "argv": engine.render(container_spec(node_job, detach=True)),
                          "make": make})
        inputs = {which: rel for which, path in (("data", job.data), ("code", job.host_code),
                                                  ("secret", job.env_file))
                  if (rel := self._relative(path)) is not None}
        return {"run_id": job.run_id, "image_id": job.image_id, "image_source": dict(self.image_source),
                "image_archive": self.image_archive(job.image_id), "inputs": inputs, "nodes": nodes,
                "run_dir": job.run_dir}

    def start_array(self, jobs: Sequence[ContainerJob]) -> list[StartedRecord]:
        self._ready()
        key = jobs[0].run_id
        job_id = f"{ray_job.JOB_PREFIX}{key}"
        array_dir = self.host.area(RAY_AREA, key)
        self.host.makedirs(array_dir)
        jobs = [self.write_secrets(job) for job in jobs]  # fetched by the task on its node, then removed
        spec = {"area": self.host.area(), "job_id": job_id, "tasks": [self._task(job) for job in jobs],
                "facts": host_script("facts.sh"), "resources": self.resources, "max_parallel": self.max_parallel}
        self._write(f"{array_dir}/{ray_job.JOB_FILE}", json.dumps(spec, indent=1, sort_keys=True))
        self._write(f"{array_dir}/{DRIVER}", host_script("ray_job.py"))
        self._write(f"{array_dir}/{RUNS_TABLE}", "".join(f"{i} {job.run_id}\n" for i, job in enumerate(jobs)))
        self._write(self.host.area(RAY_AREA, JOBS, job_id), key + "\n")
        self._call("submit", self.address, job_id, f"{array_dir}/{DRIVER}", "driver", array_dir)
        placed: list[RayTask] = [{"job_id": job_id, "index": i, "array_size": len(jobs), "array_dir": array_dir,
                                  "run_dir": job.run_dir} for i, job in enumerate(jobs)]
        return [{"container": job.name, "ray": task} for job, task in zip(jobs, placed, strict=True)]

    def _write(self, path: str, data: str | bytes) -> None:
        self.host.write_atomic(path, data.encode() if isinstance(data, str) else data)

    # -- watching and collecting
    def _job_status(self, job_id: str, *, fresh: bool = False) -> dict[str, Any]:
        """The Ray job's status and message; the replicates of a group share one job, so an answer serves them all
        for STATUS_TTL_S (the head's Python imports Ray for each question)."""
        now = time.monotonic()
        kept = self._status.get(job_id)
        if kept is None or fresh or now - kept[0] > STATUS_TTL_S:
            answer = self._call("status", self.address, job_id)
            kept = (now, answer if isinstance(answer, dict) else {})
            self._status[job_id] = kept
        return kept[1]

    def _ray(self, launch: LaunchRecord) -> RayTask:
        """The run's Ray task as its launch record names it, checked against where launcher puts such files: a
        launch.json edited by hand (or a cloned workspace's) names no other folder on the head to read or write."""
        rec = launch.get("ray")
        if not isinstance(rec, Mapping):
            raise UsageError(f"run {launch.get('run_id')} has no Ray task in its launch record",
                             "it was not started on a Ray cluster")
        missing = [k for k in ("job_id", "index", "array_dir", "run_dir") if k not in rec]
        fix = "the run's launch.json was changed by hand; stop the job with `ray job stop` on the head"
        if missing:
            raise Corrupt(f"run {launch.get('run_id')}'s launch record names its Ray task without "
                          f"{', '.join(missing)}", fix)
        key = str(rec["array_dir"]).rsplit("/", 1)[-1]
        ok = (rec["run_dir"] == self.host.run_dir(str(launch.get("run_id"))) and IDENTIFIER.fullmatch(key) is not None
              and rec["array_dir"] == self.host.area(RAY_AREA, key) and rec["job_id"] == f"{ray_job.JOB_PREFIX}{key}")
        if not ok:
            raise Corrupt(f"run {launch.get('run_id')}'s launch record names a Ray job or folders launcher does not "
                          f"make ({rec['job_id']}, {rec['array_dir']}, {rec['run_dir']})", fix)
        return rec

    def _json(self, path: str) -> dict[str, Any] | None:
        text = self.host.read_text(path)
        try:
            rec = json.loads(text) if text else None
        except ValueError:
            return None
        return rec if isinstance(rec, dict) else None

    def _info(self, r: RayTask, rec: Mapping[str, Any]) -> RayRunInfo:
        info: RayRunInfo = {"kind": self.kind, "job_id": r["job_id"], "image_source": self.image_source}
        for key in ("task_id", "node_id", "node"):
            if rec.get(key):
                info[key] = str(rec[key])
        return info

    def state(self, launch: LaunchRecord) -> RunState | None:
        r = self._ray(launch)
        task = self._json(f"{r['run_dir']}/{ray_job.TASK_FILE}")
        if task is None:
            status = self._job_status(r["job_id"])
            if status.get("status") in ACTIVE:
                return RunState(running=True, ended=False)
            task = self._json(f"{r['run_dir']}/{ray_job.TASK_FILE}")  # it may have ended between the two reads
            if task is None:
                placed = self._json(f"{r['run_dir']}/{ray_job.PLACED_FILE}") or {}
                info = self._info(r, placed)
                known = status.get("status")
                said = [line.strip() for line in str(status.get("message") or "").splitlines() if line.strip()]
                info["error"] = (f"the Ray job {r['job_id']} ended {known or 'unknown to Ray'} before its task "
                                 f"wrote a result: {said[-1] if said else 'no message'}")
                return RunState(running=False, ended=True, exit_code=None,
                                status="cancelled" if known == "STOPPED" else "failed", info=info)
        info = self._info(r, task)
        if isinstance(task.get("nodes"), list):  # a run of several nodes: every node's address, node 0's first
            info["nodes"] = [str(n) for n in task["nodes"]]
            info["node_ids"] = [str(n) for n in task.get("node_ids") or []]
        info["error"] = str(task.get("error") or "") or None
        info["node_facts"] = self._node_facts(r)
        code = task.get("exit_code")
        return RunState(running=False, ended=True, exit_code=code if isinstance(code, int) else None,
                        finished_at=task.get("ended_at"), status=str(task.get("status") or "") or None,
                        image_ran=str(task.get("image_ran") or "") or None, info=info)

    def _node_facts(self, r: RayTask) -> HostFacts | NoFacts:
        text = self.host.read_text(f"{r['run_dir']}/{ray_job.FACTS_FILE}") or ""
        from launcher.hosts.provision import parse_facts

        return parse_facts(text) if text.strip() else {}

    def logs(self, launch: LaunchRecord, *, follow: bool = False) -> Iterator[str]:
        path = f"{self._ray(launch)['run_dir']}/{ray_job.LOG_FILE}"
        offset = 0
        while True:
            state = self.state(launch) if follow else None
            chunk = self.host.run(["sh", "-c", 'test -f "$1" && tail -c +"$2" "$1" || true', "sh", path,
                                   str(offset + 1)], check=False).out
            offset += len(chunk.encode())
            yield from chunk.splitlines(keepends=True)
            if not follow or state is None or state.ended:
                return
            time.sleep(1.0)

    def stop(self, launch: LaunchRecord) -> RunState | None:
        """Cancel the group's Ray job: the driver cancels every task (each removes its container) and writes each
        run's result; if it has not ended in STOP_WAIT_S, Ray stops the job itself."""
        r = self._ray(launch)
        self._write(f"{r['array_dir']}/{ray_job.CANCEL_FILE}", b"")
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            if self._job_status(r["job_id"], fresh=True).get("status") not in ACTIVE:
                return self.state(launch)
            time.sleep(1.0)
        if not self._call("stop", self.address, r["job_id"]).get("stopped"):
            raise CommandFailed(f"Ray did not stop job {r['job_id']} on {self.name}",
                                f"stop it on the head: ray job stop {shlex.quote(r['job_id'])}")
        return self.state(launch)

    def _array_runs(self, array_dir: str) -> dict[str, str]:
        table = self.host.read_text(f"{array_dir}/{RUNS_TABLE}") or ""
        return dict(row.split(" ", 1) for row in table.splitlines() if " " in row)

    def stopped_with(self, launch: LaunchRecord) -> list[str]:
        ids = list(self._array_runs(self._ray(launch)["array_dir"]).values())
        return ids or [str(launch["run_id"])]

    def release(self, launch: LaunchRecord) -> None:
        """Nothing to forget: each task removed its container and its node's copy of the run's folder."""

    def listed(self) -> list[ListedRun]:
        out = []
        for job in self._call("list", self.address):
            if not isinstance(job, dict) or job.get("status") not in ACTIVE:
                continue
            key = (self.host.read_text(self.host.area(RAY_AREA, JOBS, str(job.get("id")))) or "").strip()
            if not key or "/" in key:
                continue
            for run_id in self._array_runs(self.host.area(RAY_AREA, key)).values():
                run_dir = self.host.run_dir(run_id)
                if self._json(f"{run_dir}/{ray_job.TASK_FILE}") is not None:
                    continue
                placed = self._json(f"{run_dir}/{ray_job.PLACED_FILE}")
                if placed:
                    out.append(ListedRun(run_id, "running", f"Ray job {job['id']} on node {placed.get('node')}"))
                else:
                    out.append(ListedRun(run_id, "pending", f"Ray job {job['id']}, waiting for a node"))
        return out
