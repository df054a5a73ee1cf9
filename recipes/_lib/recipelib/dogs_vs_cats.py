"""Dogs vs cats: Kaggle's published images, or a small synthetic stand-in made with numpy.

Two folder layouts are read:
- the 2,000 / 1,000 subset as the seed used it: ``train/{cat,dog}/*.jpg`` and ``validation/{cat,dog}/*.jpg``;
- Kaggle's ``train/`` as published (``cat.0.jpg`` ... ``dog.12499.jpg``): cat/dog 0-999 train,
  1000-1499 validation (the same 2,000 / 1,000 subset).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from recipelib.splits import first

from launcher.runtime import api
from launcher.runtime.api import BadData

CLASSES = ("cat", "dog")
_KAGGLE = re.compile(r"^(cat|dog)\.(\d+)\.jpg$")


def synthetic(pdim: int, n_train: int = 64, n_val: int = 32) -> dict[str, np.ndarray]:
    """Stripes: horizontal for 'cat' (0), vertical for 'dog' (1), random frequency, phase and noise.

    Made from a fixed generator, so it is the same dataset on every machine (its fingerprint is
    in recipe.toml).
    """
    rng = np.random.default_rng(20211119)
    n = n_train + n_val
    labels = np.arange(n) % 2
    grid = np.arange(pdim, dtype=np.float64)
    images = np.empty((n, pdim, pdim, 3), dtype=np.uint8)
    for i in range(n):
        freq = rng.uniform(0.05, 0.3)
        phase = rng.uniform(0, 2 * np.pi)
        wave = 0.5 + 0.5 * np.sin(freq * grid + phase)
        pattern = np.tile(wave[:, None], (1, pdim)) if labels[i] == 0 else np.tile(wave[None, :], (pdim, 1))
        tint = rng.uniform(0.4, 1.0, size=3)
        noise = rng.normal(0, 0.1, size=(pdim, pdim, 3))
        images[i] = np.clip((pattern[:, :, None] * tint + noise) * 255, 0, 255).astype(np.uint8)
    return {"x_train": images[:n_train], "y_train": labels[:n_train].astype(np.int64),
            "x_val": images[n_train:], "y_val": labels[n_train:].astype(np.int64)}


def _decode(path: Path, pdim: int) -> np.ndarray:
    import tensorflow as tf

    try:
        img = tf.io.decode_image(tf.io.read_file(str(path)), channels=3, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as exc:
        raise BadData(f"{path}: not a readable image ({exc.message.splitlines()[0]})") from None
    resized = tf.image.resize(img, (pdim, pdim))  # bilinear, as image_dataset_from_directory
    return np.clip(np.round(resized.numpy()), 0, 255).astype(np.uint8)


def _split_files(root: Path) -> dict[str, list[tuple[Path, int]]]:
    train = root / "train"
    if not train.is_dir():
        raise BadData(f"{train}: not found; expected train/{{cat,dog}}/*.jpg and "
                      "validation/{cat,dog}/*.jpg, or Kaggle's train/cat.0.jpg ... dog.12499.jpg")
    if (train / "cat").is_dir() or (train / "dog").is_dir():
        out: dict[str, list[tuple[Path, int]]] = {}
        for split in ("train", "validation"):
            files = []
            for label, cls in enumerate(CLASSES):
                folder = root / split / cls
                if not folder.is_dir():
                    raise BadData(f"{folder}: not found; each of train/ and validation/ holds cat/ and dog/")
                found = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
                if not found:
                    raise BadData(f"{folder}: no .jpg images")
                files += [(p, label) for p in found]
            out[split] = files
        return out
    by_class: dict[str, dict[int, Path]] = {c: {} for c in CLASSES}
    for p in train.iterdir():
        m = _KAGGLE.match(p.name)
        if m:
            by_class[m.group(1)][int(m.group(2))] = p
    if not by_class["cat"] and not by_class["dog"]:
        raise BadData(f"{train}: neither cat/ and dog/ folders nor Kaggle's cat.N.jpg / dog.N.jpg files")
    out = {"train": [], "validation": []}
    for label, cls in enumerate(CLASSES):
        for split, ids in (("train", range(1000)), ("validation", range(1000, 1500))):
            for i in ids:
                if i not in by_class[cls]:
                    missing = train / f"{cls}.{i}.jpg"
                    raise BadData(f"{missing}: missing (the subset uses {cls}.0 to {cls}.1499)")
                out[split].append((by_class[cls][i], label))
    return out


def load_folder(root: Path, pdim: int) -> dict[str, np.ndarray]:
    splits = _split_files(root)
    arrays: dict[str, np.ndarray] = {}
    for split, key in (("train", "train"), ("validation", "val")):
        files = splits[split]
        arrays[f"x_{key}"] = np.stack([_decode(p, pdim) for p, _ in files])
        arrays[f"y_{key}"] = np.array([label for _, label in files], dtype=np.int64)
    return arrays


def load(dataset: str, pdim: int) -> dict[str, np.ndarray]:
    """The arrays the dataset param selects: "files" reads --data, anything else is the synthetic
    set (recorded as the dataset at the PDIM its fingerprint in recipe.toml is pinned for, 180)."""
    if dataset == "files":
        decoded = load_folder(api.data_dir(), pdim)
        api.record_dataset(decoded)  # beside the files' fingerprint: the arrays decoded from them
        return decoded
    arrays = synthetic(pdim)
    if pdim == 180:
        api.record_dataset(arrays)
    return arrays


def splits(params: dict[str, Any], pdim: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The (x, y) train and validation splits a recipe's params select (dataset, train_samples)."""
    arrays = load(params["dataset"], pdim)
    x_train, y_train = first(arrays, "train", params["train_samples"])
    x_val, y_val = first(arrays, "val")
    print(f"{len(x_train)} train, {len(x_val)} validation images of {pdim}x{pdim}")
    return (x_train, y_train), (x_val, y_val)
