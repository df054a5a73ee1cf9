"""Probe sets for real, in the shared TensorFlow CPU image (issue 14).

- Grad-CAM as launcher.runtime.probes computes it with TensorFlow, on two tiny convolutional models
  (a softmax head and one sigmoid unit), equals the gradient-weighted map computed here by hand with
  numpy from the same weights (forward pass, the class score's gradient, channel weights, ReLU).
- catsdogs_convnet and mini_xception run as `launcher run` starts them: each run records its probe
  outputs and heatmaps; two runs with the same seed agree byte for byte and verify says identical; a
  run with another seed is explained by its impact, whose numbers are recomputed here from the files.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.runtime import pictures
from launcher.verify.impact import AGREE, EXPLANATIONS, PREDICTIONS, Tolerances

pytestmark = [pytest.mark.docker, pytest.mark.tfimage]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "probes"


@pytest.fixture(scope="module")
def tiny(cpu_image: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    out = tmp_path_factory.mktemp("tiny")
    res = subprocess.run(["docker", "run", "--rm", "--label", "org.launcher.test=probes", "-v", f"{out}:/out",
                          "-v", f"{FIXTURES}:/fixtures:ro", cpu_image["id"], "python", "/fixtures/tiny_gradcam.py",
                          "/out"], capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    with np.load(out / "tiny.npz") as z:
        return {k: z[k] for k in z.files}


def gradcam_by_hand(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, w: np.ndarray, c: np.ndarray,
                    sigmoid: bool) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Conv2D(2, 3x3, relu, valid) -> Flatten -> Dense(w, c) -> softmax or sigmoid, and the Grad-CAM
    of the predicted class at the convolution's output, from the score before the softmax/sigmoid."""
    n, size = len(x), x.shape[1] - 2
    feats = np.zeros((n, size, size, kernel.shape[-1]))
    for i in range(size):
        for j in range(size):
            patch = x[:, i:i + 3, j:j + 3, 0].astype(np.float64)
            feats[:, i, j, :] = np.einsum("nab,abk->nk", patch, kernel[:, :, 0, :].astype(np.float64)) + bias
    feats = np.maximum(feats, 0)
    logits = feats.reshape(n, -1) @ w.astype(np.float64) + c
    outs, maps, classes = [], [], []
    for s in range(n):
        if sigmoid:
            p = np.array([1 / (1 + np.exp(-logits[s, 0]))])
            cls = int(p[0] > 0.5)
            dscore = np.array([1.0 if cls == 1 else -1.0])  # the score of class 0 is minus the logit
        else:
            e = np.exp(logits[s] - logits[s].max())
            p = e / e.sum()
            cls = int(p.argmax())
            dscore = np.eye(len(p))[cls]
        grad = (w.astype(np.float64) @ dscore).reshape(feats.shape[1:])  # d score / d feature maps
        alpha = grad.mean(axis=(0, 1))
        cam = np.maximum((feats[s] * alpha).sum(axis=2), 0)
        maps.append(cam / cam.max() if cam.max() > 0 else cam)
        outs.append(p)
        classes.append(cls)
    return np.array(outs), np.array(maps), classes


@pytest.mark.parametrize("head", ["softmax", "sigmoid"])
def test_gradcam_equals_a_numpy_computation_by_hand(tiny: dict[str, np.ndarray], head: str) -> None:
    outs, maps, classes = gradcam_by_hand(tiny["x"], tiny[f"{head}_kernel"], tiny[f"{head}_bias"], tiny[f"{head}_w"],
                                          tiny[f"{head}_c"], sigmoid=head == "sigmoid")
    assert str(tiny[f"{head}_layer"]) == "conv"  # found automatically: the last conv feature map
    assert np.allclose(tiny[f"{head}_outputs"], outs, atol=1e-6)
    got = tiny[f"{head}_heatmaps"]
    assert got.shape == (8, 3, 3)
    assert np.abs(got - maps).max() < 1e-5
    assert np.array_equal(tiny[f"{head}_loaded_heatmaps"], got)  # the model saved and loaded: the same maps
    assert sum(bool(m.max() > 0) for m in maps) >= 4  # the maps compared are not all empty
    if head == "sigmoid":
        assert set(classes) == {0, 1}  # both signs of the one unit's score are exercised


# (params for a short run, the Grad-CAM layer found automatically, its map size)
RECIPES: dict[str, tuple[list[str], str, list[int]]] = {
    "catsdogs_convnet": (["epochs=3", "train_samples=64"], "conv2d_4", [7, 7]),
    "mini_xception": (["epochs=1", "train_samples=16", "batch_size=16"], "add_4", [6, 6]),
}


def _cli(ws: Any, *args: str) -> tuple[int, dict[str, Any]]:
    r = CliRunner().invoke(app, ["--workspace", str(ws.root), "--json", "--quiet", *args])
    try:
        return r.exit_code, json.loads(r.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"launcher {' '.join(args)}: exit {r.exit_code}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
                             ) from None


def _probes(ws: Any, run_id: str) -> tuple[dict[str, np.ndarray], dict[str, Any], bytes]:
    folder = ws.runs / run_id / "outputs" / "probes"
    with np.load(folder / "outputs.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads((folder / "probes.json").read_text()), (folder / "outputs.npz").read_bytes()


GROUP = "probes-{}"  # each recipe's runs share a group: the report compares them


@pytest.fixture(scope="module")
def made(cpu_image: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Per recipe, once per module: two runs with seed 1 (a, b) and one with seed 2 (c), one group."""
    return {}


def _made_runs(made: dict[str, dict[str, str]], ws: Any, recipe: str) -> dict[str, str]:
    if recipe not in made:
        flags = [x for p in RECIPES[recipe][0] for x in ("--param", p)]
        code, same = _cli(ws, "run", recipe, "--seed", "1", "--runs", "2", "--group", GROUP.format(recipe), *flags)
        assert code == 0, same
        code, other = _cli(ws, "run", recipe, "--seed", "2", "--group", GROUP.format(recipe), *flags)
        assert code == 0, other
        a, b = (m["run_id"] for m in same["data"]["runs"])
        made[recipe] = {"a": a, "b": b, "c": other["data"]["runs"][0]["run_id"]}
    return made[recipe]


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_real_runs_record_probes_and_verify_explains_another_seed_by_its_impact(
        recipe: str, cpu_image: dict[str, Any], made: dict[str, dict[str, str]]) -> None:
    ws = cpu_image["workspace"]
    _, layer, shape = RECIPES[recipe]
    a, b, c = _made_runs(made, ws, recipe).values()
    pa, doc_a, bytes_a = _probes(ws, a)
    _, _, bytes_b = _probes(ws, b)
    pc, doc_c, _ = _probes(ws, c)
    assert doc_a["recorded"] and doc_a["count"] == 16 and doc_a["indices"] == list(range(16))
    assert doc_a["gradcam"] == {"layer": layer, "chosen": "automatic", "shape": shape}
    assert doc_a["digest"] == doc_c["digest"]  # the same probe images in every run
    assert pa["heatmaps"].shape == (16, *shape) and pa["probabilities"].shape == (16, 2)
    assert pa["labels"].tolist() == [i % 2 for i in range(16)]  # the synthetic set alternates cat, dog
    assert float(pa["heatmaps"].max()) == 1.0  # scaled to [0, 1] by each map's maximum
    assert bytes_a == bytes_b  # same seed: byte-identical probe outputs and heatmaps

    code, ident = _cli(ws, "verify", "checksums", a, b)
    assert code == 0, ident["data"]["summary"]

    code, diff = _cli(ws, "verify", "checksums", a, c)
    data = diff["data"]
    assert code == 3, data["summary"]
    impact = data["explanations"][c]["impact"]
    flips = int(np.sum(pa["predicted"] != pc["predicted"]))
    dp = np.abs(pa["probabilities"].astype(np.float64) - pc["probabilities"].astype(np.float64))
    dh = np.abs(pa["heatmaps"].astype(np.float64) - pc["heatmaps"].astype(np.float64))
    assert impact["comparable"] and not impact["identical"]
    assert impact["predictions"]["flips"] == flips
    assert [f["index"] for f in impact["predictions"]["flipped"]] == np.flatnonzero(
        pa["predicted"] != pc["predicted"]).tolist()
    assert impact["predictions"]["max_prob_change"] == pytest.approx(dp.max())
    assert dh.max() > 0  # another seed moves the heatmaps
    assert impact["heatmaps"]["max_abs_diff"] == pytest.approx(dh.max())
    assert impact["heatmaps"]["mean_abs_diff"] == pytest.approx(dh.mean())
    tol = Tolerances()
    want = (PREDICTIONS if flips or dp.max() > tol.probability else
            EXPLANATIONS if dh.max() > tol.heatmap or impact["heatmaps"]["overlap"]["min_iou"] < tol.overlap
            else AGREE)
    assert impact["kind"] == want
    run = next(r for r in data["runs"] if r["run_id"] == c)
    assert run["classification"] == "input-change"
    assert run["line"].startswith("differs in seed (1 -> 2): an input change; ") and impact["line"] in run["line"]

    # Looser tolerances change the verdict on the impact, not the numbers.
    code, loose = _cli(ws, "verify", "checksums", a, c, "--tolerance", "probability=1", "--tolerance", "heatmap=1",
                       "--tolerance", "overlap=0")
    loose_impact = loose["data"]["explanations"][c]["impact"]
    assert loose_impact["kind"] == (PREDICTIONS if flips else AGREE)
    assert loose_impact["heatmaps"]["max_abs_diff"] == impact["heatmaps"]["max_abs_diff"]

    text = CliRunner().invoke(app, ["--workspace", str(ws.root), "--quiet", "verify", "checksums", a, c])
    assert "probes (16): " in text.stdout and "tolerances: probability 0.001, heatmap 0.05" in text.stdout


ONE_BIT = '''
# Added by the test: when training ends, flip the lowest bit of one weight of the first convolution,
# the smallest change a nondeterministic kernel could make to the trained model.
import numpy as _np

class _FlipOneBit(keras.callbacks.Callback):
    def on_train_end(self, logs=None):
        conv = next(layer for layer in self.model.layers if type(layer).__name__ == "Conv2D")
        kernel = conv.kernel.numpy()
        kernel.reshape(-1).view(_np.uint32)[0] ^= 1
        conv.kernel.assign(kernel)

_fit = keras.Model.fit

def _fit_with_flip(self, *args, **kwargs):
    kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), _FlipOneBit()]
    return _fit(self, *args, **kwargs)

keras.Model.fit = _fit_with_flip
'''


def test_one_bit_changed_weights_are_explained_by_their_impact_and_the_report_pictures_the_heatmaps(
        cpu_image: dict[str, Any], made: dict[str, dict[str, str]], tmp_path: Path) -> None:
    """A copy of catsdogs_convnet whose trained model has one bit of one weight flipped, run with the
    pair's seed into their group: verify finds the one element and explains it by its impact; the
    group's report tabulates every run's flips and pictures the heatmaps that moved most."""
    ws = cpu_image["workspace"]
    recipe = "catsdogs_convnet"
    runs = _made_runs(made, ws, recipe)
    copy = tmp_path / recipe
    copy.mkdir()
    (copy / "recipe.toml").write_bytes((ws.recipes / recipe / "recipe.toml").read_bytes())
    source = (ws.recipes / recipe / "train.py").read_text()
    (copy / "train.py").write_text(source.replace("p = api.params()", ONE_BIT + "\np = api.params()"))
    flags = [x for p in RECIPES[recipe][0] for x in ("--param", p)]
    code, flipped = _cli(ws, "run", str(copy), "--seed", "1", "--group", GROUP.format(recipe), *flags)
    assert code == 0, flipped
    d = flipped["data"]["runs"][0]["run_id"]

    with np.load(ws.runs / runs["a"] / "outputs/model/canonical.npz") as za, \
            np.load(ws.runs / d / "outputs/model/canonical.npz") as zd:
        differing = {k: int(np.sum(za[k].view(np.uint32) != zd[k].view(np.uint32))) for k in za.files
                     if za[k].dtype == np.float32}
    assert sum(differing.values()) == 1  # exactly one element, by one bit
    pa, _, _ = _probes(ws, runs["a"])
    pd, _, _ = _probes(ws, d)
    code, res = _cli(ws, "verify", "checksums", runs["a"], d)
    assert code == 16, res  # an edited copy is other code: compared only when asked
    code, res = _cli(ws, "verify", "checksums", runs["a"], d, "--across-code")
    assert code == 3, res["data"]["summary"]
    assert "the code differs" in res["summary"]
    impact = res["data"]["explanations"][d]["impact"]
    dh = np.abs(pa["heatmaps"].astype(np.float64) - pd["heatmaps"].astype(np.float64))
    dp = np.abs(pa["probabilities"].astype(np.float64) - pd["probabilities"].astype(np.float64))
    assert impact["predictions"]["flips"] == int(np.sum(pa["predicted"] != pd["predicted"])) == 0
    assert impact["predictions"]["max_prob_change"] == pytest.approx(dp.max())
    assert impact["heatmaps"]["max_abs_diff"] == pytest.approx(dh.max())
    assert not impact["identical"]  # the one bit reaches the probe outputs...
    assert impact["kind"] == AGREE  # ...but predictions and explanations agree within tolerance
    run = next(r for r in res["data"]["runs"] if r["run_id"] == d)
    assert "bits differ, but predictions and explanations agree within tolerance" in run["line"]

    code, rep = _cli(ws, "report", GROUP.format(recipe), "--name", "probes-report")
    assert code == 0, rep
    folder = ws.reports / "probes-report"
    doc = json.loads((folder / "report.json").read_text())
    section = doc["probes"][GROUP.format(recipe)]
    assert section["reference"] == runs["a"]
    rows = {r["run_id"]: r for r in section["runs"]}
    assert rows[runs["b"]]["identical"] and rows[d]["kind"] == AGREE and rows[d]["flips"] == 0
    pc, _, _ = _probes(ws, runs["c"])
    flipped_c = np.flatnonzero(pa["predicted"] != pc["predicted"]).tolist()
    table = section["flips"]
    assert table["runs"][0] == runs["a"] and set(table["runs"]) == {runs["a"], runs["b"], runs["c"], d}
    assert [r["index"] for r in table["rows"]] == flipped_c
    assert section["pictures"], section["notes"]
    html = (folder / "index.html").read_text()
    for pic in section["pictures"]:
        ref = pa["heatmaps"][pic["probe"]].astype(np.float64)
        other, _, _ = _probes(ws, pic["run_id"])
        delta = other["heatmaps"][pic["probe"]].astype(np.float64) - ref
        panels = {k: pictures.decode_png((folder / f).read_bytes()) for k, f in pic["files"].items()}
        assert all(f'src="{f}"' in html for f in pic["files"].values())
        diff = panels["difference"]
        assert diff.shape == panels["image"].shape == panels["reference"].shape
        # Not blank where the heatmaps differ: wherever the difference is a tenth of its largest or
        # more, the pixel is coloured (white only where they agree).
        strong = np.abs(pictures.resize(delta, *diff.shape[:2])) >= 0.1 * np.abs(delta).max()
        assert strong.any() and not np.all(diff[strong] == 255, axis=-1).any()
        assert pic["difference_scale"] == pytest.approx(np.abs(delta).max(), rel=1e-5)


PLAIN_MODEL = """import keras


def build():
    return keras.Sequential([keras.Input((12, 12, 1)), keras.layers.Conv2D(4, 3, activation="relu", name="features"),
                             keras.layers.Flatten(), keras.layers.Dense(2, activation="softmax")])
"""
PLAIN_TRAIN = """import keras
import numpy as np
from model import build

keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x = rng.random((32, 12, 12, 1), dtype=np.float32)
y = (np.arange(32) % 2).astype("int64")
m = build()
m.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
m.fit(x[:24], y[:24], validation_data=(x[24:], y[24:]), epochs=1, batch_size=8, verbose=2)
"""


def test_a_plain_script_records_the_probes_its_run_names(cpu_image: dict[str, Any], tmp_path: Path) -> None:
    ws = cpu_image["workspace"]
    project = tmp_path / "plain"
    project.mkdir()
    (project / "model.py").write_text(PLAIN_MODEL)
    (project / "train.py").write_text(PLAIN_TRAIN)
    code, out = _cli(ws, "run", str(project / "train.py"), "--seed", "1", "--probes", "4")
    assert code == 0, out
    run = out["data"]["runs"][0]
    arrays, doc, _ = _probes(ws, run["run_id"])
    assert doc["recorded"] and doc["count"] == 4 and doc["indices"] == [0, 1, 2, 3]
    assert doc["gradcam"]["layer"] == "features" and arrays["heatmaps"].shape == (4, 10, 10)
    assert run["probes"] == {"source": "option", "option": "4", "config": {
        "split": "validation", "count": 4, "indices": [], "gradcam": True, "layer": None, "fingerprint": None}}


def test_probes_off_records_none_where_the_recipe_declares_them(cpu_image: dict[str, Any]) -> None:
    ws = cpu_image["workspace"]
    code, out = _cli(ws, "run", "catsdogs_convnet", "--seed", "1", "--param", "epochs=1", "--param",
                     "train_samples=16", "--probes", "off")
    assert code == 0, out
    run = out["data"]["runs"][0]
    assert not (ws.runs / run["run_id"] / "outputs" / "probes").exists()
    assert run["probes"] == {"source": "option", "option": "off", "config": None}
