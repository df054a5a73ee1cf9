"""A report as its index.html page: one function per section (final metrics, the spread left with the
seed fixed, the figures, where the final weights diverge, bit for bit within each group, the probes,
the runs), in the order the page shows them."""

from __future__ import annotations

import html
import statistics
from typing import TYPE_CHECKING, Any, Protocol

from launcher.report import probes as probe_section
from launcher.report.records import (
    REPORT_FILE,
    Comparison,
    EpochDifferences,
    GroupProbes,
    LayerDivergence,
    SeedFixedSpread,
    WeightDivergence,
)
from launcher.report.stats import GroupStats, percent

if TYPE_CHECKING:
    from launcher.verify.stepdiff import StepsStrip


class Report(Protocol):
    """What the page shows of a report (launcher.report.assemble.Report)."""

    name: str
    groups: list[GroupStats]
    metrics: list[str]
    spread: SeedFixedSpread | None
    plots: dict[str, str]
    notes: list[str]
    comparisons: dict[str, Comparison]
    differences: dict[str, EpochDifferences]
    weights: dict[str, WeightDivergence]
    difference_plots: dict[str, str]
    weights_plot: str | None
    probes: dict[str, GroupProbes]

e = html.escape

STYLE = ("<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;"
         "text-align:right}td:first-child,th:first-child{text-align:left}"
         ".sw{display:inline-block;width:.8em;height:.8em;margin-right:.4em}img{max-width:100%}"
         "td.txt{text-align:left;max-width:30em}"
         ".st{display:inline-block;width:.5em;height:1em;margin-right:1px;vertical-align:middle}</style>")


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.6g}"
    return html.escape(str(x))  # bools print as True/False, as in the ResNet study's output


def render_html(report: Report) -> str:
    parts = [*_head(report), *_final_metrics(report), *_spread(report), *_figures(report), *_weights(report),
             *_comparisons(report), *probe_section.render(report.probes), *_runs(report)]
    parts.append(f'<p>The same data: <a href="{REPORT_FILE}">{REPORT_FILE}</a>.</p></body></html>')
    return "\n".join(parts) + "\n"


def _head(report: Report) -> list[str]:
    return ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>launcher report: {e(report.name)}</title>", STYLE,
            "</head><body>", f"<h1>Report: {e(report.name)}</h1>"]


def _final_metrics(report: Report) -> list[str]:
    head = "".join(f"<th>{e(m)} mean</th><th>{e(m)} stdev</th>" for m in report.metrics)
    rows = []
    for g in report.groups:
        cells = "".join(f"<td>{_fmt(g.final[m]['mean'])}</td><td>{_fmt(g.final[m]['stdev'])}</td>"
                        for m in report.metrics)
        seeds = ", ".join(str(s) for s in g.seeds)
        rows.append(f'<tr><td><span class="sw" style="background:{g.colour}"></span>{e(g.name)}</td>'
                    f"<td>{e(g.kind)}</td><td>{len(g.runs)}</td><td>{e(seeds)}</td>{cells}</tr>")
    return ["<h2>Final metrics</h2>",
            f"<table><tr><th>group</th><th>kind</th><th>runs</th><th>seeds</th>{head}</tr>{''.join(rows)}</table>"]


def _spread(report: Report) -> list[str]:
    if report.spread is None:
        return []
    sp = report.spread
    level = f"{100 * sp['confidence']:g}%"
    srows = "".join(
        f"<tr><td>{e(m)}</td><td>{_fmt(v['stdev_same_seed'])}</td><td>{_fmt(v['stdev_different_seeds'])}</td>"
        f"<td>{v['n_same_seed']} / {v['n_different_seeds']}</td>"
        f"<td>{percent(v['stdev_ratio'])}</td><td>{_interval(v['stdev_ratio_interval'])}</td>"
        f"<td>{percent(v['variance_ratio'])}</td><td>{_interval(v['variance_ratio_interval'])}</td>"
        f'<td class="txt">{e(v["reading"])}</td></tr>'
        for m, v in sp["metrics"].items())
    return [
        "<h2>Spread left with the seed fixed</h2>",
        f"<p>Standard deviation of each final metric over the same-seed group "
        f"<b>{e(sp['same_seed_group'])}</b> divided by that over the different-seeds group "
        f"<b>{e(sp['different_seeds_group'])}</b>: the share of the spread that fixing the seed "
        f"does not remove, with its {level} confidence interval ({e(sp['interval'])}). "
        "A share cannot exceed 100%: above it, the reading says why.</p>",
        "<table><tr><th>metric</th><th>stdev, same seed</th><th>stdev, different seeds</th>"
        f"<th>runs</th><th>stdev share</th><th>{level} interval</th><th>variance share</th>"
        f"<th>{level} interval</th><th>reading</th></tr>{srows}</table>",
        f"<p>{e(sp['advice'][0].upper() + sp['advice'][1:])}.</p>",
    ]


def _figures(report: Report) -> list[str]:
    parts = []
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
    return parts


def _weights(report: Report) -> list[str]:
    if not any(w["runs"] for w in report.weights.values()):
        return []
    parts = ["<h2>Where the final weights diverge</h2>",
             "<p>Each replicate's final weights (<code>model/canonical.npz</code>) against its group's "
             "first run, layer by layer: the relative L2 distance ||w - w<sub>ref</sub>|| / "
             "||w<sub>ref</sub>|| and the share of elements that differ at all.</p>"]
    if report.weights_plot:
        parts.append(f'<figure><img src="{e(report.weights_plot)}" alt="per-layer divergence of the final '
                     'weights"><figcaption>final weights per layer</figcaption></figure>')
    for gname, w in report.weights.items():
        if not w["runs"]:
            continue
        parts.append(f"<h3>{e(gname)} (reference {e(w['reference'])})</h3>")
        wrows = [_weights_row(name, [row for run in w["runs"] for row in run["layers"] if row["layer"] == name])
                 for name in w["layers"]]
        parts.append("<table><tr><th>layer</th><th>elements</th><th>runs differing</th>"
                     "<th>median relative L2</th><th>largest relative L2</th><th>largest |difference|</th>"
                     f"</tr>{''.join(wrows)}</table>")
    return parts


def _weights_row(name: str, per_run: list[LayerDivergence]) -> str:
    """One layer's row: how many runs differ there, and their relative L2 distances and largest difference."""
    rels = sorted(float(row["rel_l2"]) for row in per_run if row["rel_l2"] is not None)
    diffs = [float(row["max_abs_diff"]) for row in per_run if row["max_abs_diff"] is not None]
    differing = sum(row["status"] != "identical" for row in per_run)
    return (f"<tr><td>{e(name)}</td><td>{per_run[0]['elements'] if per_run else '–'}</td>"
            f"<td>{differing} of {len(per_run)}</td>"
            f"<td>{_fmt(statistics.median(rels) if rels else None)}</td>"
            f"<td>{_fmt(rels[-1] if rels else None)}</td><td>{_fmt(max(diffs) if diffs else None)}"
            "</td></tr>")


def _comparisons(report: Report) -> list[str]:
    if not report.comparisons:
        return []
    parts = ["<h2>Bit for bit, within each group</h2>"]
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
            parts.append(f"<li>{e(r['run_id'])}: {e(r['line'] or '')}{where}{_steps_html(r.get('steps'))}</li>")
        parts.append("</ul>")
    return parts


def _runs(report: Report) -> list[str]:
    rhead = "".join(f"<th>{e(m)}</th>" for m in report.metrics)
    rrows = "".join(
        f"<tr><td>{e(r.run_id)}</td><td>{e(r.group)}</td><td>{_fmt(r.seed)}</td><td>{len(r.epochs)}</td>"
        + "".join(f"<td>{_fmt(r.final.get(m))}</td>" for m in report.metrics) + "</tr>"
        for g in report.groups for r in g.runs)
    parts = ["<h2>Runs</h2>",
             f"<table><tr><th>run</th><th>group</th><th>seed</th><th>epochs</th>{rhead}</tr>{rrows}</table>"]
    parts += [f"<p><i>{e(note)}</i></p>" for note in report.notes]
    return parts


def _steps_html(steps: StepsStrip | None) -> str:
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
