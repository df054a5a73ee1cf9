"""What seed 002's two cats-vs-dogs models share (Listing 3's ConvNet and Listing 6's mini
Xception): the seeded augmentation stem, and the RMSprop / binary cross-entropy training."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

keras = tf.keras


def stem(pdim: int) -> tuple[Any, Any]:
    """The model's input and the seeded augmentation, rescaled to [0, 1]: (inputs, x)."""
    data_augmentation = keras.Sequential([
        keras.layers.RandomFlip("horizontal", seed=1),
        keras.layers.RandomRotation(0.1, seed=1),
        keras.layers.RandomZoom(0.2, seed=1),
    ], name="data_augmentation")
    inputs = keras.Input(shape=(pdim, pdim, 3))
    x = data_augmentation(inputs)
    x = keras.layers.Rescaling(1.0 / 255)(x)
    return inputs, x


def train(inputs: Any, x: Any, params: dict[str, Any], train: tuple[np.ndarray, np.ndarray],
          val: tuple[np.ndarray, np.ndarray]) -> Any:
    """The seeded dropout and the sigmoid output on x, then compile, fit and evaluate; the model."""
    x = keras.layers.Dropout(0.5, seed=7001)(x)
    outputs = keras.layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    trainable = int(sum(np.prod(w.shape) for w in model.trainable_weights))
    print(f"trainable params: {trainable:,}")
    model.compile(loss="binary_crossentropy", optimizer="rmsprop", metrics=["accuracy"])
    # A tf.data pipeline, shuffled anew each epoch from the global seed. Handing fit() the arrays instead
    # (Keras' array adapter) trains mini Xception to other bits run to run on CPU here, at any thread
    # count and with op determinism on; the same batches from this pipeline train the same bits.
    batches = (tf.data.Dataset.from_tensor_slices(train).shuffle(len(train[0]), reshuffle_each_iteration=True)
               .batch(params["batch_size"]))
    model.fit(batches, epochs=params["epochs"], verbose=2, validation_data=val)
    loss, acc = model.evaluate(val[0], val[1], verbose=0)
    print(f"accuracy: {acc:.3f}")
    return model
