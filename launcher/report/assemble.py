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

import html
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import NotFound, UsageError
from launcher.hashing import atomic_write_json, atomic_write_text
from launcher.progress import NullReporter, Reporter
from launcher.report import probes as probe_section
from launcher.report.figures import plot_differences, plot_metric, plot_weights
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
from launcher.runs.manifest import Manifest
from launcher.runs.store import group_runs
from launcher.verify.differences import read_metrics
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
CANONICAL_MODEL = "outputs/model/canonical.npz"
LAYERS_DOC = "outputs/weights/layers.json"
# Colours per group, readable on white and for the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")


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
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
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
    # a group is what the user put in it: an edited copy run into it is compared, and the verdict says
    # the code differs (different scripts or recipes in one group were refused when the group was read)
    report = verify_checksums(ws, group=group.name, reporter=reporter, across_code=True)
    data = report.to_dict()
    by_id = {r.manifest.run_id: r.manifest for r in report.runs}
    ref = by_id.get(data["reference"])
    return {
        "verdict": data["verdict"],
        "reference": data["reference"],
        "checks": data["checks"],
        "runs": [{**{k: r[k] for k in ("run_id", "status", "classification", "line", "first_difference")},
                  "steps": steps_strip(ref, by_id[r["run_id"]]) if ref is not None and r["run_id"] in by_id else None}
                 for r in data["runs"][1:]],
    }


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return name[:120] or "report"


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
        "td.txt{text-align:left;max-width:30em}"
        ".st{display:inline-block;width:.5em;height:1em;margin-right:1px;vertical-align:middle}</style>",
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
                parts.append(f"<li>{e(r['run_id'])}: {e(r['line'])}{where}{_steps_html(r.get('steps'))}</li>")
            parts.append("</ul>")
    parts += probe_section.render(report.probes)
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


def _steps_html(steps: dict[str, Any] | None) -> str:
    """The step fingerprints against the reference as a strip (green: the weights agree, red: they
    differ; a cell per step recorded in both runs), and the layers at the first red cell."""
    if not steps or not steps["strip"]:
        return ""
    e = html.escape
    cells = "".join(f'<span class="st" title="step {c["step"]}: {"agree" if c["agree"] else "differ"}" '
                    f'style="background:{"#3a3" if c["agree"] else "#c33"}"></span>' for c in steps["strip"])
    first, last = steps["strip"][0]["step"], steps["strip"][-1]["step"]
    out = f'<div>steps {first}..{last}: {cells}</div>'
    if steps["parts_by"] is not None:
        layers = ", ".join(f'<span style="color:{"#3a3" if x["agree"] else "#c33"}">{e(x["layer"])}</span>'
                           for x in steps["layers"])
        out += f"<div>layers at step {steps['parts_by']}, where they first differ: {layers}</div>"
    return out


def _interval(bounds: list[float] | None) -> str:
    if bounds is None:
        return "–"
    return f"{percent(bounds[0])} to {percent(bounds[1])}"

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
            plot_metric(directory / fname, m, stats)
            plots[m] = fname
            task.advance()
            if differences:
                fname = f"difference-{_safe_name(m)}.png"
                plot_differences(directory / fname, m, stats, differences)
                difference_plots[m] = fname
            task.advance()
        if any(w["runs"] for w in weights.values()):
            weights_plot = "weights-per-layer.png"
            plot_weights(directory / weights_plot, stats, weights)
        task.advance()
        task.close()
    comparisons = {g.name: compare_group(ws, g, rep) for g in replicated}
    probes: dict[str, dict[str, Any]] = {}
    for g in replicated:
        found = probe_section.group_probes(g, directory / f"probes-{_safe_name(g.name)}")
        if found is not None:
            probes[g.name] = found
    report = Report(report_name, directory, stats, metrics, spread, plots, notes, comparisons, differences,
                    weights, difference_plots, weights_plot, probes)
    atomic_write_json(directory / "report.json", report.to_dict())
    atomic_write_text(directory / "index.html", render_html(report))
    return report
