"""Saved weights compared by content: .npy/.npz, .keras and HDF5, PyTorch zips, safetensors."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from launcher.errors import LauncherError
from launcher.verify.contentlogs import (
    ContentDiff,
    compare_json_values,
    first_json_difference,
    model_result,
    same_bytes,
    short,
)
from launcher.verify.kerasweights import h5_arrays, import_h5py
from launcher.verify.modeldiff import diff_arrays, diff_weights
from launcher.verify.torchweights import (
    METADATA,
    TorchTensor,
    flatten_state,
    load_safetensors,
    open_torch_zip,
    read_safetensors,
)
from launcher.verify.weights import WeightArray, Weights, is_canonical_npz, load_canonical, load_npy

# ---------------------------------------------------------------- numpy


def compare_npy(a: Path, b: Path) -> ContentDiff:
    if a.name.endswith(".npz") and is_canonical_npz(a) and is_canonical_npz(b):
        wa, wb = load_canonical(a), load_canonical(b)
    else:
        wa, wb = load_npy(a), load_npy(b)
    volatile: list[str] = []
    if a.name.endswith(".npz"):
        volatile += _zip_volatile(a, b)
    return model_result("npz" if a.name.endswith(".npz") else "npy", diff_weights(wa, wb), volatile)


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


def _h5_content(handle: Any) -> dict[str, Any]:
    """Every dataset (path -> array) and attribute (path@name -> value) of an HDF5 file (an attribute's
    value is whatever the file holds: a number, a string, decoded JSON, an array)."""
    h5py = import_h5py()
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
    try:
        model = diff_weights(Weights(source_a, h5_arrays(fa, source_a)), Weights(source_b, h5_arrays(fb, source_b)))
    except LauncherError:
        model = None
    if model is not None and not model.identical:
        return model_result(fmt, model, volatile)
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
            difference = f"{key}: {short(str(x))} -> {short(str(y))}"
            break
    if difference is None and not byte_equal:
        volatile = [*volatile, f"{label} bytes (HDF5 layout or object times)"]
    return ContentDiff(fmt, difference is None, volatile, difference, model)


def compare_hdf5(a: Path, b: Path) -> ContentDiff:
    h5py = import_h5py()
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        return _compare_h5_handles("hdf5", fa, fb, a, b, [], same_bytes(a, b), "HDF5")


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
                part = compare_json_values("json", ra, rb, da == db or ra == rb)
                result.volatile += [f"{name} {v}" for v in part.volatile]
                if part.difference and result.same:
                    result = ContentDiff("keras", False, result.volatile, f"{name}: {part.difference}")
            elif name.endswith(".h5"):
                h5py = import_h5py()
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
            return model_result("torch", model, volatile)
        other_a = {k: v for k, v in leaves_a if not isinstance(v, TorchTensor)}
        other_b = {k: v for k, v in leaves_b if not isinstance(v, TorchTensor)}
        for key in list(other_a) + [k for k in other_b if k not in other_a]:
            if key not in other_a or key not in other_b:
                return ContentDiff("torch", False, volatile,
                                   f"{key}: only in {'the run' if key not in other_a else 'the reference'}", model)
            if other_a[key] != other_b[key]:
                return ContentDiff("torch", False, volatile,
                                   f"{key}: {short(other_a[key])} -> {short(other_b[key])}", model)
        return ContentDiff("torch", True, volatile, None, model)


def _zip_dates(zf: zipfile.ZipFile) -> list[tuple[int, ...]]:
    return [i.date_time for i in zf.infolist()]


def _layer_array(name: str) -> tuple[str, str]:
    layer, _, leaf = name.rpartition(".")
    return (layer or name, leaf if layer else "0")


def compare_safetensors(a: Path, b: Path) -> ContentDiff:
    model = diff_weights(load_safetensors(a), load_safetensors(b))
    ha, _ = read_safetensors(a)
    hb, _ = read_safetensors(b)
    meta = first_json_difference(ha.metadata, hb.metadata)
    if not model.identical:
        return model_result("safetensors", model, [])
    if meta:
        return ContentDiff("safetensors", False, [], f"{METADATA} {meta}", model)
    volatile = [] if same_bytes(a, b) else ["header layout (tensor order, padding)"]
    return ContentDiff("safetensors", True, volatile, None, model)
