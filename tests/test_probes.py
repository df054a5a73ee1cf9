"""The probe set, without TensorFlow: recipe.toml's [probes], the probe selection and its fingerprint,
probabilities from a model's outputs, the Grad-CAM map from feature maps and gradients, and verify's
impact comparison (flips, probability change, heatmap difference, correlation, overlap, tolerances)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher.errors import UsageError
from launcher.runtime import fingerprints as fp
from launcher.runtime import probes
from launcher.runtime.recipespec import SpecError, load_spec, parse_spec
from launcher.runtime.record import BadData, BadRecipe, Recorder
from launcher.verify.classification import with_impact
from launcher.verify.impact import (
    AGREE,
    EXPLANATIONS,
    PREDICTIONS,
    Tolerances,
    compare_probes,
    impact_lines,
    overlap,
    top_region,
)

REPO = Path(__file__).resolve().parent.parent


def _spec(tmp_path: Path, probes_table: dict[str, Any]) -> Any:
    (tmp_path / "train.py").write_text("")
    return parse_spec(tmp_path / "recipe.toml", {"entry": "train.py", "probes": probes_table}, tmp_path)


def test_probes_table_is_read_with_its_defaults(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {})
    assert spec.probes is not None
    assert spec.probes.as_dict() == {"split": "validation", "count": 16, "indices": [], "gradcam": True,
                                     "layer": None, "fingerprint": None}
    spec = _spec(tmp_path, {"indices": [3, 0, 7], "layer": "conv2d_4", "gradcam": False})
    assert spec.probes is not None and spec.probes.count == 3 and spec.probes.indices == (3, 0, 7)
    assert spec.as_dict()["probes"]["layer"] == "conv2d_4"
    (tmp_path / "train.py").write_text("")
    assert parse_spec(tmp_path / "recipe.toml", {"entry": "train.py"}, tmp_path).probes is None


@pytest.mark.parametrize(("table", "key", "words"), [
    ({"split": "train"}, "probes.split", "validation"),
    ({"count": 0}, "probes.count", ">= 1"),
    ({"count": 4, "indices": [1]}, "probes.indices", "not both"),
    ({"indices": [1, 1]}, "probes.indices", "distinct"),
    ({"indices": []}, "probes.indices", "at least one"),
    ({"gradcam": "yes"}, "probes.gradcam", "true or false"),
    ({"layer": ""}, "probes.layer", "name a layer"),
    ({"fingerprint": "md5:1"}, "probes.fingerprint", "sha256"),
    ({"size": 3}, "probes.size", "unknown key"),
])
def test_probes_table_mistakes_name_the_key(tmp_path: Path, table: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        _spec(tmp_path, table)
    assert err.value.key == key and words in err.value.detail


def test_seed_002_recipes_declare_probes() -> None:
    for name in ("catsdogs_convnet", "mini_xception"):
        spec = load_spec(REPO / "recipes" / name)
        assert spec.probes is not None and spec.probes.split == "validation" and spec.probes.count == 16


def test_selection_takes_the_declared_examples_and_checks_their_fingerprint() -> None:
    x = np.arange(10 * 4 * 4 * 3, dtype=np.uint8).reshape(10, 4, 4, 3)
    y = np.arange(10) % 2
    first = probes.select({"count": 4}, x, y)
    assert first.indices.tolist() == [0, 1, 2, 3] and np.array_equal(first.x, x[:4])
    assert first.digest == fp.arrays_fingerprint({"x": x[:4], "y": y[:4]})["digest"]
    chosen = probes.select({"indices": [7, 2]}, x, y)
    assert chosen.indices.tolist() == [7, 2] and np.array_equal(chosen.y, y[[7, 2]])
    assert probes.select({"count": 40}, x, None).indices.tolist() == list(range(10))
    assert probes.select({"count": 4, "fingerprint": first.digest}, x, y).digest == first.digest
    with pytest.raises(BadData, match=r"probes\.fingerprint expects"):
        probes.select({"count": 4, "fingerprint": "sha256:" + "0" * 64}, x, y)
    with pytest.raises(BadData, match="names example 12"):
        probes.select({"indices": [1, 12]}, x, y)


def test_probabilities_from_sigmoid_softmax_and_logits() -> None:
    p, how = probes.probabilities(np.array([[0.25], [0.9]], dtype=np.float32))
    assert how == "sigmoid output" and np.allclose(p, [[0.75, 0.25], [0.1, 0.9]])
    p, how = probes.probabilities(np.array([[-1.0], [2.0]]))
    assert how == "sigmoid of the logit" and np.allclose(p[:, 1], 1 / (1 + np.exp([1.0, -2.0])))
    p, how = probes.probabilities(np.array([[0.2, 0.7, 0.1]]))
    assert how == "softmax output" and np.allclose(p, [[0.2, 0.7, 0.1]])
    p, how = probes.probabilities(np.array([[1.0, 3.0, 0.0]]))
    e = np.exp([1.0, 3.0, 0.0])
    assert how == "softmax of the logits" and np.allclose(p, [e / e.sum()])
    assert probes.class_labels(np.eye(3)[[2, 0]]).tolist() == [2, 0]
    assert probes.class_labels(np.array([1, 0, 1])).tolist() == [1, 0, 1]
    assert probes.class_labels(np.array([0.5, 1.0])) is None


def test_gradcam_map_is_relu_of_gradient_weighted_channels_scaled_to_one() -> None:
    feats = np.zeros((2, 2, 2, 2))
    feats[0, :, :, 0] = [[1, 2], [3, 4]]
    feats[0, :, :, 1] = [[4, 0], [0, 0]]
    grads = np.zeros_like(feats)
    grads[0, :, :, 0] = 0.5  # weight 0.5
    grads[0, :, :, 1] = [[-4, 0], [0, 0]]  # weight -1
    grads[1] = -1.0  # every weight negative: an all-zero map, not a division by zero
    feats[1] = 1.0
    cam = probes.heatmaps(feats, grads)
    raw = np.maximum(0.5 * feats[0, :, :, 0] - feats[0, :, :, 1], 0)  # [[0, 1], [1.5, 2]]
    assert cam.dtype == np.float32
    assert np.allclose(cam[0], raw / raw.max()) and np.array_equal(cam[1], np.zeros((2, 2)))


def test_named_arrays_npz_is_byte_stable_and_loads() -> None:
    arrays = {"predicted": np.array([1, 0]), "heatmaps": np.ones((2, 3, 3), dtype=np.float32)}
    a = fp.arrays_npz_bytes(arrays)
    assert a == fp.arrays_npz_bytes(dict(reversed(list(arrays.items()))))
    import io

    with np.load(io.BytesIO(a)) as z:
        assert sorted(z.files) == ["heatmaps", "predicted"] and z["predicted"].tolist() == [1, 0]


def _outputs(probs: list[list[float]], maps: np.ndarray | None = None) -> dict[str, np.ndarray]:
    p = np.asarray(probs, dtype=np.float32)
    out = {"indices": np.arange(len(p)) * 2, "probabilities": p, "predicted": p.argmax(axis=1),
           "labels": np.array([0, 1, 0, 1][:len(p)])}
    if maps is not None:
        out["heatmaps"] = maps.astype(np.float32)
    return out


def test_identical_probe_outputs_agree() -> None:
    maps = np.random.default_rng(0).random((4, 5, 5))
    ref = _outputs([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]], maps)
    impact = compare_probes(ref, dict(ref))
    assert impact["kind"] == AGREE and impact["identical"]
    assert impact["predictions"]["flips"] == 0 and impact["heatmaps"]["max_abs_diff"] == 0
    assert impact["heatmaps"]["correlation"]["min"] == pytest.approx(1.0)
    assert impact["line"] == "probe outputs identical (4 probes)"


def test_tiny_changes_agree_within_tolerance_but_not_bit_for_bit() -> None:
    maps = np.random.default_rng(1).random((4, 5, 5))
    ref = _outputs([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]], maps)
    run = _outputs([[0.9001, 0.0999], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]], maps + 1e-4)
    impact = compare_probes(ref, run)
    assert impact["kind"] == AGREE and not impact["identical"]
    assert impact["predictions"]["max_prob_change"] == pytest.approx(1e-4, rel=1e-2)
    assert impact["heatmaps"]["max_abs_diff"] == pytest.approx(1e-4, rel=1e-2)
    assert impact["line"].startswith("bits differ, but predictions and explanations agree within tolerance")
    strict = compare_probes(ref, run, Tolerances(probability=1e-5))
    assert strict["kind"] == PREDICTIONS and strict["predictions"]["flips"] == 0
    assert compare_probes(ref, run, Tolerances(heatmap=1e-5))["kind"] == EXPLANATIONS


def test_flips_are_counted_and_named() -> None:
    ref = _outputs([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    run = _outputs([[0.9, 0.1], [0.7, 0.3], [0.45, 0.55], [0.3, 0.7]])
    impact = compare_probes(ref, run)
    pred = impact["predictions"]
    assert impact["kind"] == PREDICTIONS and pred["flips"] == 2
    assert pred["flipped"] == [{"probe": 1, "index": 2, "reference": 1, "run": 0, "label": 1},
                               {"probe": 2, "index": 4, "reference": 0, "run": 1, "label": 0}]
    assert pred["max_prob_change"] == pytest.approx(0.5) and pred["max_prob_change_at"] == {"probe": 1, "index": 2}
    assert pred["accuracy"] == {"reference": 1.0, "run": 0.5}
    assert impact["line"].startswith("predictions change: 2 of 4 probe predictions flip (examples 2, 4)")
    text = "\n".join(impact_lines(impact))
    assert "example 2: class 1 -> 0 (label 1)" in text and "probe accuracy 1 -> 0.5" in text


def test_moved_heatmaps_are_measured_against_numpy() -> None:
    rng = np.random.default_rng(2)
    a = rng.random((3, 6, 6))
    b = a.copy()
    b[1] = np.roll(a[1], 3, axis=1)  # the salient region moves
    ref = _outputs([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], a)
    run = _outputs([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], b)
    impact = compare_probes(ref, run)
    heat = impact["heatmaps"]
    diff = np.abs(a.astype(np.float32).astype(np.float64) - b.astype(np.float32).astype(np.float64))
    assert impact["kind"] == EXPLANATIONS
    assert heat["max_abs_diff"] == pytest.approx(diff.max()) and heat["mean_abs_diff"] == pytest.approx(diff.mean())
    r = np.corrcoef(a[1].ravel(), b[1].ravel())[0, 1]
    assert heat["correlation"]["min"] == pytest.approx(r, abs=1e-6)
    k = int(np.ceil(0.1 * 36))
    ta = set(np.argsort(-a[1].astype(np.float32).ravel())[:k].tolist())
    tb = set(np.argsort(-b[1].astype(np.float32).ravel())[:k].tolist())
    assert heat["overlap"]["min_iou"] == pytest.approx(len(ta & tb) / len(ta | tb))
    assert [r["probe"] for r in heat["most_changed"]] == [1] and heat["most_changed"][0]["index"] == 2
    assert impact["line"].startswith("explanations change (predictions agree)")


def test_overlap_of_salient_regions() -> None:
    h = np.array([[0.0, 1.0], [0.5, 0.2]])
    assert top_region(h, 0.5) == {1, 2}
    assert overlap(h, h, 0.25) == 1.0
    assert overlap(h, h[::-1], 0.25) == 0.0  # the peak moved to another pixel


def test_other_probe_sets_are_not_compared() -> None:
    ref = _outputs([[0.9, 0.1], [0.2, 0.8]])
    run = dict(ref, indices=np.array([5, 6]))
    impact = compare_probes(ref, run)
    assert impact["comparable"] is False and impact["kind"] is None and "probe sets differ" in impact["line"]


def test_the_classification_line_carries_the_impact() -> None:
    cls = {"kind": "input-change", "causes": ["seed"], "line": "differs in seed (1 -> 2): an input change"}
    ref = _outputs([[0.9, 0.1], [0.2, 0.8]])
    out = with_impact(cls, compare_probes(ref, _outputs([[0.1, 0.9], [0.2, 0.8]])))
    assert out["impact"] == PREDICTIONS and out["kind"] == "input-change"
    assert out["line"].startswith("differs in seed (1 -> 2): an input change; predictions change: 1 of 2")
    assert with_impact(cls, None) == cls


def test_tolerances_parse() -> None:
    t = Tolerances.parse(["probability=0.01", "heatmap=0.2", "overlap=0.3", "top=0.2"])
    assert t == Tolerances(probability=0.01, heatmap=0.2, overlap=0.3, top=0.2)
    assert Tolerances.parse([]) == Tolerances()
    for bad in ("probability", "speed=1", "heatmap=x", "overlap=2", "top=0", "probability=-1"):
        with pytest.raises(UsageError) as err:
            Tolerances.parse([bad])
        assert "--tolerance" in err.value.one_line() and "fix:" in err.value.one_line()


class _Out:
    def __init__(self, rank: int) -> None:
        self.shape = (None,) * rank


class _Layer:
    def __init__(self, name: str, kind: str, rank: int) -> None:
        self.name = name
        self.output = _Out(rank)
        self.__class__ = type(kind, (_Layer,), {})


class _Model:
    def __init__(self, *layers: _Layer) -> None:
        self.layers = list(layers)


def test_gradcam_layer_is_the_last_feature_map_at_or_after_a_convolution() -> None:
    xception_like = _Model(_Layer("augment", "Sequential", 4), _Layer("conv2d", "Conv2D", 4),
                           _Layer("separable_conv2d", "SeparableConv2D", 4), _Layer("conv2d_1", "Conv2D", 4),
                           _Layer("add", "Add", 4), _Layer("gap", "GlobalAveragePooling2D", 2),
                           _Layer("dense", "Dense", 2))
    assert probes.find_layer(xception_like, None).name == "add"  # the residual sum, not the 1x1 shortcut conv
    assert probes.find_layer(xception_like, "conv2d").name == "conv2d"
    no_conv = _Model(_Layer("augment", "Sequential", 4), _Layer("flatten", "Flatten", 2), _Layer("dense", "Dense", 2))
    assert probes.find_layer(no_conv, None) is None  # an image model without convolutions: no heatmaps
    with pytest.raises(BadRecipe, match="not a layer of the model") as err:
        probes.find_layer(xception_like, "block14")
    assert "conv2d_1" in str(err.value)
    with pytest.raises(BadRecipe, match="feature map"):
        probes.find_layer(xception_like, "dense")


def test_a_missing_gradcam_layer_is_refused_before_training(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, probes={"count": 2, "layer": "nope"})
    x = np.zeros((4, 3, 3, 1), dtype=np.float32)
    with pytest.raises(BadRecipe):
        probes.capture(rec, (x, np.zeros(4)), _Model(_Layer("conv2d", "Conv2D", 4)))
    rec = Recorder(tmp_path, probes={"count": 2})
    assert probes.capture(rec, None, None) is None
    assert json.loads((tmp_path / "probes/probes.json").read_text())["reason"] == \
        "fit() received no validation_data or validation_split"
    got = probes.capture(rec, [x, np.zeros(4)], None)
    assert got is not None and got.indices.tolist() == [0, 1]


def test_the_runner_hands_the_probes_table_to_the_recipe(tmp_path: Path) -> None:
    import subprocess
    import sys

    folder = tmp_path / "probing"
    folder.mkdir()
    (folder / "train.py").write_text("import os\nprint('probes=' + os.environ.get('LAUNCHER_PROBES', '-'))\n")
    (folder / "recipe.toml").write_text('framework = "none"\nentry = "train.py"\n\n[probes]\nindices = [4, 2]\n'
                                        'layer = "conv"\n')
    res = subprocess.run([sys.executable, "-m", "launcher.runtime", "run", "--recipe", str(folder), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**os.environ, "LAUNCHER_PROBES": '{"stale": true}'})
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("probes="))
    assert json.loads(line.removeprefix("probes=")) == {"split": "validation", "count": 2, "indices": [4, 2],
                                                        "gradcam": True, "layer": "conv", "fingerprint": None}
    (folder / "recipe.toml").write_text('framework = "none"\nentry = "train.py"\n')
    res = subprocess.run([sys.executable, "-m", "launcher.runtime", "run", "--recipe", str(folder), "--out",
                          str(tmp_path / "out2")], capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**os.environ, "LAUNCHER_PROBES": '{"stale": true}'})
    assert "probes=-" in res.stdout  # a recipe without [probes] records none, whatever the caller's environment
