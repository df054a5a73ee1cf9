"""Statistics of a report: runs' final metrics per group, and the share of the spread left with the seed fixed.

The standard deviation of a final metric over a same-seed group, divided by the one over a
different-seed group, comes with an F-distribution interval (normal metrics assumed), a
reading of what it says, and how many runs per group would make it tight.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.report.records import (
    GroupRow,
    MetricSpread,
    RunRow,
    SeedFixedSpread,
    ShareNumbers,
    ShareReading,
    Summary,
)

CONFIDENCE = 0.95
# "Tight": the interval of the standard-deviation share reaches no further than this factor on
# either side of the estimate (80% -> 64%..100%).
TIGHT_FACTOR = 1.25
MAX_RUNS_ADVISED = 1_000_000
SAME_SEED = "same-seed"
DIFFERENT_SEEDS = "different-seeds"
SINGLE = "single-run"


@dataclass
class RunSeries:
    run_id: str
    group: str
    replicate: int
    seed: int | None
    status: str
    # rows of outputs/metrics.jsonl as the user's code wrote them: free-form JSON (an "epoch", any metrics)
    epochs: list[dict[str, Any]]
    run_dir: Path | None = None
    profile: str | None = None

    @property
    def final(self) -> dict[str, float]:
        if not self.epochs:
            return {}
        return {k: float(v) for k, v in self.epochs[-1].items() if k != "epoch" and is_number(v)}

    def to_dict(self) -> RunRow:
        return {"run_id": self.run_id, "group": self.group, "replicate": self.replicate, "seed": self.seed,
                "status": self.status, "epochs": len(self.epochs), "final": nan_to_null(self.final)}


@dataclass
class GroupStats:
    name: str
    kind: str
    runs: list[RunSeries]
    colour: str
    final: dict[str, Summary] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int | None]:
        return sorted({r.seed for r in self.runs}, key=lambda s: (s is None, s or 0))

    def to_dict(self) -> GroupRow:
        return {"name": self.name, "kind": self.kind, "colour": self.colour, "seeds": self.seeds,
                "runs": [r.run_id for r in self.runs], "final": nan_to_null(self.final)}


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def nan_to_null(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: nan_to_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_to_null(v) for v in value]
    return value


def group_kind(runs: list[RunSeries]) -> str:
    if len(runs) < 2:
        return SINGLE
    return SAME_SEED if len({r.seed for r in runs}) == 1 else DIFFERENT_SEEDS


def describe(values: list[float]) -> Summary:
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
               confidence: float = CONFIDENCE) -> ShareReading:
    """The share with its interval, and what it says: a finding, noise, or no share at all."""
    level = f"{100 * confidence:g}%"
    out: ShareNumbers = {"stdev_ratio": None, "variance_ratio": None, "stdev_ratio_interval": None,
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
    out = {"stdev_ratio": ratio, "variance_ratio": ratio * ratio, "stdev_ratio_interval": [lo, hi],
           "variance_ratio_interval": [lo * lo, hi * hi], "interval_factor": math.sqrt(hi / lo) if lo > 0 else None,
           "runs_per_group_to_exclude_100": runs_to_exclude_all(ratio, confidence)}
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
                      confidence: float = CONFIDENCE) -> SeedFixedSpread:
    """Per metric: stdev(same seed) / stdev(different seeds), the same for the variances, their
    confidence intervals and a reading; and how many runs per group would make the intervals tight."""
    per_metric: dict[str, MetricSpread] = {}
    sizes: set[tuple[int, int]] = set()
    for m in metrics:
        fs, fd = same.final.get(m), different.final.get(m)
        s, d = fs["stdev"] if fs else None, fd["stdev"] if fd else None
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


def _finite_count(summary: Summary | None) -> int:
    return sum(1 for v in (summary["values"] if summary else []) if isinstance(v, float) and math.isfinite(v))


def percent(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{100 * x:.1f}%" if abs(x) >= 0.01 else f"{100 * x:.2g}%"
