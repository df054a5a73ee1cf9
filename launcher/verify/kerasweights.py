"""Model weights read from Keras saves: Keras 3 .weights.h5 and .keras, Keras 2 .h5 (need h5py)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from launcher.errors import BadData, Corrupt, MissingExtra, NotFound
from launcher.verify.weights import WeightArray, Weights


def import_h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:
        raise MissingExtra("reading .keras and HDF5 (.h5) files needs the Python package h5py, a dependency of "
                           "launcher that this environment lacks", "pip install h5py") from exc
    return h5py


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _keras2_arrays(handle: Any) -> list[WeightArray] | None:
    """Keras 2 HDF5 (``model.save`` / ``save_weights`` to .h5): layer and weight order are attributes."""
    group = handle["model_weights"] if "model_weights" in handle else handle
    names = group.attrs.get("layer_names")
    if names is None:
        return None
    arrays: list[WeightArray] = []
    for raw in names:
        layer = _text(raw)
        lg = group[layer]
        for i, wname in enumerate(lg.attrs.get("weight_names", [])):
            arrays.append(WeightArray(layer, str(i), np.asarray(lg[_text(wname)][()])))
    return arrays


_KERAS3_SEGMENTS = {"layers", "_layer_checkpoint_dependencies", "vars"}


def h5_arrays(handle: Any, source: Path) -> list[WeightArray]:
    h5py = import_h5py()
    arrays = _keras2_arrays(handle)
    if arrays is None:
        # Keras 3 (.weights.h5, and inside .keras): layers/<name>/vars/<i>, nested models
        # as layers/<model>/layers/<name>/vars/<i>. Groups come in name order, not model order.
        found: list[tuple[str, np.ndarray]] = []

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                found.append((name, np.asarray(obj[()])))

        handle.visititems(visit)
        arrays = []
        counters: dict[str, int] = {}
        for name, value in found:
            parent, _, leaf = name.rpartition("/")
            layer = "/".join(p for p in parent.split("/") if p not in _KERAS3_SEGMENTS)
            if leaf.isdigit():
                index = leaf
            else:
                index = str(counters.get(layer, 0))
                counters[layer] = counters.get(layer, 0) + 1
            arrays.append(WeightArray(layer or "/", index, value))
    if not arrays:
        raise BadData(f"{source} holds no weight arrays")
    return arrays


def load_h5(path: Path) -> Weights:
    h5py = import_h5py()
    if not path.exists():
        raise NotFound(f"no model file {path}")
    try:
        with h5py.File(path, "r") as f:
            return Weights(path, h5_arrays(f, path))
    except OSError as exc:
        raise Corrupt(f"{path} is not a readable HDF5 file ({exc})",
                      "re-pull the run (`launcher pull RUN`)") from exc


def load_keras(path: Path) -> Weights:
    """A ``.keras`` archive: its ``model.weights.h5`` member."""
    h5py = import_h5py()
    try:
        with zipfile.ZipFile(path) as zf:
            data = zf.read("model.weights.h5")
    except FileNotFoundError:
        raise NotFound(f"no model file {path}") from None
    except KeyError:
        raise BadData(f"{path} has no model.weights.h5 member (not a Keras 3 archive)") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise Corrupt(f"{path} is not a readable .keras archive ({exc})",
                      "re-pull the run (`launcher pull RUN`)") from exc
    with h5py.File(io.BytesIO(data), "r") as f:
        return Weights(path, h5_arrays(f, path))
