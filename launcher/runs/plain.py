"""`launcher env RUN`: the plain `docker run` that repeats a run without launcher.

The same image (by ID), the same code (the snapshot the run mounted, or the recipe baked into the
image), the same data, arguments, working directory and environment variables, and the script
started by the image's Python directly: no launcher runtime, so nothing is seeded, hooked or
recorded. It is how a reader of a paper runs the published script; for a script that seeds itself
it trains on the same batches and ends with the same weights as the run launcher made, which is
what launcher's recording is held to (it observes training and changes none of it).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from launcher.errors import LauncherError, NotFound
from launcher.hosts import engine
from launcher.hosts.containerspec import ContainerSpec, Mount
from launcher.records.manifest import read_quiet
from launcher.records.records import MOUNTED, CodePlan, LaunchRecord
from launcher.records.rundir import RunDir
from launcher.records.store import resolve_run
from launcher.specs.container import CONTAINER_CODE, CONTAINER_DATA, CONTAINER_OUT, IMAGE_RECIPES
from launcher.workspace import Workspace

LIB_DIR = "_lib"


class MountRecord(TypedDict):
    source: str
    target: str
    read_only: bool


class PlainRunRecord(TypedDict):
    """The `env` command's Result data (the command adds "shell")."""

    run_id: str
    image: str
    workdir: str
    mounts: list[MountRecord]
    env: dict[str, str]
    env_from_caller: list[str]
    command: list[str]
    gpu: bool
    argv: list[str]
    notes: list[str]


class PlainShell(PlainRunRecord):
    """`env`'s Result data: the plain run, and its `docker run` line for a shell."""

    shell: str


@dataclass(frozen=True)
class PlainRun:
    run_id: str
    image: str
    workdir: str
    mounts: list[tuple[str, str, bool]]  # (this machine's path, the container's, read-only)
    env: dict[str, str]
    from_caller: list[str]  # variables whose value comes from the caller's environment (secrets)
    command: list[str]  # what the container runs
    gpu: bool = False
    notes: list[str] = field(default_factory=list)

    def spec(self) -> ContainerSpec:
        return ContainerSpec(self.image, tuple(self.command), remove=True, workdir=self.workdir, env=dict(self.env),
                             env_from_caller=tuple(self.from_caller),
                             mounts=tuple(Mount(src, dst, ro) for src, dst, ro in self.mounts),
                             gpus="all" if self.gpu else None)

    def argv(self) -> list[str]:
        return engine.render(self.spec())

    def shell(self) -> str:
        """The argv as one shell command, an option per line."""
        return engine.render_shell(self.spec())

    def to_dict(self) -> PlainRunRecord:
        return {"run_id": self.run_id, "image": self.image, "workdir": self.workdir,
                "mounts": [{"source": s, "target": d, "read_only": ro} for s, d, ro in self.mounts],
                "env": dict(self.env), "env_from_caller": list(self.from_caller), "command": list(self.command),
                "gpu": self.gpu, "argv": self.argv(), "notes": list(self.notes)}


def _user_env(recorded: Any) -> tuple[dict[str, str], list[str]]:
    """--env values recorded with the run, and the names of --secret-env ones (values not recorded)."""
    values: dict[str, str] = {}
    secrets: list[str] = []
    for name, entry in sorted((recorded or {}).items()):
        if isinstance(entry, dict) and isinstance(entry.get("value"), str):
            values[name] = entry["value"]
        else:
            secrets.append(name)
    return values, secrets


def plain_run(ws: Workspace, ref: str, out: Path | None = None) -> PlainRun:
    """The `docker run` that repeats run ref without launcher; its outputs go to out (default:
    ./<run id>-plain in the current directory)."""
    run_dir = resolve_run(ws, ref)
    launch = RunDir(run_dir).read_launch_quiet()
    if launch is None:
        raise NotFound(f"run {run_dir.name} has no launch.json", "name a run launcher started (`launcher ps`)")
    manifest = read_quiet(run_dir)
    recipe = manifest.get("recipe") or launch.get("recipe") or {}
    code: CodePlan | dict[str, str] = launch.get("code") or {}
    notes: list[str] = []
    image = str((manifest.get("image") or {}).get("id") or launch.get("image_ran") or launch["image"]["id"])
    out_dir = (out or Path.cwd() / f"{run_dir.name}-plain").resolve()
    mounts: list[tuple[str, str, bool]] = [(str(out_dir), CONTAINER_OUT, False)]
    env = {k: str(v) for k, v in (launch["determinism"].get("env") or {}).items()}
    env["LAUNCHER_OUT"] = CONTAINER_OUT
    entry = str(recipe.get("entry") or launch["recipe"].get("entry") or "")
    if code.get("source") == MOUNTED:
        local = Path(str(code.get("local") or ""))
        if not local.is_dir():
            notes.append(f"the code snapshot {local} is not on this machine: mount a copy of the code it names "
                         f"({code.get('digest')}) at {CONTAINER_CODE}")
        mounts.append((str(local), CONTAINER_CODE, True))
        script = f"{CONTAINER_CODE}/{entry}"
    else:
        script = f"{IMAGE_RECIPES}/{recipe.get('name') or launch['recipe']['name']}/{entry}"
    if not launch["recipe"].get("script"):
        env["LAUNCHER_PARAMS"] = json.dumps(launch.get("params") or {}, sort_keys=True, separators=(",", ":"))
        env["LAUNCHER_RECIPE"] = str(launch["recipe"]["name"])
        if recipe.get("lib_digest"):
            lib = f"{CONTAINER_CODE if code.get('source') == 'mounted' else IMAGE_RECIPES}/{LIB_DIR}"
            env["PYTHONPATH"] = f"/opt/launcher:{lib}"
            if code.get("source") == MOUNTED:
                notes.append(f"the recipe used the shared library recipes/{LIB_DIR}: mount it at {lib}")
        notes.append("a recipe reads its params and paths from LAUNCHER_* through launcher.runtime.api, "
                     "which the image holds")
    data = launch.get("data")
    if data:
        mounts.append((str(data), CONTAINER_DATA, True))
        env["LAUNCHER_DATA"] = CONTAINER_DATA
        host = (launch.get("host") or {}).get("name")
        if host not in (None, "local"):
            notes.append(f"the data folder {data} is on {host}: use a copy of it here")
    values, secrets = _user_env(manifest.get("env") or launch.get("env"))
    env.update(values)
    if secrets:
        notes.append(f"{', '.join(secrets)}: secret (--secret-env), passed from your environment: export "
                     f"{'it' if len(secrets) == 1 else 'them'} first")
    host = (launch.get("host") or {}).get("name")
    if host not in (None, "local"):
        notes.append(f"the run ran on {host}: run this there, or load image {image[:19]} here first")
    notes.append("no launcher runtime: nothing is seeded, hooked or recorded; a script that does not seed itself "
                 "will not repeat the run's bits")
    command = ["python", script, *[str(a) for a in recipe.get("args") or []]]
    if launch["recipe"].get("script"):
        command = shown_beside(command, script, bool(data))
        notes.append("the script's folder and the data are linked into the working directory while it runs, as "
                     "launcher's runtime shows them (read-only, beside what it writes)")
    return PlainRun(run_id=run_dir.name, image=image, workdir=CONTAINER_OUT, mounts=mounts, env=env,
                    from_caller=secrets, command=command, gpu=_needs_gpu(ws, launch), notes=notes)


def shown_beside(command: list[str], script: str, data: bool) -> list[str]:
    """command in a shell that first links each entry of the data, then of the script's folder, into the
    working directory (a name already there is kept), and removes those links when it ends
    (launcher.runtime.workdir does the same inside a run)."""
    folders = " ".join(shlex.quote(f) + "/*" for f in ([CONTAINER_DATA] if data else [])
                       + [script.rpartition("/")[0] or "."])
    prelude = (f'for f in {folders}; do n="${{f##*/}}"; [ -e "$f" ] && [ ! -e "$n" ] && ln -s "$f" "$n"; done; '
               '"$@"; s=$?; find . -maxdepth 1 -type l -lname "/launcher/*" -delete; exit $s')
    return ["sh", "-c", prelude, "sh", *command]


def _needs_gpu(ws: Workspace, launch: LaunchRecord) -> bool:
    try:
        return ws.needs_gpu(str(launch.get("variant") or launch["image"].get("variant") or "cpu"))
    except LauncherError:  # a variant this workspace no longer has: its name says it
        return "gpu" in str(launch.get("variant"))
