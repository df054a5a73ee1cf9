"""`launcher resume RUN`: a run started with ``--checkpoint-every N`` that stopped (stopped, killed, its
host rebooted) goes on from its latest checkpoint, in a new container started as the first was
(the same image, environment, code, data, arguments and outputs folder) with ``LAUNCHER_RESUME=1``;
the runtime restores the checkpoint (launcher.runtime.checkpoint) and the run ends with the bits an
uninterrupted run of the same seed ends with.

Each container a run had is a segment in its launch record and manifest (``segments``): when it
started and ended, its exit code, and the checkpoint it resumed from.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from typing import Any

from launcher.errors import NotResumable
from launcher.hashing import atomic_write_json
from launcher.progress import Reporter
from launcher.runs.lifecycle import LAUNCH_FILE, MANIFEST_FILE, LogSink, pull_run, read_launch, run_dir, wait_run
from launcher.runs.manifest import run_segments
from launcher.runs.placement import Placement
from launcher.runs.pull import STATE_FILE
from launcher.runs.store import resolve_run_id
from launcher.runs.targets import open_placement
from launcher.runtime.checkpoint import ENV_RESUME, LATEST
from launcher.workspace import Workspace


def checkpoint_on_host(placement: Placement, launch: Mapping[str, Any]) -> str:
    """The name of the run's latest checkpoint where it ran; NotResumable when there is none."""
    text = placement.host.read_text(f"{placement.outputs(launch)}/{LATEST}")
    try:
        return str(json.loads(text or "")["name"])
    except (ValueError, KeyError, TypeError):
        raise NotResumable(
            f"run {launch['run_id']} has no checkpoint on {placement.name} ({LATEST}): it stopped before its "
            "first one", "start it again with `launcher run`") from None


def resume_run(ws: Workspace, run_ref: str, reporter: Reporter | None = None, *, detach: bool = False,
               on_log: LogSink | None = None, poll_s: float = 1.0) -> dict[str, Any]:
    """Resume the run from its latest checkpoint where it ran; wait for it and pull it (the manifest),
    or, detached, return its launch record once the container started."""
    run_id = resolve_run_id(ws, run_ref)
    launch = read_launch(ws, run_id)
    every = (launch.get("checkpoint") or {}).get("every")
    if not every:
        raise NotResumable(f"run {run_id} was started without --checkpoint-every: it has no checkpoints",
                           "start it again with `launcher run ... --checkpoint-every N`")
    local = run_dir(ws, run_id)
    manifest = local / MANIFEST_FILE
    if manifest.is_file() and json.loads(manifest.read_text()).get("status") == "succeeded":
        raise NotResumable(f"run {run_id} finished (succeeded): there is nothing to resume",
                           "resume a run that was stopped or killed, or start a new one")
    if (launch.get("env") and any("sha256" in v for v in launch["env"].values() if isinstance(v, dict))):
        raise NotResumable(f"run {run_id} was started with --secret-env, whose values launcher does not keep",
                           "start it again with `launcher run`")
    with open_placement(ws, launch) as placement:
        state = placement.state(launch)
        if state is not None and not state.ended:
            raise NotResumable(f"run {run_id} is still running on {placement.name}",
                               f"stop it first (`launcher stop {run_id}`), or wait for it (`launcher attach {run_id}`)")
        name = checkpoint_on_host(placement, launch)
        done = run_segments(launch, state)
        if state is None and manifest.is_file():  # pulled, its container removed: the manifest saw it end
            ended = json.loads(manifest.read_text())
            done[-1].update({k: done[-1].get(k) or ended.get(k) for k in ("started_at", "ended_at", "exit_code")})
        record = placement.restart(launch, {ENV_RESUME: "1"})
        started = placement.state(launch)
        done.append({"segment": len(done), "resumed_from": name, "container": record["container"],
                     "started_at": started.started_at if started else None, "argv": record["argv"]})
        launch = {**launch, "segments": done, "resumed_at": done[-1]["started_at"]}
        if record.get("image_ran"):
            launch["image_ran"] = record["image_ran"]
        atomic_write_json(local / LAUNCH_FILE, launch)
        # what was pulled of the earlier segments describes outputs the resumed container rewrites
        manifest.unlink(missing_ok=True)
        (local / STATE_FILE).unlink(missing_ok=True)
        shutil.rmtree(local / "outputs", ignore_errors=True)
        if detach:
            return launch
        wait_run(ws, run_id, placement, on_log=on_log, poll_s=poll_s)
        return pull_run(ws, run_id, placement, reporter)
