"""TensorFlow's files compared by content: TensorBoard event files, SavedModel directories (read by hand)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from launcher.verify.contentlogs import ContentDiff, model_result, same_bytes
from launcher.verify.modeldiff import diff_weights
from launcher.verify.weights import WeightArray, Weights

SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_PBTXT = "saved_model.pbtxt"
SAVED_MODEL_UNCOMPARED = (SAVED_MODEL_PB, "fingerprint.pb")
SAVEDMODEL = "savedmodel"  # the format's name in a content diff


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
                if (a / n).is_file() and (b / n).is_file() and not same_bytes(a / n, b / n)]
    if not model.identical:
        return model_result(SAVEDMODEL, model, volatile)
    files_a = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    skip = set(SAVED_MODEL_UNCOMPARED)
    for rel in sorted(files_a | files_b):
        if rel in skip or rel.startswith("variables/"):
            continue
        if rel not in files_a or rel not in files_b:
            return ContentDiff(SAVEDMODEL, False, volatile, f"{rel}: in one SavedModel only", model)
        if not same_bytes(a / rel, b / rel):
            return ContentDiff(SAVEDMODEL, False, volatile, f"{rel} differs", model)
    if (files_a & {f for f in files_a if f.startswith("variables/")}) and not all(
            same_bytes(a / f, b / f) for f in files_a if f.startswith("variables/") and f in files_b):
        volatile.append("variables bytes (tensor order or layout)")
    return ContentDiff(SAVEDMODEL, True, volatile, None, model)


def savedmodel_root(path: Path, stop: Path) -> Path | None:
    """The SavedModel directory holding ``path`` (a directory with saved_model.pb), below ``stop``."""
    for parent in path.parents:
        if parent == stop or stop not in parent.parents:
            return None
        if (parent / SAVED_MODEL_PB).is_file() and (parent / "variables").is_dir():
            return parent
    return None
