"""Operation traces: on the training steps where two runs part, a digest (and a copy) of each layer's
input and output and of each weight's gradient, in the order training computes them.

``launcher diverge`` re-executes two runs with ``LAUNCHER_OPTRACE=LO:HI``; the runtime then writes,
for each step s with LO <= s <= HI (s counts optimizer updates from 1, as the step fingerprints do:
the step that *makes* step fingerprint s):

- ``optrace/ops.jsonl``: one row per operation, ``{"step", "order", "kind", "name", "digest",
  "shape", "dtype"}``; ``kind`` is ``input`` or ``output`` (a layer's call in the forward pass) or
  ``grad`` (a weight's gradient, as handed to the optimizer);
- ``optrace/step-SSSSSS.npz``: the arrays themselves (up to :data:`MAX_ELEMENTS` each), so the size
  of a difference can be measured on the host.

PyTorch: global module forward hooks (calls under ``torch.no_grad()``, such as a test pass, are
left out) and the parameters' ``.grad`` when ``optimizer.step()`` begins. Keras: each layer's call
inside fit()'s training function is given an identity step that digests its value as it is computed
(the values and their order are untouched), and the gradients are observed as the optimizer's
``apply`` receives them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.runtime import fingerprints as fp

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from launcher.runtime.records import OpRow

ENV = "LAUNCHER_OPTRACE"
OPS = "optrace/ops.jsonl"
MAX_ELEMENTS = 1 << 22


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

    def op(self, kind: str, name: str, value: Any) -> None:
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
            if a.size <= MAX_ELEMENTS:
                self.arrays[key] = a
                row["array"] = key
            fp.append_jsonl(self.out / OPS, row)
            self.order += 1

    def end(self) -> None:
        with self.lock:
            if self.current is None:
                return
            step, arrays = self.current, self.arrays
            self.current, self.arrays = None, {}
        if arrays:
            fp.write_atomic(self.out / f"optrace/step-{step:06d}.npz", fp.arrays_npz_bytes(arrays))


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


class TorchOps:
    """Forward calls of the model's modules and the gradients of its parameters, per traced step."""

    def __init__(self, torch: Any, trace: OpTrace) -> None:
        self.torch, self.trace = torch, trace
        self.names: dict[int, str] = {}  # id(module) -> qualified name in the model
        self.params: list[tuple[str, Any]] = []

    def model_found(self, model: Any) -> None:
        self.names = {id(m): (name or type(model).__name__) for name, m in model.named_modules()}
        self.params = list(model.named_parameters())

    def forward(self, module: Any, args: Any, output: Any) -> None:
        if self.trace.current is None or not self.torch.is_grad_enabled():
            return
        name = self.names.get(id(module))
        if name is None:
            return
        inp, out = _first_tensor(args, self.torch), _first_tensor(output, self.torch)
        if inp is not None:
            self.trace.op("input", name, inp)
        if out is not None:
            self.trace.op("output", name, out)

    def grads(self) -> None:
        for name, p in reversed(self.params):  # the order backward computes them: last layer first
            if p.grad is not None:
                self.trace.op("grad", name, p.grad)


def install_torch(torch: Any, trace: OpTrace) -> TorchOps:
    """The forward hook (for every module; only the model's are recorded) and the optimizer's
    construction, where step 1 begins (launcher.runtime.steps.TorchSteps drives the rest)."""
    ops = TorchOps(torch, trace)
    torch.nn.modules.module.register_module_forward_hook(ops.forward)
    return ops


# ---------------------------------------------------------------- Keras (TensorFlow backend)


class KerasOps:
    """Taps on each layer's call and on the gradients, inside fit()'s compiled training step."""

    def __init__(self, tf: Any, trace: OpTrace) -> None:
        self.tf, self.trace = tf, trace
        self.layers: set[int] = set()

    def tap(self, kind: str, name: str, tensor: Any) -> Any:
        """``tensor`` through an identity whose side effect records its value (when tracing)."""
        tf = self.tf
        if not isinstance(tensor, (tf.Tensor, tf.Variable)) or tensor.dtype == tf.resource:
            return tensor

        def record(value: Any) -> Any:
            self.trace.op(kind, name, value.numpy())
            return 0

        done = tf.py_function(record, [tensor], Tout=tf.int64)
        with tf.control_dependencies([done]):
            return tf.identity(tensor)

    def wrap_layer_call(self, layer_cls: Any) -> None:
        original = layer_cls.__call__
        if getattr(original, "__launcher_optrace__", False):
            return
        ops = self

        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:
            if id(layer) not in ops.layers or not args or ops.tf.executing_eagerly():
                return original(layer, *args, **kwargs)
            name = layer.name  # as the step fingerprints name it
            first = ops.tap("input", name, args[0])
            out = original(layer, first, *args[1:], **kwargs)
            return ops.tap("output", name, out)

        __call__.__launcher_optrace__ = True  # type: ignore[attr-defined]
        layer_cls.__call__ = __call__

    def wrap_apply(self, optimizer: Any) -> None:
        original = optimizer.apply
        ops = self

        def apply(grads: Any, trainable_variables: Any = None, *args: Any, **kwargs: Any) -> Any:
            variables = trainable_variables if trainable_variables is not None else optimizer._trainable_variables
            if not ops.tf.executing_eagerly():
                grads = [g if g is None else ops.tap("grad", getattr(v, "path", None) or v.name, g)
                         for g, v in zip(grads, variables, strict=False)]
            return original(grads, trainable_variables, *args, **kwargs)

        optimizer.apply = apply
