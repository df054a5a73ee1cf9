"""Where two runs differ: the parts of an explanation (model arrays, initial weights, dataset and batch
fingerprints, metrics) and the records verify's JSON holds them in. Why, in one line, and the explanation
put together: :mod:`launcher.verify.classification`."""

from __future__ import annotations

from typing import NotRequired, TypedDict, TypeVar, cast

from launcher.errors import LauncherError
from launcher.records.manifest import Manifest
from launcher.runtime.records import EpochBatches, MetricsLine
from launcher.verify.contentlogs import ContentRecord
from launcher.verify.environment import EnvironmentRow
from launcher.verify.formats import native_saves
from launcher.verify.impact import ProbeImpact
from launcher.verify.jsonlines import read_json as _read_json
from launcher.verify.jsonlines import read_jsonl as _read_jsonl
from launcher.verify.modeldiff import (
    ArrayDiffRecord,
    FirstDifference,
    ModelDiff,
    diff_models,
)
from launcher.verify.stepdiff import StepsDiff

# How an artifact of a run compares with the reference's.
IDENTICAL = "identical"
IDENTICAL_CONTENT = "identical-content"  # other bytes, the same content (zip dates, wall times...)
DIFFERS = "differs"
MISSING = "missing"
REFERENCE = "reference"
UNREADABLE = "unreadable"  # launcher could not read the files as their format: not compared, never "differs"
IGNORED = "ignored"  # left out of the comparison (launcher's list, the recipe's, --ignore) and the bytes differ

# Classifications of a run compared with the reference.
CLASS_IDENTICAL = "identical"
CLASS_NONDETERMINISM = "nondeterminism"
CLASS_ENVIRONMENT = "environment"
CLASS_INPUT = "input-change"
CLASS_OUTPUTS = "outputs"  # training identical; some other output differs

CANONICAL_MODEL = "outputs/model/canonical.npz"
LAYERS = "outputs/weights/layers.json"
DATASET = "outputs/fingerprints/dataset.json"
INITIAL_WEIGHTS = "outputs/fingerprints/initial_weights.json"
BATCHES = "outputs/fingerprints/batches.jsonl"
METRICS = "outputs/metrics.jsonl"


# ---------------------------------------------------------------- records (verify's JSON: docs/verify-json.md)


class ModelExplanation(TypedDict):
    """An explanation's ``model``: the model diff of the first model file both runs hold, or why it failed."""

    source: str  # the run-relative path diffed
    error: NotRequired[str]  # the model could not be diffed: then none of the keys below
    identical: NotRequired[bool]
    arrays_total: NotRequired[int]
    arrays_differing: NotRequired[int]
    elements_total: NotRequired[int]
    elements_differing: NotRequired[int]
    first_difference: NotRequired[FirstDifference | None]
    arrays: NotRequired[list[ArrayDiffRecord]]


class InitialWeightsExplanation(TypedDict):
    """An explanation's ``initial_weights``: the two runs' fingerprints of the weights before training."""

    same: bool
    reference_digest: str | None
    digest: str | None
    arrays_differing: int
    first_difference: FirstDifference | None


class DataExplanation(TypedDict):
    """An explanation's ``data``: the two runs' dataset fingerprints."""

    same: bool
    reference_digest: str | None
    digest: str | None
    kind: str | None
    entries_differing: list[str]  # the first 20


class MetricDelta(TypedDict):
    """How one metric differs at an epoch: the values as the script reported them (numbers, usually)."""

    reference: object
    run: object
    abs_diff: NotRequired[float]  # when both are numbers


class Where(TypedDict):
    """A place in training: the epoch, the fit it belongs to (omitted for the first), and what is found there."""

    epoch: int
    fit: NotRequired[int]
    batch: NotRequired[int]  # batches: the first batch that differs in the epoch
    metrics: NotRequired[dict[str, MetricDelta]]  # metrics: name -> how it differs


class BatchesExplanation(TypedDict):
    """An explanation's ``batches``: the batch fingerprints epoch by epoch."""

    same: bool | None  # None: the batch order could not be recorded, so nothing is known
    epochs_compared: int
    epochs_differing: list[int]
    first_divergence: Where | None
    unrecorded: NotRequired[list[str]]  # why the batch order was not recorded


class EpochCounts(TypedDict):
    reference: int
    run: int


class MetricsExplanation(TypedDict):
    """An explanation's ``metrics``: metrics.jsonl epoch by epoch."""

    same: bool
    epochs_compared: int
    epochs: EpochCounts
    first_divergence: Where | None
    final: Where | None


class Classification(TypedDict):
    """An explanation's ``classification``: the one-line answer to why a run differs."""

    kind: str  # one of the CLASS_* above
    causes: list[str]
    line: str
    impact: NotRequired[str | None]  # the probe impact's kind, where both runs recorded probes


class DifferingFile(TypedDict):
    """One of an explanation's ``files``: a compared file that differs (or is missing) in the run."""

    path: str
    status: str  # differs | missing (identical-content for the files identical in content only)
    content: ContentRecord | None
    ignore: NotRequired[str]  # missing: the --ignore glob that leaves it out
    kind: NotRequired[str]  # the kind of file it is (launcher.verify.evidence: model, figure, ...)
    hint: NotRequired[str]  # compared by bytes: what the differing bytes look like (a date)


class Explanation(TypedDict):
    """Where and why one run differs from the reference (``explanations`` in verify's JSON)."""

    classification: Classification
    model: ModelExplanation | None
    initial_weights: InitialWeightsExplanation | None
    data: DataExplanation | None
    batches: BatchesExplanation | None
    steps: StepsDiff | None
    metrics: MetricsExplanation | None
    environment: list[EnvironmentRow]
    files: list[DifferingFile]
    impact: ProbeImpact | None


class WeightsFingerprint(TypedDict, total=False):
    """``outputs/fingerprints/initial_weights.json`` (launcher.runtime.fingerprints), as read here."""

    digest: str
    arrays: dict[str, str]  # "layer/array" -> digest


class DatasetFingerprint(TypedDict, total=False):
    """``outputs/fingerprints/dataset.json`` (launcher.runtime.fingerprints), as read here."""

    digest: str
    kind: str
    entries: dict[str, str]


# ---------------------------------------------------------------- explanations


def read_metrics(m: Manifest) -> list[MetricsLine] | None:
    """The run's metrics.jsonl rows (JSON objects; the metric names are the script's own); None without it."""
    return cast("list[MetricsLine] | None", _read_jsonl(m.file(METRICS)))


def _read_batches(m: Manifest) -> list[EpochBatches] | None:
    """The run's batches.jsonl rows, those with an integer epoch; None without it."""
    rows = _read_jsonl(m.file(BATCHES))
    return None if rows is None else [cast(EpochBatches, r) for r in rows if isinstance(r.get("epoch"), int)]


def explain_model(ref: Manifest, run: Manifest) -> ModelExplanation | None:
    for rel in (CANONICAL_MODEL, *native_saves()):
        if ref.artifact(rel) and run.artifact(rel):
            try:
                diff: ModelDiff = diff_models(ref.file(rel), run.file(rel))
            except LauncherError as exc:
                return {"source": rel, "error": exc.one_line()}
            out = diff.to_dict()  # less the two paths: the explanation names the runs
            return {"source": rel, "identical": out["identical"], "arrays_total": out["arrays_total"],
                    "arrays_differing": out["arrays_differing"], "elements_total": out["elements_total"],
                    "elements_differing": out["elements_differing"], "first_difference": out["first_difference"],
                    "arrays": out["arrays"]}
    return None


def _digest(doc: WeightsFingerprint | DatasetFingerprint) -> str | None:
    return doc.get("digest")


def explain_initial_weights(ref: Manifest, run: Manifest) -> InitialWeightsExplanation | None:
    da, db = _read_json(ref.file(INITIAL_WEIGHTS)), _read_json(run.file(INITIAL_WEIGHTS))
    if not isinstance(da, dict) or not isinstance(db, dict):
        return None
    a, b = cast(WeightsFingerprint, da), cast(WeightsFingerprint, db)
    arrays_a = a.get("arrays") or {}
    arrays_b = b.get("arrays") or {}
    differing = [k for k in arrays_a if arrays_a.get(k) != arrays_b.get(k)]
    differing += [k for k in arrays_b if k not in arrays_a]
    same = a.get("digest") == b.get("digest") and not differing
    first = differing[0] if differing else None
    layer, _, array = first.rpartition("/") if first else ("", "", "")
    return {
        "same": same,
        "reference_digest": _digest(a), "digest": _digest(b),
        "arrays_differing": len(differing),
        "first_difference": {"layer": layer, "array": array} if first else None,
    }


def explain_data(ref: Manifest, run: Manifest) -> DataExplanation | None:
    da, db = _read_json(ref.file(DATASET)), _read_json(run.file(DATASET))
    if not isinstance(da, dict) or not isinstance(db, dict):
        return None
    a, b = cast(DatasetFingerprint, da), cast(DatasetFingerprint, db)
    ea, eb = a.get("entries") or {}, b.get("entries") or {}
    differing = sorted(k for k in set(ea) | set(eb) if ea.get(k) != eb.get(k)) if isinstance(ea, dict) \
        and isinstance(eb, dict) else []
    return {
        "same": a.get("digest") == b.get("digest"),
        "reference_digest": _digest(a), "digest": _digest(b),
        "kind": a.get("kind"),
        "entries_differing": differing[:20],
    }


_Row = TypeVar("_Row", EpochBatches, MetricsLine)


def _by_epoch(rows: list[_Row]) -> dict[tuple[int, int], _Row]:
    """Rows keyed by (fit, epoch): a recipe that calls fit() twice numbers its epochs from 0 again."""
    out: dict[tuple[int, int], _Row] = {}
    for row in rows:
        e, fit = row.get("epoch"), row.get("fit", 0)
        if isinstance(e, int) and isinstance(fit, int):
            out[(fit, e)] = row
    return out


def _where(key: tuple[int, int]) -> Where:
    fit, epoch = key
    where: Where = {"epoch": epoch}
    if fit:
        where["fit"] = fit
    return where


def explain_batches(ref: Manifest, run: Manifest) -> BatchesExplanation | None:
    a, b = _read_batches(ref), _read_batches(run)
    if a is None or b is None:
        return None
    by_a, by_b = _by_epoch(a), _by_epoch(b)
    differing: list[int] = []
    unrecorded: list[str] = []
    compared = 0
    first: Where | None = None
    for key in sorted(set(by_a) | set(by_b)):
        ra, rb = by_a.get(key), by_b.get(key)
        if (ra and "unrecorded" in ra) or (rb and "unrecorded" in rb):
            unrecorded.append(str((ra.get("unrecorded") if ra else None) or (rb.get("unrecorded") if rb else None)))
            continue
        compared += 1
        if ra is not None and rb is not None and ra.get("digest") == rb.get("digest") \
                and ra.get("batches") == rb.get("batches"):
            continue
        differing.append(key[1])
        if first is None:
            ba = (ra.get("batches") if ra else None) or []
            bb = (rb.get("batches") if rb else None) or []
            pairs = enumerate(zip(ba, bb, strict=False))
            idx = next((i for i, (x, y) in pairs if x != y), min(len(ba), len(bb)))
            first = _where(key)
            first["batch"] = idx
    out: BatchesExplanation = {
        # None: the batch order could not be recorded (e.g. a tf.data pipeline), so nothing is known.
        "same": (not differing) if compared else None,
        "epochs_compared": compared,
        "epochs_differing": differing,
        "first_divergence": first,
    }
    if unrecorded:
        out["unrecorded"] = sorted(set(unrecorded))
    return out


def _metric_names(rows: list[MetricsLine]) -> list[str]:
    names: list[str] = []
    for row in rows:
        for k, v in row.items():
            if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool) and k not in names:
                names.append(k)
    return names


def _metric_deltas(ra: MetricsLine, rb: MetricsLine, names: list[str]) -> dict[str, MetricDelta]:
    """The metrics that differ between two metrics.jsonl rows of one epoch."""
    deltas = {k: _delta(ra.get(k), rb.get(k)) for k in names}
    return {k: v for k, v in deltas.items() if v is not None}


def explain_metrics(ref: Manifest, run: Manifest) -> MetricsExplanation | None:
    a, b = read_metrics(ref), read_metrics(run)
    if a is None or b is None:
        return None
    by_a, by_b = _by_epoch(a), _by_epoch(b)
    epochs = sorted(set(by_a) & set(by_b))
    names = _metric_names(a)
    first: Where | None = None
    for key in epochs:
        deltas = _metric_deltas(by_a[key], by_b[key], names)
        if deltas:
            first = _where(key)
            first["metrics"] = deltas
            break
    final: Where | None = None
    if epochs:
        last = epochs[-1]
        final = _where(last)
        final["metrics"] = _metric_deltas(by_a[last], by_b[last], names)
    return {
        "same": first is None and len(a) == len(b),
        "epochs_compared": len(epochs),
        "epochs": {"reference": len(a), "run": len(b)},
        "first_divergence": first,
        "final": final,
    }


def _delta(x: object, y: object) -> MetricDelta | None:
    if x == y:
        return None
    out: MetricDelta = {"reference": x, "run": y}
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        out["abs_diff"] = abs(float(y) - float(x))
    return out
