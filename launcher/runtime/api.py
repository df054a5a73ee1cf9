"""The small helper API a recipe may use (none of it is required).

```python
from launcher.runtime import api

p = api.params({"epochs": 12})      # the run's params over these defaults
data = api.data_dir()               # --data, or None
api.record_dataset({"x": x, "y": y})   # fingerprint arrays made in code; checked against recipe.toml
raise api.BadData("train.csv: expected 3 columns")   # a clear data error, exit code 17
```

A Keras recipe that calls ``model.fit`` on arrays needs nothing else: the runtime records the
initial weights, batches, metrics and final model itself. A PyTorch recipe has no fit() to hook,
so it reports those with :func:`record_initial_weights`, :func:`record_epoch` and
:func:`save_final`, and seeds its DataLoader with :func:`torch_generator`; a JAX recipe the same,
its pytree of parameters given by :func:`jax_layers`, and, since no hook sees a JAX update, each
optimizer step with :func:`record_step` (step fingerprints, verify by step, diverge to the step and
the parameter leaf). Checkpoints: :func:`resume_point` and :func:`checkpoint` for PyTorch,
:func:`jax_resume_point` and :func:`jax_checkpoint` for a JAX loop's state.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat

from launcher.runtime import fingerprints as fp
from launcher.runtime.record import BadData, recorder

if TYPE_CHECKING:
    from launcher.runtime.records import NamedArrays

JAX_STATE = "jax.npz"  # a checkpoint's JAX part: the loop's state pytree (launcher.runtime.frameworks.fw_jax)

__all__ = [
    "BadData",
    "checkpoint",
    "data_dir",
    "jax_checkpoint",
    "jax_layers",
    "jax_resume_point",
    "micro_batches",
    "out_dir",
    "params",
    "profile",
    "record_dataset",
    "record_epoch",
    "record_initial_weights",
    "record_step",
    "resume_point",
    "save_final",
    "seed",
    "threads",
    "torch_generator",
    "torch_layers",
]


# the user's params are any JSON (recipe.toml's defaults, --param, a plain script's --params), read by
# the user's own code: Any, so that a script need not narrow each value it reads
def params(defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    merged = dict(defaults or {})
    merged.update(json.loads(os.environ.get("LAUNCHER_PARAMS", "{}")))
    return merged


def data_dir() -> Path | None:
    raw = os.environ.get("LAUNCHER_DATA")
    return Path(raw) if raw else None


def micro_batches(model: Any, indices: Any, size: int) -> Iterator[Any]:
    """A PyTorch data-parallel step over fixed micro-batches: give it the step's global batch (a 1-D tensor of
    sample indices, the same on every rank) and run each micro-batch's forward and backward in the loop; the step's
    gradient is then the mean over the global batch. Under `launcher run --reduction canonical` it does not depend on
    the world size (launcher.runtime.reduction)::

        opt.zero_grad()
        for part in api.micro_batches(ddp_model, global_indices, 4):
            loss_fn(ddp_model(x[part]), y[part]).backward()
        opt.step()
    """
    from launcher.runtime import reduction
    from launcher.runtime.record import BadRecipe

    restored = recorder().checkpoints.restored  # resumed: the steps go on from the checkpoint's, and their keys
    try:
        yield from reduction.micro_batches(model, indices, size, seed=seed(),
                                           first_step=int(restored["step"]) if restored else 0)
    except reduction.ReductionError as exc:
        raise BadRecipe(str(exc)) from None


def out_dir() -> Path:
    return recorder().out


def seed() -> int | None:
    raw = os.environ.get("LAUNCHER_SEED")
    return int(raw) if raw else None


def profile() -> str:
    return os.environ.get("LAUNCHER_PROFILE", "off")


def threads() -> int | None:
    raw = os.environ.get("LAUNCHER_THREADS")
    return int(raw) if raw else None


def record_dataset(arrays: NamedArrays) -> str:
    """Fingerprint a dataset held in arrays; raises BadData if recipe.toml expects another one."""
    return str(recorder().record_dataset_arrays(arrays)["digest"])


def torch_layers(model: Any) -> fp.Layers:
    """(module name, [parameters and buffers]) in registration order, from a torch module."""
    return fp.torch_layers(model)


def jax_layers(params: Any) -> fp.Layers:
    """(parent path, [leaf arrays]) from a JAX pytree of parameters, e.g. {"dense": {"w": w, "b": b}}."""
    from launcher.runtime.frameworks.fw_jax import layers

    return layers(params)


def record_initial_weights(layers: fp.Layers) -> None:
    """The weights before training; for a loop no hook sees (JAX), also its step fingerprint of step 0."""
    rec = recorder()
    fresh = not rec.initial_recorded and not rec.checkpoints.resume
    rec.record_initial_weights(layers)
    if fresh and rec.torch_steps is None:  # PyTorch's hooks take step 0 themselves, before the first update
        rec.trace.start(lambda: layers)


def record_step(params: Any, loss: Any = None) -> None:
    """An optimizer update was made: ``params`` is the JAX pytree of parameters after it (and ``loss`` the
    batch's loss, optional). Counts the step; writes a step fingerprint where ``--trace-every N`` asks for
    one; on a `launcher diverge` re-execution, traces each parameter leaf. Cheap otherwise: nothing is read
    from the device unless a fingerprint is taken. Call it once per update, after it."""
    from launcher.runtime.frameworks import fw_jax

    recorder().record_step(params, loss, fw_jax.layers, fw_jax.leaves)


def record_epoch(epoch: int, batches: Sequence[Any], metrics: Mapping[str, SupportsFloat | str]) -> None:
    """One epoch: the sample IDs of each batch in the order trained, and the epoch's metrics."""
    rec = recorder()
    rec.record_batches(epoch, [fp.batch_digest(ids) for ids in batches])
    rec.record_metrics(epoch, metrics)
    rec.steps_boundary(epoch)


def save_final(layers: fp.Layers) -> None:
    rec = recorder()
    rec.steps_boundary()
    rec.record_final(layers)


def torch_generator() -> Any:
    """A torch.Generator for DataLoader(shuffle=True, generator=...): seeded from the run's seed."""
    import torch

    g = torch.Generator()
    s = seed()
    if s is None:
        g.seed()
    else:
        g.manual_seed(s)
    return g


# ---------------------------------------------------------------- checkpoints (PyTorch)

def resume_point(model: Any, optimizer: Any, generator: Any = None) -> int:
    """The epoch to start at: 0, or, when the run resumes (``launcher resume RUN``), the epoch after
    the latest checkpoint, with the model, the optimizer, torch's random state, the DataLoader's
    generator and Python's and NumPy's random states put back as they were there. Call it once,
    after the model, optimizer and DataLoader are made and before the epoch loop; with
    :func:`checkpoint` at each epoch's end it makes the run resumable bit for bit."""
    import torch

    from launcher.runtime import checkpoint as ck

    rec = recorder()
    points = rec.checkpoints
    points.engaged = True
    found = points.resume_from()
    if found is None:
        return 0
    folder, state = found
    if state.get("framework") != "torch":
        raise ck.NotResumable(f"checkpoint {folder.name} was written by {state.get('framework')}, not torch")
    blob = torch.load(folder / "torch.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(blob["model"])
    optimizer.load_state_dict(blob["optimizer"])
    torch.set_rng_state(blob["torch"])
    if blob.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["cuda"])
    if generator is not None:
        if blob.get("generator") is None:
            raise ck.NotResumable(f"checkpoint {folder.name} holds no DataLoader generator state")
        generator.set_state(blob["generator"])
    ck.restore_python_numpy(json.loads((folder / ck.RNG).read_text()))
    rec.resumed_at(state)
    print(f"launcher: restored checkpoint {folder.name}: model, optimizer and random states after epoch "
          f"{state['next_epoch']} (step {state['step']})",
          flush=True)
    return int(state["next_epoch"])


def checkpoint(epoch: int, model: Any, optimizer: Any, generator: Any = None) -> None:
    """The end of epoch (0-based): a checkpoint when ``--checkpoint-every N`` asks for one here (see
    :func:`resume_point`). Call it last in the epoch, after :func:`record_epoch`."""
    rec = recorder()
    points = rec.checkpoints
    if not points.due(epoch):
        return
    import torch

    def save(folder: Path) -> None:
        blob = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "generator": generator.get_state() if generator is not None else None}
        torch.save(blob, folder / "torch.pt")

    points.write(epoch, rec.trace.step, "torch", save, trace_epoch=rec.trace.epoch)


# ---------------------------------------------------------------- checkpoints (JAX)

def jax_resume_point(state: Any) -> tuple[int, Any]:
    """(the epoch to start at, the state to go on with): (0, ``state`` as given), or, when the run resumes
    (``launcher resume RUN``, or a `launcher diverge` re-execution started from a checkpoint), the epoch
    after the latest checkpoint and the state saved there, with Python's and NumPy's random states put back.
    ``state`` is any pytree of what the loop carries from epoch to epoch (parameters, optimizer state, PRNG
    keys, numbers), made as for a fresh start. Call it once, before the epoch loop; with
    :func:`jax_checkpoint` at each epoch's end it makes the run resumable bit for bit."""
    from launcher.runtime import checkpoint as ck
    from launcher.runtime.frameworks import fw_jax

    rec = recorder()
    points = rec.checkpoints
    points.engaged = True
    found = points.resume_from()
    if found is None:
        return 0, state
    folder, done = found
    if done.get("framework") != "jax":
        raise ck.NotResumable(f"checkpoint {folder.name} was written by {done.get('framework')}, not jax")
    try:
        state = fw_jax.load_state(folder / JAX_STATE, state)
    except (OSError, KeyError, ValueError) as exc:
        raise ck.NotResumable(f"checkpoint {folder.name}: {exc}") from None
    ck.restore_python_numpy(json.loads((folder / ck.RNG).read_text()))
    rec.resumed_at(done)
    print(f"launcher: restored checkpoint {folder.name}: the loop's state and random states after epoch "
          f"{done['next_epoch']} (step {done['step']})", flush=True)
    return int(done["next_epoch"]), state


def jax_checkpoint(epoch: int, state: Any) -> None:
    """The end of epoch (0-based): a checkpoint of the loop's state (the pytree :func:`jax_resume_point`
    takes) when ``--checkpoint-every N`` asks for one here. Call it last in the epoch, after :func:`record_epoch`."""
    rec = recorder()
    points = rec.checkpoints
    if not points.due(epoch):
        return
    from launcher.runtime.frameworks import fw_jax

    points.write(epoch, rec.trace.step, "jax", lambda folder: fw_jax.save_state(folder / JAX_STATE, state),
                 trace_epoch=rec.trace.epoch)
