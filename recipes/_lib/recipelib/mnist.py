"""MNIST for the convnets (Keras and PyTorch): the published mnist.npz (Keras layout), scikit-learn's bundled digits, or
digit-like images made with numpy (for hosts without scikit-learn, such as a bare GPU VM)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from launcher.runtime.api import BadData

MNIST_KEYS = ("x_train", "y_train", "x_test", "y_test")


def load_mnist_npz(folder: Path) -> dict[str, np.ndarray]:
    """mnist.npz as Keras publishes it: uint8 images (N, 28, 28) and uint8 labels."""
    path = folder / "mnist.npz"
    if not path.is_file():
        raise BadData(f"{path}: not found; the mnist dataset is one file, mnist.npz "
                      "(keys x_train, y_train, x_test, y_test)")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in MNIST_KEYS if k not in f.files]
            if missing:
                raise BadData(f"{path}: lacks {', '.join(missing)} (has {', '.join(f.files) or 'nothing'})")
            arrays = {k: f[k] for k in MNIST_KEYS}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise BadData(f"{path}: not a numpy .npz file ({exc})") from None
    for k in ("x_train", "x_test"):
        if arrays[k].ndim != 3 or arrays[k].shape[1:] != (28, 28):
            raise BadData(f"{path}: {k} has shape {arrays[k].shape}, expected (N, 28, 28)")
    return arrays


def load_digits_as_mnist() -> dict[str, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits, scaled to MNIST's 28x28 uint8 (each pixel 3x3, 2-pixel margin).

    The first 1,500 are the training set, the rest the test set: a fixed split, no randomness.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise BadData("dataset=digits needs scikit-learn in the image; "
                      "use dataset=mnist with --data") from None
    d = load_digits()
    images = np.kron(d.images, np.ones((3, 3)))  # (N, 24, 24), values 0..16
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    x = np.round(images * (255.0 / 16.0)).astype(np.uint8)
    y = d.target.astype(np.uint8)
    return {"x_train": x[:1500], "y_train": y[:1500], "x_test": x[1500:], "y_test": y[1500:]}


def synthetic_digits(n_train: int = 1500, n_test: int = 300) -> dict[str, np.ndarray]:
    """Ten fixed random 28x28 stroke templates, one per class, shifted by up to 2 pixels, with noise.

    Made from a fixed generator: the same arrays on every machine (fingerprint in recipe.toml).
    """
    rng = np.random.default_rng(28)
    templates = (rng.random((10, 7, 7)) < 0.35).astype(np.float64)
    templates = np.kron(templates, np.ones((3, 3)))  # (10, 21, 21)
    n = n_train + n_test
    labels = np.arange(n) % 10
    images = np.zeros((n, 28, 28))
    for i in range(n):
        dy, dx = rng.integers(0, 8, size=2)
        images[i, dy:dy + 21, dx:dx + 21] = templates[labels[i]]
    images = np.clip(images * 0.8 + rng.normal(0, 0.15, size=images.shape), 0, 1)
    x = np.round(images * 255).astype(np.uint8)
    y = labels.astype(np.uint8)
    return {"x_train": x[:n_train], "y_train": y[:n_train], "x_test": x[n_train:], "y_test": y[n_train:]}
