"""One run checked against its own records: the canonical weights against the per-layer digests
(weights/layers.json) and against the native save where it can be read."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from launcher.errors import Corrupt, LauncherError
from launcher.records.manifest import Manifest
from launcher.verify.differences import CANONICAL_MODEL, LAYERS
from launcher.verify.formats import native_saves
from launcher.verify.jsonlines import read_json
from launcher.verify.modeldiff import Weights, load_canonical, load_weights


class LayersCheck(TypedDict):
    arrays: int
    ok: bool


class NativeCheck(TypedDict):
    source: str
    ok: bool | None  # None: the native save could not be read (skipped)
    skipped: NotRequired[str]


class Consistency(TypedDict):
    """One run checked against its own records (``consistency`` in verify's JSON); None where not recorded."""

    layers: LayersCheck | None
    native: NativeCheck | None


def _digest_arrays(weights: Weights) -> list[tuple[str, str, str]]:
    from launcher.runtime.fingerprints import array_digest

    return [(a.layer, a.array, array_digest(a.value)) for a in weights]


def _inconsistent_hint(m: Manifest) -> str:
    return ("the run's files were altered after training; re-pull the run (`launcher pull "
            f"{m.run_id}`) if the host's copy is intact, or run it again")


def check_consistency(m: Manifest) -> Consistency:
    """Cross-check one run's records of its final weights against each other.

    ``model/canonical.npz`` against ``weights/layers.json`` (the per-layer sha256 the runtime
    wrote at the end of training) and against the native save where it can be read. A
    mismatch means a file was altered after training: Corrupt (exit 13), naming the array.
    """
    out: Consistency = {"layers": None, "native": None}
    if not m.artifact(CANONICAL_MODEL):
        return out
    canonical = _digest_arrays(load_canonical(m.file(CANONICAL_MODEL)))
    out["layers"] = _check_layers(m, canonical)
    out["native"] = _check_native(m, canonical)
    return out


def _check_layers(m: Manifest, canonical: list[tuple[str, str, str]]) -> LayersCheck | None:
    """The canonical weights against weights/layers.json; None when the run has no such record."""
    doc = read_json(m.file(LAYERS)) if m.artifact(LAYERS) else None
    if not (isinstance(doc, dict) and isinstance(doc.get("layers"), list)):
        return None
    hint = _inconsistent_hint(m)
    recorded = [(str(layer.get("name")), str(arr.get("index")), str(arr.get("sha256")))
                for layer in doc["layers"] if isinstance(layer, dict)
                for arr in layer.get("arrays") or [] if isinstance(arr, dict)]
    for (layer, array, got), rec in zip(canonical, recorded, strict=False):
        if (layer, array, got) != rec:
            raise Corrupt(f"run {m.run_id} is inconsistent: {CANONICAL_MODEL.removeprefix('outputs/')} layer "
                          f"{layer} array {array} (sha256 {got[7:19]}…) does not match its per-layer digest in "
                          f"weights/layers.json ({rec[0]}/{rec[1]} {rec[2][7:19]}…)", hint)
    if len(canonical) != len(recorded):
        raise Corrupt(f"run {m.run_id} is inconsistent: {len(canonical)} arrays in canonical.npz, "
                      f"{len(recorded)} in weights/layers.json", hint)
    return {"arrays": len(canonical), "ok": True}


def _check_native(m: Manifest, canonical: list[tuple[str, str, str]]) -> NativeCheck | None:
    """The canonical weights against the first native save that can be read (or the last that could not)."""
    out: NativeCheck | None = None
    for rel in native_saves():
        if not m.artifact(rel):
            continue
        try:
            native = load_weights(m.file(rel))
        except LauncherError as exc:
            out = {"source": rel, "ok": None, "skipped": exc.one_line()}
            continue
        found = {d for _, _, d in _digest_arrays(native)}
        shapes = {(a.value.shape, a.value.dtype.str) for a in native}
        by_key = {(a.layer, a.array): a for a in native}
        canonical_weights = load_canonical(m.file(CANONICAL_MODEL)) if len(canonical) else None
        for (layer, array, digest), wa in zip(canonical, canonical_weights or [], strict=False):
            if digest in found:
                continue
            twin = by_key.get((layer, array))
            comparable = twin is not None or (wa.value.shape, wa.value.dtype.str) in shapes
            if comparable:
                raise Corrupt(f"run {m.run_id} is inconsistent: canonical.npz layer {layer} array {array} is not "
                              f"in its native save {rel.removeprefix('outputs/')}", _inconsistent_hint(m))
        return {"source": rel, "ok": True}
    return out
