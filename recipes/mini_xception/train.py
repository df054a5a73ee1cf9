"""Seed 002, Listing 6: the mini Xception made deterministic on CPU (718,849 trainable params at
PDIM 180): seeded glorot initialisers, seeded augmentation and dropout, RMSprop."""

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
init_glorot_u = keras.initializers.GlorotUniform
inputs = keras.Input(shape=(PDIM, PDIM, 3))
x = data_augmentation(inputs)
x = keras.layers.Rescaling(1.0 / 255)(x)
x = keras.layers.Conv2D(filters=32, kernel_size=5, use_bias=False,
                        kernel_initializer=init_glorot_u(seed=1))(x)
for size in [32, 64, 128, 256, 512]:
    residual = x
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.SeparableConv2D(size, 3, padding="same", use_bias=False,
                                     depthwise_initializer=init_glorot_u(seed=1),
                                     pointwise_initializer=init_glorot_u(seed=2))(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.SeparableConv2D(size, 3, padding="same", use_bias=False,
                                     depthwise_initializer=init_glorot_u(seed=1),
                                     pointwise_initializer=init_glorot_u(seed=2))(x)
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same")(x)
    residual = keras.layers.Conv2D(size, 1, strides=2, padding="same", use_bias=False,
                                   kernel_initializer=init_glorot_u(seed=1))(residual)
    x = keras.layers.add([x, residual])
x = keras.layers.GlobalAveragePooling2D()(x)
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
