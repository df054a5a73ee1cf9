"""`launcher report` over real runs: a numpy recipe (two layers, an unseeded dropout) in a small
image, run by launcher's in-container runtime in the local Docker engine with profile `off`,
two groups of 10 runs each planned and scheduled by `launcher.experiment` (two containers at a
time). The report's intervals are checked against scipy's F distribution applied to the runs'
own metrics.jsonl; its HTML against the PNG files it names.

The runs are started with the container contract of docs/design.md (`python -m
launcher.runtime run --recipe ... --out /launcher/out`) and adopted as a pull would
(runfactory.adopt_outputs), so this test does not depend on how `launcher run` builds images."""

from __future__ import annotations

import html.parser
import importlib.util
import json
import math
import shutil
import struct
import subprocess
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import need
from runfactory import FakeRun, adopt_outputs, refresh_manifest, write_run
from runfactory import make_workspace as fake_workspace
from typer.testing import CliRunner

from launcher.cli import app
from launcher.determinism import profile_env
from launcher.experiment import DIFFERENT_SEEDS, SAME_SEED, PlannedRun, experiment
from launcher.report import write_report
from launcher.workspace import Workspace

REPO = Path(__file__).resolve().parent.parent
RECIPES = Path(__file__).resolve().parent / "fixtures" / "report_recipes"
RUNS_PER_GROUP = 10


@pytest.fixture(scope="module")
def numpy_image(base_ref: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The pinned base + numpy (this interpreter's own copy) + launcher's runtime + the report recipes."""
    numpy_dir = Path(np.__file__).resolve().parent
    ctx = tmp_path_factory.mktemp("numpy-image")
    site = ctx / "site"
    shutil.copytree(numpy_dir, site / "numpy", ignore=shutil.ignore_patterns("__pycache__", "tests"))
    libs = numpy_dir.parent / "numpy.libs"
    if libs.is_dir():
        shutil.copytree(libs, site / "numpy.libs")
    (ctx / "launcher").mkdir()
    shutil.copy(REPO / "launcher" / "__init__.py", ctx / "launcher" / "__init__.py")
    shutil.copytree(REPO / "launcher" / "runtime", ctx / "launcher" / "runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(RECIPES, ctx / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    (ctx / "Dockerfile").write_text(
        f"FROM {base_ref}\n"
        "RUN ln -sf /usr/bin/python3 /usr/local/bin/python\n"
        "ENV PYTHONPATH=/opt/launcher:/opt/site PYTHONDONTWRITEBYTECODE=1\n"
        "COPY site /opt/site\n"
        "COPY launcher /opt/launcher/launcher\n"
        "COPY recipes /opt/launcher/recipes\n"
        'RUN python -c "import numpy"\n'
    )
    tag = f"launcher-test/numpy:{uuid.uuid4().hex[:8]}"
    built = subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], capture_output=True, text=True,
                           check=False)
    # numpy is this interpreter's copy: it imports in the image only if both are CPython 3.11 on x86-64/glibc.
    assert built.returncode == 0, f"cannot build the numpy test image: {built.stderr[-1500:]}"
    image_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], check=True,
                              capture_output=True, text=True).stdout.strip()
    try:
        yield {"id": image_id, "tag": tag}
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


@pytest.fixture(scope="module")
def experiment_ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("report-runs")
    ws = Workspace.at(fake_workspace(root / "ws"), root / "cache")
    shutil.rmtree(ws.recipes)
    shutil.copytree(RECIPES, ws.recipes)
    return ws


def run_in_container(image_id: str, ws: Workspace, job: PlannedRun, scratch: Path) -> dict[str, Any]:
    """One real run of the noisy recipe (profile off), its outputs adopted into ws/runs."""
    run_id = f"20261123T{job.replicate:06d}-noisy-{uuid.uuid4().hex[:6]}"
    out = scratch / run_id
    out.mkdir(parents=True)
    env = profile_env("off")
    argv = ["docker", "run", "--rm", "--label", "org.launcher.test=report-runs"]
    for key, value in sorted(env.items()):
        argv += ["-e", f"{key}={value}"]
    argv += ["-v", f"{out}:/launcher/out", image_id, "python", "-m", "launcher.runtime", "run",
             "--recipe", "/opt/launcher/recipes/noisy", "--out", "/launcher/out", "--params", "{}"]
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert cp.returncode == 0, f"run {run_id} exited {cp.returncode}: {cp.stderr[-1500:]}"
    minute = 10 + job.replicate // 60
    adopt_outputs(ws.runs, run_id, out, recipe="noisy", seed=job.seed, group=job.group, replicate=job.replicate,
                  profile="off", env=env, started_at=f"2026-11-23T{minute:02d}:{job.replicate % 60:02d}:00Z")
    return {"runs": [{"run_id": run_id, "status": "succeeded"}]}


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
def experiment_report(experiment_ws: Workspace, numpy_image: dict[str, Any],
                      tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """20 real runs (10 per group, profile off) planned by `experiment`, then `launcher report`."""
    scratch = tmp_path_factory.mktemp("outs")
    res = experiment(experiment_ws, "noisy", RUNS_PER_GROUP, "both", ["engine-1", "engine-2"],
                     profile="off", launch=lambda job, _host: run_in_container(numpy_image["id"], experiment_ws,
                                                                               job, scratch))
    assert res.exit_code == 0, [o.error for o in res.outcomes if o.error]
    names = [res.groups[SAME_SEED], res.groups[DIFFERENT_SEEDS]]
    runner = CliRunner()
    text = runner.invoke(app, ["-w", str(experiment_ws.root), "-q", "report", *names, "--name", "noisy"])
    assert text.exit_code == 0, text.stderr
    as_json = runner.invoke(app, ["-w", str(experiment_ws.root), "-q", "--json", "report", *names,
                                  "--name", "noisy"])
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
