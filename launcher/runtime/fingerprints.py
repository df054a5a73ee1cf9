"""Digests of data, weights and batches, and the canonical model file.

Pure standard library plus numpy (imported lazily). Every digest is ``sha256:<hex>`` and every
document is canonical JSON, so the same inputs always give the same bytes. hashlib and zipfile are
imported where they are used: the recipe's interpreter writes runtime.json before the recipe's first
line and hashes only later.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.runtime.records import (
        ArrayEntry,
        ArraysFingerprint,
        EpochBatches,
        FilesFingerprint,
        JsonlLine,
        LayerArray,
        LayerEntry,
        LayersDocument,
        NamedArrays,
        WeightsFingerprint,
    )

CHUNK = 1 << 20
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
Layers = Sequence[tuple[str, Sequence[Any]]]  # (layer name, [array, ...]) in model order


def sha256_bytes(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def canonical_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def digest_of(data: Any) -> str:
    return sha256_bytes(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, canonical_json(data).encode())


def append_jsonl(path: Path, record: JsonlLine) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
        f.flush()


def as_array(value: Any) -> Any:
    import numpy as np

    if hasattr(value, "detach") and not isinstance(value, np.ndarray):  # a torch tensor
        value = value.detach().cpu().numpy()
    elif hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    return np.asarray(value)


def array_digest(value: Any) -> str:
    """sha256 over dtype, shape and the little-endian C-order bytes: equal arrays, equal digests."""
    a = as_array(value)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    import hashlib

    h = hashlib.sha256(f"{a.dtype.str}|{list(a.shape)}|".encode())
    h.update(a.tobytes(order="C"))
    return "sha256:" + h.hexdigest()


def files_fingerprint(root: Path, exclude: Iterable[str] = ("__pycache__",)) -> FilesFingerprint:
    """Every regular file under root (links followed), by relative path; mtimes play no part."""
    skip = set(exclude)
    entries: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if name in skip or not p.is_file():
                continue
            entries[p.relative_to(root).as_posix()] = sha256_file(p)
    return {"digest": digest_of(entries), "kind": "files", "entries": entries}


def arrays_fingerprint(arrays: NamedArrays) -> ArraysFingerprint:
    entries: dict[str, ArrayEntry] = {}
    for name in sorted(arrays):
        a = as_array(arrays[name])
        entries[name] = {"sha256": array_digest(a), "shape": list(a.shape), "dtype": a.dtype.str}
    return {"digest": digest_of(entries), "kind": "arrays", "entries": entries}


def weights_fingerprint(layers: Layers) -> WeightsFingerprint:
    arrays = {f"{name}/{i}": array_digest(a) for name, values in layers for i, a in enumerate(values)}
    return {"digest": digest_of(arrays), "arrays": arrays}


def layers_document(layers: Layers) -> LayersDocument:
    out: list[LayerEntry] = []
    for name, values in layers:
        items: list[LayerArray] = []
        for i, value in enumerate(values):
            a = as_array(value)
            items.append({"index": i, "shape": list(a.shape), "dtype": a.dtype.str,
                          "sha256": array_digest(a)})
        out.append({"name": name, "arrays": items})
    return {"layers": out, "digest": weights_fingerprint(layers)["digest"]}


def canonical_npz_bytes(layers: Layers) -> bytes:
    """A stored (uncompressed) zip, entries sorted ``NNN.<layer>/<i>.npy``, every date fixed.

    ``numpy.load`` reads it like any .npz; the same weights always give the same bytes.
    """
    return _stored_npz({f"{n:03d}.{name}/{i}.npy": value for n, (name, values) in enumerate(layers)
                        for i, value in enumerate(values)})


def arrays_npz_bytes(arrays: NamedArrays) -> bytes:
    """Named arrays as a canonical .npz (``NAME.npy`` entries, stored, sorted, dates fixed)."""
    return _stored_npz({f"{name}.npy": value for name, value in arrays.items()})


def _stored_npz(arrays: NamedArrays) -> bytes:
    import zipfile

    import numpy as np

    entries: list[tuple[str, bytes]] = []
    for arcname, value in arrays.items():
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.ascontiguousarray(as_array(value)), allow_pickle=False)
        entries.append((arcname, buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as zf:
        for arcname, data in sorted(entries):
            info = zipfile.ZipInfo(arcname, date_time=ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            info.create_system = 3
            zf.writestr(info, data)
    return out.getvalue()


def torch_layers(model: Any) -> Layers:
    """(module name, [parameters and buffers]) in registration order, from a torch module."""
    layers: dict[str, list[Any]] = {}
    for key, value in model.state_dict().items():
        name, _, _ = key.rpartition(".")
        layers.setdefault(name or "_", []).append(value)
    return list(layers.items())


def batch_digest(sample_ids: Any) -> str:
    """The digest of one batch: its sample IDs (positions in the training set), in order, as int64."""
    import numpy as np

    return array_digest(np.asarray(sample_ids, dtype="<i8"))


def epoch_record(epoch: int, batches: list[str]) -> EpochBatches:
    return {"epoch": epoch, "digest": digest_of(batches), "batches": batches}
