"""Seed 002, Listing 3: the deterministic cats-vs-dogs ConvNet (991,041 trainable params at PDIM 180),
seeded augmentation, RMSprop, binary cross-entropy."""

from __future__ import annotations

import tensorflow as tf
from recipelib import catsdogs_keras, dogs_vs_cats

from launcher.runtime import api

keras = tf.keras
p = api.params()
PDIM = int(p["pdim"])

train, val = dogs_vs_cats.splits(p, PDIM)

inputs, x = catsdogs_keras.stem(PDIM)
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
catsdogs_keras.train(inputs, x, p, train, val)
