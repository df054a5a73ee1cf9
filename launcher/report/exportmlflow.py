"""Runs exported to MLflow: one MLflow run per launcher run, with its params, tags and per-epoch metrics."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from launcher.errors import HostUnreachable, UsageError
from launcher.progress import NullReporter, Reporter
from launcher.records.manifest import Manifest
from launcher.records.rundir import RunDir
from launcher.report.exportrun import (
    DEFAULT_MLFLOW_DIR,
    MAX_METRICS,
    MAX_PARAMS,
    MLFLOW,
    RUN_ID_TAG,
    ExportedRun,
    ExportResult,
    Verdict,
    chunks,
    environment,
    group_verdicts,
    metric_points,
    millis,
    need_module,
    run_params,
    run_tags,
)
from launcher.workspace import Workspace

# ---------------------------------------------------------------- MLflow


def default_tracking_uri(ws: Workspace) -> str:
    return (ws.root / DEFAULT_MLFLOW_DIR).as_uri()


def normalise_tracking_uri(uri: str) -> str:
    """A plain path becomes a file: URI (MLflow reads relative paths against its own working dir)."""
    scheme = urlsplit(uri).scheme
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        return Path(uri).expanduser().resolve().as_uri()
    return uri


def _is_file_store(uri: str) -> bool:
    return urlsplit(uri).scheme == "file"


def _check_server(uri: str) -> None:
    """Fail in seconds, not after MLflow's minutes of retries, when no tracking server answers."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=5).close()
    except OSError as exc:
        raise HostUnreachable(f"no MLflow tracking server answers at {uri} ({exc})",
                              "start it (`mlflow server --host 127.0.0.1`) or check --tracking-uri") from None


def mlflow_open_command(uri: str) -> str:
    if _is_file_store(uri):
        # MLflow 3 keeps its file store in maintenance mode and asks for this opt-in to open it.
        return f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {uri}"
    if urlsplit(uri).scheme in ("http", "https"):
        return uri
    return f"mlflow ui --backend-store-uri {uri}"


def export_mlflow(ws: Workspace, manifests: Sequence[Manifest], tracking_uri: str | None = None,
                  experiment: str | None = None, reporter: Reporter | None = None) -> ExportResult:
    """One MLflow run per launcher run: params, per-epoch metrics, tags (image, lock, base, verdict), artifacts.

    The experiment is ``experiment`` or the run's code name (a recipe's name, a script's project/path).
    Exporting a run again replaces the MLflow run that an earlier export made of it (found by its
    ``launcher.run_id`` tag).
    """
    rep = reporter or NullReporter()
    uri = normalise_tracking_uri(tracking_uri or default_tracking_uri(ws))
    # MLflow phones home unless told not to; an export sends the runs where the user said, nowhere else.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    need_module("mlflow", "mlflow-skinny", MLFLOW)
    tracking = need_module("mlflow.tracking", "mlflow-skinny", MLFLOW)
    entities = need_module("mlflow.entities", "mlflow-skinny", MLFLOW)
    exceptions = need_module("mlflow.exceptions", "mlflow-skinny", MLFLOW)
    _check_server(uri)
    verdicts = group_verdicts(ws, manifests, rep)
    env = {"MLFLOW_ALLOW_FILE_STORE": "true"} if _is_file_store(uri) else {}
    result = ExportResult(MLFLOW, uri, [], mlflow_open_command(uri))
    task = rep.task("exporting to MLflow", total=len(manifests))
    with environment(**env):
        try:
            client = tracking.MlflowClient(tracking_uri=uri)
            for m in manifests:
                name = experiment or m.code_name  # two projects' train.py are two experiments
                if name not in result.experiments:
                    result.experiments[name] = _experiment_id(client, name)
                result.runs.append(_export_one_mlflow(client, entities, result.experiments[name], m,
                                                      verdicts[m.run_id]))
                task.advance()
        except exceptions.MlflowException as exc:
            raise UsageError(f"MLflow refused the export to {uri}: {' '.join(str(exc).split())}",
                             "check --tracking-uri and the MLflow server's log") from None
        finally:
            task.close()
    return result


def _experiment_id(client: Any, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return str(client.create_experiment(name))
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    return str(exp.experiment_id)


def _export_one_mlflow(client: Any, entities: Any, experiment_id: str, m: Manifest,
                       verdict: Verdict) -> ExportedRun:
    from launcher.records import integrity as verify

    verify.check_integrity([m])  # a file changed after the pull is not exported as the run's
    earlier = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{m.run_id}'")
    for old in earlier:
        client.delete_run(old.info.run_id)
    tags = run_tags(m, verdict)
    started = millis(m.started_at)
    mlrun = client.create_run(experiment_id, start_time=started, tags=tags, run_name=m.run_id)
    rid = mlrun.info.run_id
    try:
        params = run_params(m)
        points = metric_points(m)
        stamp = started or 0
        metrics = [entities.Metric(k, v, stamp, p.step) for p in points for k, v in p.values.items()]
        for chunk in chunks([entities.Param(k, v) for k, v in params.items()], MAX_PARAMS):
            client.log_batch(rid, params=chunk)
        for chunk in chunks(metrics, MAX_METRICS):
            client.log_batch(rid, metrics=chunk)
        outputs = RunDir(m.run_dir).outputs
        if outputs.is_dir():
            client.log_artifacts(rid, str(outputs), "outputs")
        client.log_artifact(rid, str(m.path))
        client.set_terminated(rid, "FINISHED" if m.status == "succeeded" else "FAILED",
                              end_time=millis(str(m.data.get("ended_at") or "")))
    except BaseException:
        client.delete_run(rid)  # nothing half-exported looks like a complete run
        raise
    names = sorted({k for p in points for k in p.values})
    return ExportedRun(m.run_id, m.group, m.replicate, rid, names, len({p.step for p in points}), len(metrics),
                       params=len(params), tags=len(tags), artifacts=len(m.artifacts) + 1, verdict=verdict,
                       replaced=bool(earlier))
