"""The report's figures (PNG): per-epoch metrics, replicates minus their reference, weights per layer."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from launcher.hashing import atomic_path
from launcher.report.records import EpochDifferences, WeightDivergence
from launcher.report.stats import GroupStats, is_number


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})


def plot_metric(path: Path, metric: str, groups: list[GroupStats]) -> None:
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    try:
        for g in groups:
            for j, r in enumerate(g.runs):
                xs = [row["epoch"] for row in r.epochs if is_number(row.get(metric))]
                ys = [row[metric] for row in r.epochs if is_number(row.get(metric))]
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


def plot_differences(path: Path, metric: str, groups: list[GroupStats],
                      differences: dict[str, EpochDifferences]) -> None:
    """One panel per group, each on its own scale: same-seed differences are often orders of
    magnitude smaller than different-seeds ones and would vanish on a shared axis."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    shown = [g for g in groups if g.name in differences and differences[g.name]["runs"]]
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


def plot_weights(path: Path, groups: list[GroupStats], weights: dict[str, WeightDivergence]) -> None:
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
