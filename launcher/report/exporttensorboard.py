"""Runs exported to TensorBoard: one event-file directory per launcher run, written by launcher."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from launcher.progress import NullReporter, Reporter
from launcher.records.manifest import Manifest
from launcher.report.exportrun import (
    EVENT_SUFFIX,
    TENSORBOARD,
    ExportedRun,
    ExportResult,
    group_verdicts,
    metric_points,
    millis,
    need_module,
)
from launcher.workspace import Workspace

# ---------------------------------------------------------------- TensorBoard


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in name).lstrip(".") or "_"


def tensorboard_run_dir(logdir: Path, m: Manifest) -> Path:
    """logdir/<group>/<run id>: one TensorBoard run per replicate, the replicates of a group side by side."""
    return logdir / _safe(m.group) / _safe(m.run_id)


def export_tensorboard(ws: Workspace, manifests: Sequence[Manifest], logdir: Path,
                       reporter: Reporter | None = None) -> ExportResult:
    """Event files from each run's per-epoch metrics (one scalar per metric and epoch), a folder per run.

    Wall times are the run's start: per-epoch times are not recorded. A run exported again
    replaces the event files an earlier export wrote for it; other files in its folder stay.
    """
    from launcher.records import integrity as verify

    rep = reporter or NullReporter()
    writer_mod = need_module("tensorboard.summary.writer.event_file_writer", "tensorboard", TENSORBOARD)
    event_pb2 = need_module("tensorboard.compat.proto.event_pb2", "tensorboard", TENSORBOARD)
    summary_pb2 = need_module("tensorboard.compat.proto.summary_pb2", "tensorboard", TENSORBOARD)
    logdir = logdir.expanduser().resolve()
    verdicts = group_verdicts(ws, manifests, rep)
    result = ExportResult(TENSORBOARD, str(logdir), [], f"tensorboard --logdir {logdir}")
    task = rep.task("writing TensorBoard event files", total=len(manifests))
    try:
        for m in manifests:
            verify.check_integrity([m])  # curves from a file changed after the pull are not the run's
            target = tensorboard_run_dir(logdir, m)
            points = metric_points(m)
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
            try:
                wall = (millis(m.started_at) or 0) / 1000.0
                writer = writer_mod.EventFileWriter(str(staging), filename_suffix=EVENT_SUFFIX)
                for p in points:
                    values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in p.values.items()]
                    writer.add_event(event_pb2.Event(wall_time=wall, step=p.step,
                                                     summary=summary_pb2.Summary(value=values)))
                writer.close()
                replaced = _replace_event_files(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            names = sorted({k for p in points for k in p.values})
            result.runs.append(ExportedRun(m.run_id, m.group, m.replicate, str(target), names,
                                           len({p.step for p in points}),
                                           sum(len(p.values) for p in points),
                                           verdict=verdicts[m.run_id], replaced=replaced))
            task.advance()
    finally:
        task.close()
    return result


def _replace_event_files(staging: Path, target: Path) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    old = [p for p in target.iterdir() if p.name.startswith("events.out.tfevents.") and p.name.endswith(EVENT_SUFFIX)]
    for p in old:
        p.unlink()
    for p in staging.iterdir():
        p.replace(target / p.name)
    return bool(old)
