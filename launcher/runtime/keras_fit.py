"""Recording what ``keras.Model.fit`` does, without changes to the recipe.

For in-memory arrays the runtime does the per-epoch shuffle itself, with a generator seeded from
``LAUNCHER_SEED`` (unseeded under the ``off`` profile), and feeds fit() a tf.data pipeline of
exactly those batches, so the batch order it writes is the order the model saw. A tf.data.Dataset
goes to fit() with one identity step added that digests each batch's contents as it is yielded;
other inputs (generators, a dataset with steps_per_epoch) go unchanged, their batch order marked
unrecorded.
Either way a callback writes the initial weights, per-epoch metrics, and, when fit() returns,
the final weights in canonical form and the native saves; and, when recipe.toml declares
``[probes]``, the model's outputs and Grad-CAM heatmaps on the probe examples taken from the
validation data fit() receives (launcher.runtime.probes).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

from launcher.runtime import fingerprints as fp
from launcher.runtime import probes as probemod
from launcher.runtime.record import Recorder


def keras_layers(model: Any) -> fp.Layers:
    """(layer name, weights) in model order; nested models count as one layer with all their weights."""
    return [(layer.name, [w.numpy() for w in layer.weights]) for layer in model.layers if layer.weights]


def _is_array(v: Any) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype") and type(v).__module__.startswith("numpy")


def _flatten(v: Any) -> tuple[list[Any], Any] | None:
    """Leaves and a structure spec for arrays nested in lists, tuples and dicts; None if not all arrays."""
    if v is None:
        return [], None
    if _is_array(v):
        return [v], "leaf"
    if isinstance(v, dict):
        leaves, specs = [], {}
        for k in sorted(v):
            sub = _flatten(v[k])
            if sub is None:
                return None
            leaves += sub[0]
            specs[k] = sub[1]
        return leaves, ("dict", specs)
    if isinstance(v, list | tuple):
        leaves, specs_l = [], []
        for item in v:
            sub = _flatten(item)
            if sub is None:
                return None
            leaves += sub[0]
            specs_l.append(sub[1])
        return leaves, (type(v).__name__, specs_l)
    return None


def _pack(spec: Any, leaves: list[Any]) -> Any:
    if spec is None:
        return None
    if spec == "leaf":
        return leaves.pop(0)
    kind, inner = spec
    if kind == "dict":
        return {k: _pack(s, leaves) for k, s in inner.items()}
    items = [_pack(s, leaves) for s in inner]
    return tuple(items) if kind == "tuple" else items


def _slice(v: Any, sl: slice) -> Any:
    if v is None:
        return None
    if _is_array(v):
        return v[sl]
    if isinstance(v, dict):
        return {k: _slice(x, sl) for k, x in v.items()}
    return type(v)(_slice(x, sl) for x in v)


class _Callback:
    """Built lazily as a keras.callbacks.Callback subclass (keras is not imported at module load)."""

    @staticmethod
    def make(keras: Any, rec: Recorder, begin: Callable[[int], None],
             batches: Callable[[int], list[str] | None], reason: str) -> Any:
        class LauncherRecorder(keras.callbacks.Callback):
            def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
                rec.record_initial_weights(keras_layers(self.model))

            def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
                begin(epoch)

            def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
                rec.record_batches(epoch, batches(epoch), reason)
                rec.record_metrics(epoch, dict(logs or {}))

        return LauncherRecorder()


class _ContentTap:
    """Digests of the batch contents a tf.data pipeline yields, as it yields them.

    Without steps_per_epoch, fit() opens a new iterator for every epoch after on_epoch_begin, so the
    digests gathered between two epoch starts are exactly that epoch's batches, in order.
    """

    def __init__(self) -> None:
        self.produced: list[str] = []

    def begin(self, _epoch: int) -> None:
        self.produced = []

    def batches(self, _epoch: int) -> list[str]:
        return list(self.produced)

    def wrap(self, tf: Any, ds: Any) -> Any:
        import hashlib

        def digest(*tensors: Any) -> Any:
            h = hashlib.sha256()
            for t in tensors:
                a = t.numpy()
                h.update(f"{a.dtype.str}|{list(a.shape)}|".encode())
                h.update(a.tobytes())
            self.produced.append("sha256:" + h.hexdigest())
            return 0

        def tap(*element: Any) -> Any:
            flat = tf.nest.flatten(element)
            done = tf.py_function(digest, flat, Tout=tf.int64)
            with tf.control_dependencies([done]):
                out = tf.nest.map_structure(tf.identity, element)
            return out if len(element) > 1 else out[0]

        return ds.map(tap)


def _save_final(rec: Recorder, model: Any) -> None:
    rec.record_final(keras_layers(model))
    model_dir = rec.path("model")
    for name, save in (("model.weights.h5", model.save_weights), ("model.keras", model.save)):
        try:
            save(str(model_dir / name))
        except Exception as exc:  # a native save is a convenience; the canonical file is the record
            print(f"launcher: could not write model/{name}: {type(exc).__name__}: {exc}", flush=True)


def _array_pipeline(tf: Any, rec: Recorder, a: dict[str, Any], seq: Any) -> tuple[Any, dict[int, list[str]]]:
    """A tf.data pipeline yielding the seeded per-epoch batches of in-memory arrays, and their digests."""
    import numpy as np

    x, y, sw = a["x"], a["y"], a["sample_weight"]
    flat_x, flat_y, flat_w = _flatten(x), _flatten(y), _flatten(sw)
    assert flat_x is not None and flat_y is not None and flat_w is not None
    leaves = flat_x[0] + flat_y[0] + flat_w[0]
    n = len(leaves[0])
    bs = int(a["batch_size"] or 32)
    full = math.ceil(n / bs)
    per_epoch = full if a["steps_per_epoch"] is None else min(int(a["steps_per_epoch"]), full)
    first, last = int(a["initial_epoch"]), int(a["epochs"])
    shuffle = bool(a["shuffle"])
    rng = np.random.default_rng(seq)
    orders: dict[int, Any] = {}
    digests: dict[int, list[str]] = {}
    for epoch in range(first, last):
        order = rng.permutation(n) if shuffle else np.arange(n)
        orders[epoch] = order
        digests[epoch] = [fp.batch_digest(order[i * bs:(i + 1) * bs]) for i in range(per_epoch)]
    # Keras casts float arrays to floatx; do the same so the model sees what it would have seen.
    floatx = tf.keras.backend.floatx()
    cast = [leaf.astype(floatx) if leaf.dtype.kind == "f" and leaf.dtype != floatx else leaf
            for leaf in leaves]
    state = {"epoch": first}

    def gather(k: Any) -> list[Any]:
        idx = orders[state["epoch"]][int(k) * bs:(int(k) + 1) * bs]
        return [leaf[idx] for leaf in cast]

    def to_batch(k: Any) -> Any:
        outs = tf.numpy_function(gather, [k], [tf.as_dtype(c.dtype) for c in cast], stateful=True)
        for t, c in zip(outs, cast, strict=True):
            t.set_shape([None, *c.shape[1:]])
        outs = list(outs)
        bx = _pack(flat_x[1], outs)
        by = _pack(flat_y[1], outs)
        bw = _pack(flat_w[1], outs)
        return (bx,) if by is None else (bx, by) if bw is None else (bx, by, bw)

    ds = tf.data.Dataset.range(per_epoch).map(to_batch).prefetch(2)
    return (ds, state), digests


def install(keras: Any, tf: Any, rec: Recorder) -> Callable[..., Any]:
    """Replace keras.Model.fit with a recording wrapper; returns the original."""
    original = keras.Model.fit
    if getattr(original, "__launcher_wrapped__", False):
        return original
    sig = inspect.signature(original)

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        a.pop("self", None)
        extra = a.pop("kwargs", {}) or {}
        rec.fits += 1
        callbacks = list(a["callbacks"] or [])
        arrays_in = _flatten(a["x"]) is not None and a["x"] is not None and _flatten(a["y"]) is not None \
            and _flatten(a["sample_weight"]) is not None
        if not arrays_in:
            tapped = isinstance(a["x"], tf.data.Dataset) and a["steps_per_epoch"] is None
            if tapped:
                tap = _ContentTap()
                a["x"] = tap.wrap(tf, a["x"])
                callbacks.insert(0, _Callback.make(keras, rec, tap.begin, tap.batches, ""))
            else:
                reason = ("steps_per_epoch keeps one iterator across epochs" if a["steps_per_epoch"]
                          else "the input is neither arrays nor a tf.data.Dataset")
                callbacks.insert(0, _Callback.make(keras, rec, lambda _e: None, lambda _e: None, reason))
            a["callbacks"] = callbacks
            probe_set = probemod.capture(rec, a["validation_data"], self)
            history = original(self, **a, **extra)
            _save_final(rec, self)
            if probe_set is not None:
                probemod.record(rec, self, probe_set)
            return history
        vs = float(a["validation_split"] or 0.0)
        if vs and a["validation_data"] is None:
            n = len(_flatten(a["x"])[0][0])  # type: ignore[index]
            split = math.floor(n * (1.0 - vs))  # Keras keeps the last samples for validation
            tail = slice(split, None)
            val: tuple[Any, ...] = (_slice(a["x"], tail), _slice(a["y"], tail))
            if a["sample_weight"] is not None:
                val = (*val, _slice(a["sample_weight"], tail))
            a["validation_data"] = val
            for key in ("x", "y", "sample_weight"):
                a[key] = _slice(a[key], slice(0, split))
        a["validation_split"] = 0.0
        named: dict[str, Any] = {}
        for key in ("x", "y", "sample_weight"):
            flat = _flatten(a[key])
            assert flat is not None
            for i, leaf in enumerate(flat[0]):
                named[key if len(flat[0]) == 1 else f"{key}/{i}"] = leaf
        rec.record_train_data(named)
        if rec.seed is not None:
            entropy = [rec.seed, rec.fits - 1]
        else:
            # No launcher seed (`off`): draw from TensorFlow's global generator, as Keras' own shuffle
            # would, so a recipe that seeds TensorFlow itself still repeats its batch order.
            entropy = [int(v) for v in tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int64).numpy()]
        probe_set = probemod.capture(rec, a["validation_data"], self)
        (ds, state), digests = _array_pipeline(tf, rec, a, entropy)
        # First in the list: it must set the epoch before fit() opens the epoch's iterator.
        callbacks.insert(0, _Callback.make(keras, rec, lambda e: state.update(epoch=e), digests.get, ""))
        kw = {k: v for k, v in a.items() if k not in ("x", "y", "sample_weight", "batch_size", "shuffle",
                                                      "steps_per_epoch", "callbacks")}
        history = original(self, ds, callbacks=callbacks, shuffle=False, **kw, **extra)
        _save_final(rec, self)
        if probe_set is not None:
            probemod.record(rec, self, probe_set)
        return history

    fit.__launcher_wrapped__ = True  # type: ignore[attr-defined]
    keras.Model.fit = fit
    return original
