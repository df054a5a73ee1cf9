"""The report's probe section: what the runs' differences do to predictions and Grad-CAM explanations.

For each group of an experiment whose runs recorded probes (``outputs/probes/``, see
launcher.runtime.probes), every run is compared with the group's first run (the reference) by
launcher.verify.impact, and the report gets:

- a row per run: the impact's kind and line, flips, the largest probability change, heatmap changes;
- a table of prediction flips across all runs: each probe example whose predicted class differs
  from the reference's in some run, with every run's class;
- side-by-side pictures (PNG, drawn by launcher.runtime.pictures) of the probe images that changed
  most: the image, the reference's heatmap over it, the run's heatmap over it, and their signed
  difference (run minus reference, blue below 0, red above, scaled to the largest |difference| of
  that probe, which the caption gives), as seed 002 shows them.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from launcher.errors import LauncherError
from launcher.hashing import atomic_write_bytes
from launcher.report.records import Drawn, FlipRow, FlipTable, GroupProbes, Picture, ProbeRun
from launcher.report.stats import GroupStats
from launcher.runtime import pictures
from launcher.verify.impact import PROBE_OUTPUTS, Tolerances, compare_probes, load_probe_outputs

PROBE_INPUTS = "outputs/probes/inputs.npz"
PICTURED = 3  # probe images pictured per group: those whose heatmaps changed most
PANELS = ("image", "reference", "run", "difference")


def _outputs(run_dir: Path | None) -> dict[str, np.ndarray] | None:
    if run_dir is None or not (run_dir / PROBE_OUTPUTS).is_file():
        return None
    try:
        return load_probe_outputs(run_dir / PROBE_OUTPUTS)
    except LauncherError:
        return None


def _images(run_dir: Path | None) -> np.ndarray | None:
    if run_dir is None or not (run_dir / PROBE_INPUTS).is_file():
        return None
    try:
        with np.load(run_dir / PROBE_INPUTS, allow_pickle=False) as z:
            return z["images"] if "images" in z.files else None
    except (OSError, ValueError, KeyError):
        return None


def _flip_table(ref_id: str, ref: dict[str, np.ndarray], others: list[tuple[str, dict[str, np.ndarray]]]
                ) -> FlipTable:
    """Probe examples whose predicted class differs from the reference's in any run."""
    runs = [ref_id] + [rid for rid, _ in others]
    if "predicted" not in ref:
        return {"runs": runs, "rows": []}
    predicted = [out["predicted"] if "predicted" in out and out["predicted"].shape == ref["predicted"].shape
                 else None for _, out in others]
    changed = np.zeros(len(ref["predicted"]), dtype=bool)
    for p in predicted:
        if p is not None:
            changed |= p != ref["predicted"]
    rows: list[FlipRow] = []
    for i in np.flatnonzero(changed):
        classes = [int(ref["predicted"][i])] + [None if p is None else int(p[i]) for p in predicted]
        row: FlipRow = {"probe": int(i), "index": int(ref["indices"][i]), "classes": classes,
                               "flipped_in": sum(c is not None and c != classes[0] for c in classes[1:])}
        if "labels" in ref:
            row["label"] = int(ref["labels"][i])
        rows.append(row)
    return {"runs": runs, "rows": rows}


def _draw(directory: Path, name: str, image: np.ndarray, a: np.ndarray, b: np.ndarray) -> Drawn:
    """The four panels of one probe, written as PNGs; their file names and the difference's scale."""
    diff = b.astype(np.float64) - a.astype(np.float64)
    scale = float(np.abs(diff).max())
    h, w = image.shape[:2]
    panels = {
        "image": image,
        "reference": pictures.overlay(image, a),
        "run": pictures.overlay(image, b),
        "difference": pictures.difference_rgb(diff, scale, h, w),
    }
    files = {}
    for key, rgb in panels.items():
        fname = f"{name}-{key}.png"
        atomic_write_bytes(directory / fname, pictures.encode_png(pictures.enlarge(rgb)))
        files[key] = f"{directory.name}/{fname}"
    return {"files": files, "difference_scale": scale}


_Outputs = dict[str, np.ndarray]  # a run's probe outputs by name (launcher.verify.impact.load_probe_outputs)
# a heatmap change worth a picture: (rank, probe, run id, its outputs, mean |difference|)
_Candidate = tuple[float, int, str, _Outputs, float]


def _compared(ref: _Outputs, run_id: str, run: _Outputs, tol: Tolerances,
              candidates: list[_Candidate]) -> tuple[ProbeRun, bool]:
    """One run's row against the reference, and whether it is comparable; its most changed heatmaps
    join the candidates for pictures."""
    impact = compare_probes(ref, run, tol)
    row: ProbeRun = {"run_id": run_id, "kind": impact.get("kind"), "line": impact["line"],
                     "identical": impact.get("identical", False)}
    if not impact.get("comparable", True):
        return row, False
    pred, heat = impact.get("predictions"), impact.get("heatmaps")
    if pred is not None:
        row["flips"] = pred["flips"]
        row["max_prob_change"] = pred["max_prob_change"]
    if heat is not None:
        row["heatmap_max_abs_diff"] = heat["max_abs_diff"]
        row["heatmap_mean_abs_diff"] = heat["mean_abs_diff"]
        row["correlation_min"] = heat["correlation"]["min"]
        row["overlap_min_iou"] = heat["overlap"]["min_iou"]
        flipped = {f["probe"] for f in (pred or {}).get("flipped", [])}
        for m in heat["most_changed"]:
            candidates.append((m["mean_abs_diff"] + (1.0 if m["probe"] in flipped else 0.0), m["probe"],
                               run_id, run, m["mean_abs_diff"]))
    return row, True


def _pictures(directory: Path, ref: _Outputs, images: np.ndarray, candidates: list[_Candidate]) -> list[Picture]:
    """The probe images whose heatmaps changed most (PICTURED at most, one picture per probe)."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.png"):  # pictures of an earlier report of this group
        old.unlink()
    seen: set[int] = set()
    out: list[Picture] = []
    for _, probe, run_id, run, mean_abs_diff in sorted(candidates, key=lambda c: (-c[0], c[1], c[2])):
        if probe in seen or len(seen) >= PICTURED:
            continue
        seen.add(probe)
        drawn = _draw(directory, f"{run_id}-probe{int(ref['indices'][probe])}", images[probe],
                      ref["heatmaps"][probe], run["heatmaps"][probe])
        out.append({
            "probe": probe, "index": int(ref["indices"][probe]), "run_id": run_id, **drawn,
            "mean_abs_diff": mean_abs_diff,
            "classes": [int(ref["predicted"][probe]), int(run["predicted"][probe])] if "predicted" in ref else None,
        })
    return out


def group_probes(group: GroupStats, directory: Path, tol: Tolerances | None = None) -> GroupProbes | None:
    """The group's probe comparison; pictures go to ``directory`` (a folder of the report). None when
    the reference run recorded no probes."""
    tol = tol or Tolerances()
    ref_run = group.runs[0]
    ref = _outputs(ref_run.run_dir)
    if ref is None:
        return None
    out: GroupProbes = {"reference": ref_run.run_id, "runs": [], "notes": [], "pictures": []}
    others: list[tuple[str, _Outputs]] = []
    candidates: list[_Candidate] = []
    for r in group.runs[1:]:
        run = _outputs(r.run_dir)
        if run is None:
            out["notes"].append(f"run {r.run_id} recorded no probe outputs: left out of the probe comparison")
            continue
        row, comparable = _compared(ref, r.run_id, run, tol, candidates)
        if comparable:
            others.append((r.run_id, run))
        out["runs"].append(row)
    out["flips"] = _flip_table(ref_run.run_id, ref, others)
    images = _images(ref_run.run_dir)
    if not candidates:
        if "heatmaps" in ref and others:
            out["notes"].append("the heatmaps are the same in every run: no pictures of differences")
        return out
    if images is None or "heatmaps" not in ref:
        out["notes"].append(f"the reference run {ref_run.run_id} recorded no probe images ({PROBE_INPUTS}): "
                            "no pictures of the heatmaps")
        return out
    out["pictures"] = _pictures(directory, ref, images, candidates)
    return out


def render(probes: dict[str, GroupProbes]) -> list[str]:
    """The HTML of the probe section (empty when no group recorded probes)."""
    e = html.escape
    if not probes:
        return []
    parts = ["<h2>What the differences do: probe predictions and Grad-CAM</h2>",
             "<p>Each run's model on its recipe's probe set (fixed held-out examples), against its group's first "
             "run: predictions that flip, the largest change of a class probability, and how far the Grad-CAM "
             "heatmaps of the predicted class move (each map scaled to [0, 1]).</p>"]
    for gname, p in probes.items():
        parts.append(f"<h3>{e(gname)} (reference {e(p['reference'])})</h3>")
        if p["runs"]:
            rows = "".join(
                f"<tr><td>{e(r['run_id'])}</td><td>{e(str(r.get('kind') or '–'))}</td>"
                f"<td>{r.get('flips', '–')}</td><td>{_g(r.get('max_prob_change'))}</td>"
                f"<td>{_g(r.get('heatmap_max_abs_diff'))}</td><td>{_g(r.get('heatmap_mean_abs_diff'))}</td>"
                f"<td>{_g(r.get('overlap_min_iou'))}</td></tr>" for r in p["runs"])
            parts.append("<table><tr><th>run</th><th>impact</th><th>flips</th><th>max |Δp|</th>"
                         "<th>heatmap max |Δ|</th><th>heatmap mean |Δ|</th><th>lowest top-10% IoU</th></tr>"
                         f"{rows}</table>")
        flips: FlipTable = p.get("flips") or {"rows": [], "runs": []}
        if flips["rows"]:
            head = "".join(f"<th>{e(rid)}</th>" for rid in flips["runs"])
            body = "".join(
                f"<tr><td>{row['index']}</td><td>{row.get('label', '–')}</td>" + "".join(
                    f"<td>{'–' if c is None else (f'<b>{c}</b>' if k and c != row['classes'][0] else c)}</td>"
                    for k, c in enumerate(row["classes"])) + "</tr>" for row in flips["rows"])
            parts.append("<p>Prediction flips across the runs (the predicted class; bold where it differs from the "
                         "reference, the first column):</p>"
                         f"<table><tr><th>example</th><th>label</th>{head}</tr>{body}</table>")
        elif p["runs"]:
            parts.append("<p>No probe prediction flips in any run.</p>")
        for pic in p["pictures"]:
            cells = "".join(f'<td><img src="{e(pic["files"][k])}" alt="{k}"></td>' for k in PANELS)
            classes = pic.get("classes")
            said = f", class {classes[0]} → {classes[1]}" if classes else ""
            parts.append(f"<table><tr><th>example {pic['index']}{e(said)}</th><th>reference heatmap</th>"
                         f"<th>{e(pic['run_id'])} heatmap</th><th>difference (±{_g(pic['difference_scale'])})</th>"
                         f"</tr><tr>{cells}</tr></table>")
        for note in p["notes"]:
            parts.append(f"<p><i>{e(note)}</i></p>")
    return parts


def _g(x: Any) -> str:
    return "–" if x is None else f"{x:.3g}" if isinstance(x, float) else html.escape(str(x))
