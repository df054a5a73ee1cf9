"""A run target without Docker: runs "happen" when started, from a script of exit codes and log lines.

`FakePlacement` is a real :class:`launcher.targets.placement.Placement` on the local filesystem (a
`LocalHost` on the workspace), so a run's whole life (launch record, pull, manifest) goes through
launcher's own code; only the container is made up. `FakeArray` starts a group at once, as a Slurm
job array does, and lets a test decide when each replicate ends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.hashing import atomic_write_json
from launcher.hosts.engine import render
from launcher.hosts.local import LocalHost
from launcher.records.records import RunState
from launcher.specs.container import ContainerJob, container_spec
from launcher.targets.placement import ListedRun, Placement
from launcher.transfers.ship import ShipResult
from launcher.workspace import Workspace

IMAGE_ID = "sha256:" + "ab" * 32


@dataclass
class Script:
    """What the made-up containers do: replicate -> exit code (default 0), and the log each writes."""

    exit_codes: dict[int, int] = field(default_factory=dict)
    log_lines: int = 15
    seed_calls: list[dict[str, Any]] | None = None  # written into runtime.json's seed_calls when given


def make_workspace(root: Path) -> Workspace:
    """A workspace with a built cpu image (its build record) and a plain script project beside it."""
    ws = Workspace.at(root / "ws", cache_dir=root / "cache")
    for folder in (ws.lockfiles, ws.dockerfiles):
        folder.mkdir(parents=True, exist_ok=True)
    ws.lock_in("cpu").write_text("numpy\n")
    ws.dockerfile("cpu").write_text("FROM ${LAUNCHER_BASE}\n")
    ws.build_record("cpu").parent.mkdir(parents=True, exist_ok=True)
    ws.build_record("cpu").write_text(json.dumps({"image_id": IMAGE_ID, "tag": "launcher/ws-cpu:1", "labels": {}}))
    ws.runs.mkdir(parents=True, exist_ok=True)
    return ws


def make_project(root: Path, name: str = "myproj", script: str = "train.py") -> Path:
    proj = root / name
    proj.mkdir(parents=True, exist_ok=True)
    (proj / script).write_text("print('training')\n")
    (proj / "util.py").write_text("X = 1\n")
    return proj / script


class FakePlacement(Placement):
    kind = "fake"

    def __init__(self, ws: Workspace, script: Script | None = None) -> None:
        super().__init__(LocalHost(ws.root))
        self.script = script or Script()
        self.jobs: list[ContainerJob] = []
        self.argvs: list[list[str]] = []
        self.env_files: dict[str, str] = {}  # run id -> the env file's text when the run started
        self.stopped: list[str] = []
        self.states: dict[str, RunState] = {}

    def prepare(self, gpu: bool) -> None:
        pass

    def send_code(self, plan: Mapping[str, Any], reporter: Any) -> dict[str, Any]:
        return {**plan, "host_path": plan["local"], "sent": False}

    def ship(self, image: Mapping[str, Any], *, via: str | None, reporter: Any, cache_dir: Path) -> ShipResult:
        return ShipResult(image_id=str(image["id"]), skipped=True)

    def start(self, job: ContainerJob) -> dict[str, Any]:
        job = self.write_secrets(job)
        self.argvs.append(render(container_spec(job)))
        if job.env_file:
            self.env_files[job.run_id] = Path(job.env_file).read_text()
        self.remove_secrets(job)
        self.jobs.append(job)
        self._run(job)
        return {"container": job.name, "image_ran": job.image_id}

    def _replicate(self, job: ContainerJob) -> int:
        return len(self.jobs) - 1

    def _run(self, job: ContainerJob, code: int | None = None) -> None:
        """What the container would leave behind: its log, exit record and runtime record."""
        out = Path(job.host_out)
        n = self._replicate(job)
        code = self.script.exit_codes.get(n, 0) if code is None else code
        (out / "logs").mkdir(parents=True, exist_ok=True)
        lines = [f"replicate {n} line {i}" for i in range(self.script.log_lines)]
        if code:
            lines.append(f"ModuleNotFoundError: No module named 'missing{n}'")
        (out / "logs" / "train.log").write_text("\n".join(lines) + "\n")
        atomic_write_json(out / "_launcher" / "exit.json",
                          {"exit_code": code, "started_at": "2026-01-01T00:00:00Z", "ended_at": "2026-01-01T00:00:01Z"})
        runtime: dict[str, Any] = {"framework": None}
        if self.script.seed_calls is not None:
            runtime["seed_calls"] = self.script.seed_calls
        atomic_write_json(out / "_launcher" / "runtime.json", runtime)
        self.states[job.run_id] = RunState(running=False, ended=True, exit_code=code)

    def state(self, launch: Mapping[str, Any]) -> RunState | None:
        return self.states.get(str(launch["run_id"]))

    def logs(self, launch: Mapping[str, Any], *, follow: bool = False) -> Iterator[str]:
        path = Path(launch["remote_dir"]) / "out" / "logs" / "train.log"
        return iter(path.read_text().splitlines(keepends=True) if path.is_file() else [])

    def stop(self, launch: Mapping[str, Any]) -> RunState | None:
        self.stopped.append(str(launch["run_id"]))
        return self.state(launch)

    def release(self, launch: Mapping[str, Any]) -> None:
        pass

    def listed(self) -> list[ListedRun]:
        return []


class FakeArray(FakePlacement):
    """A group started at once: every replicate runs until it is finished by `ends` (replicate -> exit code,
    in the order they end) or cancelled by a stop, which stops them all (as scancel stops a job array)."""

    kind = "fakearray"
    parallel = True

    def __init__(self, ws: Workspace, ends: Sequence[tuple[int, int]]) -> None:
        super().__init__(ws)
        self.ends = list(ends)
        self.polls = 0

    def start_array(self, jobs: Sequence[ContainerJob]) -> list[dict[str, Any]]:
        out = []
        for job in jobs:
            self.jobs.append(self.write_secrets(job))
            self.states[job.run_id] = RunState(running=True, ended=False)
            out.append({"container": job.name})
        return out

    def state(self, launch: Mapping[str, Any]) -> RunState | None:
        self.polls += 1
        if not self.ends and self.polls > 1000:
            raise AssertionError("replicates still run with nothing left to end them, and nothing stopped them")
        if self.ends and self.polls % 2 == 0:  # every other poll, the next scripted replicate ends
            n, code = self.ends.pop(0)
            job = self.jobs[n]
            if not self.states[job.run_id].ended:
                self._run(job, code)
        return self.states.get(str(launch["run_id"]))

    def _replicate(self, job: ContainerJob) -> int:
        return next(i for i, j in enumerate(self.jobs) if j.run_id == job.run_id)

    def stop(self, launch: Mapping[str, Any]) -> RunState | None:
        self.stopped.append(str(launch["run_id"]))
        for job in self.jobs:
            if not self.states[job.run_id].ended:
                (Path(job.host_out) / "logs").mkdir(parents=True, exist_ok=True)
                self.states[job.run_id] = RunState(running=False, ended=True, exit_code=None, status="cancelled")
        return self.states.get(str(launch["run_id"]))

    def stopped_with(self, launch: Mapping[str, Any]) -> list[str]:
        return [job.run_id for job in self.jobs]
