"""Export runs to the tools people already look at: MLflow and TensorBoard.

Both exports read only the run directory: the manifest (params, seed, determinism profile,
image ID, lock hash, base digest, artifacts) and ``outputs/metrics.jsonl`` (one line per
epoch; the step is the epoch). The verdict comes from :mod:`launcher.verify.verdicts`: a run whose
group holds at least two completed runs is compared with them; a run alone has none.

MLflow (``mlflow-skinny``) and TensorBoard (``tensorboard``) are the optional extra
``launcher[export]``; without them the export stops with :class:`MissingExtra`.
This module selects the runs and picks the exporter (:mod:`launcher.report.exportmlflow`,
:mod:`launcher.report.exporttensorboard`); what both take from a run is in :mod:`launcher.report.exportrun`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from launcher.errors import LauncherError, NotFound, UsageError
from launcher.progress import Reporter
from launcher.records.manifest import Manifest, load_manifest
from launcher.records.rundir import RunDir
from launcher.report.exportmlflow import (
    default_tracking_uri,
    export_mlflow,
    mlflow_open_command,
    normalise_tracking_uri,
)
from launcher.report.exportrun import (
    DEFAULT_MLFLOW_DIR,
    EVENT_SUFFIX,
    EXTRA,
    INSTALL_HINT,
    MLFLOW,
    RUN_ID_TAG,
    TAG_PREFIX,
    TARGETS,
    TENSORBOARD,
    VERDICT_NONE,
    ExportedRun,
    ExportResult,
    Point,
    Verdict,
    metric_points,
    run_params,
    run_tags,
)
from launcher.report.exporttensorboard import export_tensorboard, tensorboard_run_dir
from launcher.workspace import Workspace

# The exporters' names stay importable from here, where the CLI and the tests import them.
__all__ = [
    "DEFAULT_MLFLOW_DIR",
    "EVENT_SUFFIX",
    "EXTRA",
    "INSTALL_HINT",
    "MLFLOW",
    "RUN_ID_TAG",
    "TAG_PREFIX",
    "TARGETS",
    "TENSORBOARD",
    "VERDICT_NONE",
    "ExportResult",
    "ExportedRun",
    "Point",
    "Verdict",
    "default_tracking_uri",
    "export_mlflow",
    "export_runs",
    "export_tensorboard",
    "is_run",
    "metric_points",
    "mlflow_open_command",
    "normalise_tracking_uri",
    "run_params",
    "run_tags",
    "select_runs",
    "tensorboard_run_dir",
]


# ---------------------------------------------------------------- selecting runs


def select_runs(ws: Workspace, refs: Sequence[str], group: str | None = None) -> list[Manifest]:
    """Named runs (ids, id prefixes or run directories), a group's runs, or the latest group's."""
    from launcher.records.store import group_runs, latest_group, resolve_run

    if refs and group:
        raise UsageError("name runs or a group, not both", "drop the run ids or --group")
    if refs:
        seen: set[Path] = set()
        out: list[Manifest] = []
        for ref in refs:
            d = resolve_run(ws, ref)
            if d.resolve() not in seen:
                seen.add(d.resolve())
                out.append(load_manifest(d))
        return out
    runs = group_runs(ws, group if group is not None else latest_group(ws), results_only=False)
    if not runs:
        raise NotFound(f"no completed runs in group {group!r} under {ws.runs}",
                       "check the group name in a run's manifest.json")
    return runs


# ---------------------------------------------------------------- one entry point


def export_runs(ws: Workspace, refs: Sequence[str], target: str, *, group: str | None = None,
                tracking_uri: str | None = None, experiment: str | None = None, logdir: Path | None = None,
                reporter: Reporter | None = None) -> ExportResult:
    """Export the named runs (or a group's, or the latest group's) to MLflow or TensorBoard."""
    if target not in TARGETS:
        raise UsageError(f"unknown export target {target!r}", f"use --to {' or --to '.join(TARGETS)}")
    if target == TENSORBOARD:
        if tracking_uri is not None or experiment is not None:
            raise UsageError("--tracking-uri and --experiment are MLflow options", "drop them for --to tensorboard")
        if logdir is None:
            raise UsageError("--to tensorboard needs a log directory",
                             "name it after the runs: `launcher export RUN... --to tensorboard DIR`")
    elif logdir is not None:
        raise UsageError("a log directory is for --to tensorboard", "use --tracking-uri URI for MLflow")
    manifests = select_runs(ws, refs, group)
    if target == MLFLOW:
        return export_mlflow(ws, manifests, tracking_uri, experiment, reporter)
    assert logdir is not None
    return export_tensorboard(ws, manifests, logdir, reporter)


def is_run(ws: Workspace, ref: str) -> bool:
    """Whether ``ref`` names a run (the CLI uses it to tell a TensorBoard DIR from a RUN)."""
    from launcher.records.store import resolve_run

    try:
        d = resolve_run(ws, ref)
    except LauncherError:
        return False
    return RunDir(d).is_run()
