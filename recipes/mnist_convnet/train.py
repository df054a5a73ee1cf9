"""Seed 003: the Keras MNIST convnet (Conv32-Conv64-MaxPool-Dropout0.25-Flatten-Dense128-Dropout0.5-Dense10,
Adadelta, batch 128, 12 epochs). Trains with a plain model.fit: the runtime records the rest."""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf
from recipelib.mnist import load_digits_as_mnist, load_mnist_npz
from recipelib.splits import first

from launcher.runtime import api

keras = tf.keras
p = api.params()
num_classes = 10
img_rows, img_cols = 28, 28

if p["dataset"] == "mnist":
    arrays = load_mnist_npz(api.data_dir())
else:
    arrays = load_digits_as_mnist()
    api.record_dataset(arrays)
x_train, y_train = first(arrays, "train", p["train_samples"])
x_test, y_test = first(arrays, "test", p["test_samples"])

x_train = x_train.reshape(x_train.shape[0], img_rows, img_cols, 1).astype("float32") / 255
x_test = x_test.reshape(x_test.shape[0], img_rows, img_cols, 1).astype("float32") / 255
input_shape = (img_rows, img_cols, 1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

model = keras.Sequential([
    keras.Input(shape=input_shape),
    keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
    keras.layers.Conv2D(64, (3, 3), activation="relu"),
    keras.layers.MaxPooling2D(pool_size=(2, 2)),
    keras.layers.Dropout(0.25),
    keras.layers.Flatten(),
    keras.layers.Dense(128, activation="relu"),
    keras.layers.Dropout(0.5),
    keras.layers.Dense(num_classes, activation="softmax"),
])
trainable = int(sum(np.prod(w.shape) for w in model.trainable_weights))
print(f"trainable params: {trainable:,}")

start_time = time.time()
model.compile(loss=keras.losses.categorical_crossentropy,
              optimizer=keras.optimizers.Adadelta(learning_rate=p["learning_rate"]),
              metrics=["accuracy"])
model.fit(x_train, y_train, batch_size=p["batch_size"], epochs=p["epochs"], verbose=2,
          validation_data=(x_test, y_test))
score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
print("Elapsed Time:", time.time() - start_time)
