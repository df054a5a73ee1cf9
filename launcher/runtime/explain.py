"""`python -m launcher.runtime explain`: the Grad-CAM of a saved Keras model for one image file.

Run by `launcher explain RUN --image FILE` inside the run's own pinned image (so the host needs no
TensorFlow), and usable there by hand:

    python -m launcher.runtime explain --model model.keras --image cat.png --out DIR [--layer NAME]
        [--input-range LO,HI]

The image (PNG, JPEG, BMP or GIF; a GIF's first frame) is decoded by TensorFlow, converted to the
model's input channels (RGB <-> grayscale; an alpha channel is dropped), resized bilinearly to the
model's input height and width, and its pixel values 0..255 are mapped linearly onto [LO, HI], the
value range the model was trained on (default [0, 1]). The model's outputs, class probabilities and
predicted class, and the Grad-CAM map of the predicted class at the declared layer or the last
convolutional feature map (launcher.runtime.probes, exactly as a run's probe set is computed), go to:

- ``explain.json``: the model and image (paths, sha256), the input shape and range, the layer and
  whether it was chosen automatically, the probabilities, the predicted class, the heatmap's shape
  and the heatmap itself (rows of values in [0, 1]);
- ``heatmap.png``: the map on its own grid, each cell a block of pixels;
- ``overlay.png``: the map resized over the resized image (both enlarged when small).

Failures print one line, ``launcher: error: ...``, and exit with a code of launcher.errors.ExitCode
(mirrored here: this package has only the standard library, numpy and TensorFlow in an image).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal, TypedDict

from launcher.runtime import fingerprints as fp
from launcher.runtime.record import EXIT_BAD_DATA, EXIT_USAGE, BadRecipe


class FileDigest(TypedDict):
    path: str
    sha256: str


class ExplainDocument(TypedDict):
    """``explain.json``: the model and image explained, the predicted class and its Grad-CAM map."""

    model: FileDigest
    image: FileDigest
    input_shape: list[int]
    input_range: list[float]
    layer: str
    layer_chosen: Literal["declared", "automatic"]
    outputs: list[float]
    probabilities: list[float]
    probabilities_read_as: str
    predicted: int
    probability: float
    heatmap_shape: list[int]
    heatmap: list[list[float]]


# launcher.errors.ExitCode's values for the failures below.
EXIT_NOT_FOUND = 11
EXIT_CORRUPT = 13  # the model file does not load
EXIT_INCOMPATIBLE = 16  # the model is not an image classifier with a convolutional feature map
DOCUMENT = "explain.json"
HEATMAP = "heatmap.png"
OVERLAY = "overlay.png"
FILES = (DOCUMENT, HEATMAP, OVERLAY)


class ExplainError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_parser(sub: Any) -> None:
    """The `explain` subcommand on the runtime's argument parser."""
    p = sub.add_parser("explain", help="the Grad-CAM of a Keras model for one image file",
                       description="Write explain.json, heatmap.png and overlay.png: the model's prediction for "
                       "the image and the Grad-CAM map of the predicted class.")
    p.add_argument("--model", type=Path, required=True, help="a Keras model file (.keras)")
    p.add_argument("--image", type=Path, required=True, help="a PNG, JPEG, BMP or GIF file")
    p.add_argument("--out", type=Path, required=True, help="the folder to write into")
    p.add_argument("--layer", help="the layer whose feature maps Grad-CAM weighs (default: the last "
                   "convolutional feature map)")
    p.add_argument("--input-range", default="0,1", metavar="LO,HI",
                   help="the value range the model was trained on; pixel values 0..255 map onto it (default 0,1)")


def parse_range(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        lo, hi = (float(p) for p in parts)
    except ValueError:
        raise ExplainError(f"--input-range {text!r} is not two numbers LO,HI (e.g. 0,1 or 0,255)", EXIT_USAGE) from None
    if not hi > lo:
        raise ExplainError(f"--input-range {text!r}: HI must be above LO", EXIT_USAGE)
    return lo, hi


def _first_line(exc: BaseException) -> str:
    """The exception's text on one line, without TensorFlow's op decorations ({{function_node ...}}, [Op:X])."""
    text = re.sub(r"\{\{.*?\}\}|\[Op:\w+\]", "", str(exc))
    text = " ".join(text.split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def load_model(path: Path) -> Any:
    if not path.is_file():
        raise ExplainError(f"no model file {path}", EXIT_NOT_FOUND)
    import tensorflow as tf

    try:
        return tf.keras.models.load_model(str(path), compile=False)
    except Exception as exc:
        raise ExplainError(f"{path} does not load as a Keras model ({type(exc).__name__}: {_first_line(exc)})",
                           EXIT_CORRUPT) from None


def input_shape(model: Any) -> tuple[int | None, int | None, int]:
    """(height, width, channels) of an image classifier's one input; ExplainError for another model."""
    inputs, outputs = getattr(model, "inputs", None) or [], getattr(model, "outputs", None) or []
    if len(inputs) != 1 or len(outputs) != 1:
        raise ExplainError(f"the model has {len(inputs)} inputs and {len(outputs)} outputs; explain needs an image "
                           "classifier with one of each", EXIT_INCOMPATIBLE)
    shape, out = tuple(inputs[0].shape), tuple(outputs[0].shape)
    if len(shape) != 4 or len(out) != 2 or not shape[3]:
        raise ExplainError(f"the model takes inputs of shape {shape} and gives {out}; explain needs an image "
                           "classifier: (batch, height, width, channels) in, (batch, classes) out",
                           EXIT_INCOMPATIBLE)
    return shape[1], shape[2], int(shape[3])


def load_image(path: Path, height: int | None, width: int | None, channels: int) -> Any:
    """The image as float32 (h x w x channels) in 0..255, in the model's channels and size."""
    if not path.is_file():
        raise ExplainError(f"no image file {path}", EXIT_NOT_FOUND)
    import tensorflow as tf

    try:
        img = tf.io.decode_image(path.read_bytes(), channels=0, dtype=tf.uint8, expand_animations=False)
    except Exception as exc:
        raise ExplainError(f"{path} is not an image TensorFlow decodes (PNG, JPEG, BMP or GIF): "
                           f"{_first_line(exc)}", EXIT_BAD_DATA) from None
    have = int(img.shape[-1])
    if have in (2, 4):  # gray + alpha, RGB + alpha: the alpha goes
        img, have = img[:, :, :have - 1], have - 1
    if channels == 1 and have == 3:
        img = tf.image.rgb_to_grayscale(img)
    elif channels == 3 and have == 1:
        img = tf.image.grayscale_to_rgb(img)
    elif channels != have:
        raise ExplainError(f"the model takes {channels}-channel images and {path.name} has {have} channels",
                           EXIT_INCOMPATIBLE)
    x = tf.cast(img, tf.float32)
    size = (height or int(x.shape[0]), width or int(x.shape[1]))
    if (int(x.shape[0]), int(x.shape[1])) != size:
        x = tf.image.resize(x, size, method="bilinear")
    return x.numpy()


def choose_layer(model: Any, name: str | None) -> Any:
    """The declared layer (ExplainError when the model has none of that name or it is no feature map),
    else the last convolutional feature map (ExplainError when there is none)."""
    from launcher.runtime import probes  # here: every run's runtime imports this module for its parser

    if name is None:
        layer = probes.find_layer(model, None)
        if layer is None:
            raise ExplainError("the model has no convolutional feature map (a rank-4 layer output at or after a "
                               "convolution), which Grad-CAM needs", EXIT_INCOMPATIBLE)
        return layer
    names = [layer.name for layer in model.layers]
    if name not in names:
        convs = [layer.name for layer in model.layers if "Conv" in type(layer).__name__]
        raise ExplainError(f"--layer {name!r} is not a layer of the model (its convolutions: "
                           f"{', '.join(convs[-5:]) or 'none'}); name one, or leave --layer out", EXIT_USAGE)
    try:
        return probes.find_layer(model, name)
    except BadRecipe:
        raise ExplainError(f"--layer {name!r} does not output a (batch, height, width, channels) feature map, "
                           "which Grad-CAM needs; name a convolution, or leave --layer out", EXIT_USAGE) from None


def explain(model_path: Path, image_path: Path, out: Path, layer_name: str | None,
            input_range: tuple[float, float]) -> ExplainDocument:
    """Compute and write explain.json, heatmap.png and overlay.png into out; the document."""
    import numpy as np

    from launcher.runtime import pictures, probes

    model = load_model(model_path)
    height, width, channels = input_shape(model)
    pixels = load_image(image_path, height, width, channels)
    lo, hi = input_range
    x = (lo + pixels * np.float32((hi - lo) / 255.0)).astype(np.float32)[None]
    layer = choose_layer(model, layer_name)
    computed = probes.compute(model, x, layer)
    probs, how = probes.probabilities(computed["outputs"])
    predicted = int(probs[0].argmax())
    heat = computed["heatmaps"][0]
    doc: ExplainDocument = {
        "model": {"path": str(model_path), "sha256": fp.sha256_file(model_path)},
        "image": {"path": str(image_path), "sha256": fp.sha256_file(image_path)},
        "input_shape": [int(v) for v in x.shape[1:]],
        "input_range": [lo, hi],
        "layer": layer.name,
        "layer_chosen": "declared" if layer_name else "automatic",
        "outputs": [float(v) for v in np.asarray(computed["outputs"][0]).reshape(-1)],
        "probabilities": [float(v) for v in probs[0]],
        "probabilities_read_as": how,
        "predicted": predicted,
        "probability": float(probs[0][predicted]),
        "heatmap_shape": [int(v) for v in heat.shape],
        "heatmap": [[float(v) for v in row] for row in heat],
    }
    out.mkdir(parents=True, exist_ok=True)
    rgb = pictures.image_rgb(pixels, 0.0, 255.0)
    fp.write_atomic(out / HEATMAP, pictures.encode_png(pictures.enlarge(pictures.heat_rgb(heat))))
    fp.write_atomic(out / OVERLAY, pictures.encode_png(pictures.enlarge(pictures.overlay(rgb, heat))))
    fp.write_json(out / DOCUMENT, doc)  # last: its presence means the pictures are there too
    return doc


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter, before it is imported
    try:
        doc = explain(args.model, args.image, args.out, args.layer, parse_range(args.input_range))
    except ExplainError as exc:
        print(f"launcher: error: {exc}", file=sys.stderr)
        return exc.code
    print(f"launcher: class {doc['predicted']} (p {doc['probability']:.4f}), Grad-CAM at {doc['layer']} "
          f"{'x'.join(str(v) for v in doc['heatmap_shape'])}: wrote {', '.join(FILES)} to {args.out}")
    return 0
