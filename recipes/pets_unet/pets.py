"""The Oxford-IIIT Pet dataset (images + trimaps, as published) or a synthetic stand-in, split by
the hash of the pet ID as seed 000 does: md5(pet_id) % 10 -> 0-6 train, 7 validation,
8 calibration, 9 test. The partition never depends on a random draw or on the files present."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from launcher.runtime.api import BadData

PARTITIONS = {**dict.fromkeys(range(7), "train"), 7: "validation", 8: "calibration", 9: "test"}


def partition_of(pet_id: str) -> str:
    return PARTITIONS[int(hashlib.md5(pet_id.encode()).hexdigest(), 16) % 10]


def _decode(path: Path, size: int, channels: int, method: str) -> np.ndarray:
    import tensorflow as tf

    try:
        img = tf.io.decode_image(tf.io.read_file(str(path)), channels=channels, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as exc:
        raise BadData(f"{path}: not a readable image ({exc.message.splitlines()[0]})") from None
    out = tf.image.resize(img, (size, size), method=method)
    return np.clip(np.round(out.numpy()), 0, 255).astype(np.uint8)


def load_pets(root: Path, size: int) -> dict[str, np.ndarray]:
    """images/<pet_id>.jpg with annotations/trimaps/<pet_id>.png (1 pet, 2 background, 3 border)."""
    images, trimaps = root / "images", root / "annotations" / "trimaps"
    for folder in (images, trimaps):
        if not folder.is_dir():
            raise BadData(f"{folder}: not found; the Oxford-IIIT Pet layout is images/*.jpg and "
                          "annotations/trimaps/*.png")
    ids = sorted(p.stem for p in images.glob("*.jpg"))
    if not ids:
        raise BadData(f"{images}: no .jpg images")
    out: dict[str, list[np.ndarray]] = {"x_train": [], "y_train": [], "x_val": [], "y_val": []}
    for pet_id in ids:
        part = partition_of(pet_id)
        if part not in ("train", "validation"):
            continue
        mask_path = trimaps / f"{pet_id}.png"
        if not mask_path.is_file():
            raise BadData(f"{mask_path}: missing (every image needs its trimap)")
        mask = _decode(mask_path, size, 1, "nearest")
        if mask.min() < 1 or mask.max() > 3:
            raise BadData(f"{mask_path}: values {mask.min()}..{mask.max()}, a trimap holds 1, 2 and 3")
        key = "train" if part == "train" else "val"
        out[f"x_{key}"].append(_decode(images / f"{pet_id}.jpg", size, 3, "bilinear"))
        out[f"y_{key}"].append(mask - 1)
    return {k: np.stack(v) for k, v in out.items()}


def synthetic(size: int, count: int = 80) -> dict[str, np.ndarray]:
    """Ellipses ("pets") on textured backgrounds with trimap-style masks (0 pet, 1 background, 2 border),
    named synthetic_0000 ... and split by the same md5 rule as the real data."""
    rng = np.random.default_rng(3011)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    out: dict[str, list[np.ndarray]] = {"x_train": [], "y_train": [], "x_val": [], "y_val": []}
    for i in range(count):
        cy, cx = rng.uniform(0.3, 0.7, size=2) * size
        ry, rx = rng.uniform(0.15, 0.3, size=2) * size
        r = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2
        mask = np.where(r < 0.8, 0, np.where(r < 1.2, 2, 1)).astype(np.uint8)
        background = rng.uniform(0, 1, size=3) * (0.5 + 0.5 * np.sin(xx * rng.uniform(0.05, 0.3)))[..., None]
        pet = rng.uniform(0, 1, size=3)
        img = np.where((r < 1.0)[..., None], pet, background) + rng.normal(0, 0.05, size=(size, size, 3))
        part = partition_of(f"synthetic_{i:04d}")
        if part not in ("train", "validation"):
            continue
        key = "train" if part == "train" else "val"
        out[f"x_{key}"].append(np.clip(img * 255, 0, 255).astype(np.uint8))
        out[f"y_{key}"].append(mask[..., None])
    return {k: np.stack(v) for k, v in out.items()}
