"""Experiment groups -> ``reports/<name>/``: final-metric statistics, the share of the spread
left with the seed fixed, per-epoch plots of every run, index.html and report.json.

A group whose runs all share one seed is a *same-seed* group; one with several seeds is a
*different-seed* group. The standard deviation of a final metric over a same-seed group,
divided by the one over a different-seed group, is the share of the spread that the seed
does not explain (the nondeterminism of training), the 74-87% figure of the ResNet study.
"""

from __future__ import annotations

import html
import math
import re
import statistics
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


def seed_fixed_spread(same: GroupStats, different: GroupStats, metrics: list[str]) -> dict[str, Any]:
    """Per metric: stdev(same seed) / stdev(different seeds), and the same for the variances."""
    per_metric: dict[str, Any] = {}
    for m in metrics:
        s = same.final.get(m, {}).get("stdev")
        d = different.final.get(m, {}).get("stdev")
        ratio = s / d if s is not None and d else None
        per_metric[m] = {"stdev_same_seed": s, "stdev_different_seeds": d, "stdev_ratio": ratio,
                         "variance_ratio": ratio * ratio if ratio is not None else None}
    return {"same_seed_group": same.name, "different_seeds_group": different.name, "metrics": per_metric}


def _series(m: Manifest) -> RunSeries:
    rows = read_metrics(m) or []
    rows = sorted((r for r in rows if isinstance(r.get("epoch"), int)), key=lambda r: r["epoch"])
    return RunSeries(m.run_id, m.group, m.replicate, m.seed, m.status, rows)


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


def _plot(path: Path, metric: str, groups: list[GroupStats]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

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
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", metadata={"Software": None})
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
        ".sw{display:inline-block;width:.8em;height:.8em;margin-right:.4em}img{max-width:100%}</style>",
        "</head><body>", f"<h1>Report: {e(report.name)}</h1>",
        "<h2>Final metrics</h2>",
        f"<table><tr><th>group</th><th>kind</th><th>runs</th><th>seeds</th>{head}</tr>{''.join(rows)}</table>",
    ]
    if report.spread is not None:
        sp = report.spread
        parts.append("<h2>Spread left with the seed fixed</h2>")
        parts.append(f"<p>Standard deviation of each final metric over the same-seed group "
                     f"<b>{e(sp['same_seed_group'])}</b> divided by that over the different-seeds group "
                     f"<b>{e(sp['different_seeds_group'])}</b>: the share of the spread that fixing the seed "
                     f"does not remove.</p>")
        srows = "".join(
            f"<tr><td>{e(m)}</td><td>{_fmt(v['stdev_same_seed'])}</td><td>{_fmt(v['stdev_different_seeds'])}</td>"
            f"<td>{percent(v['stdev_ratio'])}</td><td>{percent(v['variance_ratio'])}</td></tr>"
            for m, v in sp["metrics"].items())
        parts.append("<table><tr><th>metric</th><th>stdev, same seed</th><th>stdev, different seeds</th>"
                     f"<th>stdev ratio</th><th>variance ratio</th></tr>{srows}</table>")
    if report.plots:
        parts.append("<h2>Per-epoch metrics, every run</h2>")
        for m, fname in report.plots.items():
            parts.append(f'<figure><img src="{e(fname)}" alt="{e(m)} per epoch"><figcaption>{e(m)}'
                         "</figcaption></figure>")
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


def percent(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{100 * x:.1f}%" if abs(x) >= 0.01 else f"{100 * x:.2g}%"


def write_report(ws: Workspace, groups: list[str], name: str | None = None,
                 reporter: Reporter | None = None) -> Report:
    """Write reports/<name>/ (index.html, report.json, one PNG per metric) for the groups given."""
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
    plots: dict[str, str] = {}
    try:
        import matplotlib  # noqa: F401 - only to know whether plots can be drawn
    except ImportError:
        notes.append("no plots: matplotlib is not installed (pip install 'launcher[report]')")
    else:
        task = rep.task("plotting metrics", total=len(metrics))
        for m in metrics:
            fname = f"metric-{_safe_name(m)}.png"
            _plot(directory / fname, m, stats)
            plots[m] = fname
            task.advance()
        task.close()
    comparisons = {g.name: compare_group(ws, g, rep) for g in stats if len(g.runs) >= 2}
    report = Report(report_name, directory, stats, metrics, spread, plots, notes, comparisons)
    atomic_write_json(directory / "report.json", report.to_dict())
    atomic_write_text(directory / "index.html", render_html(report))
    return report
