"""`launcher explain` for real, in the shared TensorFlow CPU image: one short catsdogs_convnet run, then
the Grad-CAM of its model for images written here.

The independent check: one of the run's own probe images, saved as a PNG (the 8-bit picture the run
recorded in probes/inputs.npz) and explained from the file, gets the class the run recorded for it and
a heatmap equal to the one the run recorded (probes/outputs.npz), up to the PNG's 8-bit quantisation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.runtime.pictures import MIN_SIDE, decode_png, encode_png

pytestmark = [pytest.mark.docker, pytest.mark.tfimage]
PDIM = 180  # catsdogs_convnet's input size


def _cli(ws: Any, *args: str) -> tuple[int, dict[str, Any], str]:
    r = CliRunner().invoke(app, ["--workspace", str(ws.root), "--json", "--quiet", *args])
    try:
        return r.exit_code, json.loads(r.stdout), r.stderr
    except json.JSONDecodeError:
        raise AssertionError(f"launcher {' '.join(args)}: exit {r.exit_code}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
                             ) from None


@pytest.fixture(scope="module")
def run(cpu_image: dict[str, Any]) -> dict[str, Any]:
    ws = cpu_image["workspace"]
    code, res, _ = _cli(ws, "run", "catsdogs_convnet", "--seed", "1", "--param", "epochs=1",
                        "--param", "train_samples=16")
    assert code == 0, res
    run_id = res["data"]["runs"][0]["run_id"]
    probes = ws.runs / run_id / "outputs" / "probes"
    with np.load(probes / "outputs.npz") as z:
        outputs = {k: z[k] for k in z.files}
    with np.load(probes / "inputs.npz") as z:
        images = z["images"]
    return {"ws": ws, "run_id": run_id, "doc": json.loads((probes / "probes.json").read_text()),
            "outputs": outputs, "images": images}


def stripes(height: int, width: int) -> np.ndarray:
    """Horizontal stripes, which the synthetic set calls "cat", in another size than the model's input."""
    rows = 0.5 + 0.5 * np.sin(0.2 * np.arange(height))
    img = np.repeat(rows[:, None], width, axis=1)[:, :, None] * np.array([0.9, 0.7, 0.5])
    return np.clip(np.rint(img * 255), 0, 255).astype(np.uint8)


def test_explain_a_users_image_in_the_runs_image(run: dict[str, Any], tmp_path: Path) -> None:
    ws, run_id, doc = run["ws"], run["run_id"], run["doc"]
    image = tmp_path / "stripes.png"
    image.write_bytes(encode_png(stripes(120, 90)))
    started = time.monotonic()
    code, res, _ = _cli(ws, "explain", run_id, "--image", str(image))
    assert code == 0, res
    seconds = time.monotonic() - started
    d = res["data"]
    out = ws.explanations / run_id / "stripes"
    assert d["paths"]["folder"] == str(out)
    assert json.loads((out / "explain.json").read_text()) == {k: v for k, v in d.items() if k not in ("paths", "notes")}
    assert d["run_id"] == run_id
    manifest = json.loads((ws.runs / run_id / "manifest.json").read_text())
    assert d["docker_image"] == manifest["image"]["id"]
    layer, shape = doc["gradcam"]["layer"], doc["gradcam"]["shape"]
    assert (d["layer"], d["layer_source"], d["heatmap_shape"]) == (layer, "recorded by the run's probes", shape)
    assert d["input_range"] == doc["input_range"] and d["input_range_source"] == "recorded by the run's probes"
    assert d["input_shape"] == [PDIM, PDIM, 3] and d["notes"] == []
    heat = np.array(d["heatmap"])
    assert heat.shape == tuple(shape) and heat.min() >= 0 and heat.max() <= 1
    assert heat.max() == 1.0 or heat.max() == 0.0  # scaled by its maximum, as the run's probes are
    probs = np.array(d["probabilities"])
    assert probs.shape == (2,) and probs.sum() == pytest.approx(1.0) and d["predicted"] == int(probs.argmax())
    assert d["probability"] == pytest.approx(probs.max())
    k = -(-MIN_SIDE // min(shape))
    assert decode_png((out / "heatmap.png").read_bytes()).shape == (shape[0] * k, shape[1] * k, 3)
    assert decode_png((out / "overlay.png").read_bytes()).shape == (PDIM, PDIM, 3)
    assert sorted(p.name for p in out.parent.iterdir()) == ["stripes"]  # nothing partial beside it
    print(f"explain took {seconds:.1f} s")


def test_a_probe_image_explained_from_a_png_matches_what_the_run_recorded(run: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    ws, run_id, recorded = run["ws"], run["run_id"], run["outputs"]
    image = tmp_path / "probe0.png"
    image.write_bytes(encode_png(run["images"][0]))
    out = tmp_path / "probe0"
    code, res, _ = _cli(ws, "explain", run_id, "--image", str(image), "--out", str(out))
    assert code == 0, res
    d = res["data"]
    # The synthetic probes are uint8 pictures, so their recorded range is [0, 255] and the PNG holds them
    # exactly: no 8-bit rounding enters, only float differences of a batch of 1 against the run's batch of 16.
    assert d["input_range"] == [0.0, 255.0] and d["input_range_source"] == "recorded by the run's probes"
    assert d["predicted"] == int(recorded["predicted"][0])
    assert np.abs(np.array(d["probabilities"]) - recorded["probabilities"][0]).max() < 1e-5
    mine, theirs = np.array(d["heatmap"]), recorded["heatmaps"][0].astype(np.float64)
    assert mine.shape == theirs.shape
    diff = np.abs(mine - theirs).max()
    corr = np.corrcoef(mine.ravel(), theirs.ravel())[0, 1]
    print(f"probe 0: max abs heatmap difference {diff:.3g}, correlation {corr:.6f}, input range {d['input_range']}")
    assert theirs.max() > 0 and theirs.std() > 0  # a map with something in it
    assert diff < 1e-3 and corr > 0.9999  # measured: 3e-7 and 1.000000
    # Another probe of the other class: the recorded class again (the two classes both exercised when they differ).
    other = int(np.flatnonzero(recorded["predicted"] != recorded["predicted"][0])[0]) if len(
        set(recorded["predicted"].tolist())) > 1 else 1
    image.write_bytes(encode_png(run["images"][other]))
    code, res, _ = _cli(ws, "explain", run_id, "--image", str(image), "--out", str(out))
    assert code == 0, res
    assert res["data"]["predicted"] == int(recorded["predicted"][other])
    assert np.abs(np.array(res["data"]["heatmap"]) - recorded["heatmaps"][other]).max() < 1e-3


def test_another_layer_and_a_refused_one(run: dict[str, Any], tmp_path: Path) -> None:
    ws, run_id = run["ws"], run["run_id"]
    image = tmp_path / "stripes.png"
    image.write_bytes(encode_png(stripes(PDIM, PDIM)))
    out = tmp_path / "conv3"
    code, res, _ = _cli(ws, "explain", run_id, "--image", str(image), "--layer", "conv2d_3", "--out", str(out))
    assert code == 0, res
    assert res["data"]["layer"] == "conv2d_3" and res["data"]["layer_source"] == "given"
    assert res["data"]["heatmap_shape"] == [18, 18]  # 180 -> conv 178 -> pool 89 -> 87 -> 43 -> 41 -> 20 -> conv 18
    bad = tmp_path / "dense"
    code, res, err = _cli(ws, "explain", run_id, "--image", str(image), "--layer", "flatten", "--out", str(bad))
    assert code == ExitCode.USAGE, res
    assert "--layer 'flatten' does not output a (batch, height, width, channels) feature map" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not bad.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["conv3", "stripes.png"]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    code, res, err = _cli(ws, "explain", run_id, "--image", str(broken), "--out", str(bad))
    assert code == ExitCode.BAD_DATA and "is not an image TensorFlow decodes" in err and err.count("\n") == 1
    assert not bad.exists()
