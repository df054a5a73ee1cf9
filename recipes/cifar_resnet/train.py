"""Seed 004: ResNet29v2 on CIFAR-10, the Keras ResNet v2 example at depth 29 (n = 3): Adam with the
example's step schedule and plateau reduction, per-pixel mean subtraction, shift-and-flip augmentation
(seeded preprocessing layers in place of ImageDataGenerator), batch 32, 200 epochs."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from cifar10 import digits_as_cifar, load_batches
from recipelib.splits import first

from launcher.runtime import api

keras = tf.keras
layers = keras.layers
p = api.params()
depth = int(p["depth"])
if (depth - 2) % 9:
    raise SystemExit(f"depth must be 9n+2 for ResNet v2 (29, 56, 110, ...), not {depth}")
num_classes = 10

if p["dataset"] == "cifar10":
    arrays = load_batches(api.data_dir())
else:
    arrays = digits_as_cifar()
    api.record_dataset(arrays)
x_train, y_train = first(arrays, "train", p["train_samples"])
x_test, y_test = first(arrays, "test", p["test_samples"])
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
if p["subtract_pixel_mean"]:
    x_train_mean = np.mean(x_train, axis=0)
    x_train -= x_train_mean
    x_test -= x_train_mean
print("x_train shape:", x_train.shape)
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)


def lr_schedule(epoch: int) -> float:
    lr = 1e-3
    if epoch > 180:
        lr *= 0.5e-3
    elif epoch > 160:
        lr *= 1e-3
    elif epoch > 120:
        lr *= 1e-2
    elif epoch > 80:
        lr *= 1e-1
    return lr


def resnet_layer(inputs, num_filters=16, kernel_size=3, strides=1, activation="relu",
                 batch_normalization=True, conv_first=True):
    conv = layers.Conv2D(num_filters, kernel_size=kernel_size, strides=strides, padding="same",
                         kernel_initializer="he_normal", kernel_regularizer=keras.regularizers.l2(1e-4))
    x = inputs
    if conv_first:
        x = conv(x)
        if batch_normalization:
            x = layers.BatchNormalization()(x)
        if activation is not None:
            x = layers.Activation(activation)(x)
    else:
        if batch_normalization:
            x = layers.BatchNormalization()(x)
        if activation is not None:
            x = layers.Activation(activation)(x)
        x = conv(x)
    return x


def resnet_v2(input_shape, depth, num_classes=10, augment=True):
    """Bottleneck pre-activation ResNet: 3 stages of (depth - 2) / 9 blocks, 16/64/128/256 filters."""
    num_filters_in = 16
    num_res_blocks = (depth - 2) // 9
    inputs = keras.Input(shape=input_shape)
    x = inputs
    if augment:
        x = keras.Sequential([
            layers.RandomTranslation(0.1, 0.1, fill_mode="nearest", seed=1),
            layers.RandomFlip("horizontal", seed=2),
        ], name="augmentation")(x)
    x = resnet_layer(x, num_filters=num_filters_in, conv_first=True)
    for stage in range(3):
        for res_block in range(num_res_blocks):
            activation, batch_normalization, strides = "relu", True, 1
            if stage == 0:
                num_filters_out = num_filters_in * 4
                if res_block == 0:
                    activation, batch_normalization = None, False
            else:
                num_filters_out = num_filters_in * 2
                if res_block == 0:
                    strides = 2
            y = resnet_layer(x, num_filters=num_filters_in, kernel_size=1, strides=strides,
                             activation=activation, batch_normalization=batch_normalization, conv_first=False)
            y = resnet_layer(y, num_filters=num_filters_in, conv_first=False)
            y = resnet_layer(y, num_filters=num_filters_out, kernel_size=1, conv_first=False)
            if res_block == 0:
                x = resnet_layer(x, num_filters=num_filters_out, kernel_size=1, strides=strides,
                                 activation=None, batch_normalization=False)
            x = layers.add([x, y])
        num_filters_in = num_filters_out
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    x = layers.AveragePooling2D(pool_size=8)(x)
    y = layers.Flatten()(x)
    outputs = layers.Dense(num_classes, activation="softmax", kernel_initializer="he_normal")(y)
    return keras.Model(inputs=inputs, outputs=outputs, name=f"ResNet{depth}v2")


model = resnet_v2(x_train.shape[1:], depth, num_classes, augment=bool(p["augment"]))
model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.Adam(learning_rate=lr_schedule(0)),
              metrics=["accuracy"])
trainable = int(sum(np.prod(w.shape) for w in model.trainable_weights))
print(f"{model.name}: trainable params: {trainable:,}")
callbacks = [keras.callbacks.LearningRateScheduler(lr_schedule),
             keras.callbacks.ReduceLROnPlateau(factor=np.sqrt(0.1), cooldown=0, patience=5, min_lr=0.5e-6)]
model.fit(x_train, y_train, batch_size=p["batch_size"], epochs=p["epochs"], verbose=2,
          validation_data=(x_test, y_test), callbacks=callbacks)
scores = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", scores[0])
print("Test accuracy:", scores[1])
