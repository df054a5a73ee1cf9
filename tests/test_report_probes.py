"""The report's probe section, without TensorFlow: probe outputs written as the runtime writes them,
three runs of one group; the impact rows, the table of prediction flips across the runs, and the
side-by-side pictures (decoded here, pixel by pixel: the difference panel is white exactly where the
heatmaps agree, coloured where they differ, and the overlays follow the heatmaps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher.report import probes as section
from launcher.report.stats import GroupStats, RunSeries
from launcher.runtime import fingerprints as fp
from launcher.runtime import pictures

N, H, W = 6, 4, 4  # probes, heatmap size; images are 8 x 8 RGB


def _write_run(root: Path, run_id: str, predicted: list[int], heat: np.ndarray, images: np.ndarray | None
               ) -> RunSeries:
    run_dir = root / run_id
    p1 = np.where(np.asarray(predicted) == 1, 0.8, 0.2)
    arrays = {"indices": np.arange(10, 10 + N, dtype=np.int64), "outputs": p1[:, None].astype(np.float32),
              "probabilities": np.stack([1 - p1, p1], axis=1).astype(np.float32),
              "predicted": np.asarray(predicted, dtype=np.int64), "labels": np.array([0, 1] * (N // 2)),
              "heatmaps": heat.astype(np.float32)}
    fp.write_atomic(run_dir / "outputs/probes/outputs.npz", fp.arrays_npz_bytes(arrays))
    if images is not None:
        fp.write_atomic(run_dir / "outputs/probes/inputs.npz", fp.arrays_npz_bytes({"images": images}))
    return RunSeries(run_id, "g", 0, 1, "succeeded", [], run_dir)


@pytest.fixture
def three_runs(tmp_path: Path) -> tuple[GroupStats, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    base = rng.random((N, H, W))
    moved = base.copy()
    moved[2, :2, :] = 0.0  # run c: probe 2's heatmap loses its top half, probe 4 flips
    images = rng.integers(0, 256, size=(N, 8, 8, 3), dtype=np.uint8)
    pred = [0, 1, 0, 1, 0, 1]
    runs = [_write_run(tmp_path / "runs", "a", pred, base, images),
            _write_run(tmp_path / "runs", "b", pred, base, images),
            _write_run(tmp_path / "runs", "c", [0, 1, 0, 1, 1, 1], moved, images)]
    return GroupStats("g", "same-seed", runs, "#000000"), base, moved


def test_rows_flips_and_pictures(three_runs: Any, tmp_path: Path) -> None:
    group, base, moved = three_runs
    out = section.group_probes(group, tmp_path / "report" / "probes-g")
    assert out is not None and out["reference"] == "a"
    rows = {r["run_id"]: r for r in out["runs"]}
    assert rows["b"]["identical"] and rows["b"]["kind"] == "agree" and rows["b"]["flips"] == 0
    assert rows["c"]["kind"] == "predictions" and rows["c"]["flips"] == 1
    assert rows["c"]["heatmap_max_abs_diff"] == pytest.approx(np.abs(moved - base).max(), rel=1e-6)
    assert out["flips"]["runs"] == ["a", "b", "c"]
    assert out["flips"]["rows"] == [{"probe": 4, "index": 14, "classes": [0, 0, 1], "flipped_in": 1, "label": 0}]

    # Only probe 2's heatmap moved: it alone is pictured, with run c against the reference.
    assert [(p["probe"], p["index"], p["run_id"]) for p in out["pictures"]] == [(2, 12, "c")]
    pic = out["pictures"][0]
    assert pic["difference_scale"] == pytest.approx(np.abs(moved[2] - base[2]).max(), rel=1e-6)
    folder = tmp_path / "report"
    panels = {k: pictures.decode_png((folder / f).read_bytes()) for k, f in pic["files"].items()}
    k = pictures.MIN_SIDE // 8  # 8 x 8 images are enlarged by a whole factor
    assert all(p.shape == (8 * k, 8 * k, 3) for p in panels.values())
    images = np.load(group.runs[0].run_dir / "outputs/probes/inputs.npz")["images"]
    assert np.array_equal(panels["image"][::k, ::k], images[2])
    # The difference: white where the heatmaps agree (the bottom half), not white where they differ.
    diff = panels["difference"]
    white = np.all(diff == 255, axis=2)
    assert white[diff.shape[0] // 2 + k:].all()
    assert not white[: diff.shape[0] // 4].any()
    assert diff[: diff.shape[0] // 4, :, 2].mean() > diff[: diff.shape[0] // 4, :, 0].mean()  # lower: blue
    # The run's overlay differs from the reference's only where its heatmap moved.
    changed = np.any(panels["reference"] != panels["run"], axis=2)
    assert changed[: diff.shape[0] // 4].any() and not changed[diff.shape[0] // 2 + k:].any()

    html = "\n".join(section.render({"g": out}))
    for f in pic["files"].values():
        assert f'src="{f}"' in html
    assert "<b>1</b>" in html and "<tr><td>14</td><td>0</td>" in html
    assert "example 12, class 0 → 0" in html and "difference (±" in html


def test_identical_runs_need_no_pictures_and_old_pictures_go(three_runs: Any, tmp_path: Path) -> None:
    group, _, _ = three_runs
    folder = tmp_path / "report" / "probes-g"
    section.group_probes(group, folder)
    assert list(folder.glob("*.png"))
    same = GroupStats("g", "same-seed", group.runs[:2], "#000000")
    out = section.group_probes(same, folder)
    assert out is not None and out["pictures"] == [] and out["flips"]["rows"] == []
    assert "the heatmaps are the same in every run: no pictures of differences" in out["notes"]
    html = "\n".join(section.render({"g": out}))
    assert "No probe prediction flips in any run." in html


def test_runs_without_probes(tmp_path: Path, three_runs: Any) -> None:
    group, _, _ = three_runs
    bare = RunSeries("z", "g", 0, 1, "succeeded", [], tmp_path / "nothing")
    assert section.group_probes(GroupStats("g", "same-seed", [bare, *group.runs], "#000"), tmp_path / "p") is None
    out = section.group_probes(GroupStats("g", "same-seed", [*group.runs, bare], "#000"), tmp_path / "p")
    assert out is not None
    assert "run z recorded no probe outputs: left out of the probe comparison" in out["notes"]
    assert section.render({}) == []


def test_pictures_need_the_probe_images(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a = _write_run(tmp_path, "a", [0] * N, rng.random((N, H, W)), None)
    b = _write_run(tmp_path, "b", [0] * N, rng.random((N, H, W)), None)
    out = section.group_probes(GroupStats("g", "same-seed", [a, b], "#000"), tmp_path / "p")
    assert out is not None and out["pictures"] == []
    assert any("recorded no probe images" in n for n in out["notes"])


def test_png_round_trip_and_colour_maps() -> None:
    rgb = np.random.default_rng(2).integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    data = pictures.encode_png(rgb)
    assert data == pictures.encode_png(rgb)  # byte-stable
    assert np.array_equal(pictures.decode_png(data), rgb)
    assert pictures.difference_rgb(np.zeros((2, 2)), 0.0, 2, 2).tolist() == [[[255, 255, 255]] * 2] * 2
    red = pictures.difference_rgb(np.ones((1, 1)), 1.0, 1, 1)[0, 0]
    assert red[0] > 150 and red[2] < 60
    assert pictures.heat_rgb(np.array([0.0, 1.0])).tolist() == [[68, 1, 84], [253, 231, 37]]
    assert np.allclose(pictures.resize(np.array([[0.0, 1.0]]), 1, 4), [[0.0, 0.25, 0.75, 1.0]])
    assert pictures.image_rgb(np.array([[[-1.0], [1.0]]]), -1.0, 1.0).tolist() == [[[0, 0, 0], [255, 255, 255]]]
    with pytest.raises(ValueError):
        pictures.encode_png(np.zeros((2, 2)))
