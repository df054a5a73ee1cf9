"""The run container's contract (design.md) as data: its name, its label, its mounts, its `docker run` argv."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from launcher.hosts import engine
from launcher.runs.recipes import Recipe

RUN_LABEL = "org.launcher.run"
CONTAINER_OUT = "/launcher/out"
CONTAINER_DATA = "/launcher/data"
CONTAINER_CODE = "/launcher/code"
IMAGE_RECIPES = "/opt/launcher/recipes"


def container_name(run_id: str) -> str:
    return f"launcher-{run_id}"


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

