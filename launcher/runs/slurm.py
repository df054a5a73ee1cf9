"""A Slurm cluster as a run target, reached through its login node over SSH.

The replicates of a group become one job array. launcher's area on the login node
(``~/.launcher``: run directories, datasets, code snapshots, images) must be on the filesystem
the compute nodes share with it, as a home directory on a cluster is. The image travels once,
as a `docker save` archive named by its image ID under ``~/.launcher/images/``; each array task
loads it on its node only when the node lacks that image ID, checks that the image it is about to
run has the pinned ID, runs the same container as a direct run (docs/design.md), and writes
``task.json`` (exit code, node, job and array index) and the node's fact sheet into its run
directory. launcher reads those, and squeue, to know a replicate's state.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.errors import (
    CommandFailed,
    NoScheduler,
    SchedulerDown,
    TransferCut,
    UnknownPartition,
    UsageError,
)
from launcher.hosts import engine
from launcher.hosts.base import Host
from launcher.hosts.scripts import text as host_script
from launcher.hosts.spec import HostSpec
from launcher.progress import NullReporter, Reporter
from launcher.runs.container import ContainerJob, docker_run_argv
from launcher.runs.placement import ListedRun, Placement, RunState
from launcher.runs.ship import ShipResult

JOB_NAME = "launcher"
TASK_FILE = "task.json"
NODE_FACTS = "node-facts.txt"
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")
CHUNK = 1 << 20


def parse_slurm_opts(items: Sequence[str]) -> dict[str, str]:
    """--slurm-opt KEY=VALUE (repeatable) -> {KEY: VALUE}; each becomes `#SBATCH --KEY=VALUE`."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("--")
        if not key or not key.replace("-", "").isalnum():
            raise UsageError(f"--slurm-opt {item!r} is not KEY=VALUE", "e.g. --slurm-opt time=00:30:00")
        if key in ("array", "output", "error", "job-name", "parsable", "wrap"):
            raise UsageError(f"--slurm-opt {key} is set by launcher", "drop it (use --runs for the array size)")
        out[key] = value if sep else ""
    return out


class SlurmPlacement(Placement):
    """Replicates as a Slurm job array, each task a container on its node's Docker engine."""

    kind = "slurm"
    parallel = True

    def __init__(self, host: Host, host_spec: HostSpec | None = None, *, partition: str | None = None,
                 options: Mapping[str, str] | None = None, max_parallel: int | None = None) -> None:
        super().__init__(host, host_spec)
        self.partition = partition
        self.options = dict(options or {})
        self.max_parallel = max_parallel

    @classmethod
    def reopen(cls, host: Host, host_spec: HostSpec, record: Mapping[str, Any]) -> Placement:
        return cls(host, host_spec, partition=record.get("partition"), options=record.get("options") or {},
                   max_parallel=record.get("max_parallel"))

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "partition": self.partition, "options": self.options,
                "max_parallel": self.max_parallel}

    @property
    def area(self) -> str:
        return self.host.runs_root().rsplit("/", 1)[0]  # ~/.launcher, shared with the nodes

    # -- checks before anything is sent
    def prepare(self, variant: str) -> None:
        version = self.host.run(["sbatch", "--version"], check=False)
        if version.returncode != 0:
            raise NoScheduler(
                f"{self.name} has no Slurm client (sbatch): {version.last_error_line() or 'not found'}",
                "give the cluster's login node as --host, or drop --scheduler slurm",
            )
        ping = self.host.run(["scontrol", "ping"], check=False)
        if ping.returncode != 0 or "UP" not in ping.out:
            raise SchedulerDown(
                f"the Slurm controller does not answer from {self.name}: "
                f"{(ping.out.strip() or ping.last_error_line()).splitlines()[-1:] or ['no answer']}",
                "check slurmctld on the cluster (`scontrol ping` on the login node)",
            )
        if self.partition:
            listed = self.host.run(["sinfo", "-h", "-o", "%P"], check=False)
            names = {p.strip().rstrip("*") for p in listed.out.split()}
            if self.partition not in names:
                raise UnknownPartition(
                    f"the cluster has no partition {self.partition!r} (it has: {', '.join(sorted(names)) or 'none'})",
                    "pick one of those with --partition, or drop --partition for the default",
                )

    # -- the image, once, on the shared filesystem
    def image_archive(self, image_id: str) -> str:
        return f"{self.area}/images/{image_id.removeprefix('sha256:')}.tar"

    def ship(self, image: Mapping[str, Any], *, via: str | None, reporter: Reporter | None,
             cache_dir: Path) -> ShipResult:
        if via:
            raise UsageError("--ship-via is for direct runs",
                             "drop it: a cluster gets the image on its shared filesystem")
        image_id = str(image["id"])
        archive = self.image_archive(image_id)
        if self.host.exists(archive):
            return ShipResult(image_id=image_id, skipped=True)
        self.host.makedirs(archive.rsplit("/", 1)[0])
        rep = reporter or NullReporter()
        started = time.monotonic()
        local = engine.local()
        size = int(local.inspect_image(image_id).get("Size") or 0)
        task = rep.task(f"image to {self.name}'s shared filesystem", total=size or None, unit="B")
        save = local.save(image_id)
        part = f"{archive}.part"
        recv = self.host.start(["sh", "-c", 'cat > "$1" && mv -f "$1" "$2"', "sh", part, archive], bulk=True)
        sent = 0
        try:
            for block in iter(lambda: save.stdout.read(CHUNK), b""):
                try:
                    recv.stdin.write(block)
                except (BrokenPipeError, OSError) as exc:
                    raise TransferCut(f"sending the image to {self.name} stopped after {sent >> 20} MiB: {exc}",
                                      "run again; the archive is written under a temporary name") from None
                sent += len(block)
                task.advance(len(block))
            recv.stdin.close()
            if save.wait() != 0:
                raise CommandFailed(f"docker save {image_id[:19]} failed here: {save.stderr_text()}",
                                    "check the local Docker engine")
            if recv.wait() != 0:
                raise CommandFailed(f"writing {archive} on {self.name} failed: {recv.stderr_text()}",
                                    f"check free space under {self.area} on the cluster")
        finally:
            task.close()
        return ShipResult(image_id=image_id, skipped=False, bytes_sent=sent, seconds=time.monotonic() - started)

    # -- the job array
    def start(self, job: ContainerJob) -> dict[str, Any]:
        return self.start_array([job])[0]

    def _task_script(self, job: ContainerJob, run_dir: str, owner: str | None) -> str:
        argv = docker_run_argv(replace(job, owner=owner), detach=False)
        q = shlex.quote
        image, archive = job.image_id, self.image_archive(job.image_id)
        return "\n".join([
            "#!/bin/bash",
            f"# launcher run {job.run_id}: one replicate, run by its array task",
            "set -u",
            f"RUN={q(run_dir)}",
            "write_task() {",
            '  printf \'{"exit_code": %s, "status": "%s", "node": "%s", "job_id": "%s", "array_index": "%s", '
            '"partition": "%s", "image_ran": "%s", "error": "%s", "ended_at": "%s"}\\n\' '
            '"$1" "$2" "${SLURMD_NODENAME:-$(hostname)}" "${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-}}" '
            '"${SLURM_ARRAY_TASK_ID:-0}" "${SLURM_JOB_PARTITION:-}" "${HAVE:-}" "$3" '
            '"$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$RUN/task.json.part" && mv -f "$RUN/task.json.part" "$RUN/task.json"',
            "}",
            f"sh -c {q(host_script('facts.sh'))} > \"$RUN/{NODE_FACTS}\" 2>/dev/null || true",
            f"IMAGE={q(image)}",
            "HAVE=$(docker image inspect --format '{{.Id}}' \"$IMAGE\" 2>/dev/null || true)",
            f'if [ -z "$HAVE" ] && [ -f {q(archive)} ]; then',
            f"  docker load -q -i {q(archive)} >/dev/null 2>&1 || true",
            "  HAVE=$(docker image inspect --format '{{.Id}}' \"$IMAGE\" 2>/dev/null || true)",
            "fi",
            'if [ "$HAVE" != "$IMAGE" ]; then',
            '  MSG="node ${SLURMD_NODENAME:-$(hostname)} does not have the pinned image $IMAGE'
            ' (it has: ${HAVE:-none}); nothing was run"',
            '  echo "launcher: $MSG" >&2',
            '  write_task 125 failed "$MSG"',
            "  exit 125",
            "fi",
            f"NAME={q(job.name)}",
            'docker rm -f "$NAME" >/dev/null 2>&1 || true',
            "cancelled() {",
            '  docker stop -t 5 "$NAME" >/dev/null 2>&1',
            '  write_task 143 cancelled "cancelled by Slurm (scancel or time limit)"',
            "  exit 143",
            "}",
            "trap cancelled TERM INT",
            f"{shlex.join(argv)} &",
            "wait $!",
            "RC=$?",
            'docker rm "$NAME" >/dev/null 2>&1 || true',
            'if [ "$RC" -eq 0 ]; then write_task 0 succeeded ""; else write_task "$RC" failed "exit $RC"; fi',
            'exit "$RC"',
            "",
        ])

    def start_array(self, jobs: Sequence[ContainerJob]) -> list[dict[str, Any]]:
        """Submit the jobs as one array: task i runs jobs[i]. Returns each job's launch fields."""
        owner = self.host.owner()  # the same user runs the tasks on every node; it gets the outputs
        key = jobs[0].run_id
        array_dir = f"{self.area}/slurm/{key}"
        self.host.makedirs(array_dir)
        run_dirs = [job.host_out.rsplit("/", 1)[0] for job in jobs]
        for job, run_dir in zip(jobs, run_dirs, strict=True):
            self._write(f"{run_dir}/task.sh", self._task_script(job, run_dir, owner))
        limit = f"%{self.max_parallel}" if self.max_parallel else ""
        header = [
            "#!/bin/bash",
            f"#SBATCH --job-name={JOB_NAME}",
            f"#SBATCH --array=0-{len(jobs) - 1}{limit}",
            f"#SBATCH --output={array_dir}/task-%a.log",
            "#SBATCH --open-mode=append",
        ]
        if self.partition:
            header.append(f"#SBATCH --partition={self.partition}")
        if any(job.gpu for job in jobs) and "gpus-per-task" not in self.options and "gres" not in self.options:
            header.append("#SBATCH --gpus-per-task=1")
        header += [f"#SBATCH --{k}={v}" if v else f"#SBATCH --{k}" for k, v in sorted(self.options.items())]
        tasks = " ".join(shlex.quote(f"{d}/task.sh") for d in run_dirs)
        body = [f"TASKS=({tasks})", 'exec bash "${TASKS[${SLURM_ARRAY_TASK_ID:-0}]}"', ""]
        self._write(f"{array_dir}/array.sh", "\n".join(header + body))
        self._write(f"{array_dir}/runs.txt", "".join(f"{i} {job.run_id}\n" for i, job in enumerate(jobs)))
        done = self.host.run(["sbatch", "--parsable", f"{array_dir}/array.sh"], check=False)
        job_id = done.out.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            raise CommandFailed(f"sbatch refused the job array on {self.name}: {done.last_error_line()}",
                                "check the partition and --slurm-opt values against the cluster's limits")
        self._write(f"{self.area}/slurm/jobs/{job_id}", key + "\n")
        return [{"container": job.name,
                 "slurm": {"job_id": job_id, "array_index": i, "array_size": len(jobs),
                           "log": f"{array_dir}/task-{i}.log", "run_dir": run_dirs[i]}}
                for i, job in enumerate(jobs)]

    def _write(self, path: str, text: str) -> None:
        self.host.makedirs(path.rsplit("/", 1)[0])
        self.host.run(["sh", "-c", 'cat > "$1.part" && mv -f "$1.part" "$1"', "sh", path], input=text.encode())

    # -- watching and collecting
    @staticmethod
    def _slurm(launch: Mapping[str, Any]) -> Mapping[str, Any]:
        rec = launch.get("slurm")
        if not isinstance(rec, Mapping):
            raise UsageError(f"run {launch.get('run_id')} has no Slurm job in its launch record",
                             "it was not started on a cluster")
        return rec

    def _task(self, launch: Mapping[str, Any]) -> dict[str, Any] | None:
        text = self.host.read_text(f"{self._slurm(launch)['run_dir']}/{TASK_FILE}")
        if not text:
            return None
        try:
            rec = json.loads(text)
        except ValueError:
            return None
        return rec if isinstance(rec, dict) else None

    def _queued(self, launch: Mapping[str, Any]) -> str | None:
        s = self._slurm(launch)
        done = self.host.run(["squeue", "-h", "-j", f"{s['job_id']}_{s['array_index']}", "-o", "%T"], check=False)
        states = [x for x in done.out.split() if x]
        if not states:  # squeue names a pending array by its job id alone until tasks split off
            done = self.host.run(["squeue", "-h", "-r", "-j", str(s["job_id"]), "-o", "%K %T"], check=False)
            for line in done.out.splitlines():
                idx, _, state = line.partition(" ")
                if idx.strip() == str(s["array_index"]):
                    states = [state.strip()]
        return states[0] if states else None

    def state(self, launch: Mapping[str, Any]) -> RunState | None:
        task = self._task(launch)
        if task is None:
            queued = self._queued(launch)
            if queued in ACTIVE:
                return RunState(running=True, ended=False)
            task = self._task(launch)  # it may have ended between the two reads
        if task is None:
            return RunState(running=False, ended=True, exit_code=None, status="cancelled",
                            info={"kind": self.kind, **self._slurm_info(launch), "error": "left the queue before "
                                  "it ran (cancelled, or lost with its node)"})
        facts_text = self.host.read_text(f"{self._slurm(launch)['run_dir']}/{NODE_FACTS}") or ""
        from launcher.hosts.provision import parse_facts

        info = {"kind": self.kind, **self._slurm_info(launch),
                **{k: task.get(k) for k in ("node", "job_id", "array_index", "partition", "error")},
                "node_facts": parse_facts(facts_text) if facts_text.strip() else {}}
        code = task.get("exit_code")
        return RunState(running=False, ended=True, exit_code=int(code) if isinstance(code, int) else None,
                        finished_at=task.get("ended_at"), status=str(task.get("status") or "") or None,
                        image_ran=task.get("image_ran") or None, info=info)

    def _slurm_info(self, launch: Mapping[str, Any]) -> dict[str, Any]:
        s = self._slurm(launch)
        return {"job_id": s["job_id"], "array_index": s["array_index"], "partition": self.partition}

    def logs(self, launch: Mapping[str, Any], *, follow: bool = False) -> Iterator[str]:
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

    def stop(self, launch: Mapping[str, Any]) -> RunState | None:
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
        """Array index -> run id of a job array this launcher submitted (from its runs.txt)."""
        key = (self.host.read_text(f"{self.area}/slurm/jobs/{job_id}") or "").strip()
        table = (self.host.read_text(f"{self.area}/slurm/{key}/runs.txt") or "") if key else ""
        return dict(row.split(" ", 1) for row in table.splitlines() if " " in row)

    def stopped_with(self, launch: Mapping[str, Any]) -> list[str]:
        ids = list(self._array_runs(str(self._slurm(launch)["job_id"])).values())
        return ids or [str(launch["run_id"])]

    def release(self, launch: Mapping[str, Any]) -> None:
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


def cluster_facts(login: Host) -> dict[str, Any]:
    """The cluster's fact sheet, from its login node: Slurm version, partitions, nodes (CPUs, memory,
    GPUs, state), and for each node, from a one-task job on it, its Docker engine and Pyxis/enroot."""
    placement = SlurmPlacement(login)
    placement.prepare("cpu")  # the same refusals as a run: no sbatch, no controller
    version = login.run(["sinfo", "--version"], check=False).out.strip()
    parts = []
    for line in login.run(["sinfo", "-h", "-o", "%P|%a|%D|%l"], check=False).out.splitlines():
        name, avail, count, limit = ([*line.split("|"), "", "", "", ""])[:4]
        parts.append({"name": name.rstrip("*"), "default": name.endswith("*"), "state": avail,
                      "nodes": int(count) if count.isdigit() else None, "time_limit": limit})
    nodes: dict[str, dict[str, Any]] = {}
    for line in login.run(["sinfo", "-h", "-N", "-o", "%N|%c|%m|%G|%t"], check=False).out.splitlines():
        name, cpus, mem, gres, state = ([*line.split("|"), "", "", "", "", ""])[:5]
        nodes.setdefault(name, {"name": name, "cpus": int(cpus) if cpus.isdigit() else None,
                                "memory_mb": int(mem) if mem.isdigit() else None,
                                "gpus": "" if gres in ("(null)", "") else gres, "state": state})
    probe = ("docker info --format 'docker={{.ServerVersion}} runtimes={{range $k, $v := .Runtimes}}{{$k}},{{end}}' "
             "2>/dev/null || echo docker=; command -v enroot >/dev/null && echo enroot=1 || echo enroot=0")
    for name, node in nodes.items():
        if node["state"].rstrip("*~#") not in ("idle", "mix", "alloc"):
            node["docker"] = None  # down or drained: not probed
            continue
        done = login.run(["srun", "-N1", "-n1", "-w", name, "--time=1", "sh", "-c", probe], check=False,
                         timeout=120)
        kv = dict(x.split("=", 1) for x in done.out.split() if "=" in x)
        node["docker"] = kv.get("docker") or None
        node["nvidia_runtime"] = "nvidia" in kv.get("runtimes", "")
        node["enroot"] = kv.get("enroot") == "1"
        if done.returncode != 0 and not kv:
            node["probe_error"] = done.last_error_line()
    pyxis = "--container-image" in login.run(["srun", "--help"], check=False).out
    return {"slurm_version": version, "partitions": parts, "nodes": list(nodes.values()), "pyxis": pyxis,
            "shared_area": placement.area}
