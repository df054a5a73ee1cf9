"""The probe set: a model's outputs, and Grad-CAM heatmaps, on fixed held-out examples.

A recipe declares ``[probes]`` in recipe.toml, or a run names them with ``launcher run --probes SPEC``
(launcher.runtime.probespec.ProbeSpec). For a Keras model the runtime takes the probe examples from
the validation data ``fit()`` receives (the recipe writes no code for it), checks them against the
declared fingerprint before training, and when fit() returns writes:

- ``probes/outputs.npz``: canonical (stored zip, sorted entries, fixed dates: the same values always
  give the same bytes) with ``indices`` (positions in the split), ``outputs`` (the model's raw
  outputs), ``probabilities`` (N x classes), ``predicted`` (the argmax class), ``labels`` where the
  data has them, and ``heatmaps`` (N x h x w Grad-CAM maps of the predicted class, each scaled to
  [0, 1] by its maximum) for image classifiers;
- ``probes/inputs.npz``: for image inputs, the probe images as 8-bit RGB (``images``, mapped from
  the probe set's value range, ``input_range`` in probes.json) for the report's side-by-side pictures;
- ``probes/probes.json``: which examples (their digest), how probabilities were read from the outputs,
  the Grad-CAM layer, and the digest of outputs.npz.

Grad-CAM (Selvaraju et al.): with A the layer's feature maps (h x w x k) and y the score of the
predicted class (taken before the model's final softmax or sigmoid where it ends in one, else the
output; for one sigmoid unit, its score for class 1 and the opposite for class 0), the weights
are the spatial means of dy/dA per channel, the map is ReLU(sum_k w_k A_k),
divided by its maximum (all zeros when the maximum is 0). The layer is ``probes.layer`` or else the
last layer whose output is a rank-4 (batch, h, w, channels) feature map with a convolution at or
before it: the final convolutional feature map, before the model flattens or pools it away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from launcher.runtime import fingerprints as fp
from launcher.runtime.probespec import ProbeSpec
from launcher.runtime.record import BadData, BadRecipe, Recorder

if TYPE_CHECKING:
    from typing import NotRequired

    from numpy.typing import NDArray

    from launcher.runtime.records import ArraysFingerprint, ProbeConfig

OUTPUTS = "probes/outputs.npz"
INPUTS = "probes/inputs.npz"
DOCUMENT = "probes/probes.json"
BATCH = 32  # fixed: the probes' numbers may depend on the batch they are computed in


class Computed(TypedDict):
    """What :func:`compute` gives: the model's outputs, and the Grad-CAM maps where a layer was given."""

    outputs: NDArray[Any]
    heatmaps: NotRequired[NDArray[Any]]


class GradCam(TypedDict):
    """probes.json's ``gradcam``: the layer (None: no maps), or why the maps were skipped."""

    layer: str | None
    skipped: NotRequired[str]
    chosen: NotRequired[Literal["declared", "automatic"]]
    shape: NotRequired[list[int]]


class Unrecorded(TypedDict):
    """``probes/probes.json`` when no probes were recorded: why."""

    recorded: Literal[False]
    reason: str
    config: ProbeConfig | None


class ProbesDocument(TypedDict):
    """``probes/probes.json``: which examples, how the outputs were read, the Grad-CAM layer, and
    the digest of outputs.npz."""

    recorded: Literal[True]
    split: str
    count: int
    requested: int
    indices: list[int]
    digest: str
    inputs: ArraysFingerprint
    config: ProbeConfig
    classes: int | None
    probabilities: NotRequired[str]
    accuracy: NotRequired[float]
    gradcam: GradCam
    input_range: NotRequired[list[float]]
    outputs_sha256: str


@dataclass
class ProbeSet:
    indices: Any  # int64 positions in the split
    x: Any
    y: Any | None
    digest: str  # of the probe inputs (x, and y where given)
    inputs: ArraysFingerprint  # their fingerprint document
    requested: int


def _is_array(v: Any) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype") and type(v).__module__.startswith("numpy")


def validation_arrays(validation_data: Any) -> tuple[Any, Any | None] | None:
    """(x, y) from fit()'s validation_data when it is numpy arrays (a tuple or list of them)."""
    if isinstance(validation_data, tuple | list) and validation_data and _is_array(validation_data[0]):
        y = validation_data[1] if len(validation_data) > 1 and _is_array(validation_data[1]) else None
        return validation_data[0], y
    return None


def select(config: ProbeConfig, x: Any, y: Any | None) -> ProbeSet:
    """The declared examples of the split; BadData when they are not there or not the expected ones."""
    import numpy as np

    n = len(x)
    wanted = [int(i) for i in config.get("indices") or []]
    requested = len(wanted) if wanted else int(config.get("count") or 0)
    if wanted:
        outside = [i for i in wanted if i >= n]
        if outside:
            raise BadData(f"recipe.toml probes.indices names example {outside[0]}, but the validation data "
                          f"fit() received holds {n} examples")
        idx = np.asarray(wanted, dtype=np.int64)
    else:
        idx = np.arange(min(requested, n), dtype=np.int64)
    px = np.ascontiguousarray(x[idx])
    py = None if y is None else np.ascontiguousarray(y[idx])
    doc = fp.arrays_fingerprint({"x": px, **({"y": py} if py is not None else {})})
    expected = config.get("fingerprint")
    if expected and doc["digest"] != expected:
        raise BadData(f"the probe set ({len(idx)} examples of the validation data) has fingerprint {doc['digest']}, "
                      f"recipe.toml probes.fingerprint expects {expected} (other data, or other preprocessing)")
    return ProbeSet(idx, px, py, doc["digest"], doc, requested)


def probabilities(raw: Any) -> tuple[Any, str]:
    """(N x classes probabilities, how they were read): one sigmoid unit gives two classes."""
    import numpy as np

    out = np.asarray(raw, dtype=np.float64).reshape(len(raw), -1)
    in_unit = bool(np.all((out >= 0) & (out <= 1)))
    if out.shape[1] == 1:
        p = out[:, 0] if in_unit else 1.0 / (1.0 + np.exp(-out[:, 0]))
        return np.stack([1.0 - p, p], axis=1), "sigmoid output" if in_unit else "sigmoid of the logit"
    if in_unit and np.allclose(out.sum(axis=1), 1.0, atol=1e-3):
        return out, "softmax output"
    shifted = np.exp(out - out.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True), "softmax of the logits"


def class_labels(y: Any | None) -> Any | None:
    """Integer labels from class ids or one-hot rows; None when y is not a class label."""
    import numpy as np

    if y is None:
        return None
    a = np.asarray(y)
    if a.ndim == 2 and a.shape[1] > 1:
        return a.argmax(axis=1).astype(np.int64)
    a = a.reshape(len(a), -1)
    if a.shape[1] != 1 or not np.all(np.equal(np.mod(a, 1), 0)):
        return None
    return a[:, 0].astype(np.int64)


def _rank4(layer: Any) -> bool:
    try:
        return len(layer.output.shape) == 4
    except (AttributeError, ValueError, TypeError):  # a layer used more than once has no single output
        return False


def find_layer(model: Any, name: str | None) -> Any:
    """The declared layer (BadRecipe when the model has none of that name), else the last rank-4
    feature map at or after a convolution; None when the model has none."""
    layers = list(model.layers)
    if name is not None:
        for layer in layers:
            if layer.name == name:
                if not _rank4(layer):
                    raise BadRecipe(f"recipe.toml probes.layer {name!r} does not output a (batch, height, width, "
                                    "channels) feature map, which Grad-CAM needs")
                return layer
        convs = [layer.name for layer in layers if "Conv" in type(layer).__name__]
        raise BadRecipe(f"recipe.toml probes.layer {name!r} is not a layer of the model (convolutions: "
                        f"{', '.join(convs[-5:]) or 'none'}); name one, or leave probes.layer out")
    first_conv = next((i for i, layer in enumerate(layers) if "Conv" in type(layer).__name__), None)
    if first_conv is None:
        return None
    for layer in reversed(layers[first_conv:]):
        if _rank4(layer):
            return layer
    return None


def heatmaps(feats: Any, grads: Any) -> Any:
    """Grad-CAM from feature maps and the gradients of the class score (both N x h x w x k)."""
    import numpy as np

    f = np.asarray(feats, dtype=np.float64)
    g = np.asarray(grads, dtype=np.float64)
    weights = g.mean(axis=(1, 2))  # N x k
    cam = np.maximum(np.einsum("nhwk,nk->nhw", f, weights), 0.0)
    top = cam.reshape(len(cam), -1).max(axis=1)
    scale = np.where(top > 0, top, 1.0)
    return (cam / scale[:, None, None]).astype(np.float32)


def _squashing(model: Any) -> Any | None:
    """The last layer when it ends in a softmax or sigmoid (whose input is the class score)."""
    last = model.layers[-1] if getattr(model, "layers", None) else None
    act = getattr(last, "activation", None)
    return last if getattr(act, "__name__", "") in ("softmax", "sigmoid") else None


def _feature_model(tf: Any, model: Any, layer: Any) -> Any:
    """A model from the inputs to (the layer's feature maps, the model's output), sharing its layers.

    A Sequential model is chained again, layer by layer, from a new input: one loaded from a file
    may hold its layers' outputs from an earlier build that its inputs no longer reach, and the
    gradient through them would be None."""
    if isinstance(model, tf.keras.Sequential):
        inputs = tf.keras.Input(shape=tuple(model.inputs[0].shape[1:]), dtype=model.inputs[0].dtype)
        h, feats = inputs, None
        for each in model.layers:
            h = each(h)
            if each is layer:
                feats = h
        return tf.keras.Model(inputs, [feats, h])
    return tf.keras.Model(model.inputs, [layer.output, model.outputs[0]])


def compute(model: Any, x: Any, layer: Any | None) -> Computed:
    """The model's outputs on x, in batches of BATCH, and Grad-CAM maps of the predicted class at
    ``layer`` (none when ``layer`` is None). The class score is taken before the model's final
    softmax or sigmoid where it ends in one (as the Grad-CAM paper does, and free of the float32
    cancellation of a saturated probability), else it is the output itself."""
    import numpy as np
    import tensorflow as tf

    dtype = getattr(model.inputs[0], "dtype", None) if getattr(model, "inputs", None) else None
    outs: list[Any] = []
    maps: list[Any] = []
    squash = _squashing(model) if layer is not None else None
    act = squash.activation if squash is not None else None
    if squash is not None:
        squash.activation = tf.keras.activations.linear  # the model now outputs the scores; restored below
    try:
        probe_model = _feature_model(tf, model, layer) if layer is not None else None
        for start in range(0, len(x), BATCH):
            xb = tf.convert_to_tensor(x[start:start + BATCH])
            if dtype is not None:
                xb = tf.cast(xb, dtype)
            if probe_model is None:
                outs.append(np.asarray(model(xb, training=False)))
                continue
            with tf.GradientTape() as tape:
                feats, scores = probe_model(xb, training=False)
                out = act(scores) if act is not None else scores
                flat = tf.reshape(scores, (tf.shape(scores)[0], -1))
                probs, _ = probabilities(tf.reshape(out, (tf.shape(out)[0], -1)).numpy())
                cls = probs.argmax(axis=1)
                if flat.shape[-1] == 1:  # one unit: its score for class 1, its opposite for class 0
                    sign = tf.constant(np.where(cls == 1, 1.0, -1.0), dtype=flat.dtype)
                    score = tf.reduce_sum(sign * flat[:, 0])
                else:
                    score = tf.reduce_sum(tf.gather(flat, tf.constant(cls), axis=1, batch_dims=1))
            grads = tape.gradient(score, feats)
            outs.append(np.asarray(out))
            maps.append(heatmaps(feats.numpy(), grads.numpy()))
    finally:
        if squash is not None:
            squash.activation = act
    result: Computed = {"outputs": np.concatenate(outs).astype(np.float32)}
    if maps:
        result["heatmaps"] = np.concatenate(maps)
    return result


def _unrecorded(rec: Recorder, reason: str) -> None:
    doc: Unrecorded = {"recorded": False, "reason": reason, "config": rec.probes}
    fp.write_json(rec.path(DOCUMENT), doc)


def capture(rec: Recorder, validation_data: Any, model: Any = None) -> ProbeSet | None:
    """Before training: the probe set from fit()'s validation data (None, and a note, without it);
    a declared Grad-CAM layer the model does not have is refused now, not after training."""
    if not rec.probes:
        return None
    name = rec.probes.get("layer")
    names = [layer.name for layer in getattr(model, "layers", None) or []]
    if name and names and name not in names:
        find_layer(model, name)  # raises BadRecipe naming the model's convolutions
    arrays = validation_arrays(validation_data)
    if arrays is None:
        why = ("fit() received no validation_data or validation_split" if validation_data is None
               else "fit()'s validation data is not numpy arrays")
        _unrecorded(rec, why)
        return None
    return select(rec.probes, *arrays)


def record(rec: Recorder, model: Any, probes: ProbeSet) -> ProbesDocument | None:
    """After training: the model's outputs (and heatmaps) on the probe set, written canonically;
    None (and probes.json saying why) when the model is not one the probes fit."""
    # capture() made the probe set from rec.probes; its defaults where a caller gave none
    config = rec.probes if rec.probes is not None else ProbeSpec().as_dict()
    if len(getattr(model, "outputs", None) or []) != 1 or len(getattr(model, "inputs", None) or []) != 1:
        _unrecorded(rec, "the model does not have exactly one input and one output")
        return None
    out_rank = len(model.outputs[0].shape)
    gradcam: GradCam = {"layer": None}
    layer = None
    if config.get("gradcam", True):
        if out_rank != 2 or len(probes.x.shape) != 4:
            gradcam["skipped"] = "Grad-CAM needs an image classifier: (batch, h, w, c) inputs, (batch, classes) outputs"
        else:
            layer = find_layer(model, config.get("layer"))
            if layer is None:
                gradcam["skipped"] = "the model has no convolutional feature map"
            else:
                gradcam["layer"] = layer.name
                gradcam["chosen"] = "declared" if config.get("layer") else "automatic"
    computed = compute(model, probes.x, layer)
    arrays: dict[str, NDArray[Any]] = {"indices": probes.indices, "outputs": computed["outputs"]}
    doc: ProbesDocument = {"recorded": True, "split": config.get("split", "validation"),
                           "count": len(probes.indices), "requested": probes.requested,
                           "indices": [int(i) for i in probes.indices], "digest": probes.digest,
                           "inputs": probes.inputs, "config": config,
                           "classes": None,  # not a classifier: the raw outputs only
                           "gradcam": gradcam, "outputs_sha256": ""}  # the digest once outputs.npz is made
    if out_rank == 2:
        import numpy as np

        probs, how = probabilities(computed["outputs"])
        arrays["probabilities"] = probs.astype(np.float32)
        arrays["predicted"] = probs.argmax(axis=1).astype(np.int64)
        labels = class_labels(probes.y)
        if labels is not None:
            arrays["labels"] = labels
            doc["accuracy"] = float(np.mean(labels == arrays["predicted"]))
        doc["classes"] = int(probs.shape[1])
        doc["probabilities"] = how
    if "heatmaps" in computed:
        arrays["heatmaps"] = computed["heatmaps"]
        gradcam["shape"] = list(computed["heatmaps"].shape[1:])
    if len(probes.x.shape) == 4 and probes.x.shape[-1] in (1, 3, 4) and len(probes.x):
        import numpy as np

        from launcher.runtime.pictures import image_rgb

        lo, hi = float(np.min(probes.x)), float(np.max(probes.x))
        doc["input_range"] = [lo, hi]
        images = np.stack([image_rgb(x, lo, hi) for x in probes.x])
        fp.write_atomic(rec.path(INPUTS), fp.arrays_npz_bytes({"images": images}))
    data = fp.arrays_npz_bytes(arrays)
    fp.write_atomic(rec.path(OUTPUTS), data)
    doc["outputs_sha256"] = fp.sha256_bytes(data)
    fp.write_json(rec.path(DOCUMENT), doc)
    return doc


