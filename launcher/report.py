"""Experiment groups -> ``reports/<name>/``: final-metric statistics, the share of the spread
left with the seed fixed and its confidence interval, per-epoch plots of every run and of each
replicate's difference from its group's first run, a per-layer picture of where the final
weights diverge, index.html and report.json.

A group whose runs all share one seed is a *same-seed* group; one with several seeds is a
*different-seed* group. The standard deviation of a final metric over a same-seed group,
divided by the one over a different-seed group, is the share of the spread that the seed
does not explain (the nondeterminism of training), the 74-87% figure of the ResNet study.
With few runs that ratio is mostly noise, so it comes with an F-distribution interval
(normal metrics assumed) and a share above 100% is explained rather than reported.
"""

from __future__ import annotations

import functools
import html
import json
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import NotFound, UsageError
from launcher.hashing import atomic_path, atomic_write_json, atomic_write_text
from launcher.manifest import Manifest
from launcher.progress import NullReporter, Reporter
from launcher.verify import group_runs, read_metrics, verify_checksums
from launcher.workspace import Workspace

SCHEMA = "launcher.report/v1"
CONFIDENCE = 0.95
# "Tight": the interval of the standard-deviation share reaches no further than this factor on
# either side of the estimate (80% -> 64%..100%).
TIGHT_FACTOR = 1.25
MAX_RUNS_ADVISED = 1_000_000
CANONICAL_MODEL = "outputs/model/canonical.npz"
LAYERS_DOC = "outputs/weights/layers.json"
SAME_SEED = "same-seed"
DIFFERENT_SEEDS = "different-seeds"
SINGLE = "single-run"
# Colours per group, readable on white and for the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")


@dataclass
class RunSeries:
    run_id: str
    group: str
    replicate: int
    seed: int | None
    status: str
    epochs: list[dict[str, Any]]
    run_dir: Path | None = None
    profile: str | None = None

    @property
    def final(self) -> dict[str, float]:
        if not self.epochs:
            return {}
        return {k: float(v) for k, v in self.epochs[-1].items() if k != "epoch" and _is_number(v)}

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "group": self.group, "replicate": self.replicate, "seed": self.seed,
                "status": self.status, "epochs": len(self.epochs), "final": _clean(self.final)}


@dataclass
class GroupStats:
    name: str
    kind: str
    runs: list[RunSeries]
    colour: str
    final: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int | None]:
        return sorted({r.seed for r in self.runs}, key=lambda s: (s is None, s or 0))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "colour": self.colour, "seeds": self.seeds,
                "runs": [r.run_id for r in self.runs], "final": _clean(self.final)}


@dataclass
class Report:
    name: str
    directory: Path
    groups: list[GroupStats]
    metrics: list[str]
    spread: dict[str, Any] | None
    plots: dict[str, str]
    notes: list[str]
    comparisons: dict[str, dict[str, Any]] = field(default_factory=dict)
    differences: dict[str, dict[str, Any]] = field(default_factory=dict)
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)
    difference_plots: dict[str, str] = field(default_factory=dict)
    weights_plot: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "name": self.name,
            "directory": str(self.directory),
            "metrics": self.metrics,
            "groups": [g.to_dict() for g in self.groups],
            "runs": [r.to_dict() for g in self.groups for r in g.runs],
            "seed_fixed_spread": _clean(self.spread),
            "plots": self.plots,
            "difference_plots": self.difference_plots,
            "weights_plot": self.weights_plot,
            "differences": _clean(self.differences),
            "weights": _clean(self.weights),
            "comparisons": self.comparisons,
            "notes": self.notes,
        }


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def group_kind(runs: list[RunSeries]) -> str:
    if len(runs) < 2:
        return SINGLE
    return SAME_SEED if len({r.seed for r in runs}) == 1 else DIFFERENT_SEEDS


def describe(values: list[float]) -> dict[str, Any]:
    finite = [v for v in values if math.isfinite(v)]
    return {
        "n": len(values),
        "mean": statistics.fmean(finite) if finite else None,
        "stdev": statistics.stdev(finite) if len(finite) >= 2 else None,
        "min": min(finite) if finite else None,
        "max": max(finite) if finite else None,
        "values": values,
    }


# ---------------------------------------------------------------- the interval of the share


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


@functools.lru_cache(maxsize=4096)
def f_quantile(p: float, d1: float, d2: float) -> float:
    """The p-quantile of the F distribution with (d1, d2) degrees of freedom.

    F = (d2 / d1) * B / (1 - B) with B ~ Beta(d1/2, d2/2); B's quantile is found by bisection,
    to double precision, on the monotone I_x. No scipy needed on the host.
    """
    if not 0.0 < p < 1.0 or d1 <= 0 or d2 <= 0:
        raise ValueError(f"bad F quantile arguments p={p}, d1={d1}, d2={d2}")
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if beta_cdf(mid, d1 / 2, d2 / 2) < p:
            lo = mid
        else:
            hi = mid
    b = (lo + hi) / 2
    return (d2 / d1) * b / (1.0 - b)


def ratio_interval(stdev_same: float, n_same: int, stdev_different: float, n_different: int,
                   confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Confidence interval of sigma_same / sigma_different from two samples' standard deviations.

    (s1^2 / sigma1^2) / (s2^2 / sigma2^2) follows F(n1 - 1, n2 - 1) for normal samples, so the
    variance ratio lies in [R / F(1 - a/2; n1-1, n2-1), R / F(a/2; n1-1, n2-1)] with R = s1^2 / s2^2;
    the standard-deviation ratio's interval is its square root.
    """
    if n_same < 2 or n_different < 2 or stdev_different <= 0:
        raise ValueError("an interval needs two runs per group and spread among the different seeds")
    alpha = 1.0 - confidence
    variance_ratio = (stdev_same / stdev_different) ** 2
    d1, d2 = n_same - 1, n_different - 1
    lo = variance_ratio / f_quantile(1.0 - alpha / 2, d1, d2)
    hi = variance_ratio / f_quantile(alpha / 2, d1, d2)
    return math.sqrt(lo), math.sqrt(hi)


def _smallest_runs(ok: Callable[[int], bool]) -> int | None:
    """The smallest runs per group (>= 2) for which ok(n) holds, ok being monotone; None past the cap."""
    if not ok(MAX_RUNS_ADVISED):
        return None
    lo, hi = 1, MAX_RUNS_ADVISED  # ok(lo) is false (no interval with one run), ok(hi) true
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def interval_factor(n: int, confidence: float = CONFIDENCE) -> float:
    """With n runs in each group, the interval is [r / k, r * k] around the estimate r: this k."""
    return math.sqrt(f_quantile(1.0 - (1.0 - confidence) / 2, n - 1, n - 1))


def runs_for_tight(confidence: float = CONFIDENCE, factor: float = TIGHT_FACTOR) -> int | None:
    """Runs per group (both groups alike) for an interval within `factor` of the estimate."""
    return _smallest_runs(lambda n: n >= 2 and interval_factor(n, confidence) <= factor)


def runs_to_exclude_all(stdev_ratio: float, confidence: float = CONFIDENCE) -> int | None:
    """Runs per group for the interval to stay below 100%, if the estimate held (0 < ratio < 1)."""
    if not 0 < stdev_ratio < 1:
        return None
    return _smallest_runs(lambda n: n >= 2 and stdev_ratio * interval_factor(n, confidence) < 1.0)


def read_share(stdev_same: float | None, n_same: int, stdev_different: float | None, n_different: int,
               confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The share with its interval, and what it says: a finding, noise, or no share at all."""
    level = f"{100 * confidence:g}%"
    out: dict[str, Any] = {"stdev_ratio": None, "variance_ratio": None, "stdev_ratio_interval": None,
                           "variance_ratio_interval": None, "interval_factor": None,
                           "runs_per_group_to_exclude_100": None}
    runs = f"{n_same} and {n_different} runs"
    if stdev_same is None or stdev_different is None:
        return {**out, "status": "undefined",
                "reading": f"no share: it needs at least 2 runs with this metric in each group ({runs})"}
    if stdev_different == 0:
        if stdev_same == 0:
            return {**out, "status": "undefined",
                    "reading": "no share: neither group varies (every run ended with the same value)"}
        return {**out, "status": "not-a-share",
                "reading": "not a share: the different-seeds runs all agree while the same-seed runs do not, "
                           "so something besides the seed differs between the groups (hosts, data, code, "
                           "determinism profile)"}
    ratio = stdev_same / stdev_different
    lo, hi = ratio_interval(stdev_same, n_same, stdev_different, n_different, confidence)
    out.update(stdev_ratio=ratio, variance_ratio=ratio * ratio, stdev_ratio_interval=[lo, hi],
               variance_ratio_interval=[lo * lo, hi * hi], interval_factor=math.sqrt(hi / lo) if lo > 0 else None,
               runs_per_group_to_exclude_100=runs_to_exclude_all(ratio, confidence))
    interval = f"{level} interval {percent(lo)} to {percent(hi)}, {runs}"
    if ratio == 0:
        return {**out, "status": "identical",
                "reading": f"with the seed fixed, none of the standard deviation remains: the {n_same} same-seed "
                           "runs agree exactly"}
    if ratio <= 1:
        text = f"with the seed fixed, {percent(ratio)} of the standard deviation remains ({interval})"
        if hi >= 1:
            text += "; the interval reaches 100%, so these runs cannot tell whether fixing the seed removes " \
                    "any of the spread"
        return {**out, "status": "estimate", "reading": text}
    if lo <= 1:
        return {**out, "status": "noise",
                "reading": f"{percent(ratio)} is not a finding: a share cannot exceed 100%, and with {runs} the "
                           f"{level} interval ({percent(lo)} to {percent(hi)}) includes 100%; the runs are "
                           f"consistent with any share from {percent(lo)} to 100%"}
    return {**out, "status": "not-a-share",
            "reading": f"not a share: the same-seed runs vary more than the different-seeds runs, beyond the "
                       f"noise ({percent(ratio)}, {interval}), so something besides the seed differs between "
                       "the groups (hosts, data, code, determinism profile)"}


def seed_fixed_spread(same: GroupStats, different: GroupStats, metrics: list[str],
                      confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Per metric: stdev(same seed) / stdev(different seeds), the same for the variances, their
    confidence intervals and a reading; and how many runs per group would make the intervals tight."""
    per_metric: dict[str, Any] = {}
    sizes: set[tuple[int, int]] = set()
    for m in metrics:
        fs, fd = same.final.get(m, {}), different.final.get(m, {})
        s, d = fs.get("stdev"), fd.get("stdev")
        n_s, n_d = _finite_count(fs), _finite_count(fd)
        if s is not None and d is not None:
            sizes.add((n_s, n_d))
        per_metric[m] = {"stdev_same_seed": s, "stdev_different_seeds": d, "n_same_seed": n_s,
                         "n_different_seeds": n_d, **read_share(s, n_s, d, n_d, confidence)}
    tight = runs_for_tight(confidence)
    level = f"{100 * confidence:g}%"
    advice = (f"about {tight} runs per group would bring each {level} interval within a factor of "
              f"{TIGHT_FACTOR:g} of its estimate (for example 80% -> {percent(0.8 / TIGHT_FACTOR)} to "
              f"{percent(0.8 * TIGHT_FACTOR)})")
    if len(sizes) == 1:
        n_s, n_d = next(iter(sizes))
        now = (f_quantile(1 - (1 - confidence) / 2, n_s - 1, n_d - 1)
               / f_quantile((1 - confidence) / 2, n_s - 1, n_d - 1)) ** 0.25
        advice = (f"with {n_s} same-seed and {n_d} different-seeds runs each interval reaches a factor of "
                  f"{now:.3g} either side of its estimate; " + advice)
    return {"same_seed_group": same.name, "different_seeds_group": different.name, "confidence": confidence,
            "interval": "F distribution (normal metrics assumed)", "tight_factor": TIGHT_FACTOR,
            "runs_per_group_for_tight": tight, "advice": advice, "metrics": per_metric}


def _finite_count(summary: dict[str, Any]) -> int:
    return sum(1 for v in summary.get("values") or [] if isinstance(v, float) and math.isfinite(v))


def _series(m: Manifest) -> RunSeries:
    rows = read_metrics(m) or []
    rows = sorted((r for r in rows if isinstance(r.get("epoch"), int)), key=lambda r: r["epoch"])
    determinism = m.data.get("determinism")
    profile = determinism.get("profile") if isinstance(determinism, dict) else None
    return RunSeries(m.run_id, m.group, m.replicate, m.seed, m.status, rows, m.run_dir, profile)


def collect(ws: Workspace, groups: list[str]) -> tuple[list[GroupStats], list[str]]:
    if not groups:
        raise UsageError("name at least one group", "e.g. `launcher report mnist-20261122-same-seed`")
    stats: list[GroupStats] = []
    metrics: list[str] = []
    for i, name in enumerate(dict.fromkeys(groups)):
        manifests = group_runs(ws, name)
        if not manifests:
            raise NotFound(f"no completed runs in group {name!r} under {ws.runs}",
                           "check the group name in a run's manifest.json, or run `launcher experiment`")
        recipes = {m.recipe_name for m in manifests}
        if len(recipes) > 1:
            raise UsageError(f"group {name!r} mixes recipes: {', '.join(sorted(recipes))}")
        runs = [_series(m) for m in manifests]
        for r in runs:
            for k in r.final:
                if k not in metrics:
                    metrics.append(k)
        stats.append(GroupStats(name, group_kind(runs), runs, PALETTE[i % len(PALETTE)]))
    for g in stats:
        g.final = {m: describe([r.final[m] for r in g.runs if m in r.final]) for m in metrics}
    return stats, metrics


# ---------------------------------------------------------------- differences from the reference


def epoch_differences(group: GroupStats, metrics: list[str]) -> dict[str, Any]:
    """Each replicate's metric minus the group's first run's, epoch by epoch (epochs both have)."""
    ref = group.runs[0]
    ref_rows = {row["epoch"]: row for row in ref.epochs}
    runs = []
    for r in group.runs[1:]:
        rows = [(row["epoch"], row) for row in r.epochs if row["epoch"] in ref_rows]
        per_metric: dict[str, list[float | None]] = {}
        for m in metrics:
            a = [ref_rows[e].get(m) for e, _ in rows]
            b = [row.get(m) for _, row in rows]
            per_metric[m] = [_minus(y, x) for x, y in zip(a, b, strict=True)]
        runs.append({"run_id": r.run_id, "epochs": [e for e, _ in rows], "metrics": per_metric})
    return {"reference": ref.run_id, "runs": runs}


def _minus(x: Any, y: Any) -> float | None:
    return float(x) - float(y) if _is_number(x) and _is_number(y) else None


def _layer_digests(run_dir: Path) -> dict[str, list[str]] | None:
    """layer -> its arrays' sha256 from weights/layers.json, in model order; None without it."""
    try:
        doc = json.loads((run_dir / LAYERS_DOC).read_text())
        return {str(layer["name"]): [str(a["sha256"]) for a in layer["arrays"]] for layer in doc["layers"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _by_layer(path: Path) -> dict[str, list[Any]]:
    from launcher.modeldiff import load_canonical

    layers: dict[str, list[Any]] = {}
    for wa in load_canonical(path):
        layers.setdefault(wa.layer, []).append(wa.value)
    return layers


def _layer_divergence(name: str, ref: list[Any], other: list[Any] | None, same_digests: bool) -> dict[str, Any]:
    import numpy as np

    elements = sum(int(a.size) for a in ref)
    row: dict[str, Any] = {"layer": name, "status": "identical", "arrays": len(ref), "arrays_differing": 0,
                           "elements": elements, "elements_differing": 0, "max_abs_diff": 0.0, "rel_l2": 0.0}
    if same_digests:
        return row
    if other is None:
        return {**row, "status": "missing", "arrays_differing": len(ref), "elements_differing": None,
                "max_abs_diff": None, "rel_l2": None}
    if len(other) != len(ref) or any(a.shape != b.shape for a, b in zip(ref, other, strict=False)):
        return {**row, "status": "shape", "arrays_differing": len(ref), "elements_differing": None,
                "max_abs_diff": None, "rel_l2": None}
    diff_sq = norm_sq = max_abs = 0.0
    differing_arrays = differing = 0
    for a, b in zip(ref, other, strict=True):
        x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        delta = y - x
        changed = int(np.count_nonzero((delta != 0) | (np.isnan(x) != np.isnan(y))))
        differing += changed
        differing_arrays += changed > 0
        if delta.size:
            finite = np.where(np.isfinite(delta), delta, 0.0)
            max_abs = max(max_abs, float(np.abs(finite).max()))
            diff_sq += float(np.square(finite).sum())
            norm_sq += float(np.square(np.where(np.isfinite(x), x, 0.0)).sum())
    rel = math.sqrt(diff_sq / norm_sq) if norm_sq > 0 else (0.0 if diff_sq == 0 else math.inf)
    return {**row, "status": "differs" if differing else "identical", "arrays_differing": differing_arrays,
            "elements_differing": differing, "max_abs_diff": max_abs, "rel_l2": rel}


def weight_divergence(group: GroupStats) -> dict[str, Any]:
    """Per replicate and layer: how far its final weights are from the group's first run's.

    Layers whose per-array digests (weights/layers.json) match are identical without reading
    the arrays; the others are read from model/canonical.npz and measured: elements that differ,
    the largest absolute difference and ||w - w_ref|| / ||w_ref|| (relative L2) over the layer.
    """
    ref = group.runs[0]
    out: dict[str, Any] = {"reference": ref.run_id, "layers": [], "runs": [], "notes": []}
    if ref.run_dir is None or not (ref.run_dir / CANONICAL_MODEL).is_file():
        out["notes"].append(f"the reference run {ref.run_id} has no {CANONICAL_MODEL}: no per-layer picture")
        return out
    ref_digests = _layer_digests(ref.run_dir)
    ref_layers: dict[str, list[Any]] | None = None
    for r in group.runs[1:]:
        if r.run_dir is None or not (r.run_dir / CANONICAL_MODEL).is_file():
            out["notes"].append(f"run {r.run_id} has no {CANONICAL_MODEL}: left out of the per-layer picture")
            continue
        digests = _layer_digests(r.run_dir)
        if ref_layers is None:
            ref_layers = _by_layer(ref.run_dir / CANONICAL_MODEL)
            out["layers"] = list(ref_layers)
        known = ref_digests is not None and digests is not None and list(ref_digests) == list(ref_layers)
        other_layers = None if known and digests == ref_digests else _by_layer(r.run_dir / CANONICAL_MODEL)
        rows = []
        for name, arrays in ref_layers.items():
            same = known and digests is not None and digests.get(name) == (ref_digests or {}).get(name)
            other = None if other_layers is None else other_layers.get(name)
            rows.append(_layer_divergence(name, arrays, other, same))
        out["runs"].append({"run_id": r.run_id, "layers": rows})
    return out


def compare_group(ws: Workspace, group: GroupStats, reporter: Reporter) -> dict[str, Any]:
    """The group's runs checked bit for bit against its first: models, data, batches all the same?"""
    report = verify_checksums(ws, group=group.name, reporter=reporter)
    data = report.to_dict()
    return {
        "verdict": data["verdict"],
        "reference": data["reference"],
        "checks": data["checks"],
        "runs": [{k: r[k] for k in ("run_id", "status", "classification", "line", "first_difference")}
                 for r in data["runs"][1:]],
    }


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return name[:120] or "report"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})


def _plot(path: Path, metric: str, groups: list[GroupStats]) -> None:
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    try:
        for g in groups:
            for j, r in enumerate(g.runs):
                xs = [row["epoch"] for row in r.epochs if _is_number(row.get(metric))]
                ys = [row[metric] for row in r.epochs if _is_number(row.get(metric))]
                ax.plot(xs, ys, color=g.colour, alpha=0.75, linewidth=1.2, marker="o", markersize=2.5,
                        label=f"{g.name} ({g.kind}, {len(g.runs)} runs)" if j == 0 else None)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} per epoch, every run")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        _save(fig, path)
    finally:
        plt.close(fig)


def _plot_differences(path: Path, metric: str, groups: list[GroupStats],
                      differences: dict[str, dict[str, Any]]) -> None:
    """One panel per group, each on its own scale: same-seed differences are often orders of
    magnitude smaller than different-seeds ones and would vanish on a shared axis."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    shown = [g for g in groups if differences.get(g.name, {}).get("runs")]
    fig, axes = plt.subplots(max(1, len(shown)), 1, figsize=(7, 1.0 + 2.4 * max(1, len(shown))), dpi=110,
                             sharex=True, squeeze=False)
    try:
        for ax, g in zip(axes[:, 0], shown, strict=False):
            diff = differences[g.name]
            ax.axhline(0.0, color="#555555", linewidth=0.8, linestyle="--")
            for r in diff["runs"]:
                pts = [(e, d) for e, d in zip(r["epochs"], r["metrics"].get(metric, []), strict=False)
                       if d is not None and math.isfinite(d)]
                ax.plot([e for e, _ in pts], [d for _, d in pts], color=g.colour, alpha=0.75, linewidth=1.2,
                        marker="o", markersize=2.5)
            ax.set_title(f"{g.name} ({g.kind}): {len(diff['runs'])} runs minus {diff['reference']}", fontsize=9)
            ax.set_ylabel(f"{metric} - ref.", fontsize=8)
            ax.grid(alpha=0.3)
        axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
        axes[-1, 0].set_xlabel("epoch")
        fig.suptitle(f"{metric}: each replicate minus its group's first run", fontsize=11)
        _save(fig, path)
    finally:
        plt.close(fig)


def _plot_weights(path: Path, groups: list[GroupStats], weights: dict[str, dict[str, Any]]) -> None:
    """Per layer: each replicate's relative L2 distance from its reference (log scale, bit-identical
    layers on a floor line) above the share of the layer's elements that differ."""
    plt = _pyplot()
    layers: list[str] = []
    for w in weights.values():
        layers += [name for name in w["layers"] if name not in layers]
    positive = [row["rel_l2"] for w in weights.values() for r in w["runs"] for row in r["layers"]
                if row["rel_l2"] is not None and 0 < row["rel_l2"] < math.inf]
    floor = min(positive) / 10 if positive else 1e-12
    width = max(6.0, min(16.0, 1.0 + 0.6 * len(layers)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width, 6.4), dpi=110, sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    try:
        shown = [g for g in groups if g.name in weights and weights[g.name]["runs"]]
        for k, g in enumerate(shown):
            offset = (k - (len(shown) - 1) / 2) * 0.25
            xs_top, ys_top, xs_same, xs_bottom, ys_bottom = [], [], [], [], []
            for r in weights[g.name]["runs"]:
                for row in r["layers"]:
                    if row["layer"] not in layers:
                        continue
                    x = layers.index(row["layer"]) + offset
                    rel = row["rel_l2"]
                    if rel is not None and rel > 0:
                        xs_top.append(x)
                        ys_top.append(min(rel, 1e6))
                    elif rel == 0:
                        xs_same.append(x)
                    if row["elements_differing"] is not None and row["elements"]:
                        xs_bottom.append(x)
                        ys_bottom.append(100.0 * row["elements_differing"] / row["elements"])
            label = f"{g.name} ({len(weights[g.name]['runs'])} runs vs {weights[g.name]['reference']})"
            top.scatter(xs_top, ys_top, color=g.colour, alpha=0.7, s=16, label=label)
            top.scatter(xs_same, [floor] * len(xs_same), color=g.colour, marker="x", s=22, alpha=0.8)
            bottom.scatter(xs_bottom, ys_bottom, color=g.colour, alpha=0.7, s=16)
        top.set_yscale("log")
        top.axhline(floor, color="#999999", linewidth=0.8, linestyle=":")
        top.annotate("bit-identical (x)", (0.0, floor), xytext=(2, 3), textcoords="offset points",
                     xycoords=("axes fraction", "data"), fontsize=7, color="#555555")
        top.set_ylabel("||w - w_ref|| / ||w_ref||")
        top.set_title("Final weights, per layer: distance from the group's first run")
        top.grid(alpha=0.3)
        if shown:
            top.legend(fontsize=7)
        bottom.set_ylabel("elements differing (%)")
        bottom.set_ylim(-5, 105)
        bottom.grid(alpha=0.3)
        bottom.set_xticks(range(len(layers)))
        bottom.set_xticklabels(layers, rotation=45 if len(layers) > 6 else 0, ha="right" if len(layers) > 6
                               else "center", fontsize=8)
        bottom.set_xlabel("layer (model order)")
        _save(fig, path)
    finally:
        plt.close(fig)


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.6g}"
    return html.escape(str(x))  # bools print as True/False, as in the ResNet study's output


def render_html(report: Report) -> str:
    e = html.escape
    head = "".join(f"<th>{e(m)} mean</th><th>{e(m)} stdev</th>" for m in report.metrics)
    rows = []
    for g in report.groups:
        cells = "".join(f"<td>{_fmt(g.final[m]['mean'])}</td><td>{_fmt(g.final[m]['stdev'])}</td>"
                        for m in report.metrics)
        seeds = ", ".join(str(s) for s in g.seeds)
        rows.append(f'<tr><td><span class="sw" style="background:{g.colour}"></span>{e(g.name)}</td>'
                    f"<td>{e(g.kind)}</td><td>{len(g.runs)}</td><td>{e(seeds)}</td>{cells}</tr>")
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>launcher report: {e(report.name)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;"
        "text-align:right}td:first-child,th:first-child{text-align:left}"
        ".sw{display:inline-block;width:.8em;height:.8em;margin-right:.4em}img{max-width:100%}"
        "td.txt{text-align:left;max-width:30em}</style>",
        "</head><body>", f"<h1>Report: {e(report.name)}</h1>",
        "<h2>Final metrics</h2>",
        f"<table><tr><th>group</th><th>kind</th><th>runs</th><th>seeds</th>{head}</tr>{''.join(rows)}</table>",
    ]
    if report.spread is not None:
        sp = report.spread
        level = f"{100 * sp['confidence']:g}%"
        parts.append("<h2>Spread left with the seed fixed</h2>")
        parts.append(f"<p>Standard deviation of each final metric over the same-seed group "
                     f"<b>{e(sp['same_seed_group'])}</b> divided by that over the different-seeds group "
                     f"<b>{e(sp['different_seeds_group'])}</b>: the share of the spread that fixing the seed "
                     f"does not remove, with its {level} confidence interval ({e(sp['interval'])}). "
                     "A share cannot exceed 100%: above it, the reading says why.</p>")
        srows = "".join(
            f"<tr><td>{e(m)}</td><td>{_fmt(v['stdev_same_seed'])}</td><td>{_fmt(v['stdev_different_seeds'])}</td>"
            f"<td>{v['n_same_seed']} / {v['n_different_seeds']}</td>"
            f"<td>{percent(v['stdev_ratio'])}</td><td>{_interval(v['stdev_ratio_interval'])}</td>"
            f"<td>{percent(v['variance_ratio'])}</td><td>{_interval(v['variance_ratio_interval'])}</td>"
            f'<td class="txt">{e(v["reading"])}</td></tr>'
            for m, v in sp["metrics"].items())
        parts.append("<table><tr><th>metric</th><th>stdev, same seed</th><th>stdev, different seeds</th>"
                     f"<th>runs</th><th>stdev share</th><th>{level} interval</th><th>variance share</th>"
                     f"<th>{level} interval</th><th>reading</th></tr>{srows}</table>")
        parts.append(f"<p>{e(sp['advice'][0].upper() + sp['advice'][1:])}.</p>")
    if report.plots:
        parts.append("<h2>Per-epoch metrics, every run</h2>")
        for m, fname in report.plots.items():
            parts.append(f'<figure><img src="{e(fname)}" alt="{e(m)} per epoch"><figcaption>{e(m)}'
                         "</figcaption></figure>")
    if report.difference_plots:
        parts.append("<h2>Difference from the reference, per epoch</h2>")
        refs = ", ".join(f"{e(g)}: {e(d['reference'])}" for g, d in report.differences.items())
        parts.append(f"<p>Each replicate's metric minus that of its group's first run ({refs}).</p>")
        for m, fname in report.difference_plots.items():
            parts.append(f'<figure><img src="{e(fname)}" alt="{e(m)}: difference from the reference per epoch">'
                         f"<figcaption>{e(m)} minus the reference</figcaption></figure>")
    if any(w["runs"] for w in report.weights.values()):
        parts.append("<h2>Where the final weights diverge</h2>")
        parts.append("<p>Each replicate's final weights (<code>model/canonical.npz</code>) against its group's "
                     "first run, layer by layer: the relative L2 distance ||w - w<sub>ref</sub>|| / "
                     "||w<sub>ref</sub>|| and the share of elements that differ at all.</p>")
        if report.weights_plot:
            parts.append(f'<figure><img src="{e(report.weights_plot)}" alt="per-layer divergence of the final '
                         'weights"><figcaption>final weights per layer</figcaption></figure>')
        for gname, w in report.weights.items():
            if not w["runs"]:
                continue
            parts.append(f"<h3>{e(gname)} (reference {e(w['reference'])})</h3>")
            wrows = []
            for name in w["layers"]:
                per_run: list[dict[str, Any]] = [row for run in w["runs"] for row in run["layers"]
                                                 if row["layer"] == name]
                rels = sorted(float(row["rel_l2"]) for row in per_run if row["rel_l2"] is not None)
                diffs = [float(row["max_abs_diff"]) for row in per_run if row["max_abs_diff"] is not None]
                differing = sum(row["status"] != "identical" for row in per_run)
                wrows.append(f"<tr><td>{e(name)}</td><td>{per_run[0]['elements'] if per_run else '–'}</td>"
                             f"<td>{differing} of {len(per_run)}</td>"
                             f"<td>{_fmt(statistics.median(rels) if rels else None)}</td>"
                             f"<td>{_fmt(rels[-1] if rels else None)}</td><td>{_fmt(max(diffs) if diffs else None)}"
                             "</td></tr>")
            parts.append("<table><tr><th>layer</th><th>elements</th><th>runs differing</th>"
                         "<th>median relative L2</th><th>largest relative L2</th><th>largest |difference|</th>"
                         f"</tr>{''.join(wrows)}</table>")
    if report.comparisons:
        parts.append("<h2>Bit for bit, within each group</h2>")
        labels = (("models", "Models all the same"), ("initial_weights", "Initial weights all the same"),
                  ("data", "XY training data all the same"), ("batches", "Batches all the same"))
        for gname, comp in report.comparisons.items():
            parts.append(f"<h3>{e(gname)}</h3><ul>")
            for key, label in labels:
                c = comp["checks"][key]
                parts.append(f"<li>{label}: <b>{_fmt(c['all_same'])}</b> (runs checked: {c['checked']}/{c['of']})"
                             "</li>")
            parts.append("</ul><ul>")
            for r in comp["runs"]:
                first = r["first_difference"]
                where = f"; first differing layer {e(first['layer'])} array {e(first['array'])}" if first else ""
                parts.append(f"<li>{e(r['run_id'])}: {e(r['line'])}{where}</li>")
            parts.append("</ul>")
    parts.append("<h2>Runs</h2>")
    rhead = "".join(f"<th>{e(m)}</th>" for m in report.metrics)
    rrows = "".join(
        f"<tr><td>{e(r.run_id)}</td><td>{e(r.group)}</td><td>{_fmt(r.seed)}</td><td>{len(r.epochs)}</td>"
        + "".join(f"<td>{_fmt(r.final.get(m))}</td>" for m in report.metrics) + "</tr>"
        for g in report.groups for r in g.runs)
    parts.append(f"<table><tr><th>run</th><th>group</th><th>seed</th><th>epochs</th>{rhead}</tr>{rrows}</table>")
    for note in report.notes:
        parts.append(f"<p><i>{e(note)}</i></p>")
    parts.append('<p>The same data: <a href="report.json">report.json</a>.</p></body></html>')
    return "\n".join(parts) + "\n"


def _interval(bounds: list[float] | None) -> str:
    if bounds is None:
        return "–"
    return f"{percent(bounds[0])} to {percent(bounds[1])}"


def percent(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{100 * x:.1f}%" if abs(x) >= 0.01 else f"{100 * x:.2g}%"


def write_report(ws: Workspace, groups: list[str], name: str | None = None,
                 reporter: Reporter | None = None) -> Report:
    """Write reports/<name>/ (index.html, report.json, the PNG figures) for the groups given."""
    rep = reporter or NullReporter()
    stats, metrics = collect(ws, groups)
    report_name = _safe_name(name or "+".join(g.name for g in stats))
    directory = ws.reports / report_name
    directory.mkdir(parents=True, exist_ok=True)
    same = next((g for g in stats if g.kind == SAME_SEED), None)
    diff = next((g for g in stats if g.kind == DIFFERENT_SEEDS), None)
    spread = seed_fixed_spread(same, diff, metrics) if same and diff else None
    notes: list[str] = []
    if spread is None:
        notes.append("no share of the spread: it needs one same-seed group and one different-seeds group "
                     "(`launcher experiment RECIPE --runs N --seeds both`)")
    elif same is not None and any(r.profile == "off" for r in same.runs):
        notes.append(f"the same-seed group {same.name} ran with determinism profile `off`, which passes no seed "
                     "to the recipe: unless the recipe seeds itself, both groups ran unseeded and the share "
                     "should be near 100%")
    replicated = [g for g in stats if len(g.runs) >= 2]
    differences = {g.name: epoch_differences(g, metrics) for g in replicated}
    task = rep.task("comparing final weights per layer", total=len(replicated))
    weights: dict[str, dict[str, Any]] = {}
    for g in replicated:
        weights[g.name] = weight_divergence(g)
        notes += weights[g.name]["notes"]
        task.advance()
    task.close()
    plots: dict[str, str] = {}
    difference_plots: dict[str, str] = {}
    weights_plot: str | None = None
    try:
        import matplotlib  # noqa: F401 - only to know whether plots can be drawn
    except ImportError:
        notes.append("no plots: matplotlib is not installed (pip install 'launcher[report]')")
    else:
        task = rep.task("plotting", total=2 * len(metrics) + 1)
        for m in metrics:
            fname = f"metric-{_safe_name(m)}.png"
            _plot(directory / fname, m, stats)
            plots[m] = fname
            task.advance()
            if differences:
                fname = f"difference-{_safe_name(m)}.png"
                _plot_differences(directory / fname, m, stats, differences)
                difference_plots[m] = fname
            task.advance()
        if any(w["runs"] for w in weights.values()):
            weights_plot = "weights-per-layer.png"
            _plot_weights(directory / weights_plot, stats, weights)
        task.advance()
        task.close()
    comparisons = {g.name: compare_group(ws, g, rep) for g in replicated}
    report = Report(report_name, directory, stats, metrics, spread, plots, notes, comparisons, differences,
                    weights, difference_plots, weights_plot)
    atomic_write_json(directory / "report.json", report.to_dict())
    atomic_write_text(directory / "index.html", render_html(report))
    return report
