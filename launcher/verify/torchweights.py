"""Model weights read without torch: PyTorch .pt/.pth zips (state dicts, checkpoints) and safetensors."""

from __future__ import annotations

import collections
import io
import json
import pickle
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypedDict, cast

import numpy as np

from launcher.errors import BadData, Corrupt, NotFound
from launcher.verify.weights import WeightArray, Weights, open_zip

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
    zf = open_zip(path, lambda exc: BadData(f"{path} is not a PyTorch zip checkpoint ({exc})",
                                            "save it with torch.save (the zip format of PyTorch 1.6 and later)"))
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
    for name, entry in header.tensors.items():
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


METADATA = "__metadata__"  # the safetensors header's one key that is not a tensor
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
                       "BOOL": "?", "F8_E4M3": "u1", "F8_E5M2": "u1"}


class TensorEntry(TypedDict):
    """One tensor of a safetensors file's JSON header."""

    dtype: str
    shape: list[int]
    data_offsets: list[int]  # [begin, end) in the data after the header


@dataclass(frozen=True)
class SafetensorsHeader:
    """A safetensors file's JSON header: its tensors (sorted by their offsets) and its ``__metadata__``."""

    tensors: dict[str, TensorEntry]
    metadata: object  # as the file holds it (the format says str -> str); None when absent


def read_safetensors(path: Path) -> tuple[SafetensorsHeader, memoryview]:
    """(header, data bytes after the header)."""
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
        tensors: dict[str, TensorEntry] = {}
        for k, v in header.items():
            if k == METADATA:
                continue
            if not (isinstance(v, dict) and isinstance(v.get("data_offsets"), list) and "dtype" in v
                    and isinstance(v.get("shape"), list)):
                raise ValueError(f"tensor {k} lacks dtype, shape or data_offsets")
            tensors[k] = cast(TensorEntry, v)
    except ValueError as exc:
        raise BadData(f"{path} is not a safetensors file ({exc})") from exc
    ordered = dict(sorted(tensors.items(), key=lambda kv: kv[1]["data_offsets"][0]))
    return SafetensorsHeader(ordered, header.get(METADATA)), memoryview(raw)[8 + n:]
