"""Seed 002, Listing 6: the mini Xception made deterministic on CPU (718,849 trainable params at
PDIM 180): seeded glorot initialisers, seeded augmentation and dropout, RMSprop."""

from __future__ import annotations

import tensorflow as tf
from recipelib import catsdogs_keras, dogs_vs_cats

from launcher.runtime import api

keras = tf.keras
p = api.params()
PDIM = int(p["pdim"])

train, val = dogs_vs_cats.splits(p, PDIM)

init_glorot_u = keras.initializers.GlorotUniform
inputs, x = catsdogs_keras.stem(PDIM)
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
catsdogs_keras.train(inputs, x, p, train, val)
