"""`launcher report` over real runs made the way a user makes them: a numpy recipe (two
layers, an unseeded dropout; framework "none", so no TensorFlow import) in a scratch workspace
whose recipes/ holds only tests/fixtures/report_recipes, on the session's TensorFlow CPU
environment image. `launcher experiment noisy --runs 10 --seeds both --determinism off` builds
the workspace's image first (only launcher's recipes layer is new: the environment image is
reused) and runs the two groups of 10 on the local engine; then the `launcher report` line it
prints is run. The report's intervals are checked against scipy's F distribution applied to the
runs' own metrics.jsonl; its HTML against the PNG files it names."""

from __future__ import annotations

import html.parser
import importlib.util
import json
import math
import shlex
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import need
from runfactory import FakeRun, refresh_manifest, write_run
from runfactory import make_workspace as fake_workspace
from typer.testing import CliRunner

from launcher.cli import app
from launcher.images.buildrecord import read_record
from launcher.report.assemble import write_report
from launcher.runtime.code import code_digest
from launcher.workspace import Workspace

RECIPES = Path(__file__).resolve().parent / "fixtures" / "report_recipes"
RUNS_PER_GROUP = 10


@pytest.fixture(scope="module")
def experiment_ws(make_workspace: Callable[..., Workspace], cpu_image: dict[str, Any],
                  tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A scratch workspace on the bootstrapped base whose recipes are the report recipes alone.
    cpu_image has built the environment image of these same Dockerfile, lock and base."""
    ws = make_workspace(tmp_path_factory.mktemp("report-runs") / "ws", recipes=False)
    for recipe in RECIPES.iterdir():
        shutil.copytree(recipe, ws.recipes / recipe.name, ignore=shutil.ignore_patterns("__pycache__"))
    return ws


class ImageSources(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.sources += [v for k, v in attrs if k == "src" and v is not None]


def check_png(path: Path) -> tuple[int, int]:
    """A whole, valid PNG: signature, every chunk's CRC, IHDR first, IEND last, the image data
    inflating to height rows of pixels; and Pillow decodes it. Returns (width, height)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name}: not a PNG signature"
    pos, chunks, idat = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path.name}: bad CRC in chunk {kind!r}"
        chunks.append(kind)
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks, f"{path.name}: {chunks}"
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    assert len(zlib.decompress(idat)) == height * (1 + math.ceil(width * channels * depth / 8))
    if importlib.util.find_spec("PIL") is not None:
        from PIL import Image

        with Image.open(path) as im:
            im.load()
            assert im.size == (width, height)
    return width, height


def check_report_html(directory: Path) -> list[str]:
    """Every image index.html references exists in the report folder and is a valid PNG."""
    parser = ImageSources()
    parser.feed((directory / "index.html").read_text())
    assert parser.sources, "index.html shows no image"
    for src in parser.sources:
        path = directory / src
        assert path.resolve().parent == directory.resolve(), f"{src} is outside the report folder"
        assert path.is_file(), f"index.html shows {src}, which is not in {directory}"
        check_png(path)
    return parser.sources


def need_plots() -> None:
    need(importlib.util.find_spec("matplotlib") is not None,
         "matplotlib is not installed (pip install -e '.[dev]')")


def scipy_f() -> Any:
    need(importlib.util.find_spec("scipy") is not None, "scipy is not installed (pip install -e '.[dev]')")
    from scipy.stats import f

    return f


def test_html_figures_of_a_fake_experiment(tmp_path: Path) -> None:
    """Without Docker: the new figures are in index.html and every image there is a valid PNG."""
    need_plots()
    ws = Workspace.at(fake_workspace(tmp_path / "ws"), tmp_path / "cache")
    for i in range(4):
        write_run(ws.runs, FakeRun(run_id=f"s{i}", group="same", replicate=i, unseeded_dropout=True,
                                   dropout_entropy=i))
        write_run(ws.runs, FakeRun(run_id=f"d{i}", group="diff", replicate=i, seed=100 + i))
    r = CliRunner().invoke(app, ["-w", str(ws.root), "-q", "--json", "report", "same", "diff", "--name", "f"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)["data"]
    sources = check_report_html(ws.reports / "f")
    assert set(sources) == {*doc["plots"].values(), *doc["difference_plots"].values(), doc["weights_plot"]}
    assert set(doc["difference_plots"]) == {"accuracy", "loss"} and doc["weights_plot"] == "weights-per-layer.png"
    # The fake dropout sits before the dense layers: conv2d is identical in every same-seed run.
    same = doc["weights"]["same"]
    assert same["reference"] == "s0" and same["layers"] == ["conv2d", "dense", "dense_1"]
    for run in same["runs"]:
        status = {row["layer"]: row["status"] for row in run["layers"]}
        assert status == {"conv2d": "identical", "dense": "differs", "dense_1": "differs"}
        assert run["layers"][0]["rel_l2"] == 0.0 and 0 < run["layers"][1]["rel_l2"] < 1e-3
    diff = doc["weights"]["diff"]
    assert all(row["status"] == "differs" for run in diff["runs"] for row in run["layers"])
    # Per epoch: each replicate minus the reference, from the runs' own metrics.
    d1 = doc["differences"]["diff"]["runs"][0]
    assert d1["run_id"] == "d1" and d1["epochs"] == [0, 1, 2]
    ref_rows = [json.loads(x) for x in (ws.runs / "d0" / "outputs" / "metrics.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in (ws.runs / "d1" / "outputs" / "metrics.jsonl").read_text().splitlines()]
    assert d1["metrics"]["loss"] == pytest.approx([b["loss"] - a["loss"] for a, b in zip(ref_rows, rows,
                                                                                         strict=True)])


def test_runs_without_final_weights_are_noted_not_drawn(tmp_path: Path) -> None:
    ws = Workspace.at(fake_workspace(tmp_path / "ws"), tmp_path / "cache")
    for i in range(3):
        d = write_run(ws.runs, FakeRun(run_id=f"r{i}", group="g", replicate=i, seed=10 + i))
        if i == 2:
            (d / "outputs" / "model" / "canonical.npz").unlink()
            refresh_manifest(d)
    doc = write_report(ws, ["g"], name="w").to_dict()
    assert [r["run_id"] for r in doc["weights"]["g"]["runs"]] == ["r1"]
    assert any("r2 has no outputs/model/canonical.npz" in n for n in doc["notes"])
    (ws.runs / "r0" / "outputs" / "model" / "canonical.npz").unlink()
    refresh_manifest(ws.runs / "r0")
    doc = write_report(ws, ["g"], name="w").to_dict()
    assert doc["weights"]["g"]["runs"] == [] and doc["weights_plot"] is None
    assert any("reference run r0 has no" in n for n in doc["notes"])


@pytest.fixture(scope="module")
def experiment_report(experiment_ws: Workspace, cpu_image: dict[str, Any]) -> dict[str, Any]:
    """`launcher experiment` (20 real runs, profile off, local engine), then the `launcher report`
    line it prints, as text and as JSON."""
    runner = CliRunner()
    ws = ["--workspace", str(experiment_ws.root)]
    ran = runner.invoke(app, [*ws, "experiment", "noisy", "--runs", str(RUNS_PER_GROUP), "--seeds", "both",
                              "--determinism", "off"])
    assert ran.exit_code == 0, (ran.stdout[-3000:], ran.stderr[-3000:])
    assert f"{2 * RUNS_PER_GROUP} runs in 2 groups" in ran.stdout
    # The workspace had no image: the first run builds it, once, on the session's environment image.
    assert ran.stderr.count("building it first") == 1, ran.stderr[-3000:]
    record = read_record(experiment_ws, "cpu")
    assert record is not None
    assert record.extra["env_image_id"] == cpu_image["record"].extra["env_image_id"]
    assert record.extra["recipes"] == {"noisy": code_digest(RECIPES / "noisy")}
    manifests = [json.loads(p.read_text()) for p in sorted(experiment_ws.runs.glob("*/manifest.json"))]
    assert len(manifests) == 2 * RUNS_PER_GROUP
    for m in manifests:  # launcher's own runs: its image, the baked recipe, profile off, no framework
        assert m["image"]["id"] == record.image_id and m["status"] == "succeeded"
        assert (m["recipe"]["code_source"], m["recipe"]["tree_digest"]) == ("image", code_digest(RECIPES / "noisy"))
        assert m["determinism"]["profile"] == "off" and m["runtime"]["framework"] is None
    line = next(x for x in ran.stdout.splitlines() if x.startswith("report:"))
    command = shlex.split(line.removeprefix("report:"))
    assert command[:2] == ["launcher", "report"] and len(command) == 4, line
    names = command[2:]
    text = runner.invoke(app, [*ws, "-q", *command[1:], "--name", "noisy"])
    assert text.exit_code == 0, text.stderr
    as_json = runner.invoke(app, [*ws, "-q", "--json", *command[1:], "--name", "noisy"])
    assert as_json.exit_code == 0, as_json.stderr
    return {"groups": names, "text": text.stdout, "doc": json.loads(as_json.stdout)["data"],
            "directory": experiment_ws.reports / "noisy", "ws": experiment_ws}


def final_values(ws: Workspace, run_ids: list[str], metric: str) -> list[float]:
    """The last epoch's value of each run, read straight from its pulled metrics.jsonl."""
    out = []
    for run_id in run_ids:
        lines = (ws.runs / run_id / "outputs" / "metrics.jsonl").read_text().splitlines()
        out.append(float(json.loads(lines[-1])[metric]))
    return out


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.tfimage
def test_real_runs_report_each_share_with_its_interval(experiment_report: dict[str, Any]) -> None:
    f = scipy_f()
    doc, ws = experiment_report["doc"], experiment_report["ws"]
    same, diff = doc["groups"]
    assert (same["kind"], diff["kind"]) == ("same-seed", "different-seeds")
    assert len(same["runs"]) == len(diff["runs"]) == RUNS_PER_GROUP
    assert doc["metrics"] == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert {r["status"] for r in doc["runs"]} == {"succeeded"}
    spread = doc["seed_fixed_spread"]
    assert any("profile `off`" in n for n in doc["notes"])
    shown = 0
    for metric, v in spread["metrics"].items():
        a = np.array(final_values(ws, same["runs"], metric))
        b = np.array(final_values(ws, diff["runs"], metric))
        assert v["stdev_same_seed"] == pytest.approx(a.std(ddof=1))
        assert v["stdev_different_seeds"] == pytest.approx(b.std(ddof=1))
        assert (v["n_same_seed"], v["n_different_seeds"]) == (RUNS_PER_GROUP, RUNS_PER_GROUP)
        line = next(x for x in experiment_report["text"].splitlines() if x.startswith(f"{metric}: "))
        if v["status"] in ("undefined", "identical"):  # e.g. an accuracy every run shares: said, not hidden
            assert "no share" in line or "none of the standard deviation" in line
            continue
        r = a.var(ddof=1) / b.var(ddof=1)
        d = RUNS_PER_GROUP - 1
        lo, hi = math.sqrt(r / f.ppf(0.975, d, d)), math.sqrt(r / f.ppf(0.025, d, d))
        assert v["stdev_ratio"] == pytest.approx(math.sqrt(r))
        assert v["stdev_ratio_interval"] == pytest.approx([lo, hi], rel=1e-9)
        assert v["variance_ratio_interval"] == pytest.approx([lo * lo, hi * hi], rel=1e-9)
        # The printed line carries the share and its interval, or says why it is not a share.
        assert f"{100 * lo:.1f}%" in line and ("95% interval" in line or "interval (" in line)
        if v["stdev_ratio"] > 1:
            assert v["status"] in ("noise", "not-a-share") and "of the standard deviation remains" not in line
        else:
            assert v["status"] == "estimate" and "of the standard deviation remains" in line
        shown += 1
    assert shown >= 2
    assert f"about {spread['runs_per_group_for_tight']} runs per group" in experiment_report["text"]
    assert 60 < spread["runs_per_group_for_tight"] < 100


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.tfimage
def test_real_runs_report_html_figures(experiment_report: dict[str, Any]) -> None:
    need_plots()
    doc, directory = experiment_report["doc"], experiment_report["directory"]
    sources = check_report_html(directory)
    expected = {*doc["plots"].values(), *doc["difference_plots"].values(), doc["weights_plot"]}
    assert set(sources) == expected and len(expected) == 2 * len(doc["metrics"]) + 1
    index = (directory / "index.html").read_text()
    assert "Difference from the reference, per epoch" in index and "Where the final weights diverge" in index
    for group in experiment_report["groups"]:
        w = doc["weights"][group]
        assert w["layers"] == ["dense", "dense_1"] and len(w["runs"]) == RUNS_PER_GROUP - 1
        for run in w["runs"]:  # unseeded: every replicate's weights differ from the reference's
            assert [row["status"] for row in run["layers"]] == ["differs", "differs"]
            assert all(row["rel_l2"] > 0 and row["elements"] == (8 * 16 + 16 if row["layer"] == "dense" else 17)
                       for row in run["layers"])
        assert len(doc["differences"][group]["runs"]) == RUNS_PER_GROUP - 1
