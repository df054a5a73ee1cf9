"""The seed-fixed share's confidence interval, against independent references: scipy's F
distribution and a seeded simulation of normal samples with a known ratio."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import numpy as np
import pytest
from conftest import need

from launcher.report.assemble import (
    f_quantile,
    interval_factor,
    ratio_interval,
    read_share,
    runs_for_tight,
    runs_to_exclude_all,
    seed_fixed_spread,
)


def scipy_f() -> Any:
    need(importlib.util.find_spec("scipy") is not None, "scipy is not installed (pip install -e '.[dev]')")
    from scipy.stats import f

    return f


def reference_interval(s_same: float, n_same: int, s_diff: float, n_diff: int,
                       confidence: float = 0.95) -> tuple[float, float]:
    """The textbook interval for sigma1^2 / sigma2^2, written with scipy's quantiles."""
    f = scipy_f()
    alpha = 1 - confidence
    r = s_same**2 / s_diff**2
    return (math.sqrt(r / f.ppf(1 - alpha / 2, n_same - 1, n_diff - 1)),
            math.sqrt(r / f.ppf(alpha / 2, n_same - 1, n_diff - 1)))


@pytest.mark.parametrize("p", [0.001, 0.025, 0.05, 0.5, 0.95, 0.975, 0.999])
@pytest.mark.parametrize("d1,d2", [(1, 1), (2, 2), (2, 49), (9, 9), (9, 19), (49, 49), (30, 4), (999, 999)])
def test_f_quantile_matches_scipy(p: float, d1: int, d2: int) -> None:
    assert f_quantile(p, d1, d2) == pytest.approx(scipy_f().ppf(p, d1, d2), rel=1e-9)


def test_interval_matches_scipy_and_the_resnet_numbers() -> None:
    for s, n_s, d, n_d in [(0.01994929, 50, 0.02699318, 50), (0.00301954, 50, 0.00346379, 50),
                           (2.465, 3, 1.0, 3), (0.3, 10, 1.1, 12), (1.0, 2, 1.0, 2)]:
        assert ratio_interval(s, n_s, d, n_d) == pytest.approx(reference_interval(s, n_s, d, n_d), rel=1e-9)
    lo, hi = ratio_interval(0.01994929, 50, 0.02699318, 50)
    assert (round(lo, 3), round(hi, 3)) == (0.557, 0.981)  # the 74% of seed 004: below 100%, just
    lo, hi = ratio_interval(0.00301954, 50, 0.00346379, 50)
    assert lo < 0.872 < 1 < hi  # its 87%: 50 runs per group cannot tell it from 100%
    assert runs_to_exclude_all(0.00301954 / 0.00346379) > 50
    assert ratio_interval(0.3, 10, 1.1, 12, confidence=0.9) == pytest.approx(
        reference_interval(0.3, 10, 1.1, 12, confidence=0.9), rel=1e-9)


def test_the_interval_covers_the_true_ratio_95_times_in_100() -> None:
    """Seeded simulation: normal samples with sigma ratio 0.8, 10 and 12 runs; count the hits."""
    rng = np.random.default_rng(2026)
    trials, hits = 4000, 0
    for _ in range(trials):
        a = rng.normal(0.0, 0.8, 10)
        b = rng.normal(5.0, 1.0, 12)
        lo, hi = ratio_interval(float(a.std(ddof=1)), 10, float(b.std(ddof=1)), 12)
        hits += lo <= 0.8 <= hi
    assert 0.935 < hits / trials < 0.965


def test_runs_for_a_tight_interval() -> None:
    f = scipy_f()
    n = runs_for_tight()
    assert n is not None
    assert math.sqrt(f.ppf(0.975, n - 1, n - 1)) <= 1.25 < math.sqrt(f.ppf(0.975, n - 2, n - 2))
    assert interval_factor(n) <= 1.25 < interval_factor(n - 1)
    assert runs_for_tight(factor=2.0) == 11  # with 10 runs per group the interval reaches a factor 2.006
    m = runs_to_exclude_all(0.74)
    assert m is not None and 0.74 * interval_factor(m) < 1 <= 0.74 * interval_factor(m - 1)
    assert runs_to_exclude_all(1.0) is None and runs_to_exclude_all(0.0) is None


def test_a_share_above_100_percent_is_explained_not_reported() -> None:
    # The case: 3 runs per group, 246.5%.
    r = read_share(0.02465, 3, 0.01, 3)
    assert r["status"] == "noise" and r["stdev_ratio"] == pytest.approx(2.465)
    assert "246.5% is not a finding" in r["reading"] and "includes 100%" in r["reading"]
    assert "of the standard deviation remains" not in r["reading"]
    lo, hi = r["stdev_ratio_interval"]
    assert (lo, hi) == pytest.approx(reference_interval(0.02465, 3, 0.01, 3))
    assert f"{100 * lo:.1f}%" in r["reading"]
    # Far above 100% with many runs: beyond the noise, something else differs between the groups.
    r = read_share(3.0, 30, 1.0, 30)
    assert r["status"] == "not-a-share" and "beyond the noise" in r["reading"]
    assert r["stdev_ratio_interval"][0] > 1
    # A finding, with its interval; one that cannot be told from 100% says so.
    r = read_share(0.5, 40, 1.0, 40)
    assert r["status"] == "estimate" and r["reading"].startswith("with the seed fixed, 50.0% of the standard")
    assert "95% interval" in r["reading"] and "cannot tell" not in r["reading"]
    r = read_share(0.9, 10, 1.0, 10)
    assert r["status"] == "estimate" and "cannot tell whether fixing the seed removes" in r["reading"]
    assert r["variance_ratio_interval"] == pytest.approx([x * x for x in r["stdev_ratio_interval"]])
    # The edges: identical same-seed runs, a constant different-seeds group, too few runs.
    r = read_share(0.0, 5, 1.0, 5)
    assert r["status"] == "identical" and r["stdev_ratio_interval"] == [0.0, 0.0]
    assert read_share(1.0, 5, 0.0, 5)["status"] == "not-a-share"
    assert read_share(0.0, 5, 0.0, 5)["status"] == "undefined"
    assert read_share(None, 1, 1.0, 5)["status"] == "undefined"


def test_seed_fixed_spread_carries_the_interval_and_the_advice() -> None:
    from launcher.report.assemble import GroupStats, RunSeries, describe, group_kind

    def group(name: str, seeds: list[int], losses: list[float]) -> GroupStats:
        runs = [RunSeries(f"{name}{i}", name, i, s, "succeeded", [{"epoch": 0, "loss": v}])
                for i, (s, v) in enumerate(zip(seeds, losses, strict=True))]
        g = GroupStats(name, group_kind(runs), runs, "#000")
        g.final = {"loss": describe([r.final["loss"] for r in runs])}
        return g

    rng = np.random.default_rng(4)
    same_values = [float(v) for v in rng.normal(1.0, 0.01, 12)]
    diff_values = [float(v) for v in rng.normal(1.0, 0.02, 12)]
    sp = seed_fixed_spread(group("s", [7] * 12, same_values), group("d", list(range(12)), diff_values), ["loss"])
    m = sp["metrics"]["loss"]
    assert (m["n_same_seed"], m["n_different_seeds"]) == (12, 12)
    ref = reference_interval(float(np.std(same_values, ddof=1)), 12, float(np.std(diff_values, ddof=1)), 12)
    assert m["stdev_ratio_interval"] == pytest.approx(ref, rel=1e-9)
    assert sp["runs_per_group_for_tight"] == runs_for_tight() and sp["confidence"] == 0.95
    assert sp["advice"].startswith("with 12 same-seed and 12 different-seeds runs")
    assert f"about {runs_for_tight()} runs per group" in sp["advice"]
