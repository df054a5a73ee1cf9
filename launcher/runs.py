"""Runs: start a recipe in a container on a host, follow it, pull its outputs, write the manifest.

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
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from launcher import __version__, recipes, transfer
from launcher.errors import (
    BadData,
    CommandFailed,
    Corrupt,
    DiskFull,
    HostNotReady,
    HostUnreachable,
    LauncherError,
    NoGpu,
    NotFound,
    UnsafePath,
    UsageError,
)
from launcher.hashing import atomic_write_json
from launcher.hosts import engine, open_host
from launcher.hosts.base import Host
from launcher.hosts.engine import Engine
from launcher.manifest import describe_code, read_json_object
from launcher.progress import NullReporter, Reporter
from launcher.recipes import Recipe
from launcher.workspace import VARIANTS, Workspace

LAUNCH_FILE = "launch.json"
MANIFEST_FILE = "manifest.json"
RUN_LABEL = "org.launcher.run"
CONTAINER_OUT = "/launcher/out"
CONTAINER_DATA = "/launcher/data"
CONTAINER_CODE = "/launcher/code"
IMAGE_RECIPES = "/opt/launcher/recipes"
MIN_FREE_BYTES = 512 << 20
_RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}-[A-Za-z0-9_.-]+-[0-9a-f]{6}$")

LogSink = Callable[[str], None]


@dataclass
class RunSpec:
    recipe: str
    variant: str = "cpu"
    seed: int | None = None
    profile: str = "deterministic"
    threads: int | None = None
    data: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    replicate: int = 0
    detach: bool = False
    ship_via: str | None = None  # None: docker save | load; or a registry address such as 127.0.0.1:5000
    data_from: str | None = None  # a dataset folder on this machine, sent to the host by content
    data_source: dict[str, Any] | None = None  # where the data came from (set by _place_data)
    args: list[str] = field(default_factory=list)  # the script's own argv (after `--`)
    code: str | None = None  # --code DIR: the folder a plain script is sent with
    entry: str | None = None  # --entry FILE: the script of a folder without recipe.toml
    mount: bool = False  # mount the workspace recipe read-only instead of running the baked copy
    build: bool = True  # rebuild a stale image first; False: refuse to run stale code
    code_plan: dict[str, Any] | None = None  # what code runs and where the host has it (set by _place_code)


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


def parse_params(pairs: Sequence[str]) -> dict[str, Any]:
    """KEY=VALUE strings -> typed values (JSON numbers, booleans, else the string itself)."""
    return dict(recipes.parse_param(p) for p in pairs)


def load_recipe(ws: Workspace, name_or_path: str, entry: str | None = None) -> Recipe:
    return recipes.load_recipe(ws, name_or_path, entry=entry)


def check_params(recipe: Recipe, given: Mapping[str, Any]) -> dict[str, Any]:
    if recipe.adhoc and given:
        raise UsageError(
            f"--param {next(iter(given))}=... given, but the plain script {recipe.entry} declares no params",
            f"pass its own arguments after `--` (launcher run {recipe.entry} -- --{next(iter(given))} VALUE), "
            "or declare params in a recipe.toml",
        )
    if not recipe.adhoc:
        unknown = sorted(set(given) - set(recipe.params))
        if unknown:
            raise UsageError(
                f"recipe {recipe.name} has no param {unknown[0]!r}",
                f"its params are: {', '.join(sorted(recipe.params)) or 'none'}",
            )
    return dict(given)


def image_record(ws: Workspace, variant: str) -> dict[str, Any]:
    if variant not in VARIANTS:
        raise UsageError(f"unknown variant {variant!r}", f"use one of: {', '.join(VARIANTS)}")
    path = ws.build_record(variant)
    try:
        rec = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotFound(
            f"no {variant} image has been built in this workspace",
            f"build it with `launcher build {variant}`",
        ) from None
    except ValueError:
        raise Corrupt(f"{path} is not valid JSON", f"rebuild with `launcher build {variant}`") from None
    labels = rec.get("labels") or {}
    return {
        "id": rec["image_id"],
        "tag": rec.get("tag"),
        "variant": variant,
        "base_digest": labels.get("org.launcher.base-digest"),
        "lock_sha256": labels.get("org.launcher.lock-sha256"),
        "git_commit": labels.get("org.launcher.git-commit"),
        # outside git the commit is "unknown", and so is whether the tree was clean
        "git_dirty": (str(labels.get("org.launcher.git-dirty", "")).lower() in ("1", "true", "yes")
                      if labels.get("org.launcher.git-commit", "unknown") != "unknown" else None),
        "launcher_version": labels.get("org.launcher.version") or __version__,
        "recipes": dict((rec.get("extra") or {}).get("recipes") or {}),
    }


def container_name(run_id: str) -> str:
    return f"launcher-{run_id}"


def run_dir(ws: Workspace, run_id: str) -> Path:
    if not _RUN_ID.match(run_id):
        raise UsageError(f"{run_id!r} is not a run id", "see `launcher ps` for run ids")
    return ws.runs / run_id


def docker_run_argv(
    *,
    run_id: str,
    image_id: str,
    env: Mapping[str, str],
    host_out: str,
    recipe: Recipe,
    params: Mapping[str, Any],
    data: str | None = None,
    gpu: bool = False,
    host_code: str | None = None,
    code_entry: str | None = None,
    args: Sequence[str] = (),
    owner: str | None = None,
) -> list[str]:
    """The container contract of design.md, as an argv. host_code: the code folder on the host,
    mounted read-only (a plain script's project, or a recipe folder run without baking);
    code_entry: the script inside it. owner ("UID:GID"): who gets the outputs when the run ends
    (the container runs as root; the user on the host should own what it wrote)."""
    argv = engine.command("run", "-d", "--name", container_name(run_id), "--label", f"{RUN_LABEL}={run_id}")
    for key, value in sorted(env.items()):
        argv += ["-e", f"{key}={value}"]
    if owner:
        argv += ["-e", f"LAUNCHER_OWNER={owner}"]
    argv += ["-v", f"{host_out}:{CONTAINER_OUT}"]
    if data:
        argv += ["-v", f"{data}:{CONTAINER_DATA}:ro"]
    if host_code:
        argv += ["-v", f"{host_code}:{CONTAINER_CODE}:ro"]
    if gpu:
        argv += ["--gpus", "all"]
    argv += [image_id, "python", "-m", "launcher.runtime", "run"]
    if host_code and recipe.adhoc:
        argv += ["--script", f"{CONTAINER_CODE}/{code_entry or recipe.path.name}", "--code-root", CONTAINER_CODE]
    elif host_code:
        argv += ["--recipe", CONTAINER_CODE]
    else:
        argv += ["--recipe", f"{IMAGE_RECIPES}/{recipe.name}"]
    argv += ["--code-source", "mounted" if host_code else "image", "--out", CONTAINER_OUT]
    if data:
        argv += ["--data", CONTAINER_DATA]
    argv += ["--params", json.dumps(dict(params), sort_keys=True, separators=(",", ":"))]
    if args:
        argv += ["--", *args]
    return argv


def baked(ws: Workspace, recipe: Recipe, mount: bool = False) -> bool:
    """Whether the run executes the copy of the recipe baked into the image (a workspace recipe,
    not mounted), rather than code mounted from the host."""
    return not mount and not recipe.adhoc and recipe.path.parent == ws.recipes.resolve()


def plan_code(ws: Workspace, spec: RunSpec, recipe: Recipe) -> dict[str, Any]:
    """What code the run executes: the recipe baked into the image, or a folder to mount (a plain
    script's project, a recipe folder from outside the workspace, or --mount), snapshotted here
    by its code digest."""
    from launcher import code

    if spec.code and not recipe.adhoc:
        raise UsageError("--code is for plain scripts", f"{recipe.name} is a recipe folder: it is its own code")
    if baked(ws, recipe, spec.mount):
        return {"source": "image", "git": code.git_state(recipe.path)}
    root = Path(spec.code) if spec.code else None
    if recipe.adhoc:
        script = recipe.path
        if root is None:
            root = code.git_toplevel(script.parent) or script.parent
        tree = code.select(root, script)
    else:
        tree = code.select(recipe.path)
    local = code.snapshot(tree, ws.cache_dir)
    return {"source": "mounted", "local": str(local), **tree.to_dict()}


def _place_code(spec: RunSpec, host: Host, reporter: Reporter | None) -> RunSpec:
    """Put the snapshot of mounted code on the host (sent once per content); baked code needs nothing."""
    plan = dict(spec.code_plan or {})
    if plan.get("source") != "mounted" or plan.get("host_path"):
        return spec
    if host.kind == "local":  # the local engine mounts the snapshot where it is
        plan["host_path"], plan["sent"] = plan["local"], False
        return replace(spec, code_plan=plan)
    from launcher import datasets

    placed = datasets.place(host, Path(plan["local"]), reporter, area="code",
                            name=str(plan["digest"]).removeprefix("sha256:"))
    plan["host_path"] = placed.path
    plan["sent"] = placed.sent
    return replace(spec, code_plan=plan)


def host_options(spec: str | None, **opts: Any) -> dict[str, Any]:
    return {
        "spec": spec,
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in opts.items() if v is not None},
    }


def reopen_host(ws: Workspace, launch: Mapping[str, Any]) -> Host:
    opts = dict(launch.get("host_options") or {"spec": None})
    spec = opts.pop("spec", None)
    kw: dict[str, Any] = {
        k: (Path(v) if k in ("identity", "ssh_config", "known_hosts") else v) for k, v in opts.items()
    }
    return open_host(spec, workspace_root=ws.root, **kw)


def _gpu_ready(host: Host) -> None:
    runtimes = Engine(host).runtimes()
    smi = host.run(["nvidia-smi", "-L"], check=False)
    if smi.returncode != 0 or "GPU" not in smi.out:
        raise NoGpu(
            f"{host.name} has no NVIDIA GPU that nvidia-smi can see, so --variant gpu cannot run",
            "use --variant cpu, or a GPU host with its driver installed",
        )
    if "nvidia" not in runtimes:
        raise HostNotReady(
            f"Docker on {host.name} has no NVIDIA runtime",
            f"run `launcher provision --host {host.name} --gpu --install`",
        )


def _output_owner(host: Host) -> str | None:
    """Whom the container should hand its outputs to: the host user, unless Docker there is
    rootless or remaps user namespaces. Then the container's root already writes as that user
    on the host, and a chown inside would hand the files to a subordinate ID instead."""
    opts = Engine(host).security_options()
    if opts is None or any("rootless" in o or "userns" in o for o in opts):
        return None
    return host.owner()


def _place_data(spec: RunSpec, host: Host, reporter: Reporter | None) -> RunSpec:
    """Resolve --data-from: the dataset is sent to the host (once per content) and mounted
    from where it landed, exactly like --data."""
    if not spec.data_from:
        return spec
    if spec.data:
        raise UsageError(
            "--data and --data-from both given", "--data names a folder on the host, --data-from one here: pick one"
        )
    from launcher import datasets

    local = Path(spec.data_from).expanduser()
    placed = datasets.place(host, local, reporter)
    source = {"kind": "sent", "local": str(local.resolve()), **placed.to_dict()}
    return replace(spec, data=placed.path, data_from=None, data_source=source)


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
    from launcher import determinism

    rep = reporter or NullReporter()
    recipe = recipe or load_recipe(ws, spec.recipe, entry=spec.entry)
    params = check_params(recipe, spec.params)
    env = determinism.profile_env(spec.profile, spec.seed, spec.threads)
    image = image_record(ws, spec.variant)
    baked_digests = image.pop("recipes", {})
    Engine(host).require()
    if spec.variant == "gpu":
        _gpu_ready(host)
    spec = _place_data(spec, host, rep)
    if spec.code_plan is None:
        spec = replace(spec, code_plan=plan_code(ws, spec, recipe))
    spec = _place_code(spec, host, rep)
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
        shipped = transfer.ship_image_via_registry(
            host, image["id"], registry=spec.ship_via, tag=image.get("tag"), reporter=rep,
            cache_dir=cache_dir or ws.cache_dir,
        )
    else:
        shipped = transfer.ship_image(
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
        owner=_output_owner(host),
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
    on_pass: Callable[[transfer.PullResult], None] | None = None,
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
            result = transfer.pull_outputs(
                h,
                f"{launch['remote_dir']}/out",
                local / "outputs",
                state_file=local / transfer.STATE_FILE,
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
    result: transfer.PullResult,
    state: Mapping[str, Any] | None,
) -> dict[str, Any]:
    from launcher.manifest import assemble, write_manifest

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
    from launcher import build, determinism

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
        from launcher import provision

        facts = provision.facts_for_run(ws, host)
    if spec.data_from:  # sent once for every replicate, after the cheap checks
        Engine(host).require()
        spec = _place_data(spec, host, reporter)
    if (spec.code_plan or {}).get("source") == "mounted":
        Engine(host).require()
        spec = _place_code(spec, host, reporter)
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


def list_runs(ws: Workspace, host: Host | None = None) -> list[dict[str, Any]]:
    """Local run directories with their state; with a host, also its launcher containers."""
    rows: dict[str, dict[str, Any]] = {}
    if ws.runs.is_dir():
        for d in sorted(ws.runs.iterdir()):
            launch = read_json_object(d / LAUNCH_FILE)
            if not launch:
                continue
            manifest = read_json_object(d / MANIFEST_FILE)
            rows[d.name] = {
                "run_id": d.name,
                "recipe": launch.get("recipe", {}).get("name"),
                "code": describe_code(manifest.get("recipe") or launch.get("recipe") or {}),
                "group": launch.get("group"),
                "host": launch.get("host", {}).get("name"),
                "status": manifest.get("status") or "incomplete",
                "launched_at": launch.get("launched_at"),
            }
    if host is not None:
        fmt = '{{.Label "' + RUN_LABEL + '"}}\t{{.State}}\t{{.Status}}'
        for line in Engine(host).ps_by_label(RUN_LABEL, fmt):
            rid, _, rest = line.partition("\t")
            st, _, status = rest.partition("\t")
            row = rows.setdefault(rid, {"run_id": rid, "host": host.name, "status": "unknown here"})
            row["container"] = st
            row["container_status"] = status
    return sorted(rows.values(), key=lambda r: r["run_id"])


def logs(ws: Workspace, run_id: str, sink: LogSink, *, follow: bool = False) -> None:
    """The recipe's output: from the container while it exists, else from the pulled train.log."""
    launch = read_launch(ws, run_id)
    pulled = run_dir(ws, run_id) / "outputs" / "logs" / "train.log"
    try:
        host = reopen_host(ws, launch)
    except (HostUnreachable, LauncherError):
        if pulled.is_file():
            host = None
        else:
            raise
    try:
        if host is not None and Engine(host).container_state(launch["container"]) is not None:
            for line in Engine(host).logs(launch["container"], follow=follow):
                sink(line.rstrip("\n"))
            return
        if pulled.is_file():
            with open(pulled, encoding="utf-8", errors="replace") as f:
                for line in f:
                    sink(line.rstrip("\n"))
            return
        raise NotFound(
            f"no logs for {run_id}: the container is gone and nothing was pulled", "run `launcher pull RUN`"
        )
    finally:
        if host is not None:
            host.close()


def attach(ws: Workspace, run_id: str, sink: LogSink, reporter: Reporter | None = None) -> dict[str, Any]:
    """Follow a detached run to its end, then pull it."""
    launch = read_launch(ws, run_id)
    host = reopen_host(ws, launch)
    try:
        if Engine(host).container_state(launch["container"]) is not None:
            wait_run(ws, run_id, host, on_log=sink)
        return pull_run(ws, run_id, host, reporter)
    finally:
        host.close()


def stop(ws: Workspace, run_id: str) -> dict[str, Any]:
    launch = read_launch(ws, run_id)
    host = reopen_host(ws, launch)
    try:
        done = Engine(host).stop(launch["container"], timeout_s=10)
        if done.returncode != 0:
            raise NotFound(
                f"run {run_id} has no container on {host.name}: {done.last_error_line()}",
                "it may have finished already: `launcher pull RUN`",
            )
        state = Engine(host).container_state(launch["container"]) or {}
        return {"run_id": run_id, "stopped": True, "exit_code": state.get("ExitCode")}
    finally:
        host.close()


def clean(ws: Workspace, run_id: str, *, force: bool = False, reporter: Reporter | None = None) -> dict[str, Any]:
    """Delete a run's directory and container on its host, once the local copy is complete and
    still matches its manifest (force: without that check). The local run directory stays."""
    from launcher.manifest import load_manifest
    from launcher.verify import check_integrity

    launch = read_launch(ws, run_id)
    if not force:
        check_integrity([load_manifest(run_dir(ws, run_id))], reporter)
    host = reopen_host(ws, launch)
    try:
        remote = str(launch.get("remote_dir") or host.run_dir(run_id))
        if not remote.endswith(f"/{run_id}") or "/.launcher/" not in remote:
            raise UsageError(
                f"run {run_id} records {remote!r} as its directory on {host.name}, which is not a launcher run "
                "directory",
                "remove it by hand on the host",
            )
        state = Engine(host).container_state(launch["container"])
        if state and state.get("Running"):
            raise UsageError(
                f"run {run_id} is still running on {host.name}", f"stop it first: `launcher stop {run_id}`"
            )
        if state is not None:
            Engine(host).rm(launch["container"])
        existed = host.exists(remote)
        if existed:
            done = host.run(["rm", "-rf", "--", remote], check=False)
            if host.exists(remote):
                raise CommandFailed(
                    f"could not remove {remote} on {host.name}: {done.last_error_line()}",
                    "its files may belong to root (runs from before outputs were handed to the host user): "
                    f"`sudo rm -rf {remote}` on the host",
                )
        return {"run_id": run_id, "host": host.name, "remote_dir": remote, "removed": existed,
                "container_removed": state is not None}
    finally:
        host.close()
