"""Compare the files ML code writes by their content, not their bytes.

Two saves of the same weights rarely have the same bytes: a ``.keras`` zip carries entry dates
and a ``date_saved``, a PyTorch zip a random serialization id, a TensorBoard event file a wall
time in every record (and the time, host and pid in its name), a SavedModel graph ids that
change on every export. :func:`compare_files` reads both files in their format and answers
whether their content is equal, what differs in the bytes only, and where the content differs
(for weights, the first differing layer and array, through :mod:`launcher.modeldiff`).

Formats: ``.keras``; HDF5 ``.h5``/``.hdf5`` (Keras full-model and weights saves); SavedModel
directories (``variables/`` read by hand from TensorFlow's tensor bundle; ``saved_model.pb``
and ``fingerprint.pb`` are not compared); PyTorch ``.pt``/``.pth`` zips (read without torch);
safetensors; ``.npy``/``.npz``; TensorBoard event files; CSV, JSON and JSON-lines logs. A
format not listed, or a file that cannot be read as its name says, is compared by bytes.
"""

from __future__ import annotations

import csv
import io
import json
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from launcher.errors import LauncherError
from launcher.modeldiff import (
    ModelDiff,
    TorchTensor,
    WeightArray,
    Weights,
    diff_arrays,
    diff_weights,
    flatten_state,
    is_canonical_npz,
    load_canonical,
    load_npy,
    open_torch_zip,
    read_safetensors,
)

# Fields of JSON and CSV logs that change on every run by nature: compared neither in JSON
# objects (any depth) nor as CSV columns; a difference in them is listed as volatile bytes.
VOLATILE_FIELDS = frozenset({
    "time", "timestamp", "wall_time", "walltime", "date", "datetime", "date_saved", "created", "hostname",
    "pid", "elapsed", "duration", "start", "end",
})
VOLATILE_FIELD_SUFFIXES = ("_time", "_at", "_timestamp", "_date", "_duration", "_elapsed", "_seconds")

EVENTS_MARK = "tfevents"
SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_UNCOMPARED = ("saved_model.pb", "fingerprint.pb")


def volatile_field(name: str) -> bool:
    low = name.lower()
    return low in VOLATILE_FIELDS or low.endswith(VOLATILE_FIELD_SUFFIXES)


@dataclass
class ContentDiff:
    """The comparison of two files of one format."""

    format: str
    same: bool  # the content is equal
    volatile: list[str] = field(default_factory=list)  # what differs in the bytes only
    difference: str | None = None  # where the content differs first, one phrase
    model: ModelDiff | None = None  # for arrays: the diff naming the layer and array

    @property
    def first_difference(self) -> dict[str, str] | None:
        first = self.model.first_difference if self.model is not None else None
        return {"layer": first.layer, "array": first.array} if first else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format, "same": self.same, "volatile": list(self.volatile),
                               "difference": self.difference, "first_difference": self.first_difference}
        if self.model is not None and not self.model.identical:
            out["arrays_differing"] = len(self.model.differing)
            out["arrays_total"] = len(self.model.arrays)
        return out


def _model_result(fmt: str, model: ModelDiff, volatile: list[str]) -> ContentDiff:
    first = model.first_difference
    if first is None:
        return ContentDiff(fmt, True, volatile, model=model)
    what = {"differs": f"{first.differing} of {first.total} elements differ", "shape": "shape or dtype differ",
            "missing": "in one file only"}.get(first.status, first.status)
    return ContentDiff(fmt, False, volatile, f"layer {first.layer} array {first.array}: {what}", model)


# ---------------------------------------------------------------- dispatch


def file_format(name: str) -> str | None:
    """The format a file name says, or None (then bytes are compared)."""
    low = name.lower()
    base = PurePosixPath(low).name
    if EVENTS_MARK in base and base.startswith("events.out."):
        return "tfevents"
    for suffix, fmt in ((".keras", "keras"), (".h5", "hdf5"), (".hdf5", "hdf5"), (".pt", "torch"),
                        (".pth", "torch"), (".safetensors", "safetensors"), (".npy", "npy"), (".npz", "npz"),
                        (".csv", "csv"), (".tsv", "csv"), (".jsonl", "jsonl"), (".json", "json")):
        if low.endswith(suffix):
            return fmt
    return None


def compare_files(a: Path, b: Path, name: str | None = None) -> ContentDiff | None:
    """Compare two files by the content their format holds; None when the format is not known.

    A file that cannot be read as its format is reported as differing in content, with why.
    """
    fmt = file_format(name or a.name)
    if fmt is None:
        return None
    try:
        return _COMPARERS[fmt](a, b)
    except (LauncherError, OSError, ValueError, KeyError, zipfile.BadZipFile, struct.error) as exc:
        why = exc.one_line() if isinstance(exc, LauncherError) else f"{type(exc).__name__}: {exc}"
        return ContentDiff(fmt, False, [], f"cannot be read as {fmt}: {why}")


# ---------------------------------------------------------------- JSON and CSV


def _strip_volatile(value: Any, path: str, removed: set[str]) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, str) and volatile_field(k):
                removed.add(f"{path}.{k}" if path else k)
                continue
            out[k] = _strip_volatile(v, f"{path}.{k}" if path else str(k), removed)
        return out
    if isinstance(value, list):
        return [_strip_volatile(v, f"{path}[{i}]", removed) for i, v in enumerate(value)]
    return value


def first_json_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first path where two parsed JSON values differ, with both values (shortened)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                return f"{sub}: only in {'the run' if k not in a else 'the reference'}"
            found = first_json_difference(a[k], b[k], sub)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_json_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path or 'value'}: {len(a)} items -> {len(b)}"
        return None
    if a == b and type(a) is type(b):
        return None
    return f"{path or 'value'}: {_short(a)} -> {_short(b)}"


def _short(v: Any) -> str:
    try:
        text = json.dumps(v) if not isinstance(v, str) else repr(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _volatile_diffs(removed_a: set[str], removed_b: set[str], a: Any, b: Any) -> list[str]:
    """The volatile fields whose values differ (or that only one file has)."""
    out = []
    for path in sorted(removed_a | removed_b):
        if _lookup(a, path) != _lookup(b, path):
            out.append(path)
    return out


def _lookup(value: Any, path: str) -> Any:
    cur = value
    for part in path.replace("[", ".[").split("."):
        if not part:
            continue
        if part.startswith("["):
            idx = int(part[1:-1])
            cur = cur[idx] if isinstance(cur, list) and idx < len(cur) else None
        else:
            cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def _compare_json_values(fmt: str, a: Any, b: Any, byte_equal: bool) -> ContentDiff:
    ra: set[str] = set()
    rb: set[str] = set()
    sa, sb = _strip_volatile(a, "", ra), _strip_volatile(b, "", rb)
    volatile = [f"field {p}" for p in _volatile_diffs(ra, rb, a, b)][:10]
    diff = first_json_difference(sa, sb)
    if diff is None and not volatile and not byte_equal:
        volatile = ["formatting (key order, spacing)"]
    return ContentDiff(fmt, diff is None, volatile, diff)


def compare_json(a: Path, b: Path) -> ContentDiff:
    ba, bb = a.read_bytes(), b.read_bytes()
    return _compare_json_values("json", json.loads(ba), json.loads(bb), ba == bb)


def compare_jsonl(a: Path, b: Path) -> ContentDiff:
    ba, bb = a.read_bytes(), b.read_bytes()
    rows_a = [json.loads(line) for line in ba.splitlines() if line.strip()]
    rows_b = [json.loads(line) for line in bb.splitlines() if line.strip()]
    result = _compare_json_values("jsonl", rows_a, rows_b, ba == bb)
    if result.difference and result.difference.startswith("["):
        line, _, rest = result.difference[1:].partition("]")
        result.difference = f"line {int(line) + 1}{rest}"
    result.volatile = [v.replace("field [", "field line ").replace("].", ": ") for v in result.volatile]
    return result


def compare_csv(a: Path, b: Path) -> ContentDiff:
    ba, bb = a.read_bytes(), b.read_bytes()
    delim = "\t" if a.name.lower().endswith(".tsv") else ","
    rows_a = list(csv.reader(io.StringIO(ba.decode("utf-8")), delimiter=delim))
    rows_b = list(csv.reader(io.StringIO(bb.decode("utf-8")), delimiter=delim))
    header = rows_a[0] if rows_a else []
    skip = {i for i, name in enumerate(header) if volatile_field(name.strip())}
    volatile: set[str] = set()
    difference = None
    if header != (rows_b[0] if rows_b else []):
        difference = f"header: {_short(header)} -> {_short(rows_b[0] if rows_b else [])}"
    for r, (ra, rb) in enumerate(zip(rows_a, rows_b, strict=False)):
        if difference:
            break
        for c in range(max(len(ra), len(rb))):
            x = ra[c] if c < len(ra) else None
            y = rb[c] if c < len(rb) else None
            if x == y:
                continue
            col = header[c] if c < len(header) else str(c)
            if c in skip:
                volatile.add(f"column {col}")
                continue
            difference = f"row {r} column {col}: {_short(x)} -> {_short(y)}"
            break
    if difference is None and len(rows_a) != len(rows_b):
        difference = f"{len(rows_a)} rows -> {len(rows_b)}"
    vol = sorted(volatile)
    if difference is None and not vol and ba != bb:
        vol = ["formatting (line endings, quoting)"]
    return ContentDiff("csv", difference is None, vol, difference)


# ---------------------------------------------------------------- numpy


def compare_npy(a: Path, b: Path) -> ContentDiff:
    if a.name.endswith(".npz") and is_canonical_npz(a) and is_canonical_npz(b):
        wa, wb = load_canonical(a), load_canonical(b)
    else:
        wa, wb = load_npy(a), load_npy(b)
    volatile: list[str] = []
    if a.name.endswith(".npz"):
        volatile += _zip_volatile(a, b)
    return _model_result("npz" if a.name.endswith(".npz") else "npy", diff_weights(wa, wb), volatile)


def _zip_volatile(a: Path, b: Path) -> list[str]:
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        da = {i.filename: (i.date_time, i.extra, i.external_attr, i.create_system) for i in za.infolist()}
        db = {i.filename: (i.date_time, i.extra, i.external_attr, i.create_system) for i in zb.infolist()}
    out = []
    if any(da[n][0] != db[n][0] for n in da if n in db):
        out.append("zip entry dates")
    if any(da[n][1:] != db[n][1:] for n in da if n in db):
        out.append("zip entry attributes")
    return out


# ---------------------------------------------------------------- Keras and HDF5


def _h5py() -> Any:
    from launcher.modeldiff import _import_h5py

    return _import_h5py()


def _h5_content(handle: Any) -> dict[str, Any]:
    """Every dataset (path -> array) and attribute (path@name -> value) of an HDF5 file."""
    h5py = _h5py()
    out: dict[str, Any] = {}

    def attrs(prefix: str, obj: Any) -> None:
        for k, v in obj.attrs.items():
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            if isinstance(v, str) and v[:1] in "{[":
                try:
                    v = json.loads(v)
                except ValueError:
                    pass
            out[f"{prefix}@{k}"] = v

    attrs("/", handle)

    def visit(name: str, obj: Any) -> None:
        attrs(name, obj)
        if isinstance(obj, h5py.Dataset):
            out[name] = np.asarray(obj[()])

    handle.visititems(visit)
    return out


def _compare_h5_handles(fmt: str, fa: Any, fb: Any, source_a: Path, source_b: Path,
                        volatile: list[str], byte_equal: bool, label: str) -> ContentDiff:
    from launcher.modeldiff import _h5_arrays

    try:
        model = diff_weights(Weights(source_a, _h5_arrays(fa, source_a)), Weights(source_b, _h5_arrays(fb, source_b)))
    except LauncherError:
        model = None
    if model is not None and not model.identical:
        return _model_result(fmt, model, volatile)
    ca, cb = _h5_content(fa), _h5_content(fb)
    difference = None
    for key in list(ca) + [k for k in cb if k not in ca]:
        if key not in ca or key not in cb:
            difference = f"{key}: only in {'the run' if key not in ca else 'the reference'}"
            break
        x, y = ca[key], cb[key]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            xa, ya = np.asarray(x), np.asarray(y)
            if xa.dtype.kind in "OSUV" or ya.dtype.kind in "OSUV":
                same = xa.shape == ya.shape and xa.tolist() == ya.tolist()
            else:
                same = diff_arrays("", "", xa, ya).status == "identical"
            if not same:
                difference = f"{key} differs"
                break
        elif "@" in key and isinstance(x, (dict, list)) and isinstance(y, (dict, list)):
            found = first_json_difference(x, y)
            if found:
                difference = f"{key}: {found}"
                break
        elif x != y:
            difference = f"{key}: {_short(str(x))} -> {_short(str(y))}"
            break
    if difference is None and not byte_equal:
        volatile = [*volatile, f"{label} bytes (HDF5 layout or object times)"]
    return ContentDiff(fmt, difference is None, volatile, difference, model)


def compare_hdf5(a: Path, b: Path) -> ContentDiff:
    h5py = _h5py()
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        return _compare_h5_handles("hdf5", fa, fb, a, b, [], _same_bytes(a, b), "HDF5")


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def _renumber_shared_ids(value: Any, seen: dict[Any, int]) -> Any:
    """Keras writes Python object ids as ``shared_object_id``: keep which objects are shared, not the ids."""
    if isinstance(value, dict):
        return {k: (seen.setdefault(v, len(seen)) if k == "shared_object_id" else _renumber_shared_ids(v, seen))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_renumber_shared_ids(v, seen) for v in value]
    return value


def compare_keras(a: Path, b: Path) -> ContentDiff:
    """A Keras 3 archive: config.json, metadata.json (date_saved ignored), model.weights.h5, assets."""
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        names_a, names_b = za.namelist(), zb.namelist()
        if sorted(names_a) != sorted(names_b):
            only = sorted(set(names_a) ^ set(names_b))
            return ContentDiff("keras", False, [], f"archive members differ: {', '.join(only[:5])}")
        volatile = _zip_volatile(a, b)
        result = ContentDiff("keras", True, volatile)
        for name in names_a:
            da, db = za.read(name), zb.read(name)
            if name.endswith(".json"):
                ja, jb = json.loads(da), json.loads(db)
                ra, rb = _renumber_shared_ids(ja, {}), _renumber_shared_ids(jb, {})
                if (ra, rb) != (ja, jb) and ra == rb and ja != jb:
                    result.volatile.append(f"{name} shared_object_id (Python object ids)")
                part = _compare_json_values("json", ra, rb, da == db or ra == rb)
                result.volatile += [f"{name} {v}" for v in part.volatile]
                if part.difference and result.same:
                    result = ContentDiff("keras", False, result.volatile, f"{name}: {part.difference}")
            elif name.endswith(".h5"):
                h5py = _h5py()
                with h5py.File(io.BytesIO(da), "r") as fa, h5py.File(io.BytesIO(db), "r") as fb:
                    part = _compare_h5_handles("keras", fa, fb, a, b, [], da == db, name)
                result.volatile += part.volatile
                if part.model is not None:
                    result.model = part.model
                if not part.same:
                    return ContentDiff("keras", False, result.volatile, part.difference, part.model)
            elif da != db and result.same:
                result = ContentDiff("keras", False, result.volatile, f"member {name} differs")
        return result


# ---------------------------------------------------------------- PyTorch and safetensors


def compare_torch(a: Path, b: Path) -> ContentDiff:
    """torch.save zips: every tensor (state dicts, optimizer state) and every other value."""
    ta, tb = open_torch_zip(a), open_torch_zip(b)
    with ta.zf, tb.zf:
        volatile: list[str] = []
        ids = [z.members.get(f"{z.prefix}.data/serialization_id") for z in (ta, tb)]
        if ids[0] is not None and ids[1] is not None and ta.zf.read(ids[0]) != tb.zf.read(ids[1]):
            volatile.append("serialization id")
        if _zip_dates(ta.zf) != _zip_dates(tb.zf):
            volatile.append("zip entry dates")
        if ta.prefix != tb.prefix:
            volatile.append(f"archive name ({ta.prefix.rstrip('/')} -> {tb.prefix.rstrip('/')})")
        leaves_a, leaves_b = list(flatten_state(ta.obj)), list(flatten_state(tb.obj))
        arrays_a = [WeightArray(*_layer_array(k), ta.array(v)) for k, v in leaves_a if isinstance(v, TorchTensor)]
        arrays_b = [WeightArray(*_layer_array(k), tb.array(v)) for k, v in leaves_b if isinstance(v, TorchTensor)]
        model = diff_weights(Weights(a, arrays_a), Weights(b, arrays_b))
        if not model.identical:
            return _model_result("torch", model, volatile)
        other_a = {k: v for k, v in leaves_a if not isinstance(v, TorchTensor)}
        other_b = {k: v for k, v in leaves_b if not isinstance(v, TorchTensor)}
        for key in list(other_a) + [k for k in other_b if k not in other_a]:
            if key not in other_a or key not in other_b:
                return ContentDiff("torch", False, volatile,
                                   f"{key}: only in {'the run' if key not in other_a else 'the reference'}", model)
            if other_a[key] != other_b[key]:
                return ContentDiff("torch", False, volatile,
                                   f"{key}: {_short(other_a[key])} -> {_short(other_b[key])}", model)
        return ContentDiff("torch", True, volatile, None, model)


def _zip_dates(zf: zipfile.ZipFile) -> list[tuple[int, ...]]:
    return [i.date_time for i in zf.infolist()]


def _layer_array(name: str) -> tuple[str, str]:
    layer, _, leaf = name.rpartition(".")
    return (layer or name, leaf if layer else "0")


def compare_safetensors(a: Path, b: Path) -> ContentDiff:
    from launcher.modeldiff import load_safetensors

    model = diff_weights(load_safetensors(a), load_safetensors(b))
    ha, _ = read_safetensors(a)
    hb, _ = read_safetensors(b)
    meta = first_json_difference(ha.get("__metadata__"), hb.get("__metadata__"))
    if not model.identical:
        return _model_result("safetensors", model, [])
    if meta:
        return ContentDiff("safetensors", False, [], f"__metadata__ {meta}", model)
    volatile = [] if _same_bytes(a, b) else ["header layout (tensor order, padding)"]
    return ContentDiff("safetensors", True, volatile, None, model)


# ---------------------------------------------------------------- protobuf wire format


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def proto_fields(buf: bytes | memoryview) -> Iterator[tuple[int, int, Any, int, int]]:
    """(field number, wire type, value, start, end) of each field of a serialized message."""
    pos = 0
    n = len(buf)
    while pos < n:
        start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = bytes(buf[pos:pos + 8]), pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = bytes(buf[pos:pos + length]), pos + length
        elif wire == 5:
            value, pos = bytes(buf[pos:pos + 4]), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > n:
            raise ValueError("truncated field")
        yield number, wire, value, start, pos


def _without_fields(buf: bytes, drop: set[int]) -> bytes:
    out = bytearray()
    for number, _, _, start, end in proto_fields(buf):
        if number not in drop:
            out += buf[start:end]
    return bytes(out)


# ---------------------------------------------------------------- TensorBoard events


def read_records(path: Path) -> list[bytes]:
    """The records of a TFRecord file (length, its masked crc, data, its masked crc)."""
    raw = path.read_bytes()
    out = []
    pos = 0
    while pos < len(raw):
        if pos + 12 > len(raw):
            raise ValueError(f"truncated record header at byte {pos}")
        (length,) = struct.unpack_from("<Q", raw, pos)
        pos += 12
        if pos + length + 4 > len(raw):
            raise ValueError(f"truncated record at byte {pos - 12}")
        out.append(raw[pos:pos + length])
        pos += length + 4
    return out


_EVENT_WALL_TIME = 1
_EVENT_STEP = 2
_EVENT_SUMMARY = 5


def _event_where(event: bytes) -> str:
    step = 0
    tags: list[str] = []
    for number, _, value, _, _ in proto_fields(event):
        if number == _EVENT_STEP:
            step = value
        elif number == _EVENT_SUMMARY:
            for vn, _, v, _, _ in proto_fields(value):
                if vn == 1:  # Summary.value
                    tags += [t.decode("utf-8", "replace") for tn, _, t, _, _ in proto_fields(v) if tn == 1]
    return f"step {step}" + (f", tag {', '.join(tags[:3])}" if tags else "")


def compare_events(a: Path, b: Path) -> ContentDiff:
    """TensorBoard event files: every Event compared without its wall_time (field 1)."""
    ra, rb = read_records(a), read_records(b)
    volatile = []
    if a.name != b.name:
        volatile.append("file name (time, host, pid)")
    times_differ = False
    difference = None
    for i, (x, y) in enumerate(zip(ra, rb, strict=False)):
        if x == y:
            continue
        sx, sy = _without_fields(x, {_EVENT_WALL_TIME}), _without_fields(y, {_EVENT_WALL_TIME})
        if sx == sy:
            times_differ = True
            continue
        difference = f"event {i} ({_event_where(x)}) differs"
        break
    if difference is None and len(ra) != len(rb):
        difference = f"{len(ra)} events -> {len(rb)}"
    if times_differ:
        volatile.append("event wall times")
    return ContentDiff("tfevents", difference is None, volatile, difference)


# ---------------------------------------------------------------- SavedModel (tensor bundle)

# TensorFlow DataType enum -> numpy dtype (strings are compared as raw bytes).
_TF_DTYPES = {1: "<f4", 2: "<f8", 3: "<i4", 4: "u1", 5: "<i2", 6: "i1", 9: "<i8", 10: "?", 8: "<c8",
              14: "<u2", 17: "<u2", 18: "<c16", 19: "<f2", 22: "<u4", 23: "<u8"}
_TABLE_MAGIC = 0xDB4775248B80FB57


def _block_handle(buf: bytes | memoryview, pos: int = 0) -> tuple[int, int, int]:
    offset, pos = _varint(buf, pos)
    size, pos = _varint(buf, pos)
    return offset, size, pos


def _read_block(raw: bytes, offset: int, size: int) -> bytes:
    if offset + size + 5 > len(raw):
        raise ValueError("block beyond the end of the table")
    if raw[offset + size] != 0:
        raise ValueError("compressed table blocks are not supported")
    return raw[offset:offset + size]


def _block_entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 * (restarts + 1)
    pos = 0
    key = b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        vlen, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + vlen]
        pos += vlen


def read_table(path: Path) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of a LevelDB-format table (TensorFlow's checkpoint index)."""
    raw = path.read_bytes()
    out: list[tuple[bytes, bytes]] = []
    if len(raw) < 48 or struct.unpack_from("<Q", raw, len(raw) - 8)[0] != _TABLE_MAGIC:
        raise ValueError(f"{path.name} is not a TensorFlow table (bad magic)")
    footer = raw[-48:]
    _, _, pos = _block_handle(footer)
    index_off, index_size, _ = _block_handle(footer, pos)
    for _, handle in _block_entries(_read_block(raw, index_off, index_size)):
        off, size, _ = _block_handle(handle)
        out.extend(_block_entries(_read_block(raw, off, size)))
    return out


def load_tensor_bundle(variables: Path) -> Weights:
    """``variables/variables.index`` + data shards -> arrays (layer = the variable's path)."""
    entries = read_table(variables / "variables.index")
    shards: dict[int, bytes] = {}
    arrays: list[WeightArray] = []
    num_shards = 1
    for key, value in entries:
        if key == b"":
            num_shards = next((v for n, _, v, _, _ in proto_fields(value) if n == 1), 1)
            continue
        dtype = shard = offset = size = 0
        shape: list[int] = []
        for n, _, v, _, _ in proto_fields(value):
            if n == 1:
                dtype = v
            elif n == 2:
                for dn, _, dim, _, _ in proto_fields(v):
                    if dn == 2:
                        shape.append(next((s for sn, _, s, _, _ in proto_fields(dim) if sn == 1), 0))
            elif n == 3:
                shard = v
            elif n == 4:
                offset = v
            elif n == 5:
                size = v
        if shard not in shards:
            shards[shard] = (variables / f"variables.data-{shard:05d}-of-{num_shards:05d}").read_bytes()
        data = shards[shard][offset:offset + size]
        np_dtype = _TF_DTYPES.get(dtype)
        if np_dtype is None or np.dtype(np_dtype).itemsize * int(np.prod(shape, dtype=np.int64)) != size:
            value_arr = np.frombuffer(data, dtype=np.uint8)  # strings, or a layout not understood: bytes
        else:
            value_arr = np.frombuffer(data, dtype=np.dtype(np_dtype)).reshape(shape)
        name = key.decode("utf-8", "replace").removesuffix("/.ATTRIBUTES/VARIABLE_VALUE")
        layer, _, leaf = name.rpartition("/")
        arrays.append(WeightArray(layer or name, leaf if layer else "0", value_arr))
    return Weights(variables, arrays)


def compare_savedmodel(a: Path, b: Path) -> ContentDiff:
    """Two SavedModel directories: their variables by tensor, other files by bytes.

    ``saved_model.pb`` and ``fingerprint.pb`` are not compared: TensorFlow writes object ids and
    checksums into them that change on every export of the same model.
    """
    wa, wb = load_tensor_bundle(a / "variables"), load_tensor_bundle(b / "variables")
    model = diff_weights(wa, wb)
    volatile = [f"{n} (not compared)" for n in SAVED_MODEL_UNCOMPARED
                if (a / n).is_file() and (b / n).is_file() and not _same_bytes(a / n, b / n)]
    if not model.identical:
        return _model_result("savedmodel", model, volatile)
    files_a = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    skip = set(SAVED_MODEL_UNCOMPARED)
    for rel in sorted(files_a | files_b):
        if rel in skip or rel.startswith("variables/"):
            continue
        if rel not in files_a or rel not in files_b:
            return ContentDiff("savedmodel", False, volatile, f"{rel}: in one SavedModel only", model)
        if not _same_bytes(a / rel, b / rel):
            return ContentDiff("savedmodel", False, volatile, f"{rel} differs", model)
    if (files_a & {f for f in files_a if f.startswith("variables/")}) and not all(
            _same_bytes(a / f, b / f) for f in files_a if f.startswith("variables/") and f in files_b):
        volatile.append("variables bytes (tensor order or layout)")
    return ContentDiff("savedmodel", True, volatile, None, model)


def savedmodel_root(path: Path, stop: Path) -> Path | None:
    """The SavedModel directory holding ``path`` (a directory with saved_model.pb), below ``stop``."""
    for parent in path.parents:
        if parent == stop or stop not in parent.parents:
            return None
        if (parent / SAVED_MODEL_PB).is_file() and (parent / "variables").is_dir():
            return parent
    return None


_COMPARERS = {
    "keras": compare_keras, "hdf5": compare_hdf5, "torch": compare_torch, "safetensors": compare_safetensors,
    "npy": compare_npy, "npz": compare_npy, "csv": compare_csv, "json": compare_json, "jsonl": compare_jsonl,
    "tfevents": compare_events,
}
