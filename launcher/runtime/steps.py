"""Step fingerprints: a digest of the weights at points of training, so two runs can be said to agree
up to one step and part before the next.

``fingerprints/steps.jsonl`` holds one row per recorded point::

    {"step": 120, "epoch": 0, "digest": "sha256:…", "layers": {"dense": "sha256:…", …}, "loss": 0.31,
     "module": "Sequential", "optimizer": "Adam"}

``module`` and ``optimizer`` name what the digests cover (the model's class, and the optimizer's or
``by hand``). ``step`` counts optimizer steps from the start of the run (Keras: the optimizer's iterations;
PyTorch: calls of any optimizer's ``step()``). Step 0 is the weights before the first update. The
points are each epoch's end (Keras' epochs; for PyTorch, each time a new pass over a DataLoader
begins after some steps, each :func:`launcher.runtime.api.record_epoch`, and the end of the
script) and, with ``LAUNCHER_TRACE_EVERY=N`` (``launcher run --trace-every N``), every N steps.
``LAUNCHER_TRACE_EVERY=off`` records nothing. Reading the weights changes nothing in training.

Each layer's digest is the digest of its arrays' digests (launcher.runtime.fingerprints), so the
first layer that differs at the parting point can be named without storing weights.
"""

from __future__ import annotations

import gc
import os
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.runtime import fingerprints as fp
from launcher.runtime.outfiles import STEPS as STEPS  # where the rows go (named with the runtime's other files)

if TYPE_CHECKING:
    from launcher.runtime.records import StepRow

ENV = "LAUNCHER_TRACE_EVERY"
EPOCH = "epoch"
OFF = "off"

LayersFn = Callable[[], fp.Layers]
CoversFn = Callable[[], dict[str, str]]  # what the digests cover: {"module": ..., "optimizer": ...}


def parse_every(text: str | None) -> int | str | None:
    """``epoch`` (or nothing) -> None: epoch ends only; ``off`` -> "off"; N -> N (at least 1).
    Raises ValueError for anything else."""
    value = (text or EPOCH).strip().lower()
    if value == EPOCH:
        return None
    if value == OFF:
        return OFF
    n = int(value)
    if n < 1:
        raise ValueError(f"{text!r} is not a step count of at least 1")
    return n


def layer_digests(layers: fp.Layers) -> dict[str, str]:
    """Per layer, the digest of its arrays' digests, in model order (a repeated name gets #n)."""
    out: dict[str, str] = {}
    for name, values in layers:
        key, n = name, 1
        while key in out:
            n += 1
            key = f"{name}#{n}"
        out[key] = fp.digest_of([fp.array_digest(v) for v in values])
    return out


class StepTrace:
    """The points recorded in one run, appended to ``steps.jsonl`` as they are taken."""

    def __init__(self, path: Any, every: int | str | None) -> None:
        self.path = path
        self.off = every == OFF
        self.every = every if isinstance(every, int) else None
        self.step = 0
        self.last: int | None = None  # the step of the last row written
        self.epoch = 0  # the number of the next epoch boundary (PyTorch, where nothing numbers them)
        self.covers: CoversFn | None = None  # set by the framework's recorder

    def record(self, layers: LayersFn, *, epoch: int | None = None, loss: Any = None) -> None:
        """A row at the current step, unless one was written at it already."""
        if self.off or self.last == self.step:
            return
        digests = layer_digests(layers())
        row: StepRow = {"step": self.step, "digest": fp.digest_of(digests), "layers": digests}
        if epoch is not None:
            row["epoch"] = epoch
        number = _number(loss)
        if number is not None:
            row["loss"] = number
        if self.covers is not None:
            row.update(self.covers())  # type: ignore[typeddict-item]
        fp.append_jsonl(self.path, row)
        self.last = self.step

    def start(self, layers: LayersFn) -> None:
        """Step 0: the weights before the first update (once per run)."""
        if self.step == 0 and self.last is None:
            self.record(layers)

    def stepped(self, step: int, layers: LayersFn, loss: Any = None) -> None:
        """Training reached ``step``; a row if ``--trace-every N`` asks for one here."""
        self.step = step
        if self.every and step % self.every == 0:
            self.record(layers, loss=loss)

    def boundary(self, layers: LayersFn, epoch: int | None = None, loss: Any = None) -> None:
        """An epoch ended (or the script did): a row if training moved since the last one."""
        if self.step == 0 or self.last == self.step:
            return
        if epoch is None:
            epoch = self.epoch
        self.epoch = epoch + 1
        self.record(layers, epoch=epoch, loss=loss)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        if hasattr(value, "item"):
            value = value.item()
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def from_env(path: Any) -> StepTrace:
    try:
        every = parse_every(os.environ.get(ENV))
    except ValueError:
        every = None  # checked on the host; a hand-made bad value falls back to epoch ends
    return StepTrace(path, every)


# ---------------------------------------------------------------- PyTorch


class TorchSteps:
    """Counts the steps of every torch optimizer and records the model they update.

    The model is found once, at the first point recorded: the smallest ``nn.Module`` alive that holds
    every parameter the stepping optimizer updates. Its layers are named as in the final record
    (:func:`launcher.runtime.api.torch_layers`); without one, the optimizer's parameters are
    recorded by position.

    A script that updates its parameters by hand (``p.data.add_(p.grad, alpha=-lr)``, as PyTorch's
    word-language-model example does by default) steps no optimizer: until one steps, each call of
    ``Tensor.backward()`` counts as a step (the weights before backward number k+1 are those after k
    updates), and the model is the largest ``nn.Module`` alive that no other holds.
    """

    def __init__(self, torch: Any, trace: StepTrace, ops: Any = None) -> None:
        self.torch, self.trace = torch, trace
        self.ops = ops  # launcher.runtime.optrace.TorchOps, on a `launcher diverge` re-execution
        self.optimizer: Any = None
        self.model: weakref.ref[Any] | None = None
        self.searched = False
        self.backwards = 0  # Tensor.backward() calls before any optimizer stepped (updates made by hand)
        self.optimizer_made = False  # an optimizer exists: backward() calls are its steps' (accumulated), not updates
        self.module = "parameters"  # the class of the model found, for covers()
        trace.covers = self.covers

    @property
    def by_hand(self) -> bool:
        return self.optimizer is None and not self.optimizer_made and self.backwards > 0

    def layers(self) -> fp.Layers:
        model = self.model() if self.model is not None else None
        if model is None and not self.searched and (self.optimizer is not None or self.backwards):
            self.searched = True
            model = self._find_model() if self.optimizer is not None else self._largest_model()
        if model is not None:
            return fp.torch_layers(model)
        params = [p for group in getattr(self.optimizer, "param_groups", []) for p in group["params"]]
        return [(f"param.{i}", [p]) for i, p in enumerate(params)]

    def covers(self) -> dict[str, str]:
        """The model's class (its last one found: at the script's end a model made in a function is gone,
        and its parameters are read through the optimizer) and the optimizer's (``by hand`` without one)."""
        model = self.model() if self.model is not None else None
        if model is not None:
            self.module = type(model).__name__
        return {"module": self.module, "optimizer": type(self.optimizer).__name__ if self.optimizer is not None
                else "by hand"}

    def _find_model(self) -> Any:
        nn = self.torch.nn
        wanted = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        best, best_size = None, 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            objects = [obj for obj in gc.get_objects() if isinstance(obj, nn.Module)]
        for obj in objects:
            held = {id(p) for p in obj.parameters()}
            if wanted <= held and (best is None or len(held) < best_size):
                best, best_size = obj, len(held)
        if best is not None:
            self.model = weakref.ref(best)
            if self.ops is not None:
                self.ops.model_found(best)
        return best

    def _largest_model(self) -> Any:
        """The nn.Module alive that holds the most parameters and is no other module's child."""
        nn = self.torch.nn
        with warnings.catch_warnings():  # isinstance() on some of torch's objects warns of deprecations
            warnings.simplefilter("ignore")
            modules = [obj for obj in gc.get_objects() if isinstance(obj, nn.Module)]
        children = {id(c) for m in modules for c in m.children()}
        roots = [m for m in modules if id(m) not in children]
        best = max(roots, key=lambda m: sum(p.numel() for p in m.parameters()), default=None)
        if best is not None:
            self.model = weakref.ref(best)
            if self.ops is not None:
                self.ops.model_found(best)
        return best

    def backward(self) -> None:
        """``Tensor.backward()`` is about to run: a step of a loop that updates its parameters by hand (none while an
        optimizer exists: several backward calls before its first step accumulate gradients, micro-batches)."""
        if self.optimizer is not None or self.optimizer_made:
            return
        self.backwards += 1
        if self.backwards == 1:
            self.trace.start(self.layers)
            self.model, self.searched = None, False  # an optimizer stepping next finds its own model
        else:
            self.trace.stepped(self.backwards - 1, self.layers)

    def backward_done(self) -> None:
        """``Tensor.backward()`` returned. In a loop that updates by hand, on a diverge re-execution: the
        step's gradients are traced, and the next step begins (its update, the loop's own code, comes
        before its forward pass, whose weights the trace reads there)."""
        if self.ops is not None and self.by_hand:
            self.ops.grads()
            self.ops.trace.begin(self.backwards + 1)

    def created(self, optimizer: Any) -> None:
        """An optimizer was made: its steps are the run's; on a diverge re-execution, find its model now and begin
        step 1."""
        self.optimizer_made = True
        if self.optimizer is None and self.ops is not None:
            self.optimizer = optimizer
            self.layers()
            self.ops.trace.begin(1)

    def before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.optimizer is None:
            self.optimizer = optimizer
        if optimizer is self.optimizer:
            self.trace.start(self.layers)
            if self.ops is not None:
                self.ops.grads()

    def after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.optimizer is None:
            self.optimizer = optimizer
        self.trace.stepped(self.trace.step + 1, self.layers)
        if self.ops is not None and optimizer is self.optimizer:
            self.ops.updated()
            self.ops.trace.begin(self.trace.step + 1)

    def boundary(self, epoch: int | None = None) -> None:
        """An epoch ended (a new pass over a DataLoader begins, the recipe said so, or the script
        ended): a row if steps were taken since the last one."""
        if self.by_hand:
            self.trace.step = self.backwards  # the update after the last backward has been made by now
        if self.optimizer is not None or self.by_hand:
            self.trace.boundary(self.layers, epoch=epoch)


def install_torch(torch: Any, trace: StepTrace, ops: Any = None) -> TorchSteps | None:
    """Global optimizer hooks and a DataLoader wrapper (torch >= 2.0); None where they are missing.
    ops: a launcher.runtime.optrace.TorchOps on a diverge re-execution. Optimizers' construction is watched: once
    one exists, backward() calls are its steps' gradients (accumulated over micro-batches), and on a diverge
    re-execution step 1 begins there."""
    if trace.off and ops is None:
        return None
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        from torch.utils.data import DataLoader
    except ImportError:
        return None
    steps = TorchSteps(torch, trace, ops)
    register_optimizer_step_pre_hook(steps.before_step)
    register_optimizer_step_post_hook(steps.after_step)
    original_backward = torch.Tensor.backward

    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        steps.backward()
        done = original_backward(self, *args, **kwargs)
        steps.backward_done()
        return done

    torch.Tensor.backward = backward
    init = torch.optim.Optimizer.__init__  # watched: an optimizer made means backward() calls are not updates

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        steps.created(self)

    torch.optim.Optimizer.__init__ = __init__
    original = DataLoader.__iter__
    if not getattr(original, "__launcher_wrapped__", False):
        def __iter__(self: Any) -> Any:
            steps.boundary()
            return original(self)

        __iter__.__launcher_wrapped__ = True  # type: ignore[attr-defined]
        DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
    return steps


# ---------------------------------------------------------------- loops that report their steps (JAX)


class PytreeSteps:
    """The steps a loop reports itself (launcher.runtime.api.record_step), with its parameters after each
    update as a pytree: a JAX loop, which no hook sees. On a diverge re-execution each leaf is traced after
    each update in the window (launcher.runtime.optrace, kind ``updated``). ``layers`` and ``leaves`` read a
    pytree (launcher.runtime.frameworks.fw_jax's, handed in by the api)."""

    def __init__(self, trace: StepTrace, layers: Callable[[Any], fp.Layers],
                 leaves: Callable[[Any], list[tuple[str, str, Any]]], ops: Any = None) -> None:
        self.trace, self.layers, self.leaves = trace, layers, leaves
        self.ops = ops  # launcher.runtime.optrace.OpTrace, on a `launcher diverge` re-execution
        self.params: Any = None  # the parameters after the last update reported
        self.described = False

    def stepped(self, params: Any, loss: Any = None) -> None:
        self.params = params
        step = self.trace.step + 1
        self.trace.stepped(step, lambda: self.layers(params), loss=loss)
        ops = self.ops
        if ops is None:
            return
        if not self.described:
            self.described = True
            ops.describe({"framework": "jax", "operations": False, "xla": True,
                          "weights": "the parameter pytree after each update, from api.record_step"})
        ops.begin(step)
        if ops.current is not None:
            ops.weights("updated", self.leaves(params))
        ops.end()

    def boundary(self, epoch: int | None = None) -> None:
        params = self.params
        if params is not None:
            self.trace.boundary(lambda: self.layers(params), epoch=epoch)
