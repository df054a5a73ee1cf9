"""What an export takes from a run (metric points, params, tags, its verdict), the export results, optional packages."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypedDict, TypeVar

from launcher.errors import Corrupt, LauncherError, MissingExtra
from launcher.progress import Reporter
from launcher.records.manifest import Manifest
from launcher.verify.differences import METRICS
from launcher.workspace import Workspace

MLFLOW = "mlflow"
TENSORBOARD = "tensorboard"
TARGETS = (MLFLOW, TENSORBOARD)
EXTRA = "export"
INSTALL_HINT = f"pip install 'launcher[{EXTRA}]'"

DEFAULT_MLFLOW_DIR = "mlruns"  # in the workspace; `mlflow ui` run there opens it
TAG_PREFIX = "launcher."
RUN_ID_TAG = TAG_PREFIX + "run_id"
EVENT_SUFFIX = ".launcher"  # event files launcher's export wrote, so a re-export replaces only its own

VERDICT_NONE = "none"

# MLflow's log_batch limits per request.
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100
MAX_PARAM_CHARS = 6000


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
    path = m.file(METRICS)
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
    return text if len(text) <= MAX_PARAM_CHARS else text[:MAX_PARAM_CHARS - 1] + "…"


T = TypeVar("T")


class VerdictRecord(TypedDict):
    verdict: str
    run: str
    line: str


@dataclass(frozen=True)
class Verdict:
    """The group's verdict from launcher.verify.verdicts, and this run's place in it."""

    verdict: str  # identical | differs | ... as launcher.verify.verdicts says it, or "none"
    run: str  # reference | identical | differs | none
    line: str  # one line a person reads

    def to_dict(self) -> VerdictRecord:
        return {"verdict": self.verdict, "run": self.run, "line": self.line}


def group_verdicts(ws: Workspace, manifests: Sequence[Manifest], reporter: Reporter) -> dict[str, Verdict]:
    """Verify each group once; a run alone in its group, or one verify cannot compare, has none."""
    from launcher.records.store import group_runs
    from launcher.verify.verdicts import verify_checksums

    out: dict[str, Verdict] = {}
    by_group: dict[str, list[Manifest]] = {}
    for m in manifests:
        by_group.setdefault(m.group, []).append(m)
    for group, members in by_group.items():
        complete = group_runs(ws, group, results_only=False)
        if len(complete) < 2:
            for m in members:
                out[m.run_id] = Verdict(VERDICT_NONE, VERDICT_NONE,
                                        f"not verified: {m.run_id} is the only completed run of group {group}")
            continue
        try:
            report = verify_checksums(ws, group=group, reporter=reporter, across_code=True).to_dict()
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
        TAG_PREFIX + "code": m.code_name,  # a script's project/path (myproj/train.py); a recipe's name
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


class ExportedRunRecord(TypedDict):
    """One run of `launcher export`'s JSON result."""

    run_id: str
    group: str
    replicate: int
    destination: str
    metrics: list[str]
    steps: int
    points: int
    params: int
    tags: int
    artifacts: int
    verdict: VerdictRecord | None
    replaced: bool


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

    def to_dict(self) -> ExportedRunRecord:
        return {"run_id": self.run_id, "group": self.group, "replicate": self.replicate,
                "destination": self.destination, "metrics": self.metrics, "steps": self.steps,
                "points": self.points, "params": self.params, "tags": self.tags, "artifacts": self.artifacts,
                "verdict": self.verdict.to_dict() if self.verdict else None, "replaced": self.replaced}


class ExportRecord(TypedDict):
    """The `export` command's Result data."""

    target: str
    destination: str
    open_with: str
    experiments: dict[str, str]
    runs: list[ExportedRunRecord]


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

    def to_dict(self) -> ExportRecord:
        return {"target": self.target, "destination": self.destination, "open_with": self.open_with,
                "experiments": self.experiments, "runs": [r.to_dict() for r in self.runs]}


# ---------------------------------------------------------------- optional packages


def need_module(module: str, package: str, target: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(f"`launcher export --to {target}` needs {package}, which is not installed ({exc})",
                           INSTALL_HINT) from None


@contextmanager
def environment(**values: str) -> Iterator[None]:
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


def millis(stamp: str | None) -> int | None:
    if not stamp:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


def chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
