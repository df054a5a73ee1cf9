"""CIFAR-10 in its published "python version" (pickled batches), or scikit-learn's digits as a
small 32x32 RGB stand-in."""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import numpy as np

from launcher.runtime.api import BadData

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
# The batches are numpy arrays pickled by Python 2; nothing else may be unpickled from a data folder.
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return getattr(importlib.import_module(module), name)


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise BadData(f"{path}: not found; CIFAR-10's python version holds data_batch_1..5 and test_batch")
    try:
        with open(path, "rb") as f:
            d = _ArraysOnly(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise BadData(f"{path}: not a CIFAR-10 python batch ({exc})") from None
    if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
        raise BadData(f"{path}: not a CIFAR-10 python batch (no b'data' / b'labels')")
    data = np.asarray(d[b"data"], dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3072:
        raise BadData(f"{path}: data has shape {data.shape}, expected (N, 3072)")
    x = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return x, np.asarray(d[b"labels"], dtype=np.uint8)


def load_batches(folder: Path) -> dict[str, np.ndarray]:
    root = folder / "cifar-10-batches-py" if (folder / "cifar-10-batches-py").is_dir() else folder
    xs, ys = zip(*(_read_batch(root / name) for name in TRAIN_BATCHES), strict=True)
    x_test, y_test = _read_batch(root / TEST_BATCH)
    return {"x_train": np.concatenate(xs), "y_train": np.concatenate(ys), "x_test": x_test, "y_test": y_test}


def digits_as_cifar() -> dict[str, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits as 32x32 RGB uint8 (each pixel 4x4, grey); 1,500 train / 297 test."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise BadData("dataset=digits needs scikit-learn in the image; "
                      "use dataset=cifar10 with --data") from None
    d = load_digits()
    grey = np.round(np.kron(d.images, np.ones((4, 4))) * (255.0 / 16.0)).astype(np.uint8)
    x = np.repeat(grey[..., None], 3, axis=-1)
    y = d.target.astype(np.uint8)
    return {"x_train": x[:1500], "y_train": y[:1500], "x_test": x[1500:], "y_test": y[1500:]}
