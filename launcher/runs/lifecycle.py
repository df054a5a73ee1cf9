"""A run's life: start it in a container on a host, wait for it, pull its outputs, finish its manifest.

Its spec and code plan are in :mod:`launcher.runs.spec`, the container's argv in
:mod:`launcher.runs.container`, the host's side in :mod:`launcher.runs.placement`, and the commands on
existing runs (ps, logs, attach, stop, clean) in :mod:`launcher.runs.control`.
A run directory ``runs/<run-id>/`` gets ``launch.json`` when the container starts, the
verified ``outputs/`` as they are pulled, and ``manifest.json`` last, so a directory
without a manifest is never mistaken for a finished run.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from launcher.errors import (
    BadData,
    CommandFailed,
    DiskFull,
    NotFound,
    UnsafePath,
    UsageError,
)
from launcher.hashing import atomic_write_json
from launcher.hosts.base import Host
from launcher.hosts.engine import Engine
from launcher.progress import NullReporter, Reporter
from launcher.runs.container import (
    CONTAINER_CODE,
    CONTAINER_DATA,
    CONTAINER_OUT,
    IMAGE_RECIPES,
    RUN_LABEL,
    container_name,
    docker_run_argv,
)
from launcher.runs.placement import gpu_ready, host_options, output_owner, place_code, place_data, reopen_host
from launcher.runs.pull import STATE_FILE, PullResult, pull_outputs
from launcher.runs.recipes import Recipe
from launcher.runs.ship import ship_image, ship_image_via_registry
from launcher.runs.spec import (
    RunSpec,
    baked,
    check_params,
    image_record,
    load_recipe,
    parse_params,
    plan_code,
)
from launcher.workspace import Workspace

LAUNCH_FILE = "launch.json"
MANIFEST_FILE = "manifest.json"
MIN_FREE_BYTES = 512 << 20
_RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}-[A-Za-z0-9_.-]+-[0-9a-f]{6}$")

LogSink = Callable[[str], None]

__all__ = [
    "CONTAINER_CODE",
    "CONTAINER_DATA",
    "CONTAINER_OUT",
    "IMAGE_RECIPES",
    "LAUNCH_FILE",
    "MANIFEST_FILE",
    "MIN_FREE_BYTES",
    "RUN_LABEL",
    "LogSink",
    "RunOutcome",
    "RunSpec",
    "baked",
    "check_params",
    "container_name",
    "docker_run_argv",
    "follow_logs",
    "host_options",
    "image_record",
    "load_recipe",
    "new_run_id",
    "parse_params",
    "plan_code",
    "pull_run",
    "read_launch",
    "reopen_host",
    "run_dir",
    "run_recipe",
    "start_run",
    "utc_now",
    "wait_run",
]


@dataclass
class RunOutcome:
    group: str
    runs: list[dict[str, Any]]  # manifests, or launch records for detached runs
    detached: bool = False

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.runs if r.get("status") == "failed"]


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id(recipe: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", recipe)[:40] or "run"
    return f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{safe}-{secrets.token_hex(3)}"


def run_dir(ws: Workspace, run_id: str) -> Path:
    if not _RUN_ID.match(run_id):
        raise UsageError(f"{run_id!r} is not a run id", "see `launcher ps` for run ids")
    return ws.runs / run_id


def _with_data(spec: RunSpec, host: Host, reporter: Reporter | None) -> RunSpec:
    """The spec with its --data-from folder sent to the host and mounted from there like --data."""
    path, source = place_data(host, str(spec.data_from), spec.data, reporter)
    return replace(spec, data=path, data_from=None, data_source=source)


def start_run(
    ws: Workspace,
    spec: RunSpec,
    host: Host,
    reporter: Reporter | None = None,
    *,
    host_opts: Mapping[str, Any] | None = None,
    facts: Mapping[str, Any] | None = None,
    recipe: Recipe | None = None,
    cache_dir: Path | None = None,
) -> dict[str, Any]:
    """Check everything, ship the image, start the container detached; return the launch record."""
    from launcher.runs import determinism

    rep = reporter or NullReporter()
    recipe = recipe or load_recipe(ws, spec.recipe, entry=spec.entry)
    params = check_params(recipe, spec.params)
    env = determinism.profile_env(spec.profile, spec.seed, spec.threads)
    image = image_record(ws, spec.variant)
    baked_digests = image.pop("recipes", {})
    Engine(host).require()
    if spec.variant == "gpu":
        gpu_ready(host)
    if spec.data_from:
        spec = _with_data(spec, host, rep)
    if spec.code_plan is None:
        spec = replace(spec, code_plan=plan_code(ws, spec, recipe))
    spec = replace(spec, code_plan=place_code(spec.code_plan, host, rep))
    plan = spec.code_plan or {}
    root = host.runs_root()
    host.makedirs(root)
    free = host.free_bytes(root)
    if free < MIN_FREE_BYTES:
        raise DiskFull(
            f"{host.name} has only {free >> 20} MiB free under {root}; a run needs at least "
            f"{MIN_FREE_BYTES >> 20} MiB",
            "free space on the host and retry",
        )
    if spec.data and not host.exists(spec.data):
        raise BadData(
            f"the data path {spec.data} does not exist on {host.name}",
            "give a path on the host that runs the recipe",
        )
    if spec.ship_via:
        shipped = ship_image_via_registry(
            host, image["id"], registry=spec.ship_via, tag=image.get("tag"), reporter=rep,
            cache_dir=cache_dir or ws.cache_dir,
        )
    else:
        shipped = ship_image(
            host, image["id"], tag=image.get("tag"), reporter=rep, cache_dir=cache_dir or ws.cache_dir
        )
    run_id = new_run_id(recipe.name)
    group = spec.group or run_id
    remote = host.run_dir(run_id)
    host.makedirs(f"{remote}/out")
    host_code = plan.get("host_path")
    data = str(PurePosixPath(spec.data)) if spec.data else None
    argv = docker_run_argv(
        run_id=run_id,
        image_id=image["id"],
        env=env,
        host_out=f"{remote}/out",
        recipe=recipe,
        params=params,
        data=data,
        gpu=spec.variant == "gpu",
        host_code=host_code,
        code_entry=plan.get("entry") or None,
        args=spec.args,
        owner=output_owner(host),
    )
    launch = {
        "run_id": run_id,
        "group": group,
        "replicate": spec.replicate,
        "host": host.describe(),
        "host_options": dict(host_opts or host_options(None)),
        "container": container_name(run_id),
        "remote_dir": remote,
        "recipe": {
            "name": recipe.name,
            "framework": recipe.framework,
            "entry": plan.get("entry") or recipe.entry,
            "script": recipe.adhoc,
            "code_source": plan.get("source"),
            "git": plan.get("git") or {},
            "args": list(spec.args),
            "volatile": list(getattr(recipe.spec, "volatile", ()) or ()),
            # what the host expects to run; the manifest records what the container computed
            "expected_digest": plan.get("digest") or baked_digests.get(recipe.name),
        },
        "code": {k: v for k, v in plan.items() if k not in ("git",)},
        "params": params,
        "seed": int(env["LAUNCHER_SEED"]) if "LAUNCHER_SEED" in env else spec.seed,
        "determinism": {
            "profile": spec.profile,
            "threads": int(env["LAUNCHER_THREADS"]) if "LAUNCHER_THREADS" in env else spec.threads,
            "env": env,
        },
        "image": image,
        "data": data,
        "data_source": spec.data_source or ({"kind": "host", "path": data} if data else None),
        "variant": spec.variant,
        "facts": dict(facts or {}),
        "ship": shipped.to_dict(),
        "launched_at": utc_now(),
        "argv": argv,
    }
    local = ws.runs / run_id
    atomic_write_json(local / LAUNCH_FILE, launch)
    started = Engine(host).run_container(argv)
    if started.returncode != 0:
        launch["start_error"] = started.last_error_line()
        atomic_write_json(local / LAUNCH_FILE, launch)
        raise CommandFailed(
            f"the container for {run_id} did not start on {host.name}: {started.last_error_line()}",
            "check the image and Docker on the host",
        )
    ran = Engine(host).container_image(container_name(run_id))
    if ran is not None:
        launch["image_ran"] = ran
        atomic_write_json(local / LAUNCH_FILE, launch)
    rep.note(f"started {run_id} on {host.name}")
    return launch


def read_launch(ws: Workspace, run_id: str) -> dict[str, Any]:
    path = run_dir(ws, run_id) / LAUNCH_FILE
    try:
        launch: dict[str, Any] = json.loads(path.read_text())
        return launch
    except FileNotFoundError:
        raise NotFound(f"no run {run_id} in {ws.runs}", "see `launcher ps` for run ids") from None


def follow_logs(host: Host, container: str, sink: LogSink) -> None:
    for line in Engine(host).logs(container, follow=True):
        sink(line.rstrip("\n"))


def wait_run(
    ws: Workspace, run_id: str, host: Host, *, on_log: LogSink | None = None, poll_s: float = 1.0
) -> int:
    """Wait for the container to exit (streaming its logs) and return its exit code."""
    launch = read_launch(ws, run_id)
    name = launch["container"]
    if on_log is not None:
        follow_logs(host, name, on_log)
    while True:
        state = Engine(host).container_state(name)
        if state is None:
            raise NotFound(
                f"the container of {run_id} is gone from {host.name}",
                "its outputs may still be there: `launcher pull RUN`",
            )
        if not state.get("Running") and state.get("Status") in ("exited", "dead", "created"):
            return int(state.get("ExitCode", -1))
        time.sleep(poll_s)


def pull_run(
    ws: Workspace,
    run_id: str,
    host: Host | None = None,
    reporter: Reporter | None = None,
    *,
    watch: float | None = None,
    on_pass: Callable[[PullResult], None] | None = None,
    remove_container: bool = True,
) -> dict[str, Any]:
    """Copy the run's outputs back (skipping files verified before); write the manifest once it ended.

    Returns the manifest, or, while the run still goes (and watch is None), a status record.
    """
    launch = read_launch(ws, run_id)
    own = host is None
    h = host or reopen_host(ws, launch)
    local = run_dir(ws, run_id)
    try:
        while True:
            state = Engine(h).container_state(launch["container"])
            running = bool(state and state.get("Running"))
            result = pull_outputs(
                h,
                f"{launch['remote_dir']}/out",
                local / "outputs",
                state_file=local / STATE_FILE,
                reporter=reporter,
            )
            if on_pass is not None:
                on_pass(result)
            if result.refused:
                raise UnsafePath(
                    f"run {run_id}: refused {len(result.refused)} output entries: "
                    + "; ".join(result.refused[:3]),
                    "nothing was written outside runs/; inspect the outputs on the host",
                )
            if not running:
                break
            if watch is None:
                return {"run_id": run_id, "status": "running", "pulled": result.to_dict()}
            time.sleep(watch)
        if state is None and not result.files:
            raise NotFound(
                f"run {run_id} has neither a container nor outputs on {h.name}",
                "it may have been removed on the host",
            )
        manifest = _finish(ws, launch, h, result, state)
        if remove_container and state is not None:
            Engine(h).rm(launch["container"])
        return manifest
    finally:
        if own:
            h.close()


def _finish(
    ws: Workspace,
    launch: Mapping[str, Any],
    host: Host,
    result: PullResult,
    state: Mapping[str, Any] | None,
) -> dict[str, Any]:
    from launcher.runs.manifest import assemble, write_manifest

    local = run_dir(ws, launch["run_id"])
    data = assemble(launch, local / "outputs", result.files, state, utc_now())
    write_manifest(local, data)
    return data


def run_recipe(
    ws: Workspace,
    spec: RunSpec,
    host: Host,
    reporter: Reporter | None = None,
    *,
    runs: int = 1,
    seeds: Sequence[int | None] = (),
    on_log: LogSink | None = None,
    host_opts: Mapping[str, Any] | None = None,
    facts: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
) -> RunOutcome:
    """Run the recipe `runs` times for each seed (one group), waiting and pulling unless detached."""
    if runs < 1:
        raise UsageError(f"--runs must be at least 1, not {runs}", "drop --runs or give a positive number")
    recipe = load_recipe(ws, spec.recipe, entry=spec.entry)
    check_params(recipe, spec.params)
    from launcher.images import build
    from launcher.runs import determinism

    seed_list = list(seeds) or [spec.seed]
    for seed in seed_list:  # a bad profile, seed or thread count stops here, before a build or an upload
        determinism.profile_env(spec.profile, seed, spec.threads)
    plan = plan_code(ws, spec, recipe)
    spec = replace(spec, code_plan=plan)
    build.ensure_current(ws, spec.variant, recipes=plan.get("source") == "image",
                         allow_build=spec.build, reporter=reporter)
    group = (
        spec.group
        or f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{recipe.name}-g{secrets.token_hex(3)}"
    )
    if facts is None:
        from launcher.hosts import provision

        facts = provision.facts_for_run(ws, host)
    if spec.data_from:  # sent once for every replicate, after the cheap checks
        Engine(host).require()
        spec = _with_data(spec, host, reporter)
    if (spec.code_plan or {}).get("source") == "mounted":
        Engine(host).require()
        spec = replace(spec, code_plan=place_code(spec.code_plan, host, reporter))
    out: list[dict[str, Any]] = []
    replicate = spec.replicate  # experiments hand out replicate numbers across hosts
    for seed in seed_list:
        for _ in range(runs):
            one = RunSpec(**{**asdict(spec), "seed": seed, "group": group, "replicate": replicate})
            launch = start_run(
                ws, one, host, reporter, host_opts=host_opts, facts=facts, recipe=recipe, cache_dir=cache_dir
            )
            replicate += 1
            if spec.detach:
                out.append(launch)
                continue
            wait_run(ws, launch["run_id"], host, on_log=on_log)
            out.append(pull_run(ws, launch["run_id"], host, reporter))
    return RunOutcome(group=group, runs=out, detached=spec.detach)


