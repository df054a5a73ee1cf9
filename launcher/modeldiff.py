"""Load model weights from their saved forms and diff them array by array.

Forms: the runtime's canonical ``model/canonical.npz`` (a stored zip of ``NNN.<layer>/<i>.npy``
entries, written by ``launcher.runtime.fingerprints.canonical_npz_bytes``), Keras 3
``.weights.h5`` and ``.keras`` and Keras 2 ``.h5`` (need h5py), PyTorch state dicts and
checkpoints ``.pt``/``.pth`` (read from the zip without torch), safetensors, ``.npy``/``.npz``.
Arrays are compared bit for bit; for those that differ the count
of differing elements and the largest absolute and relative differences are computed with
whole-array numpy operations, slice by slice, so a 25M-parameter model diffs in about a second.
"""

from __future__ import annotations

import collections
import io
import json
import math
import pickle
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

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


# PyTorch's zip format: <archive>/data.pkl references storages <archive>/data/<key> by persistent id.
# Read without torch: the pickle is replayed with stand-ins for torch's classes (nothing of the
# file's choosing is imported or called), and each tensor is a numpy view of its storage bytes.
_TORCH_STORAGE_DTYPES = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "BFloat16Storage": "<u2",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?", "ComplexFloatStorage": "<c8", "ComplexDoubleStorage": "<c16",
}


@dataclass(frozen=True)
class TorchTensor:
    """A tensor of a torch pickle: its storage key, dtype and view (no torch needed)."""

    key: str
    dtype: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


class Opaque:
    """An object of a class the reader does not import: compared by its qualified name and state."""

    qualname = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Opaque) and self.qualname == other.qualname and self.args == other.args
                and self.state == other.state)

    def __hash__(self) -> int:
        return hash(self.qualname)

    def __repr__(self) -> str:
        return f"<{self.qualname}{self.args!r}>"


def _opaque_class(module: str, name: str) -> type:
    return type(name, (Opaque,), {"qualname": f"{module}.{name}"})


def _rebuild_tensor(storage: Any, offset: int, size: Any, stride: Any, *_: Any) -> TorchTensor:
    key, dtype = storage
    return TorchTensor(key, dtype, int(offset), tuple(int(x) for x in size), tuple(int(x) for x in stride))


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


class _TorchUnpickler(pickle.Unpickler):
    _REAL: ClassVar[dict[tuple[str, str], Any]] = {
        ("collections", "OrderedDict"): collections.OrderedDict, ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset, ("builtins", "slice"): slice, ("torch", "Size"): tuple}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._REAL:
            return self._REAL[(module, name)]
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch._utils" and name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
            return _rebuild_parameter
        if module == "torch" and name in _TORCH_STORAGE_DTYPES:
            return _TORCH_STORAGE_DTYPES[name]
        return _opaque_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage":
            dtype = pid[1] if isinstance(pid[1], str) else "u1"
            return (str(pid[2]), dtype)
        raise pickle.UnpicklingError(f"unsupported persistent id {pid!r}")


@dataclass
class TorchArchive:
    """A torch zip checkpoint: its unpickled object (tensors as :class:`TorchTensor`) and storages."""

    source: Path
    prefix: str
    obj: Any
    members: dict[str, zipfile.ZipInfo]
    zf: zipfile.ZipFile

    def storage(self, key: str) -> bytes:
        return self.zf.read(f"{self.prefix}data/{key}")

    def array(self, t: TorchTensor) -> np.ndarray:
        raw = np.frombuffer(self.storage(t.key), dtype=np.dtype(t.dtype))
        if not t.shape:
            return raw[t.offset:t.offset + 1].reshape(())
        item = raw.itemsize
        view = np.lib.stride_tricks.as_strided(raw[t.offset:], shape=t.shape,
                                               strides=tuple(s * item for s in t.stride))
        return np.ascontiguousarray(view)


def open_torch_zip(path: Path) -> TorchArchive:
    """Open a torch zip checkpoint without torch (the format of ``torch.save`` since 1.6)."""
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise NotFound(f"no model file {path}") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise BadData(f"{path} is not a PyTorch zip checkpoint ({exc})",
                      "save it with torch.save (the zip format of PyTorch 1.6 and later)") from exc
    pkl = next((n for n in zf.namelist() if n.endswith("data.pkl") and n.count("/") == 1), None)
    if pkl is None:
        zf.close()
        raise BadData(f"{path} has no <archive>/data.pkl member (not a torch.save zip)")
    prefix = pkl[: -len("data.pkl")]
    try:
        obj = _TorchUnpickler(io.BytesIO(zf.read(pkl))).load()
    except Exception as exc:  # a damaged pickle raises many types
        zf.close()
        raise Corrupt(f"{path}: {pkl} is not a readable pickle ({exc})",
                      "re-pull the run (`launcher pull RUN`)") from exc
    return TorchArchive(path, prefix, obj, {i.filename: i for i in zf.infolist()}, zf)


def flatten_state(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Leaves of nested dicts, lists and tuples as (dotted path, value)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten_state(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)) and any(isinstance(x, (dict, list, tuple, TorchTensor)) for x in obj):
        for i, v in enumerate(obj):
            yield from flatten_state(v, f"{prefix}.{i}" if prefix else str(i))
    else:
        yield prefix, obj


def _torch_key(name: str) -> tuple[str, str]:
    layer, _, leaf = name.rpartition(".")
    return (layer or name, leaf if layer else "0")


def load_torch(path: Path) -> Weights:
    """A PyTorch state dict (or a checkpoint holding one under ``state_dict``/``model_state_dict``).

    Read from the zip without torch, so it works where torch is not installed.
    """
    archive = open_torch_zip(path)
    with archive.zf:
        obj = archive.obj
        if isinstance(obj, dict):
            for key in ("state_dict", "model_state_dict"):
                if isinstance(obj.get(key), dict):
                    obj = obj[key]
                    break
        if not isinstance(obj, dict):
            raise BadData(f"{path} holds a {type(obj).__name__}, not a state dict")
        arrays: list[WeightArray] = []
        for name, value in flatten_state(obj):
            if isinstance(value, TorchTensor):
                arr = archive.array(value)
                if value.dtype == "<u2":  # bfloat16: compare its bits, values as float32
                    arr = (arr.astype(np.uint32) << 16).view(np.float32)
                layer, leaf = _torch_key(name)
                arrays.append(WeightArray(layer, leaf, arr))
    return Weights(path, arrays)


def load_safetensors(path: Path) -> Weights:
    """A safetensors file: 8-byte little-endian header length, a JSON header, then raw tensor bytes."""
    header, data = read_safetensors(path)
    arrays: list[WeightArray] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise BadData(f"{path}: tensor {name} has an unknown dtype {entry['dtype']!r}")
        arr = np.frombuffer(data[begin:end], dtype=np.dtype(dtype)).reshape(entry["shape"])
        if entry["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        layer, leaf = _torch_key(name)
        arrays.append(WeightArray(layer, leaf, arr))
    return Weights(path, arrays)


_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
                       "BOOL": "?", "F8_E4M3": "u1", "F8_E5M2": "u1"}


def read_safetensors(path: Path) -> tuple[dict[str, Any], memoryview]:
    """(header, data bytes after the header); tensors sorted by their offsets."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"no model file {path}") from None
    try:
        n = int.from_bytes(raw[:8], "little")
        if len(raw) < 8 or n > len(raw) - 8:
            raise ValueError("header length beyond the end of the file")
        header = json.loads(raw[8:8 + n])
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        for k, v in tensors.items():
            if not (isinstance(v, dict) and isinstance(v.get("data_offsets"), list) and "dtype" in v
                    and isinstance(v.get("shape"), list)):
                raise ValueError(f"tensor {k} lacks dtype, shape or data_offsets")
    except ValueError as exc:
        raise BadData(f"{path} is not a safetensors file ({exc})") from exc
    ordered = dict(sorted(tensors.items(), key=lambda kv: kv[1]["data_offsets"][0]))
    if "__metadata__" in header:
        ordered["__metadata__"] = header["__metadata__"]
    return ordered, memoryview(raw)[8 + n:]


def load_npy(path: Path) -> Weights:
    """One .npy array, or a plain .npz (np.savez): each entry one array."""
    if path.name.endswith(".npy"):
        try:
            with open(path, "rb") as f:
                return Weights(path, [WeightArray(path.stem, "0", _read_npy(f.read(), path.name, path))])
        except FileNotFoundError:
            raise NotFound(f"no model file {path}") from None
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise NotFound(f"no model file {path}") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise Corrupt(f"{path} is not a readable .npz archive ({exc})",
                      "re-pull the run (`launcher pull RUN`)") from exc
    with zf:
        return Weights(path, [WeightArray(n.removesuffix(".npy"), "0", _read_npy(zf.read(n), n, path))
                              for n in zf.namelist()])


def is_canonical_npz(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return bool(names) and all(_split_canonical(n) is not None for n in names)


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
