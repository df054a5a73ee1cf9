"""Export runs to the tools people already look at: MLflow and TensorBoard.

Both exports read only the run directory: the manifest (params, seed, determinism profile,
image ID, lock hash, base digest, artifacts) and ``outputs/metrics.jsonl`` (one line per
epoch; the step is the epoch). The verdict comes from :mod:`launcher.verify`: a run whose
group holds at least two completed runs is compared with them; a run alone has none.

MLflow (``mlflow-skinny``) and TensorBoard (``tensorboard``) are the optional extra
``launcher[export]``; without them the export stops with :class:`MissingExtra`.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from launcher.errors import Corrupt, HostUnreachable, LauncherError, MissingExtra, NotFound, UsageError
from launcher.manifest import Manifest, load_manifest
from launcher.progress import NullReporter, Reporter
from launcher.workspace import Workspace

MLFLOW = "mlflow"
TENSORBOARD = "tensorboard"
TARGETS = (MLFLOW, TENSORBOARD)
EXTRA = "export"
INSTALL_HINT = f"pip install 'launcher[{EXTRA}]'"

DEFAULT_MLFLOW_DIR = "mlruns"  # in the workspace; `mlflow ui` run there opens it
TAG_PREFIX = "launcher."
RUN_ID_TAG = TAG_PREFIX + "run_id"
EVENT_SUFFIX = ".launcher"  # event files this module wrote, so a re-export replaces only its own

VERDICT_NONE = "none"

# MLflow's log_batch limits per request.
_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS = 1000, 100, 100
_MAX_PARAM_CHARS = 6000


# ---------------------------------------------------------------- what a run holds


@dataclass(frozen=True)
class Point:
    step: int
    values: Mapping[str, float]


def metric_points(m: Manifest) -> list[Point]:
    """The per-epoch metrics of a run; the step is the epoch.

    A script that calls fit() more than once records epochs from 0 again (with a ``fit``
    index): those steps continue after the previous fit's, so one curve never goes back.
    Values that are not numbers are left out.
    """
    path = m.file("outputs/metrics.jsonl")
    if not path.is_file():
        return []
    points: list[Point] = []
    offset, last_fit, last_step = 0, None, -1
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise Corrupt(f"run {m.run_id}: outputs/metrics.jsonl line {n} is not JSON ({exc})",
                          f"re-pull the run (`launcher pull {m.run_id}`)") from exc
        if not isinstance(row, dict):
            continue
        fit = row.get("fit", 0)
        if fit != last_fit:
            offset, last_fit = last_step + 1, fit
        epoch = row.get("epoch")
        step = offset + (int(epoch) if isinstance(epoch, int | float) else n - 1)
        values = {k: float(v) for k, v in row.items()
                  if k not in ("epoch", "fit") and isinstance(v, int | float) and not isinstance(v, bool)}
        points.append(Point(step, values))
        last_step = max(last_step, step)
    return points


def run_params(m: Manifest) -> dict[str, str]:
    """The recipe's params, the seed and the determinism profile, as MLflow params (strings)."""
    out = {str(k): _param_text(v) for k, v in m.params.items()}
    det = m.determinism
    out.setdefault("seed", _param_text(m.seed))
    out.setdefault("determinism_profile", _param_text(det.get("profile")))
    if det.get("threads") is not None:
        out.setdefault("determinism_threads", _param_text(det.get("threads")))
    return out


def _param_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= _MAX_PARAM_CHARS else text[:_MAX_PARAM_CHARS - 1] + "…"


@dataclass(frozen=True)
class Verdict:
    """The group's verdict from launcher.verify, and this run's place in it."""

    verdict: str  # identical | differs | ... as launcher.verify says it, or "none"
    run: str  # reference | identical | differs | none
    line: str  # one line a person reads

    def to_dict(self) -> dict[str, str]:
        return {"verdict": self.verdict, "run": self.run, "line": self.line}


def _verdicts(ws: Workspace, manifests: Sequence[Manifest], reporter: Reporter) -> dict[str, Verdict]:
    """Verify each group once; a run alone in its group, or one verify cannot compare, has none."""
    from launcher import verify

    out: dict[str, Verdict] = {}
    by_group: dict[str, list[Manifest]] = {}
    for m in manifests:
        by_group.setdefault(m.group, []).append(m)
    for group, members in by_group.items():
        complete = verify.group_runs(ws, group)
        if len(complete) < 2:
            for m in members:
                out[m.run_id] = Verdict(VERDICT_NONE, VERDICT_NONE,
                                        f"not verified: {m.run_id} is the only completed run of group {group}")
            continue
        try:
            report = verify.verify_checksums(ws, group=group, reporter=reporter).to_dict()
        except LauncherError as exc:
            for m in members:
                out[m.run_id] = Verdict(VERDICT_NONE, VERDICT_NONE, f"not verified: {exc.one_line()}")
            continue
        rows = {r.get("run_id"): r for r in report.get("runs", [])}
        for m in members:
            row = rows.get(m.run_id)
            if row is None:
                out[m.run_id] = Verdict(VERDICT_NONE, VERDICT_NONE,
                                        f"not verified: {m.run_id} is not among the runs of group {group} "
                                        f"under {ws.runs}")
                continue
            status = str(row.get("status") or VERDICT_NONE)
            line = str(report.get("summary") or "")
            if status not in ("reference", "identical") and row.get("line"):
                line = str(row["line"])
            out[m.run_id] = Verdict(str(report.get("verdict") or VERDICT_NONE), status, line)
    return out


def run_tags(m: Manifest, verdict: Verdict) -> dict[str, str]:
    img = m.image
    tags = {
        RUN_ID_TAG: m.run_id,
        TAG_PREFIX + "group": m.group,
        TAG_PREFIX + "replicate": str(m.replicate),
        TAG_PREFIX + "recipe": m.recipe_name,
        TAG_PREFIX + "status": m.status,
        TAG_PREFIX + "seed": str(m.seed),
        TAG_PREFIX + "determinism_profile": str(m.determinism.get("profile")),
        TAG_PREFIX + "image_id": str(img.get("id")),
        TAG_PREFIX + "image_tag": str(img.get("tag")),
        TAG_PREFIX + "lock_sha256": str(img.get("lock_sha256")),
        TAG_PREFIX + "base_digest": str(img.get("base_digest")),
        TAG_PREFIX + "git_commit": str(img.get("git_commit")),
        TAG_PREFIX + "host": str(m.host.get("name")),
        TAG_PREFIX + "verdict": verdict.verdict,
        TAG_PREFIX + "verdict_run": verdict.run,
        TAG_PREFIX + "verdict_line": verdict.line,
    }
    if img.get("git_commit"):
        tags["mlflow.source.git.commit"] = str(img["git_commit"])
    return tags


# ---------------------------------------------------------------- results


@dataclass
class ExportedRun:
    run_id: str
    group: str
    replicate: int
    destination: str  # the MLflow run ID, or the TensorBoard run folder
    metrics: list[str]
    steps: int
    points: int
    params: int = 0
    tags: int = 0
    artifacts: int = 0
    verdict: Verdict | None = None
    replaced: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "group": self.group, "replicate": self.replicate,
                "destination": self.destination, "metrics": self.metrics, "steps": self.steps,
                "points": self.points, "params": self.params, "tags": self.tags, "artifacts": self.artifacts,
                "verdict": self.verdict.to_dict() if self.verdict else None, "replaced": self.replaced}


@dataclass
class ExportResult:
    target: str
    destination: str  # the tracking URI, or the TensorBoard log dir
    runs: list[ExportedRun]
    open_with: str  # the command that shows the export
    experiments: dict[str, str] = field(default_factory=dict)  # MLflow: name -> experiment ID

    def summary_line(self) -> str:
        where = {MLFLOW: f"MLflow at {self.destination}", TENSORBOARD: f"TensorBoard event files in {self.destination}"}
        n = len(self.runs)
        return f"exported {n} run{'s' if n != 1 else ''} to {where[self.target]}; open with: {self.open_with}"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "destination": self.destination, "open_with": self.open_with,
                "experiments": self.experiments, "runs": [r.to_dict() for r in self.runs]}


# ---------------------------------------------------------------- selecting runs


def select_runs(ws: Workspace, refs: Sequence[str], group: str | None = None) -> list[Manifest]:
    """Named runs (ids, id prefixes or run directories), a group's runs, or the latest group's."""
    from launcher import verify

    if refs and group:
        raise UsageError("name runs or a group, not both", "drop the run ids or --group")
    if refs:
        seen: set[Path] = set()
        out: list[Manifest] = []
        for ref in refs:
            d = verify.resolve_run(ws, ref)
            if d.resolve() not in seen:
                seen.add(d.resolve())
                out.append(load_manifest(d))
        return out
    runs = verify.group_runs(ws, group if group is not None else verify.latest_group(ws))
    if not runs:
        raise NotFound(f"no completed runs in group {group!r} under {ws.runs}",
                       "check the group name in a run's manifest.json")
    return runs


# ---------------------------------------------------------------- optional packages


def _need(module: str, package: str, target: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(f"`launcher export --to {target}` needs {package}, which is not installed ({exc})",
                           INSTALL_HINT) from None


@contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _millis(stamp: str | None) -> int | None:
    if not stamp:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


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

    The experiment is ``experiment`` or the recipe's name. Exporting a run again replaces the
    MLflow run that an earlier export made of it (found by its ``launcher.run_id`` tag).
    """
    rep = reporter or NullReporter()
    uri = normalise_tracking_uri(tracking_uri or default_tracking_uri(ws))
    # MLflow phones home unless told not to; an export sends the runs where the user said, nowhere else.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    _need("mlflow", "mlflow-skinny", MLFLOW)
    tracking = _need("mlflow.tracking", "mlflow-skinny", MLFLOW)
    entities = _need("mlflow.entities", "mlflow-skinny", MLFLOW)
    exceptions = _need("mlflow.exceptions", "mlflow-skinny", MLFLOW)
    _check_server(uri)
    verdicts = _verdicts(ws, manifests, rep)
    env = {"MLFLOW_ALLOW_FILE_STORE": "true"} if _is_file_store(uri) else {}
    result = ExportResult(MLFLOW, uri, [], mlflow_open_command(uri))
    task = rep.task("exporting to MLflow", total=len(manifests))
    with _env(**env):
        try:
            client = tracking.MlflowClient(tracking_uri=uri)
            for m in manifests:
                name = experiment or m.recipe_name
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
    from launcher import verify

    verify.check_integrity([m])  # a file changed after the pull is not exported as the run's
    earlier = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{m.run_id}'")
    for old in earlier:
        client.delete_run(old.info.run_id)
    tags = run_tags(m, verdict)
    started = _millis(m.started_at)
    mlrun = client.create_run(experiment_id, start_time=started, tags=tags, run_name=m.run_id)
    rid = mlrun.info.run_id
    try:
        params = run_params(m)
        points = metric_points(m)
        stamp = started or 0
        metrics = [entities.Metric(k, v, stamp, p.step) for p in points for k, v in p.values.items()]
        for chunk in _chunks([entities.Param(k, v) for k, v in params.items()], _MAX_PARAMS):
            client.log_batch(rid, params=chunk)
        for chunk in _chunks(metrics, _MAX_METRICS):
            client.log_batch(rid, metrics=chunk)
        outputs = m.run_dir / "outputs"
        if outputs.is_dir():
            client.log_artifacts(rid, str(outputs), "outputs")
        client.log_artifact(rid, str(m.path))
        client.set_terminated(rid, "FINISHED" if m.status == "succeeded" else "FAILED",
                              end_time=_millis(str(m.data.get("ended_at") or "")))
    except BaseException:
        client.delete_run(rid)  # nothing half-exported looks like a complete run
        raise
    names = sorted({k for p in points for k in p.values})
    return ExportedRun(m.run_id, m.group, m.replicate, rid, names, len({p.step for p in points}), len(metrics),
                       params=len(params), tags=len(tags), artifacts=len(m.artifacts) + 1, verdict=verdict,
                       replaced=bool(earlier))


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
    from launcher import verify

    rep = reporter or NullReporter()
    writer_mod = _need("tensorboard.summary.writer.event_file_writer", "tensorboard", TENSORBOARD)
    event_pb2 = _need("tensorboard.compat.proto.event_pb2", "tensorboard", TENSORBOARD)
    summary_pb2 = _need("tensorboard.compat.proto.summary_pb2", "tensorboard", TENSORBOARD)
    logdir = logdir.expanduser().resolve()
    verdicts = _verdicts(ws, manifests, rep)
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
                wall = (_millis(m.started_at) or 0) / 1000.0
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
    from launcher import verify

    try:
        d = verify.resolve_run(ws, ref)
    except LauncherError:
        return False
    return (d / "manifest.json").is_file() or (d / "launch.json").is_file()
