"""Seed 002, Listing 3: the deterministic cats-vs-dogs ConvNet (991,041 trainable params at PDIM 180),
seeded augmentation, RMSprop, binary cross-entropy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from dogs_vs_cats import load_folder, synthetic

from launcher.runtime import api

keras = tf.keras
p = api.params()
PDIM = int(p["pdim"])

if p["dataset"] == "files":
    arrays = load_folder(api.data_dir(), PDIM)
else:
    arrays = synthetic(PDIM)
    if PDIM == 180:
        api.record_dataset(arrays)
x_train, y_train, x_val, y_val = (arrays[k] for k in ("x_train", "y_train", "x_val", "y_val"))
if p["train_samples"]:
    x_train, y_train = x_train[: p["train_samples"]], y_train[: p["train_samples"]]
print(f"{len(x_train)} train, {len(x_val)} validation images of {PDIM}x{PDIM}")

data_augmentation = keras.Sequential([
    keras.layers.RandomFlip("horizontal", seed=1),
    keras.layers.RandomRotation(0.1, seed=1),
    keras.layers.RandomZoom(0.2, seed=1),
], name="data_augmentation")
inputs = keras.Input(shape=(PDIM, PDIM, 3))
x = data_augmentation(inputs)
x = keras.layers.Rescaling(1.0 / 255)(x)
x = keras.layers.Conv2D(filters=32, kernel_size=3, activation="relu")(x)
x = keras.layers.MaxPooling2D(pool_size=2)(x)
x = keras.layers.Conv2D(filters=64, kernel_size=3, activation="relu")(x)
x = keras.layers.MaxPooling2D(pool_size=2)(x)
x = keras.layers.Conv2D(filters=128, kernel_size=3, activation="relu")(x)
x = keras.layers.MaxPooling2D(pool_size=2)(x)
x = keras.layers.Conv2D(filters=256, kernel_size=3, activation="relu")(x)
x = keras.layers.MaxPooling2D(pool_size=2)(x)
x = keras.layers.Conv2D(filters=256, kernel_size=3, activation="relu")(x)
x = keras.layers.Flatten()(x)
x = keras.layers.Dropout(0.5, seed=7001)(x)
outputs = keras.layers.Dense(1, activation="sigmoid")(x)
model = keras.Model(inputs=inputs, outputs=outputs)
trainable = int(sum(np.prod(w.shape) for w in model.trainable_weights))
print(f"trainable params: {trainable:,}")
model.compile(loss="binary_crossentropy", optimizer="rmsprop", metrics=["accuracy"])
model.fit(x_train, y_train, batch_size=p["batch_size"], epochs=p["epochs"], verbose=2,
          validation_data=(x_val, y_val))
loss, acc = model.evaluate(x_val, y_val, verbose=0)
print(f"accuracy: {acc:.3f}")
