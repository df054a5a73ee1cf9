"""Experiment groups -> ``reports/<name>/``: the report assembled (statistics from
:mod:`launcher.report.stats`, figures from :mod:`launcher.report.figures`, where the final weights
diverge per layer, each group checked bit for bit) and written as index.html and report.json.

A group whose runs all share one seed is a *same-seed* group; one with several seeds is a
*different-seed* group. The standard deviation of a final metric over a same-seed group,
divided by the one over a different-seed group, is the share of the spread that the seed
does not explain (the nondeterminism of training), the 74-87% figure of the ResNet study.
With few runs that ratio is mostly noise, so it comes with an F-distribution interval
(normal metrics assumed) and a share above 100% is explained rather than reported.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import NotFound, UsageError
from launcher.hashing import atomic_write_json, atomic_write_text
from launcher.progress import NullReporter, Reporter
from launcher.records.manifest import Manifest
from launcher.records.store import group_runs
from launcher.report import probes as probe_section
from launcher.report.figures import plot_differences, plot_metric, plot_weights
from launcher.report.page import render_html
from launcher.report.records import (
    REPORT_FILE,
    ComparedRun,
    Comparison,
    EpochDifferences,
    GroupProbes,
    LayerDivergence,
    ReportDoc,
    RunDifferences,
    RunWeights,
    SeedFixedSpread,
    WeightDivergence,
)
from launcher.report.stats import (
    DIFFERENT_SEEDS,
    SAME_SEED,
    GroupStats,
    RunSeries,
    describe,
    f_quantile,
    group_kind,
    interval_factor,
    is_number,
    nan_to_null,
    percent,
    ratio_interval,
    read_share,
    runs_for_tight,
    runs_to_exclude_all,
    seed_fixed_spread,
)
from launcher.verify.differences import CANONICAL_MODEL, read_metrics
from launcher.verify.differences import LAYERS as LAYERS_DOC
from launcher.verify.stepdiff import steps_strip
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace

# The statistics' names stay importable from here, where tests and the CLI import them.
__all__ = [
    "SCHEMA",
    "GroupStats",
    "Report",
    "RunSeries",
    "describe",
    "f_quantile",
    "group_kind",
    "interval_factor",
    "percent",
    "ratio_interval",
    "read_share",
    "runs_for_tight",
    "runs_to_exclude_all",
    "seed_fixed_spread",
    "write_report",
]

SCHEMA = "launcher.report.assemble/v1"
# Colours per group, readable on white and for the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")


@dataclass
class Report:
    name: str
    directory: Path
    groups: list[GroupStats]
    metrics: list[str]
    spread: SeedFixedSpread | None
    plots: dict[str, str]
    notes: list[str]
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    differences: dict[str, EpochDifferences] = field(default_factory=dict)
    weights: dict[str, WeightDivergence] = field(default_factory=dict)
    difference_plots: dict[str, str] = field(default_factory=dict)
    weights_plot: str | None = None
    probes: dict[str, GroupProbes] = field(default_factory=dict)

    def to_dict(self) -> ReportDoc:
        """What reports/<name>/report.json holds (and the `report` command's Result data)."""
        return {
            "schema": SCHEMA,
            "name": self.name,
            "directory": str(self.directory),
            "metrics": self.metrics,
            "groups": [g.to_dict() for g in self.groups],
            "runs": [r.to_dict() for g in self.groups for r in g.runs],
            "seed_fixed_spread": nan_to_null(self.spread),
            "plots": self.plots,
            "difference_plots": self.difference_plots,
            "weights_plot": self.weights_plot,
            "differences": nan_to_null(self.differences),
            "weights": nan_to_null(self.weights),
            "comparisons": self.comparisons,
            "probes": nan_to_null(self.probes),
            "notes": self.notes,
        }


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
        codes = {m.code_name for m in manifests}  # a recipe's name, a script's project/path
        if len(codes) > 1:
            raise UsageError(f"group {name!r} mixes the runs of different code: {', '.join(sorted(codes))}",
                             "report each code's runs in groups of their own")
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


def epoch_differences(group: GroupStats, metrics: list[str]) -> EpochDifferences:
    """Each replicate's metric minus the group's first run's, epoch by epoch (epochs both have)."""
    ref = group.runs[0]
    ref_rows = {row["epoch"]: row for row in ref.epochs}
    runs: list[RunDifferences] = []
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
    return float(x) - float(y) if is_number(x) and is_number(y) else None


def _layer_digests(run_dir: Path) -> dict[str, list[str]] | None:
    """layer -> its arrays' sha256 from weights/layers.json, in model order; None without it."""
    try:
        doc = json.loads((run_dir / LAYERS_DOC).read_text())
        return {str(layer["name"]): [str(a["sha256"]) for a in layer["arrays"]] for layer in doc["layers"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _by_layer(path: Path) -> dict[str, list[Any]]:
    from launcher.verify.modeldiff import load_canonical

    layers: dict[str, list[Any]] = {}
    for wa in load_canonical(path):
        layers.setdefault(wa.layer, []).append(wa.value)
    return layers


def _layer_divergence(name: str, ref: list[Any], other: list[Any] | None, same_digests: bool) -> LayerDivergence:
    import numpy as np

    elements = sum(int(a.size) for a in ref)
    row: LayerDivergence = {"layer": name, "status": "identical", "arrays": len(ref), "arrays_differing": 0,
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


def weight_divergence(group: GroupStats) -> WeightDivergence:
    """Per replicate and layer: how far its final weights are from the group's first run's.

    Layers whose per-array digests (weights/layers.json) match are identical without reading
    the arrays; the others are read from model/canonical.npz and measured: elements that differ,
    the largest absolute difference and ||w - w_ref|| / ||w_ref|| (relative L2) over the layer.
    """
    ref = group.runs[0]
    out: WeightDivergence = {"reference": ref.run_id, "layers": [], "runs": [], "notes": []}
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
        rows: list[LayerDivergence] = []
        for name, arrays in ref_layers.items():
            same = known and digests is not None and digests.get(name) == (ref_digests or {}).get(name)
            other = None if other_layers is None else other_layers.get(name)
            rows.append(_layer_divergence(name, arrays, other, same))
        done: RunWeights = {"run_id": r.run_id, "layers": rows}
        out["runs"].append(done)
    return out


def compare_group(ws: Workspace, group: GroupStats, reporter: Reporter) -> Comparison:
    """The group's runs checked bit for bit against its first: models, data, batches all the same?"""
    # a group is what the user put in it: an edited copy run into it is compared, and the verdict says
    # the code differs (different scripts or recipes in one group were refused when the group was read)
    report = verify_checksums(ws, group=group.name, reporter=reporter, across_code=True)
    data = report.to_dict()
    by_id = {r.manifest.run_id: r.manifest for r in report.runs}
    ref = by_id.get(data["reference"])
    runs: list[ComparedRun] = []
    for r in data["runs"][1:]:
        # the strip as launcher.verify.stepdiff builds it (records.StepsStrip)
        steps = steps_strip(ref, by_id[r["run_id"]]) if ref is not None and r["run_id"] in by_id else None
        runs.append({"run_id": r["run_id"], "status": r["status"], "classification": r["classification"],
                     "line": r["line"], "first_difference": r["first_difference"],
                     "steps": steps})
    return {"verdict": data["verdict"], "reference": data["reference"], "checks": data["checks"], "runs": runs}


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return name[:120] or "report"


def _spread_and_notes(stats: list[GroupStats], metrics: list[str]) -> tuple[SeedFixedSpread | None, list[str]]:
    """The share of the spread, where one same-seed and one different-seeds group allow it, and what
    the page should say about it."""
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
    return spread, notes


def _weights(replicated: list[GroupStats], notes: list[str], rep: Reporter) -> dict[str, WeightDivergence]:
    task = rep.task("comparing final weights per layer", total=len(replicated))
    weights: dict[str, WeightDivergence] = {}
    for g in replicated:
        weights[g.name] = weight_divergence(g)
        notes += weights[g.name]["notes"]
        task.advance()
    task.close()
    return weights


@dataclass
class _Plots:
    metrics: dict[str, str] = field(default_factory=dict)
    differences: dict[str, str] = field(default_factory=dict)
    weights: str | None = None


def _plots(directory: Path, stats: list[GroupStats], metrics: list[str], differences: dict[str, EpochDifferences],
           weights: dict[str, WeightDivergence], notes: list[str], rep: Reporter) -> _Plots:
    """The PNG figures, where matplotlib is installed (a note says why not otherwise)."""
    plots = _Plots()
    try:
        import matplotlib  # noqa: F401 - only to know whether plots can be drawn
    except ImportError:
        notes.append("no plots: matplotlib is not installed (pip install 'launcher[report]')")
        return plots
    task = rep.task("plotting", total=2 * len(metrics) + 1)
    for m in metrics:
        fname = f"metric-{_safe_name(m)}.png"
        plot_metric(directory / fname, m, stats)
        plots.metrics[m] = fname
        task.advance()
        if differences:
            fname = f"difference-{_safe_name(m)}.png"
            plot_differences(directory / fname, m, stats, differences)
            plots.differences[m] = fname
        task.advance()
    if any(w["runs"] for w in weights.values()):
        plots.weights = "weights-per-layer.png"
        plot_weights(directory / plots.weights, stats, weights)
    task.advance()
    task.close()
    return plots


def _probes(directory: Path, replicated: list[GroupStats]) -> dict[str, GroupProbes]:
    probes: dict[str, GroupProbes] = {}
    for g in replicated:
        found = probe_section.group_probes(g, directory / f"probes-{_safe_name(g.name)}")
        if found is not None:
            probes[g.name] = found
    return probes


def write_report(ws: Workspace, groups: list[str], name: str | None = None,
                 reporter: Reporter | None = None) -> Report:
    """Write reports/<name>/ (index.html, report.json, the PNG figures) for the groups given."""
    rep = reporter or NullReporter()
    stats, metrics = collect(ws, groups)
    report_name = _safe_name(name or "+".join(g.name for g in stats))
    directory = ws.reports / report_name
    directory.mkdir(parents=True, exist_ok=True)
    spread, notes = _spread_and_notes(stats, metrics)
    replicated = [g for g in stats if len(g.runs) >= 2]
    differences = {g.name: epoch_differences(g, metrics) for g in replicated}
    weights = _weights(replicated, notes, rep)
    plots = _plots(directory, stats, metrics, differences, weights, notes, rep)
    comparisons = {g.name: compare_group(ws, g, rep) for g in replicated}
    probes = _probes(directory, replicated)
    report = Report(report_name, directory, stats, metrics, spread, plots.metrics, notes, comparisons, differences,
                    weights, plots.differences, plots.weights, probes)
    atomic_write_json(directory / REPORT_FILE, report.to_dict())
    atomic_write_text(directory / "index.html", render_html(report))
    return report
