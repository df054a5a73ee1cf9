"""JAX: no global random state (the program's PRNG keys are its own, recorded when made from a seed:
``jax.random.PRNGKey`` and ``jax.random.key`` calls are listed in runtime.json), kernels made
deterministic by ``XLA_FLAGS`` (read when its backend starts), weights fingerprinted from a pytree of
parameters (:func:`layers`, through ``launcher.runtime.api.jax_layers``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from launcher.runtime import fingerprints as fp
from launcher.runtime.frameworks.base import DETERMINISTIC, Framework

if TYPE_CHECKING:
    from launcher.runtime.records import Applied

DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"


def apply(jax: Any, profile: str, seed: int | None, threads: int | None) -> Applied:
    flags = os.environ.get("XLA_FLAGS", "")
    info: Applied = {"name": "jax", "version": getattr(jax, "__version__", None),
                            "xla_flags": os.environ.get("XLA_FLAGS"),
                            "deterministic_ops": profile in DETERMINISTIC and DETERMINISTIC_FLAG in flags}
    info["seeded"] = ["python", "numpy"] if seed is not None else []
    info["note"] = "JAX's PRNG keys come from the program: its PRNGKey/key calls are listed in seed_calls"
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
