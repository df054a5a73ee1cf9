"""JAX: no global random state (the program's PRNG keys are its own, recorded when made from a seed:
``jax.random.PRNGKey`` and ``jax.random.key`` calls are listed in runtime.json), kernels made
deterministic by ``XLA_FLAGS`` (read when its backend starts), XLA's CPU thread pool bound by the run's
thread count (:func:`bind_threads`), weights fingerprinted from a pytree of parameters (:func:`layers`,
through ``launcher.runtime.api.jax_layers`` and ``api.record_step``), and a loop's state (parameters,
optimizer state, PRNG keys: any pytree of arrays) saved and restored for checkpoints
(:func:`save_state`, :func:`load_state`, through ``api.jax_checkpoint`` and ``api.jax_resume_point``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from launcher.runtime import fingerprints as fp
from launcher.runtime.frameworks.base import DETERMINISTIC, Framework

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.runtime.records import Applied

DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"


def bind_threads(threads: int) -> int | None:
    """XLA's CPU client sizes its thread pools from the CPUs this process may run on, read when its backend
    starts: the process is bound to the first ``threads`` of those it may use now (threads it starts from
    here on inherit that). The number bound, or None where the system cannot bind."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
        chosen = set(allowed[:max(threads, 1)])
        os.sched_setaffinity(0, chosen)
    except (AttributeError, OSError):
        return None
    return len(chosen)


def initialize_distributed(jax: Any) -> dict[str, Any]:
    """A process of a run of several (launcher.runtime.distributed started it): JAX's distributed runtime
    initialized before anything starts its backend, with CPU collectives over Gloo; the script's own
    ``jax.distributed.initialize()`` then does nothing (it was called with what launcher knows: the coordinator on
    node 0, the process count, this process's id)."""
    coordinator = os.environ["LAUNCHER_JAX_COORDINATOR"]
    processes, process_id = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=processes, process_id=process_id)

    def initialize(*args: Any, **kwargs: Any) -> None:
        return None  # launcher initialized it with this run's layout

    jax.distributed.initialize = initialize
    return {"processes": processes, "process_id": process_id}  # not the coordinator: its name holds the run's id


def apply(jax: Any, profile: str, seed: int | None, threads: int | None) -> Applied:
    flags = os.environ.get("XLA_FLAGS", "")
    info: Applied = {"name": "jax", "version": getattr(jax, "__version__", None),
                            "xla_flags": os.environ.get("XLA_FLAGS"),
                            "deterministic_ops": profile in DETERMINISTIC and DETERMINISTIC_FLAG in flags}
    info["seeded"] = ["python", "numpy"] if seed is not None else []
    if threads is not None:  # before the backend starts (jax.devices() below starts it)
        bound = bind_threads(threads)
        if bound:
            info["threads"] = {"intra_op": bound, "inter_op": bound}
    if os.environ.get("LAUNCHER_DISTRIBUTED") == "jax_distributed":  # before jax.devices() starts the backend
        info["distributed"] = initialize_distributed(jax)
    info["note"] = "JAX's PRNG keys come from the program: its PRNGKey/key calls are listed in seed_calls"
    if threads is not None and "threads" not in info:
        info["note"] += f"; XLA's CPU threads could not be bound to {threads} (no CPU affinity here)"
    try:
        info["devices"] = [f"{d.platform}:{d.id}" for d in jax.devices()]
        info["backend"] = jax.default_backend()
    except Exception as exc:  # no backend: the program will say so itself
        info["devices"] = [f"unavailable: {type(exc).__name__}"]
    try:
        import jaxlib

        info["jaxlib"] = getattr(jaxlib, "__version__", None)
    except ImportError:
        pass
    return info


def layers(params: Any) -> fp.Layers:
    """(parent path, [leaf arrays]) in the pytree's own order, from a pytree of parameters: a dict
    {"dense1": {"w": ..., "b": ...}} gives ("['dense1']", [w, b])."""
    import jax
    import numpy as np

    grouped: dict[str, list[Any]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        parent = jax.tree_util.keystr(tuple(path[:-1])) or "_"
        grouped.setdefault(parent, []).append(np.asarray(leaf))
    return list(grouped.items())


def leaves(params: Any) -> list[tuple[str, str, Any]]:
    """(parent path, leaf path, array) for each leaf of a pytree of parameters, grouped as :func:`layers` groups
    them: {"dense1": {"w": w}} gives ("['dense1']", "['dense1']['w']", w)."""
    import jax
    import numpy as np

    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        out.append((jax.tree_util.keystr(tuple(path[:-1])) or "_", jax.tree_util.keystr(tuple(path)), np.asarray(leaf)))
    return out


def _is_key(jax: Any, leaf: Any) -> bool:
    """A typed PRNG key (jax.random.key), whose data is saved instead of the key itself."""
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))


def save_state(path: Path, state: Any) -> None:
    """Every leaf of a pytree (parameters, an optax state, PRNG keys, numbers) into one .npz, with the
    tree's structure to check on restore."""
    import jax
    import numpy as np

    values, treedef = jax.tree_util.tree_flatten(state)
    arrays = {"treedef": np.array(str(treedef))}
    for i, leaf in enumerate(values):
        arrays[f"{i:05d}"] = np.asarray(jax.random.key_data(leaf) if _is_key(jax, leaf) else leaf)
    fp.write_atomic(path, fp.arrays_npz_bytes(arrays))


def load_state(path: Path, template: Any) -> Any:
    """The pytree saved in path, in the structure, dtypes and kinds of template (the loop's state as made
    before the checkpoint is restored). Raises ValueError where they differ."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    values, treedef = jax.tree_util.tree_flatten(template)
    with np.load(path, allow_pickle=False) as saved:
        if str(saved["treedef"].reshape(-1)[0]) != str(treedef) or len(saved.files) != len(values) + 1:
            raise ValueError(f"{path.name} holds another state than the loop makes (its structure differs)")
        restored = []
        for i, leaf in enumerate(values):
            data = saved[f"{i:05d}"]  # a 0-d value is stored as one element: shaped back as the template's
            if _is_key(jax, leaf):
                shape = jax.random.key_data(leaf).shape
                restored.append(jax.random.wrap_key_data(jnp.asarray(data.reshape(shape)),
                                                         impl=jax.random.key_impl(leaf)))
            elif isinstance(leaf, (bool, int, float)):
                restored.append(type(leaf)(data.reshape(-1)[0].item()))
            elif data.size != np.size(leaf):
                raise ValueError(f"{path.name}: leaf {i} holds {data.size} values, the loop's {np.size(leaf)}")
            elif isinstance(leaf, np.ndarray):
                restored.append(data.reshape(leaf.shape).astype(leaf.dtype))
            else:
                restored.append(jnp.asarray(data.reshape(np.shape(leaf)), dtype=leaf.dtype))
    return jax.tree_util.tree_unflatten(treedef, restored)


SCAFFOLD = '''"""{name}: a small JAX model (an MLP, optax's Adam), trained in a loop of its own.

It reports its fingerprints through launcher.runtime.api (JAX has no fit() to hook); its PRNG key
comes from the run's seed, and runtime.json lists the key made from it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from launcher.runtime import api

p = api.params()
if p["dataset"] == "files":
    path = api.data_dir() / "data.npz"
    if not path.is_file():
        raise api.BadData(f"{{path}}: not found; expected data.npz with arrays x and y")
    with np.load(path) as f:
        x, y = f["x"].astype("float32"), f["y"].astype("int32")
else:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    api.record_dataset({{"x": x, "y": y}})
key = jax.random.PRNGKey(api.seed() or 0)
k1, k2, shuffle = jax.random.split(key, 3)
params = {{"hidden": {{"w": jax.random.normal(k1, (x.shape[1], 16)) * 0.3, "b": jnp.zeros(16)}},
          "out": {{"w": jax.random.normal(k2, (16, 2)) * 0.3, "b": jnp.zeros(2)}}}}
opt = optax.adam(1e-2)
state = opt.init(params)


def loss_fn(params, xb, yb):
    h = jax.nn.relu(xb @ params["hidden"]["w"] + params["hidden"]["b"])
    logits = h @ params["out"]["w"] + params["out"]["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()


@jax.jit
def step(params, state, xb, yb):
    loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss


api.record_initial_weights(api.jax_layers(params))
for epoch in range(p["epochs"]):
    shuffle, sub = jax.random.split(shuffle)
    order = np.asarray(jax.random.permutation(sub, len(x)))
    batches, total = [], 0.0
    for start in range(0, len(x), p["batch_size"]):
        ids = order[start:start + p["batch_size"]]
        params, state, loss = step(params, state, x[ids], y[ids])
        api.record_step(params, loss)  # a step fingerprint where --trace-every asks for one
        batches.append(ids)
        total += float(loss) * len(ids)
    api.record_epoch(epoch, batches, {{"loss": total / len(x)}})
api.save_final(api.jax_layers(params))
'''

JAX = Framework(
    name="jax", label="JAX", modules=("jax", "flax", "optax", "jaxlib", "equinox", "haiku"), packages=("jax",),
    variant="jax-cpu", apply=apply, env=lambda threads: {"XLA_FLAGS": DETERMINISTIC_FLAG},
    seeders={"jax": (("random.PRNGKey", "jax.random.PRNGKey"), ("random.key", "jax.random.key"))},
    scaffold=SCAFFOLD)
