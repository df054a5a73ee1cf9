"""Operation traces: on the training steps where two runs part, a digest (and a copy) of what each
step computed, in the order training computes it.

``launcher diverge`` re-executes two runs with ``LAUNCHER_OPTRACE=LO:HI``; the runtime then writes,
for each step s with LO <= s <= HI (s counts optimizer updates from 1, as the step fingerprints do:
the step that *makes* step fingerprint s):

- ``optrace/ops.jsonl``: one row per value, ``{"step", "order", "kind", "name", "digest", "shape",
  "dtype"}`` (and ``"layer"`` for weights). ``kind`` is

  - ``weights``: a layer's weight as the forward pass of step s reads it (PyTorch: the model's
    state at its first forward call of the step; Keras: each weight as its layer's call inside the
    compiled training step reads it, or, where fit() is compiled with XLA, the weights as the step
    begins, after every callback). Compared with the step fingerprint of step s-1 (the weights right
    after the update of step s-1) it shows a change made between the two outside the traced
    operations: a callback, a constraint, a direct assignment to ``param.data``;
  - ``input`` / ``output``: a layer's call in the forward pass;
  - ``grad``: a weight's gradient, as handed to the optimizer;
  - ``updated``: a weight right after the optimizer update of step s (a JAX loop's parameter leaves,
    through :func:`launcher.runtime.api.record_step`);

- ``optrace/step-SSSSSS.npz``: the arrays themselves (up to :data:`MAX_ELEMENTS` each), so the size
  of a difference can be measured on the host;
- ``optrace/trace.json``: what could be traced, and how (:func:`OpTrace.describe`).

PyTorch: global module forward hooks (calls under ``torch.no_grad()``, such as a test pass, are
left out) and the parameters' ``.grad`` when ``optimizer.step()`` begins. Keras: beside each layer's
call inside fit()'s training function, an op that digests its weights, input and output as they are
computed, and beside the optimizer's ``apply`` one for each gradient it receives; nothing is put on
the path the values take, so the training step computes the same bits as the run traced (`launcher
diverge` checks that it does). fit() compiled with XLA stays compiled with XLA: a Python call cannot
be compiled, so only the weights are traced then, and trace.json says so.
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.runtime import fingerprints as fp

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from launcher.runtime.records import OpRow, OpTraceInfo

ENV = "LAUNCHER_OPTRACE"
OPS = "optrace/ops.jsonl"
INFO = "optrace/trace.json"
MAX_ELEMENTS = 1 << 22
WEIGHTS, INPUT, OUTPUT, GRAD, UPDATED = "weights", "input", "output", "grad", "updated"


def parse_window(text: str | None) -> tuple[int, int] | None:
    """``LO:HI`` -> (LO, HI); None when not set. Raises ValueError for anything else."""
    if not text:
        return None
    lo, _, hi = text.partition(":")
    window = int(lo), int(hi or lo)
    if window[0] < 1 or window[1] < window[0]:
        raise ValueError(f"{text!r} is not a window of steps LO:HI with 1 <= LO <= HI")
    return window


class OpTrace:
    """The operations of the steps in a window, written as each step ends."""

    def __init__(self, out: Path, window: tuple[int, int]) -> None:
        self.out = out
        self.lo, self.hi = window
        self.current: int | None = None
        self.order = 0
        self.arrays: dict[str, NDArray[Any]] = {}  # the traced step's small arrays, by OpRow.array
        self.lock = threading.Lock()  # Keras' taps may run on TensorFlow's threads

    def begin(self, step: int) -> None:
        """Step ``step`` is about to be computed; traced when it lies in the window."""
        self.end()
        if self.lo <= step <= self.hi:
            self.current, self.order, self.arrays = step, 0, {}

    def op(self, kind: str, name: str, value: Any, layer: str | None = None) -> None:
        if self.current is None:
            return
        a = fp.as_array(value)
        digest = fp.array_digest(a)
        with self.lock:
            if self.current is None:
                return
            key = f"{self.order:05d}"
            row: OpRow = {"step": self.current, "order": self.order, "kind": kind, "name": name,
                          "digest": digest, "shape": list(a.shape), "dtype": a.dtype.str}
            if layer is not None:
                row["layer"] = layer
            if a.size <= MAX_ELEMENTS:
                self.arrays[key] = a
                row["array"] = key
            fp.append_jsonl(self.out / OPS, row)
            self.order += 1

    def weights(self, kind: str, named: list[tuple[str, str, Any]]) -> None:
        """Each (layer, weight name, value) as one row of ``kind`` (weights or updated)."""
        for layer, name, value in named:
            self.op(kind, name, value, layer=layer)

    def end(self) -> None:
        with self.lock:
            if self.current is None:
                return
            step, arrays = self.current, self.arrays
            self.current, self.arrays = None, {}
        if arrays:
            fp.write_atomic(self.out / f"optrace/step-{step:06d}.npz", fp.arrays_npz_bytes(arrays))

    def describe(self, info: OpTraceInfo) -> None:
        """What this run's trace holds (written once its framework's taps are in place)."""
        fp.write_json(self.out / INFO, info)


def from_env(out: Path) -> OpTrace | None:
    try:
        window = parse_window(os.environ.get(ENV))
    except ValueError:
        return None
    return OpTrace(out, window) if window else None


# ---------------------------------------------------------------- PyTorch


def _first_tensor(value: Any, torch: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item, torch)
            if found is not None:
                return found
    if isinstance(value, dict):
        for key in sorted(value):
            found = _first_tensor(value[key], torch)
            if found is not None:
                return found
    return None


def torch_weights(model: Any) -> list[tuple[str, str, Any]]:
    """(layer, weight name, tensor) for each entry of the model's state, grouped into layers as its step
    fingerprints group them (launcher.runtime.fingerprints.torch_layers)."""
    return [(key.rpartition(".")[0] or "_", key, value) for key, value in model.state_dict().items()]


class TorchOps:
    """Forward calls of the model's modules, the weights its forward pass reads, the gradients of its
    parameters and the weights after each update, per traced step."""

    def __init__(self, torch: Any, trace: OpTrace) -> None:
        self.torch, self.trace = torch, trace
        self.names: dict[int, str] = {}  # id(module) -> qualified name in the model
        self.params: list[tuple[str, Any]] = []
        self.model: weakref.ref[Any] | None = None
        self.read_at: int | None = None  # the step whose weights were recorded at its first forward call

    def model_found(self, model: Any) -> None:
        self.names = {id(m): (name or type(model).__name__) for name, m in model.named_modules()}
        self.params = list(model.named_parameters())
        self.model = weakref.ref(model)
        self.trace.describe({"framework": "torch", "operations": True, "xla": False,
                             "weights": "the model's state at its first forward call of each step"})

    def _model(self) -> Any:
        return self.model() if self.model is not None else None

    def before_forward(self, module: Any, args: Any) -> None:
        """The first forward call of the model in a traced step: the weights it reads."""
        trace = self.trace
        if trace.current is None or self.read_at == trace.current or id(module) not in self.names \
                or not self.torch.is_grad_enabled():
            return
        model = self._model()
        if model is not None:
            self.read_at = trace.current
            trace.weights(WEIGHTS, torch_weights(model))

    def forward(self, module: Any, args: Any, output: Any) -> None:
        if self.trace.current is None or not self.torch.is_grad_enabled():
            return
        name = self.names.get(id(module))
        if name is None:
            return
        inp, out = _first_tensor(args, self.torch), _first_tensor(output, self.torch)
        if inp is not None:
            self.trace.op(INPUT, name, inp)
        if out is not None:
            self.trace.op(OUTPUT, name, out)

    def grads(self) -> None:
        for name, p in reversed(self.params):  # the order backward computes them: last layer first
            if p.grad is not None:
                self.trace.op(GRAD, name, p.grad)

    def updated(self) -> None:
        """The optimizer's update of the traced step is made: the weights now."""
        model = self._model()
        if model is not None:
            self.trace.weights(UPDATED, torch_weights(model))


def install_torch(torch: Any, trace: OpTrace) -> TorchOps:
    """The forward hooks (for every module; only the model's are recorded); launcher.runtime.steps.TorchSteps
    finds the model and drives the steps."""
    ops = TorchOps(torch, trace)
    torch.nn.modules.module.register_module_forward_pre_hook(ops.before_forward)
    torch.nn.modules.module.register_module_forward_hook(ops.forward)
    return ops


# ---------------------------------------------------------------- Keras (TensorFlow backend)


class KerasOps:
    """Taps on the trained model's layer calls (the weights each reads, its input and output) and on
    the gradients, inside fit()'s compiled training step; without taps (XLA), the weights as each step
    begins and ends."""

    def __init__(self, tf: Any, trace: OpTrace, model: Any) -> None:
        self.tf, self.trace, self.model = tf, trace, model
        self.taps = True  # False where fit() is compiled with XLA, which cannot compile a Python call

    def is_model_layer(self, layer: Any) -> bool:
        """One of the layers of the model fit() trains (asked while its step is being traced, so that
        layers a subclassed model makes in build() count too)."""
        return any(mine is layer for mine in self.model.layers)

    def _record(self, kind: str, name: str, tensor: Any, layer: str | None = None) -> Any:
        """An op that records tensor's value when the step runs (a stateful op: TensorFlow runs it)."""
        def record(value: Any) -> Any:
            self.trace.op(kind, name, value.numpy(), layer=layer)
            return 0

        return self.tf.py_function(record, [tensor], Tout=self.tf.int64)

    def tap(self, kind: str, name: str, tensor: Any) -> Any:
        """``tensor`` itself, unchanged, with an op beside it that records its value (when tracing).

        Nothing is put on the path the values take: an identity there changes what Keras computes (its
        crossentropy reads the logits a softmax output carries as an attribute, which an identity drops,
        and falls back to the probabilities), so the traced run would not compute what the run did. A
        stateful op that nothing consumes still runs: a tf.function runs each one, in program order."""
        tf = self.tf
        if isinstance(tensor, (tf.Tensor, tf.Variable)) and tensor.dtype != tf.resource:
            self._record(kind, name, tensor)
        return tensor

    def read_weights(self, layer: Any) -> list[Any]:
        """Ops that record each weight of layer as its call reads it, in the step fingerprints' order."""
        done = []
        for v in layer.weights:
            stored = getattr(v, "_value", None)  # the backend's variable: its value as stored, never autocast
            value = self.tf.identity(stored if stored is not None else v.value)
            done.append(self._record(WEIGHTS, f"{layer.name}/{v.name}", value, layer=layer.name))
        return done

    def weights_now(self) -> list[tuple[str, str, Any]]:
        """(layer, weight name, value) of the model's weights, read now (eagerly)."""
        return [(layer.name, f"{layer.name}/{v.name}", v.numpy()) for layer in self.model.layers for v in layer.weights]

    def wrap_layer_call(self, layer_cls: Any) -> None:
        original = layer_cls.__call__
        if getattr(original, "__launcher_optrace__", False):
            return
        ops = self

        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:
            if not ops.taps or not args or ops.tf.executing_eagerly() or not ops.is_model_layer(layer):
                return original(layer, *args, **kwargs)
            name = layer.name  # as the step fingerprints name it
            ops.read_weights(layer)
            ops.tap(INPUT, name, args[0])
            return ops.tap(OUTPUT, name, original(layer, *args, **kwargs))

        __call__.__launcher_optrace__ = True  # type: ignore[attr-defined]
        layer_cls.__call__ = __call__

    def wrap_apply(self, optimizer: Any) -> None:
        original = optimizer.apply
        ops = self

        def apply(grads: Any, trainable_variables: Any = None, *args: Any, **kwargs: Any) -> Any:
            variables = trainable_variables if trainable_variables is not None else optimizer._trainable_variables
            if ops.taps and not ops.tf.executing_eagerly():
                for g, v in zip(grads, variables, strict=False):
                    if g is not None:
                        ops.tap(GRAD, getattr(v, "path", None) or v.name, g)
            return original(grads, trainable_variables, *args, **kwargs)

        optimizer.apply = apply
