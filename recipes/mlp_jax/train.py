"""A two-layer MLP on the digits in JAX, trained by a loop of its own with optax's Adam.

JAX has no global random state: the PRNG key is made from the run's seed (api.seed()), and the
runtime lists that call in runtime.json (seed_calls). Initial weights, each optimizer step (step
fingerprints), the sample IDs of every batch, per-epoch metrics and the final weights
(model/canonical.npz, one array per pytree leaf, grouped by parent path) go through
launcher.runtime.api, and so do checkpoints: the loop's state (parameters, Adam's state, the shuffle
key) is what api.jax_resume_point restores and api.jax_checkpoint saves. ``halve_lr_at`` halves the
learning rate from that optimizer step on (0: never), a schedule that makes two runs part at a known step.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from recipelib.mnist import load_digits_as_mnist, load_mnist_npz, synthetic_digits
from recipelib.splits import first

from launcher.runtime import api

p = api.params()
if p["dataset"] == "mnist":
    arrays = load_mnist_npz(api.data_dir())
else:
    arrays = load_digits_as_mnist() if p["dataset"] == "digits" else synthetic_digits()
    api.record_dataset(arrays)
x_train, y_train = first(arrays, "train", p["train_samples"])
x_test, y_test = first(arrays, "test", p["test_samples"])
x_train = x_train.reshape(len(x_train), -1).astype(np.float32) / 255
x_test = x_test.reshape(len(x_test), -1).astype(np.float32) / 255
y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)
print(f"{len(x_train)} train samples, {len(x_test)} test samples; devices: {jax.devices()}")

key = jax.random.PRNGKey(api.seed() or 0)
k_hidden, k_out, shuffle = jax.random.split(key, 3)
hidden = int(p["hidden"])
params = {
    "hidden": {"w": jax.random.normal(k_hidden, (x_train.shape[1], hidden)) * (2 / x_train.shape[1]) ** 0.5,
               "b": jnp.zeros(hidden)},
    "out": {"w": jax.random.normal(k_out, (hidden, 10)) * (1 / hidden) ** 0.5, "b": jnp.zeros(10)},
}
lr = float(p["learning_rate"])
halve_at = int(p["halve_lr_at"])
# optax counts the updates made before: the update of step N (1-based) is count N - 1
optimizer = optax.adam(optax.piecewise_constant_schedule(lr, {halve_at - 1: 0.5}) if halve_at > 0 else lr)
state = optimizer.init(params)


def logits_of(params: dict, x: jnp.ndarray) -> jnp.ndarray:
    h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


def loss_of(params: dict, x: jnp.ndarray, y: jnp.ndarray) -> jnp.ndarray:
    return optax.softmax_cross_entropy_with_integer_labels(logits_of(params, x), y).mean()


@jax.jit
def train_step(params: dict, state: optax.OptState, x: jnp.ndarray, y: jnp.ndarray) -> tuple:
    loss, grads = jax.value_and_grad(loss_of)(params, x, y)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss


@jax.jit
def evaluate(params: dict, x: jnp.ndarray, y: jnp.ndarray) -> tuple:
    logits = logits_of(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), (logits.argmax(1) == y).mean()


api.record_initial_weights(api.jax_layers(params))
first, (params, state, shuffle) = api.jax_resume_point((params, state, shuffle))
batch = int(p["batch_size"])
start = time.time()
for epoch in range(first, int(p["epochs"])):
    shuffle, sub = jax.random.split(shuffle)
    order = np.asarray(jax.random.permutation(sub, len(x_train)))
    batches, total = [], 0.0
    for at in range(0, len(order), batch):
        ids = order[at:at + batch]
        params, state, loss = train_step(params, state, x_train[ids], y_train[ids])
        api.record_step(params, loss)
        batches.append(ids)
        total += float(loss) * len(ids)
    val_loss, val_acc = evaluate(params, x_test, y_test)
    metrics = {"loss": total / len(order), "val_loss": float(val_loss), "val_accuracy": float(val_acc)}
    api.record_epoch(epoch, batches, metrics)
    api.jax_checkpoint(epoch, (params, state, shuffle))
    print(f"epoch {epoch + 1}/{p['epochs']}: " + " - ".join(f"{k}: {v:.4f}" for k, v in metrics.items()))
print(f"Elapsed Time: {time.time() - start:.2f}")
api.save_final(api.jax_layers(params))
