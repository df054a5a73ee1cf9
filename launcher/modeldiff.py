"""Load model weights from their saved forms and diff them array by array.

Forms: the runtime's canonical ``model/canonical.npz`` (a stored zip of ``NNN.<layer>/<i>.npy``
entries, written by ``launcher.runtime.fingerprints.canonical_npz_bytes``), Keras 3
``.weights.h5`` and ``.keras`` and Keras 2 ``.h5`` (need h5py), PyTorch state dicts
``.pt``/``.pth`` (need torch). Arrays are compared bit for bit; for those that differ the count
of differing elements and the largest absolute and relative differences are computed with
whole-array numpy operations, slice by slice, so a 25M-parameter model diffs in about a second.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from launcher.errors import BadData, Corrupt, LauncherError, NotFound

IDENTICAL = "identical"
DIFFERS = "differs"
SHAPE = "shape"  # shape or dtype differ: the elements cannot be compared
MISSING = "missing"  # in one model only


@dataclass(frozen=True)
class WeightArray:
    layer: str
    array: str
    value: np.ndarray

    @property
    def key(self) -> tuple[str, str]:
        return (self.layer, self.array)


@dataclass
class Weights:
    """Arrays in model order (the order of the file)."""

    source: Path
    arrays: list[WeightArray]

    def __iter__(self) -> Iterator[WeightArray]:
        return iter(self.arrays)

    @property
    def parameter_count(self) -> int:
        return sum(int(a.value.size) for a in self.arrays)


@dataclass(frozen=True)
class ArrayDiff:
    layer: str
    array: str
    status: str
    shape: tuple[int, ...] | None = None
    other_shape: tuple[int, ...] | None = None
    dtype: str | None = None
    total: int = 0
    differing: int = 0
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer, "array": self.array, "status": self.status,
            "shape": list(self.shape) if self.shape is not None else None,
            "other_shape": list(self.other_shape) if self.other_shape is not None else None,
            "dtype": self.dtype, "total": self.total, "differing": self.differing,
            "max_abs_diff": _json_float(self.max_abs_diff), "max_rel_diff": _json_float(self.max_rel_diff),
        }


@dataclass
class ModelDiff:
    reference: str
    other: str
    arrays: list[ArrayDiff] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return all(a.status == IDENTICAL for a in self.arrays)

    @property
    def differing(self) -> list[ArrayDiff]:
        return [a for a in self.arrays if a.status != IDENTICAL]

    @property
    def first_difference(self) -> ArrayDiff | None:
        return next((a for a in self.arrays if a.status != IDENTICAL), None)

    def to_dict(self) -> dict[str, Any]:
        first = self.first_difference
        return {
            "reference": self.reference,
            "other": self.other,
            "identical": self.identical,
            "arrays_total": len(self.arrays),
            "arrays_differing": len(self.differing),
            "elements_total": sum(a.total for a in self.arrays),
            "elements_differing": sum(a.differing for a in self.arrays),
            "first_difference": {"layer": first.layer, "array": first.array} if first else None,
            "arrays": [a.to_dict() for a in self.arrays],
        }


def _json_float(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return str(x)  # "nan", "inf": JSON has no literal for them


# ---------------------------------------------------------------- loading


def _read_npy(data: bytes, name: str, source: Path) -> np.ndarray:
    try:
        arr = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise Corrupt(f"{source}: entry {name} is not a readable .npy array ({exc})",
                      "re-pull the run (`launcher pull RUN`)") from exc
    return arr


def _split_canonical(name: str) -> tuple[int, str, str] | None:
    if not name.endswith(".npy"):
        return None
    stem = name[: -len(".npy")]
    prefix, sep, index = stem.rpartition("/")
    order, dot, layer = prefix.partition(".")
    if not sep or not dot or not order.isdigit() or not layer:
        return None
    return int(order), layer, index


def load_canonical(path: Path) -> Weights:
    """``canonical.npz``: entries ``NNN.<layer>/<i>.npy``; NNN gives the model order."""
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise NotFound(f"no model file {path}") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise Corrupt(f"{path} is not a readable zip archive ({exc})",
                      "re-pull the run (`launcher pull RUN`)") from exc
    entries: list[tuple[int, str, str, str]] = []
    with zf:
        for info in zf.infolist():
            parts = _split_canonical(info.filename)
            if parts is None:
                raise Corrupt(f"{path}: entry {info.filename!r} is not named NNN.<layer>/<i>.npy",
                              "re-pull the run, or re-save the model with the runtime's canonical writer")
            entries.append((*parts, info.filename))
        entries.sort(key=lambda e: (e[0], e[1], _index_key(e[2])))
        arrays = [WeightArray(layer, index, _read_npy(zf.read(name), name, path))
                  for _, layer, index, name in entries]
    return Weights(path, arrays)


def _index_key(index: str) -> tuple[int, int | str]:
    return (0, int(index)) if index.isdigit() else (1, index)


def _import_h5py() -> Any:
    try:
        import h5py
    except ImportError as exc:
        raise LauncherError("reading Keras .weights.h5/.keras files needs h5py",
                            "pip install 'launcher[report]' (or h5py)") from exc
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


def _h5_arrays(handle: Any, source: Path) -> list[WeightArray]:
    h5py = _import_h5py()
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
    h5py = _import_h5py()
    if not path.exists():
        raise NotFound(f"no model file {path}")
    try:
        with h5py.File(path, "r") as f:
            return Weights(path, _h5_arrays(f, path))
    except OSError as exc:
        raise Corrupt(f"{path} is not a readable HDF5 file ({exc})",
                      "re-pull the run (`launcher pull RUN`)") from exc


def load_keras(path: Path) -> Weights:
    """A ``.keras`` archive: its ``model.weights.h5`` member."""
    h5py = _import_h5py()
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
        return Weights(path, _h5_arrays(f, path))


def load_torch(path: Path) -> Weights:
    """A PyTorch state dict (or a checkpoint holding one under ``state_dict``/``model_state_dict``)."""
    try:
        import torch
    except ImportError as exc:
        raise LauncherError("reading PyTorch .pt files needs torch", "pip install torch") from exc
    if not path.exists():
        raise NotFound(f"no model file {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file
        raise Corrupt(f"{path} is not a loadable PyTorch state dict ({exc})",
                      "re-pull the run (`launcher pull RUN`)") from exc
    if isinstance(obj, dict):
        for key in ("state_dict", "model_state_dict"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict):
        raise BadData(f"{path} holds a {type(obj).__name__}, not a state dict")
    arrays: list[WeightArray] = []
    for name, tensor in obj.items():
        if not hasattr(tensor, "detach"):
            continue
        layer, _, leaf = str(name).rpartition(".")
        t = tensor.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            # numpy has no bfloat16: compare its bits as int16, values as float32.
            value = t.view(torch.int16).numpy().view(np.uint16)
            value = (value.astype(np.uint32) << 16).view(np.float32)
        else:
            value = t.numpy()
        arrays.append(WeightArray(layer or name, leaf if layer else "0", value))
    return Weights(path, arrays)


def load_weights(path: Path) -> Weights:
    """Pick the loader by file name."""
    name = path.name
    if name.endswith(".npz"):
        return load_canonical(path)
    if name.endswith(".h5") or name.endswith(".hdf5"):
        return load_h5(path)
    if name.endswith(".keras"):
        return load_keras(path)
    if name.endswith((".pt", ".pth")):
        return load_torch(path)
    raise BadData(f"{path}: unknown model format", "use canonical.npz, .weights.h5, .keras or .pt")


# ---------------------------------------------------------------- diffing


def _bits(a: np.ndarray) -> np.ndarray:
    """The array's raw bits as unsigned integers of the same width, flat (so -0.0 != 0.0, NaN == NaN)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    size = flat.dtype.itemsize
    if flat.dtype.kind in "fciub" and size in (1, 2, 4, 8):
        return flat.view(f"u{size}")
    return flat.view(np.uint8)


# Elements per slice: temporaries stay in cache and no array-sized float64 copies are made.
_SLICE = 1 << 18


def _slice_stats(va: np.ndarray, vb: np.ndarray) -> tuple[float, float]:
    """Max abs and max rel difference of the differing elements of one slice (nan if any is nan)."""
    if va.dtype.kind == "c":
        va, vb = va.astype(np.complex128), vb.astype(np.complex128)
    else:
        va, vb = va.astype(np.float64), vb.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = np.abs(va - vb)
        scale = np.maximum(np.abs(va), np.abs(vb))
        rel = np.divide(d, scale, out=np.zeros_like(d), where=scale > 0)
    return float(np.max(d)), float(np.max(rel))  # np.max propagates nan


def diff_arrays(layer: str, array: str, a: np.ndarray, b: np.ndarray) -> ArrayDiff:
    if a.shape != b.shape or a.dtype != b.dtype:
        return ArrayDiff(layer, array, SHAPE, shape=tuple(a.shape), other_shape=tuple(b.shape),
                         dtype=f"{a.dtype} vs {b.dtype}" if a.dtype != b.dtype else str(a.dtype),
                         total=int(a.size), differing=int(max(a.size, b.size)))
    ba, bb = _bits(a), _bits(b)
    numeric = a.dtype.kind in "fciub"
    fa, fb = np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1)
    width = ba.size // max(1, a.size)  # >1 only for dtypes compared as raw bytes
    n = 0
    max_abs = max_rel = 0.0
    for start in range(0, a.size, _SLICE):
        stop = min(a.size, start + _SLICE)
        ne = ba[start * width:stop * width] != bb[start * width:stop * width]
        if width > 1:
            ne = ne.reshape(-1, width).any(axis=1)
        k = int(np.count_nonzero(ne))
        if k == 0:
            continue
        n += k
        if numeric:
            sa, sr = _slice_stats(fa[start:stop][ne], fb[start:stop][ne])
            max_abs = sa if math.isnan(sa) or math.isnan(max_abs) else max(max_abs, sa)
            max_rel = sr if math.isnan(sr) or math.isnan(max_rel) else max(max_rel, sr)
    if n == 0:
        return ArrayDiff(layer, array, IDENTICAL, shape=tuple(a.shape), dtype=str(a.dtype), total=int(a.size))
    return ArrayDiff(layer, array, DIFFERS, shape=tuple(a.shape), dtype=str(a.dtype), total=int(a.size),
                     differing=n, max_abs_diff=max_abs if numeric else None,
                     max_rel_diff=max_rel if numeric else None)


def diff_weights(ref: Weights, other: Weights) -> ModelDiff:
    """Per (layer, array) in the reference's order, then arrays only the other model has."""
    out = ModelDiff(str(ref.source), str(other.source))
    theirs = {a.key: a for a in other}
    for a in ref:
        b = theirs.pop(a.key, None)
        if b is None:
            out.arrays.append(ArrayDiff(a.layer, a.array, MISSING, shape=tuple(a.value.shape),
                                        dtype=str(a.value.dtype), total=int(a.value.size),
                                        differing=int(a.value.size)))
        else:
            out.arrays.append(diff_arrays(a.layer, a.array, a.value, b.value))
    for b in theirs.values():
        out.arrays.append(ArrayDiff(b.layer, b.array, MISSING, other_shape=tuple(b.value.shape),
                                    dtype=str(b.value.dtype), total=int(b.value.size),
                                    differing=int(b.value.size)))
    return out


def diff_models(ref_path: Path, other_path: Path) -> ModelDiff:
    return diff_weights(load_weights(ref_path), load_weights(other_path))
