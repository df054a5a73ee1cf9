"""Diff two models' weights array by array, whichever saved form each comes in.

The forms are read by :mod:`launcher.verify.weights` (the runtime's canonical ``model/canonical.npz``,
``.npy``/``.npz``), :mod:`launcher.verify.kerasweights` (Keras 3 ``.weights.h5`` and ``.keras``, Keras 2
``.h5``) and :mod:`launcher.verify.torchweights` (PyTorch ``.pt``/``.pth`` without torch, safetensors).
Arrays are compared bit for bit; for those that differ the count
of differing elements and the largest absolute and relative differences are computed with
whole-array numpy operations, slice by slice, so a 25M-parameter model diffs in about a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np

from launcher.errors import BadData, ExitCode, verdict_exit_code
from launcher.verify.kerasweights import h5_arrays, import_h5py, load_h5, load_keras
from launcher.verify.torchweights import (
    Opaque,
    TorchArchive,
    TorchTensor,
    flatten_state,
    load_safetensors,
    load_torch,
    open_torch_zip,
    read_safetensors,
)
from launcher.verify.weights import WeightArray, Weights, is_canonical_npz, load_canonical, load_npy

# The readers' names stay importable from here, where tests and other modules import them.
__all__ = [
    "DIFFERS",
    "IDENTICAL",
    "MISSING",
    "SHAPE",
    "ArrayDiff",
    "ModelDiff",
    "Opaque",
    "TorchArchive",
    "TorchTensor",
    "WeightArray",
    "Weights",
    "diff_arrays",
    "diff_models",
    "diff_weights",
    "flatten_state",
    "h5_arrays",
    "import_h5py",
    "is_canonical_npz",
    "load_canonical",
    "load_h5",
    "load_keras",
    "load_npy",
    "load_safetensors",
    "load_torch",
    "load_weights",
    "open_torch_zip",
    "read_safetensors",
]

IDENTICAL = "identical"
DIFFERS = "differs"
SHAPE = "shape"  # shape or dtype differ: the elements cannot be compared
MISSING = "missing"  # in one model only


class FirstDifference(TypedDict):
    """Where two models first differ: the layer and the array within it."""

    layer: str
    array: str


class ArrayDiffRecord(TypedDict):
    """One array of a model diff as written in verify's JSON (``arrays`` of a model diff)."""

    layer: str
    array: str
    status: str  # identical | differs | shape | missing
    shape: list[int] | None
    other_shape: list[int] | None
    dtype: str | None
    total: int
    differing: int
    max_abs_diff: float | str | None  # "nan", "inf" as strings: JSON has no literal for them
    max_rel_diff: float | str | None


class ModelDiffRecord(TypedDict):
    """A model diff as written in verify's JSON (``verify models``, an explanation's ``model``)."""

    reference: str
    other: str
    identical: bool
    arrays_total: int
    arrays_differing: int
    elements_total: int
    elements_differing: int
    first_difference: FirstDifference | None
    arrays: list[ArrayDiffRecord]


class SourcedModelDiff(ModelDiffRecord):
    """`verify models`' Result data: the diff, and the file named as the explanation's model "source"."""

    source: str


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

    def to_dict(self) -> ArrayDiffRecord:
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

    @property
    def exit_code(self) -> ExitCode:
        return verdict_exit_code(self.first_difference is None)

    def to_dict(self) -> ModelDiffRecord:
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


def load_weights(path: Path) -> Weights:
    """Pick the loader by file name."""
    name = path.name
    if name.endswith(".npz"):
        return load_canonical(path) if is_canonical_npz(path) else load_npy(path)
    if name.endswith(".npy"):
        return load_npy(path)
    if name.endswith(".safetensors"):
        return load_safetensors(path)
    if name.endswith(".h5") or name.endswith(".hdf5"):
        return load_h5(path)
    if name.endswith(".keras"):
        return load_keras(path)
    if name.endswith((".pt", ".pth")):
        return load_torch(path)
    raise BadData(f"{path}: unknown model format",
                  "use canonical.npz, .npz, .npy, .weights.h5, .h5, .keras, .pt, .pth or .safetensors")


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
