"""What a difference in the weights does: the probe set's predictions and Grad-CAM explanations.

A run of a recipe that declares ``[probes]`` holds ``outputs/probes/outputs.npz`` (written by
launcher.runtime.probes: the model's probabilities, predicted classes and Grad-CAM heatmaps on
fixed held-out examples). Two runs whose bits differ are compared there:

- predictions: how many probe predictions flip (and which), and the largest change of any class
  probability;
- explanations: the largest and the mean absolute difference of the heatmaps (each scaled to
  [0, 1]), their correlation (Pearson, per probe: the lowest and the mean), and the overlap of their
  most salient regions (IoU of the top ``top`` fraction of pixels, per probe: the lowest and the mean).

The impact is one of three (:data:`AGREE`, :data:`PREDICTIONS`, :data:`EXPLANATIONS`), decided by
:class:`Tolerances` (``launcher verify checksums --tolerance KEY=VALUE``):

- predictions change when any prediction flips or a probability moves by more than ``probability``;
- explanations change when a heatmap pixel moves by more than ``heatmap``, or the top-``top``
  regions of some probe overlap less than ``overlap`` (IoU);
- otherwise the bits differ, but predictions and explanations agree within tolerance.
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np

from launcher.errors import Corrupt, UsageError
from launcher.records.manifest import Manifest
from launcher.records.rundir import OUTPUTS
from launcher.runtime import probes as runtime_probes

PROBE_OUTPUTS = f"{OUTPUTS}/{runtime_probes.OUTPUTS}"  # the runtime's probe outputs, from the run folder
PROBE_DOCUMENT = f"{OUTPUTS}/{runtime_probes.DOCUMENT}"

AGREE = "agree"  # the bits differ, but predictions and explanations agree within tolerance
PREDICTIONS = "predictions"  # a prediction flips, or a probability moves beyond the tolerance
EXPLANATIONS = "explanations"  # predictions agree; the heatmaps move beyond the tolerance
MAX_LISTED = 20  # flips and most-changed probes listed by name


class ToleranceRecord(TypedDict):
    """:class:`Tolerances` as written in an impact's ``tolerances``."""

    probability: float
    heatmap: float
    overlap: float
    top: float


class Flip(TypedDict):
    """A probe whose predicted class flips: its position, the example's index, both classes, its label."""

    probe: int
    index: int
    reference: int
    run: int
    label: NotRequired[int]


class ProbePlace(TypedDict):
    probe: int
    index: int


class Accuracy(TypedDict):
    reference: float
    run: float


class PredictionsImpact(TypedDict):
    """An impact's ``predictions``: flips and the largest probability change."""

    flips: int
    flipped: list[Flip]  # the first MAX_LISTED
    max_prob_change: float
    max_prob_change_at: ProbePlace | None
    agree: bool
    accuracy: NotRequired[Accuracy]  # with labels


class Correlation(TypedDict):
    min: float
    mean: float


class Overlap(TypedDict):
    top: float
    min_iou: float
    mean_iou: float


class ChangedProbe(TypedDict):
    probe: int
    mean_abs_diff: float
    index: NotRequired[int]  # added by compare_probes, which knows the examples


class HeatmapsImpact(TypedDict):
    """An impact's ``heatmaps``: how far the Grad-CAM heatmaps move."""

    shape: list[int]
    max_abs_diff: float
    mean_abs_diff: float
    correlation: Correlation
    overlap: Overlap
    most_changed: list[ChangedProbe]
    agree: bool


class ProbeImpact(TypedDict):
    """An explanation's ``impact``: what two runs' difference does to the probe set (verify's JSON, the report)."""

    tolerances: ToleranceRecord
    probes: int | None  # None: the probe sets differ by their recorded digest
    comparable: bool
    identical: NotRequired[bool]  # comparable only, as are predictions and heatmaps
    predictions: NotRequired[PredictionsImpact | None]
    heatmaps: NotRequired[HeatmapsImpact | None]
    kind: str | None  # AGREE | PREDICTIONS | EXPLANATIONS; None: nothing to compare
    line: str
    source: NotRequired[str]  # the probe outputs' path, when read from runs


@dataclass(frozen=True)
class Tolerances:
    """How far probe outputs may move and still count as agreeing (README "Verify")."""

    probability: float = 1e-3  # largest change of any class probability
    heatmap: float = 0.05  # largest change of any heatmap pixel (maps are scaled to [0, 1])
    overlap: float = 0.5  # lowest IoU of the most salient regions, per probe
    top: float = 0.1  # the most salient region: this fraction of a heatmap's pixels

    @classmethod
    def parse(cls, items: Iterable[str]) -> Tolerances:
        """``KEY=VALUE`` items over the defaults; UsageError naming a bad key or value."""
        known = [f.name for f in fields(cls)]
        out = cls()
        for item in items:
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in known:
                raise UsageError(f"--tolerance {item!r}: expected KEY=VALUE with KEY one of {', '.join(known)}",
                                 "e.g. --tolerance probability=0.01 --tolerance heatmap=0.1")
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            upper = math.inf if key == "probability" else 1.0
            if not (0.0 <= value <= upper) or (key == "top" and value == 0.0):
                raise UsageError(f"--tolerance {key}={raw}: not a number from 0 to {upper:g}"
                                 + (" (above 0)" if key == "top" else ""),
                                 f"give {key} a value like {getattr(cls(), key)}")
            out = replace(out, **{key: value})
        return out

    def to_dict(self) -> ToleranceRecord:
        return {"probability": self.probability, "heatmap": self.heatmap, "overlap": self.overlap, "top": self.top}


def load_probe_outputs(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise Corrupt(f"{path} cannot be read as the probe outputs ({exc})", "re-pull the run (`launcher pull RUN`)"
                      ) from exc


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    sa, sb = a.std(), b.std()
    if sa == 0 or sb == 0:
        return 1.0 if np.array_equal(a, b) else 0.0
    return float(np.mean((a - a.mean()) * (b - b.mean())) / (sa * sb))


def top_region(h: np.ndarray, top: float) -> set[int]:
    """The positions of the ``top`` fraction of the most salient pixels (ties: the first in C order)."""
    flat = h.ravel()
    k = max(1, math.ceil(top * flat.size))
    return {int(i) for i in np.argsort(-flat, kind="stable")[:k]}


def overlap(a: np.ndarray, b: np.ndarray, top: float) -> float:
    """IoU of the two heatmaps' most salient regions."""
    ra, rb = top_region(a, top), top_region(b, top)
    return len(ra & rb) / len(ra | rb)


def compare_heatmaps(a: np.ndarray, b: np.ndarray, tol: Tolerances) -> HeatmapsImpact:
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    per_probe = diff.reshape(len(diff), -1).mean(axis=1) if len(diff) else np.zeros(0)
    corr = [_correlation(x, y) for x, y in zip(a, b, strict=True)]
    iou = [overlap(x, y, tol.top) for x, y in zip(a, b, strict=True)]
    max_abs = float(diff.max()) if diff.size else 0.0
    ranked = [int(i) for i in np.argsort(-per_probe, kind="stable") if per_probe[i] > 0][:MAX_LISTED]
    return {
        "shape": list(a.shape[1:]),
        "max_abs_diff": max_abs,
        "mean_abs_diff": float(diff.mean()) if diff.size else 0.0,
        "correlation": {"min": min(corr, default=1.0), "mean": float(np.mean(corr)) if corr else 1.0},
        "overlap": {"top": tol.top, "min_iou": min(iou, default=1.0), "mean_iou": float(np.mean(iou)) if iou else 1.0},
        "most_changed": [{"probe": i, "mean_abs_diff": float(per_probe[i])} for i in ranked],
        "agree": max_abs <= tol.heatmap and min(iou, default=1.0) >= tol.overlap,
    }


def _flip(i: int, indices: np.ndarray, pa: np.ndarray, pb: np.ndarray, labels: np.ndarray | None) -> Flip:
    flip: Flip = {"probe": i, "index": int(indices[i]), "reference": int(pa[i]), "run": int(pb[i])}
    if labels is not None:
        flip["label"] = int(labels[i])
    return flip


def compare_predictions(ref: Mapping[str, np.ndarray], run: Mapping[str, np.ndarray],
                        tol: Tolerances) -> PredictionsImpact | None:
    """Flips and the largest probability change; None when the runs' probabilities cannot be compared."""
    if not ("probabilities" in ref and "probabilities" in run
            and ref["probabilities"].shape == run["probabilities"].shape):
        return None
    indices = ref["indices"]
    pa, pb = ref["predicted"], run["predicted"]
    flipped = np.flatnonzero(pa != pb)
    dp = np.abs(ref["probabilities"].astype(np.float64) - run["probabilities"].astype(np.float64))
    where = int(dp.max(axis=1).argmax()) if dp.size else 0
    labels = ref.get("labels")
    largest = float(dp.max()) if dp.size else 0.0
    predictions: PredictionsImpact = {
        "flips": len(flipped),
        "flipped": [_flip(int(i), indices, pa, pb, labels) for i in flipped[:MAX_LISTED]],
        "max_prob_change": largest,
        "max_prob_change_at": {"probe": where, "index": int(indices[where])} if dp.size else None,
        "agree": not len(flipped) and largest <= tol.probability,
    }
    if labels is not None:
        predictions["accuracy"] = {"reference": float(np.mean(pa == labels)), "run": float(np.mean(pb == labels))}
    return predictions


def _impact_kind(predictions: PredictionsImpact | None, heat: HeatmapsImpact | None) -> str | None:
    if predictions is not None and not predictions["agree"]:
        return PREDICTIONS
    if heat is not None and not heat["agree"]:
        return EXPLANATIONS
    if predictions is None and heat is None:
        return None
    return AGREE


def probe_impact(ref: Mapping[str, np.ndarray], run: Mapping[str, np.ndarray],
                 tol: Tolerances | None = None) -> ProbeImpact:
    """The impact of a run's difference on the probe set (both runs' outputs.npz, read)."""
    tol = tol or Tolerances()
    probes = len(ref.get("indices", []))
    if not np.array_equal(ref.get("indices", []), run.get("indices", [])):
        return {"tolerances": tol.to_dict(), "probes": probes, "comparable": False, "kind": None,
                "line": "probe sets differ (other examples): predictions and explanations not compared"}
    indices = ref["indices"]
    predictions = compare_predictions(ref, run, tol)
    heat = None
    if "heatmaps" in ref and "heatmaps" in run and ref["heatmaps"].shape == run["heatmaps"].shape:
        heat = compare_heatmaps(ref["heatmaps"], run["heatmaps"], tol)
        for row in heat["most_changed"]:
            row["index"] = int(indices[row["probe"]])
    out: ProbeImpact = {
        "tolerances": tol.to_dict(), "probes": probes, "comparable": True,
        "identical": set(ref) == set(run) and all(np.array_equal(ref[k], run[k]) for k in ref),
        "predictions": predictions, "heatmaps": heat, "kind": _impact_kind(predictions, heat), "line": "",
    }
    out["line"] = impact_phrase(out)
    return out


def compare_probes(ref: Mapping[str, np.ndarray], run: Mapping[str, np.ndarray],
                   tol: Tolerances | None = None) -> dict[str, Any]:
    """:func:`probe_impact` as a plain dict, for launcher.report.probes, which reads it as one."""
    return dict(probe_impact(ref, run, tol))


def _g(x: float) -> str:
    return f"{x:.3g}"


def impact_phrase(impact: ProbeImpact) -> str:
    """One phrase for the classification line."""
    if not impact.get("comparable", True):
        return str(impact["line"])
    n = impact["probes"]
    pred, heat = impact.get("predictions"), impact.get("heatmaps")
    parts = []
    if pred is not None:
        flips = pred["flips"]
        which = ", ".join(str(f["index"]) for f in pred["flipped"][:5]) + (", ..." if flips > 5 else "")
        parts.append((f"{flips} of {n} probe predictions flip (examples {which})" if flips else
                      f"no probe prediction flips of {n}") + f", max |Δp| {_g(pred['max_prob_change'])}")
    if heat is not None:
        parts.append(f"heatmaps max |Δ| {_g(heat['max_abs_diff'])}, mean |Δ| {_g(heat['mean_abs_diff'])}, "
                     f"correlation >= {_g(heat['correlation']['min'])}, top-{_g(100 * heat['overlap']['top'])}% "
                     f"IoU >= {_g(heat['overlap']['min_iou'])}")
    detail = "; ".join(parts)
    kind = impact.get("kind")
    if kind == PREDICTIONS:
        return f"predictions change: {detail}"
    if kind == EXPLANATIONS:
        return f"explanations change (predictions agree): {detail}"
    if kind == AGREE:
        if impact.get("identical"):
            return f"probe outputs identical ({n} probes)"
        return f"bits differ, but predictions and explanations agree within tolerance ({detail})"
    return "probe outputs hold no predictions or heatmaps to compare"


def _probe_digest(m: Manifest) -> str | None:
    try:
        doc = json.loads(m.file(PROBE_DOCUMENT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc.get("digest") if isinstance(doc, dict) else None


def explain_impact(ref: Manifest, run: Manifest, tol: Tolerances | None = None) -> ProbeImpact | None:
    """The impact on the probe set of two runs' difference; None when either run recorded no probes."""
    if not (ref.artifact(PROBE_OUTPUTS) and run.artifact(PROBE_OUTPUTS)):
        return None
    da, db = _probe_digest(ref), _probe_digest(run)
    if da is not None and db is not None and da != db:
        return {"probes": None, "comparable": False, "kind": None, "tolerances": (tol or Tolerances()).to_dict(),
                "line": f"probe sets differ (inputs {da[7:19]}… vs {db[7:19]}…): predictions and explanations "
                        "not compared"}
    impact = probe_impact(load_probe_outputs(ref.file(PROBE_OUTPUTS)), load_probe_outputs(run.file(PROBE_OUTPUTS)),
                            tol)
    impact["source"] = PROBE_OUTPUTS
    return impact


def impact_lines(impact: ProbeImpact) -> list[str]:
    """The impact as text lines for `launcher verify checksums`."""
    if not impact.get("comparable", True):
        return [f"probes: {impact['line']}"]
    lines = [f"probes ({impact['probes']}): {impact['line']}"]
    pred = impact.get("predictions")
    if pred is not None:
        for f in pred["flipped"]:
            label = f" (label {f['label']})" if "label" in f else ""
            lines.append(f"  flips: example {f['index']}: class {f['reference']} -> {f['run']}{label}")
        if pred["flips"] > len(pred["flipped"]):
            lines.append(f"  and {pred['flips'] - len(pred['flipped'])} more flips (all of them in --json)")
        acc = pred.get("accuracy")
        if acc:
            lines.append(f"  probe accuracy {_g(acc['reference'])} -> {_g(acc['run'])}")
    heat = impact.get("heatmaps")
    if heat is not None and heat["most_changed"]:
        lines.append("  heatmaps changed most: " + ", ".join(
            f"example {r['index']} (mean |Δ| {_g(r['mean_abs_diff'])})" for r in heat["most_changed"][:5]))
    tol = impact["tolerances"]
    lines.append(f"  tolerances: probability {_g(tol['probability'])}, heatmap {_g(tol['heatmap'])}, "
                 f"overlap {_g(tol['overlap'])} (top {_g(100 * tol['top'])}%)")
    return lines
