"""Recording what ``keras.Model.fit`` does, without changing what it trains.

fit() runs as the script wrote it: the same arguments, the same input pipeline, Keras' own shuffle.
The runtime only adds a callback, first in the list, that records the initial weights and each
epoch's metrics, and, when fit() returns, writes the final weights in canonical form and the native
saves; and, when a probe set is asked for, the model's outputs on it (launcher.runtime.probes).

The batch order is recorded as Keras' input pipeline yields it (:class:`BatchTap`): on the TensorFlow
backend, each time Keras opens an iterator on the training data the runtime hands it the same
dataset with one identity step added, which digests every batch's contents as it is produced and
files the digest under that iterator's number. An epoch's batches are those of the iterator Keras
opened for it. Values, order and random state are untouched, so a script trains on the same batches
under launcher as without it. Where that cannot be done (another backend, a distribution strategy,
``steps_per_epoch``, which keeps one iterator across epochs) the batch order is marked unrecorded.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from launcher.runtime import fingerprints as fp
from launcher.runtime import optrace
from launcher.runtime import probes as probemod
from launcher.runtime.record import Recorder

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from launcher.runtime.checkpoint import Resume

Logs = Mapping[str, float] | None  # what Keras hands a callback: each metric's value so far


class FitArguments(TypedDict):
    """The arguments of fit() launcher reads (bound to fit()'s signature, defaults applied); the
    values are the user's data and settings as given."""

    x: Any
    y: Any
    sample_weight: Any
    validation_data: Any
    validation_split: float | None
    steps_per_epoch: int | None

TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"  # where Keras 3 keeps TFEpochIterator
KERAS_STATE = "keras.npz"  # a checkpoint's Keras part (launcher.runtime.checkpoint)


def keras_layers(model: Any) -> fp.Layers:
    """(layer name, weights) in model order; nested models count as one layer with all their weights."""
    return [(layer.name, [w.numpy() for w in layer.weights]) for layer in model.layers if layer.weights]


def _is_array(v: Any) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype") and type(v).__module__.startswith("numpy")


def _leaves(v: Any) -> list[Any] | None:
    """The arrays nested in lists, tuples and dicts (dicts by sorted key); None if not all arrays."""
    if v is None:
        return []
    if _is_array(v):
        return [v]
    items = [v[k] for k in sorted(v)] if isinstance(v, dict) else list(v) if isinstance(v, list | tuple) else None
    if items is None:
        return None
    out: list[Any] = []
    for item in items:
        sub = _leaves(item)
        if sub is None:
            return None
        out += sub
    return out


def _slice(v: Any, sl: slice) -> Any:
    if v is None:
        return None
    if _is_array(v):
        return v[sl]
    if isinstance(v, dict):
        return {k: _slice(x, sl) for k, x in v.items()}
    return type(v)(_slice(x, sl) for x in v)


def _digest_arrays(arrays: list[Any]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype.str}|{list(a.shape)}|".encode())
        if a.dtype.kind == "O":  # strings: their bytes, not the object pointers
            h.update(b"\0".join(x if isinstance(x, bytes) else str(x).encode() for x in a.ravel()))
        else:
            h.update(a.tobytes())
    return "sha256:" + h.hexdigest()


class BatchTap:
    """The digests of the batches each training iterator yields, by the iterator's number."""

    def __init__(self, tf: Any) -> None:
        self.tf = tf
        self.opened = 0
        self.digests: dict[int, list[str]] = {}
        self.epoch_iterator: dict[int, int] = {}  # epoch -> the first iterator opened after it began
        self.unrecorded: str | None = "fit() did not open a TensorFlow input pipeline (another Keras backend?)"
        self.base: Any = None  # the training dataset Keras iterates, untapped

    def attach(self, epoch_iterator: Any) -> None:
        """Serve this Keras epoch iterator's datasets through the tap (see the module's doc)."""
        tf = self.tf
        self.base = epoch_iterator._get_iterator()
        if getattr(epoch_iterator, "steps_per_epoch", None):
            self.unrecorded = "steps_per_epoch keeps one iterator across epochs"
            return
        base = self.base
        if not isinstance(base, tf.data.Dataset):
            self.unrecorded = "a distribution strategy's input pipeline"
            return

        def digest(number: Any, *tensors: Any) -> Any:
            self.digests.setdefault(int(number), []).append(_digest_arrays([t.numpy() for t in tensors]))
            return 0

        def tap(number: Any, element: Any) -> Any:
            flat = [t for t in tf.nest.flatten(element) if t is not None]
            done = tf.py_function(digest, [number, *flat], Tout=tf.int64)
            with tf.control_dependencies([done]):
                return tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), element)

        def opened() -> Any:
            number = self.opened
            self.opened += 1
            self.digests[number] = []
            tag = tf.data.Dataset.from_tensors(tf.constant(number, tf.int64)).repeat()
            return tf.data.Dataset.zip((tag, base)).map(tap)

        try:
            opened()  # one made now: a pipeline the tap cannot wrap is left as it is
        except Exception as exc:  # a structure tf.nest or py_function cannot take
            self.unrecorded = f"the input pipeline could not be observed ({type(exc).__name__})"
            return
        self.opened, self.digests = 0, {}
        epoch_iterator._get_iterator = opened
        self.unrecorded = None

    def skip_epochs(self, n: int) -> None:
        """Open (and draw one batch from) n iterators on the training data, untapped, as the n epochs
        resumed past did: an input pipeline whose shuffle advances with each iterator stands where
        the uninterrupted run's stood."""
        if self.base is None:
            return
        for _ in range(n):
            next(iter(self.base), None)

    def epoch_begins(self, epoch: int) -> None:
        self.epoch_iterator[epoch] = self.opened

    def epoch_batches(self, epoch: int) -> tuple[list[str] | None, str]:
        """The batches of an epoch that has ended, or None and why not."""
        if self.unrecorded is not None:
            return None, self.unrecorded
        number = self.epoch_iterator.get(epoch, -1)
        if number not in self.digests:
            return None, "no new iterator was opened for this epoch"
        batches = list(self.digests[number])
        for old in [n for n in self.digests if n <= number]:
            del self.digests[old]
        return batches, ""


class _Attach:
    """Hands the next TFEpochIterator that Keras makes (fit()'s training iterator) to a tap."""

    pending: BatchTap | None = None

    @classmethod
    def patch(cls, trainer: Any) -> None:
        klass = trainer.TFEpochIterator
        if getattr(klass.__init__, "__launcher_wrapped__", False):
            return
        original = klass.__init__

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            tap, cls.pending = cls.pending, None
            if tap is not None:
                tap.attach(self)

        __init__.__launcher_wrapped__ = True  # type: ignore[attr-defined]
        klass.__init__ = __init__


def _iterations(model: Any) -> int | None:
    """The optimizer's step count (Keras counts it across fit() calls), or None."""
    try:
        return int(model.optimizer.iterations.numpy())
    except Exception:  # no optimizer yet, or another backend's variable
        return None


def _recorder_callback(keras: Any, rec: Recorder, tap: BatchTap,
                       resume: Resume | None = None) -> Any:
    trace = rec.trace
    points = rec.checkpoints

    class LauncherRecorder(keras.callbacks.Callback):  # type: ignore[misc]
        def layers(self) -> fp.Layers:
            return keras_layers(self.model)

        def covers(self) -> dict[str, str]:
            return {"module": type(self.model).__name__,
                    "optimizer": type(getattr(self.model, "optimizer", None)).__name__}

        def on_train_begin(self, logs: Logs = None) -> None:
            trace.covers = self.covers
            rec.record_initial_weights(keras_layers(self.model))
            if resume is not None:
                restore(keras, self.model, resume, rec, tap)
            trace.start(self.layers)

        def on_epoch_begin(self, epoch: int, logs: Logs = None) -> None:
            tap.epoch_begins(epoch)

        def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
            batches, why = tap.epoch_batches(epoch)
            rec.record_batches(epoch, batches, why)
            rec.record_metrics(epoch, dict(logs or {}))
            step = _iterations(self.model)
            trace.step = step if step is not None else trace.step
            trace.boundary(self.layers, epoch=epoch, loss=(logs or {}).get("loss"))
            if points.due(epoch):
                points.write(epoch, trace.step, "keras", lambda folder: save_state(keras, self.model, folder))

    class LauncherStepRecorder(LauncherRecorder):
        """With --trace-every N: also a row every N optimizer steps (the batch hook costs a little)."""

        def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
            step = _iterations(self.model)
            if step is not None:
                trace.stepped(step, self.layers, loss=(logs or {}).get("loss"))

    return LauncherStepRecorder() if trace.every else LauncherRecorder()


def _optrace_callbacks(keras: Any, ops: optrace.KerasOps) -> tuple[Any, Any]:
    """On a diverge re-execution: one callback first among fit()'s, which says which step the training
    function computes (its taps read it) and records the weights right after its update, before any
    other callback can change them; and, where the step is compiled with XLA (no taps), one last,
    which records the weights as the step begins, after every callback."""

    class LauncherOpTrace(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_begin(self, batch: int, logs: Logs = None) -> None:
            done = _iterations(self.model)
            if done is not None:
                ops.trace.begin(done + 1)

        def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
            if ops.trace.current is not None:
                ops.trace.weights(optrace.UPDATED, ops.weights_now())
            ops.trace.end()

    class LauncherOpTraceLast(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_begin(self, batch: int, logs: Logs = None) -> None:
            if not ops.taps and ops.trace.current is not None:
                ops.trace.weights(optrace.WEIGHTS, ops.weights_now())

    return LauncherOpTrace(), LauncherOpTraceLast()


def _trace_ops(keras: Any, tf: Any, rec: Recorder, model: Any) -> tuple[Any, Any] | None:
    """Taps on the trained model's layers and gradients for a diverge re-execution; its callbacks, or
    None. fit() compiled with XLA stays so (what the original run computed), traced at the weights only."""
    trace = rec.optrace
    if trace is None:
        return None
    ops = optrace.KerasOps(tf, trace, model)
    ops.wrap_layer_call(keras.layers.Layer)
    if getattr(model, "optimizer", None) is not None:
        ops.wrap_apply(model.optimizer)
    xla = bool(getattr(model, "jit_compile", False))
    ops.taps = not xla
    where = ("as each step begins, after every callback, and after its update; fit() is compiled with XLA, as in "
             "the run traced, which cannot compile a tap inside the step" if xla
             else "as each layer's call inside fit()'s compiled training step reads them")
    trace.describe({"framework": "keras", "operations": not xla, "xla": xla, "weights": where})
    if xla:
        print("launcher: operation trace: fit() is compiled with XLA, as in the run traced: the weights are traced "
              "at each step's start and end, the operations inside the step are not", file=sys.stderr, flush=True)
    return _optrace_callbacks(keras, ops)


# ---------------------------------------------------------------- checkpoints

def _state_arrays(keras: Any, model: Any) -> dict[str, NDArray[Any]]:
    """Everything training changes, by position: the model's variables (weights, and the dropout
    layers' seed generator states), the optimizer's (its step, learning rate and slots), and Keras'
    global seed generator where one exists."""
    arrays = {f"model/{i:05d}": v.numpy() for i, v in enumerate(model.variables)}
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        arrays.update({f"optimizer/{i:05d}": v.numpy() for i, v in enumerate(optimizer.variables)})
    generator = _global_seed_generator()
    if generator is not None:
        arrays["global_seed_generator"] = generator.state.numpy()
    return arrays


def _global_seed_generator() -> Any:
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        return None
    return global_state.get_global_attribute("global_seed_generator")


def save_state(keras: Any, model: Any, folder: Path) -> None:
    fp.write_atomic(folder / KERAS_STATE, fp.arrays_npz_bytes(_state_arrays(keras, model)))


def restore(keras: Any, model: Any, resume: Resume, rec: Recorder, tap: BatchTap) -> None:
    """Put the state of the checkpoint back (see _state_arrays), after fit() built the model and optimizer."""
    import numpy as np

    from launcher.runtime import checkpoint as ck

    folder, state = resume
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not getattr(optimizer, "built", True):
        optimizer.build(model.trainable_variables)  # its slots exist from the first step on: made now, as zeros
    with np.load(folder / KERAS_STATE) as saved:
        arrays = {k: saved[k] for k in saved.files}
    now = _state_arrays(keras, model)
    if sorted(arrays) != sorted(now) or any(arrays[k].size != now[k].size for k in now):
        raise ck.NotResumable(f"checkpoint {folder.name} holds {len(arrays)} variables, the model and optimizer "
                              f"{len(now)} (or their shapes differ): not the same model")
    for i, v in enumerate(model.variables):
        v.assign(arrays[f"model/{i:05d}"].reshape(v.shape))  # a scalar is stored as one element
    if model.optimizer is not None:
        for i, v in enumerate(model.optimizer.variables):
            v.assign(arrays[f"optimizer/{i:05d}"].reshape(v.shape))
    generator = _global_seed_generator()
    if generator is not None:
        generator.state.assign(arrays["global_seed_generator"].reshape(generator.state.shape))
    ck.restore_python_numpy(json.loads((folder / ck.RNG).read_text()))
    tap.skip_epochs(int(state["next_epoch"]))
    rec.resumed_at(state)
    print(f"launcher: restored checkpoint {folder.name}: model, optimizer and random states after epoch "
          f"{state['next_epoch']} (step {state['step']})",
          flush=True)


def _refusal(a: FitArguments, named: dict[str, list[Any]] | None, fits: int) -> str | None:
    """Why this fit() cannot be checkpointed and resumed bit for bit, or None."""
    if fits > 1:
        return "the script calls fit() more than once; launcher checkpoints a script with one fit()"
    if named is None:
        return ("fit() trains on a tf.data dataset, a generator or a PyDataset, whose position launcher cannot "
                "restore; give it NumPy arrays")
    if a.get("steps_per_epoch"):
        return "fit(steps_per_epoch=...) keeps one iterator across epochs, whose position launcher cannot restore"
    return None


def _save_final(rec: Recorder, model: Any) -> None:
    rec.record_final(keras_layers(model))
    model_dir = rec.path("model")
    for name, save in (("model.weights.h5", model.save_weights), ("model.keras", model.save)):
        try:
            save(str(model_dir / name))
        except Exception as exc:  # a native save is a convenience; the canonical file is the record
            print(f"launcher: could not write model/{name}: {type(exc).__name__}: {exc}", flush=True)


def _train_and_validation(a: FitArguments) -> tuple[dict[str, list[Any]] | None, Any]:
    """The arrays fit() trains on (after Keras' own validation split: the last samples), by name,
    and its validation data; read from the arguments, nothing passed on changed."""
    validation = a["validation_data"]
    parts = {key: a[key] for key in ("x", "y", "sample_weight")}
    if any(_leaves(v) is None for v in parts.values()) or a["x"] is None:
        return None, validation
    vs = float(a["validation_split"] or 0.0)
    if vs and validation is None:
        n = len(_leaves(a["x"])[0])  # type: ignore[index]
        split = math.floor(n * (1.0 - vs))
        tail = slice(split, None)
        validation = (_slice(a["x"], tail), _slice(a["y"], tail))
        parts = {key: _slice(v, slice(0, split)) for key, v in parts.items()}
    named: dict[str, list[Any]] = {}
    for key, v in parts.items():
        leaves = _leaves(v) or []
        for i, leaf in enumerate(leaves):
            named[key if len(leaves) == 1 else f"{key}/{i}"] = leaf
    return named, validation


def _resume_point(rec: Recorder, a: FitArguments, named: dict[str, list[Any]] | None,
                  given: inspect.BoundArguments) -> Resume | None:
    """The checkpoint this fit resumes from (None for none), given's initial_epoch set to it; raises
    NotResumable where checkpoints are on and this fit cannot be resumed."""
    points = rec.checkpoints
    if not points.active:
        return None
    points.engaged = True
    problem = _refusal(a, named, rec.fits)
    if problem is not None:
        from launcher.runtime.checkpoint import NotResumable

        raise NotResumable(problem)
    resume = points.resume_from()
    if resume is not None:  # Keras numbers epochs from 0 whatever initial_epoch is: the next one
        given.arguments["initial_epoch"] = int(resume[1]["next_epoch"])
    return resume


def _add_callbacks(keras: Any, model: Any, given: inspect.BoundArguments, ours: list[Any],
                   last: list[Any] | None = None) -> None:
    """ours put first among the callbacks of the fit call given (a CallbackList Keras built, or a list),
    and last after them."""
    callbacks = given.arguments.get("callbacks")
    if isinstance(callbacks, keras.callbacks.CallbackList):
        for n, callback in enumerate(ours):
            callback.set_model(model)
            callbacks.callbacks.insert(n, callback)
        for callback in last or []:
            callback.set_model(model)
            callbacks.callbacks.append(callback)
    else:
        given.arguments["callbacks"] = [*ours, *(callbacks or []), *(last or [])]


def install(keras: Any, tf: Any, rec: Recorder) -> Callable[..., Any]:
    """Wrap keras.Model.fit so that it is recorded (see the module's doc); returns the original."""
    original = keras.Model.fit
    if getattr(original, "__launcher_wrapped__", False):
        return cast(Callable[..., Any], original)
    sig = inspect.signature(original)

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = sig.bind(self, *args, **kwargs)
        full = sig.bind(self, *args, **kwargs)
        full.apply_defaults()
        bound = dict(full.arguments)
        bound.update(bound.pop("kwargs", {}) or {})
        a = cast(FitArguments, bound)  # fit()'s own parameters: every key is there, defaults applied
        rec.fits += 1
        named, validation = _train_and_validation(a)
        if named is not None:
            rec.record_train_data(named)
        resume = _resume_point(rec, a, named, given)
        probe_set = probemod.capture(rec, validation, self)
        tap = BatchTap(tf)
        ours = [_recorder_callback(keras, rec, tap, resume)]
        traced = _trace_ops(keras, tf, rec, self)
        if traced is not None:
            ours.append(traced[0])
        _add_callbacks(keras, self, given, ours, [traced[1]] if traced is not None else None)
        try:
            import importlib

            _Attach.patch(importlib.import_module(TRAINER_MODULE))
            _Attach.pending = tap
        except (ImportError, AttributeError):
            tap.unrecorded = "this Keras version's training loop is not one launcher knows"
        try:
            history = original(*given.args, **given.kwargs)
        finally:
            _Attach.pending = None
        _save_final(rec, self)
        if probe_set is not None:
            probemod.record(rec, self, probe_set)
        return history

    fit.__launcher_wrapped__ = True  # type: ignore[attr-defined]
    keras.Model.fit = fit
    return cast(Callable[..., Any], original)
