"""Seed 000: U-Net for Oxford-IIIT Pet segmentation with a MobileNetV2 (default) or VGG19 backbone,
skip connections from the layers the seed names, seeded initialisers and dropout, Adam at the seed's
tuned learning rate, batch 60, 12 epochs. Backbone weights come only from a local file
(`backbone_weights`); without one the backbone trains from scratch. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
from pets import load_pets, synthetic
from recipelib.splits import first

from launcher.runtime import api

keras = tf.keras
layers = keras.layers
p = api.params()
SIZE = int(p["img_size"])
if SIZE % 32:  # each decoder step doubles a skip's size back: five halvings must all be exact
    raise SystemExit(f"img_size must be a multiple of 32 (32, 64, 96, 128, ...), not {SIZE}")
OUTPUT_CLASSES = 3
SKIPS = {
    "mobilenetv2": ["block_1_expand_relu", "block_3_expand_relu", "block_6_expand_relu",
                    "block_13_expand_relu", "block_16_project"],
    "vgg19": ["block1_pool", "block2_pool", "block3_pool", "block4_pool", "block5_pool"],
}
backbone_name = str(p["backbone"]).lower()
if backbone_name not in SKIPS:
    raise SystemExit(f"backbone must be mobilenetv2 or vgg19, not {p['backbone']!r}")
dropout_seed = None if str(p["dropout_seed"]) == "none" else int(p["dropout_seed"])
init_seed = int(p["init_seed"])

if p["dataset"] == "files":
    arrays = load_pets(api.data_dir(), SIZE)
else:
    arrays = synthetic(SIZE)
    if SIZE == 128:
        api.record_dataset(arrays)
x_train, y_train = first(arrays, "train", p["train_samples"])
x_val, y_val = first(arrays, "val")
print(f"{len(x_train)} train, {len(x_val)} validation pets of {SIZE}x{SIZE} (md5(pet_id) % 10 partition)")


def preprocess(x: np.ndarray) -> np.ndarray:
    x = x.astype("float32")
    if backbone_name == "mobilenetv2":
        return x / 127.5 - 1.0
    return keras.applications.vgg19.preprocess_input(x)


weights_file = str(p["backbone_weights"])
weights: str | None = None
if weights_file:
    if not Path(weights_file).is_file():
        raise api.BadData(f"{weights_file}: backbone weights file not found (nothing is downloaded)")
    weights = weights_file
if backbone_name == "mobilenetv2":
    base = keras.applications.MobileNetV2(input_shape=[SIZE, SIZE, 3], include_top=False, weights=weights)
else:
    base = keras.applications.VGG19(input_shape=[SIZE, SIZE, 3], include_top=False, weights=weights)
down_stack = keras.Model(inputs=base.input, outputs=[base.get_layer(n).output for n in SKIPS[backbone_name]],
                         name=f"{backbone_name}_down")
down_stack.trainable = not (weights and p["freeze_backbone"])


def upsample(filters: int, size: int, seed: int, name: str) -> keras.Sequential:
    """Conv2DTranspose (x2) -> BatchNorm -> Dropout -> ReLU, the pix2pix decoder block."""
    block = [layers.Conv2DTranspose(filters, size, strides=2, padding="same", use_bias=False,
                                    kernel_initializer=keras.initializers.RandomNormal(0.0, 0.02, seed=seed)),
             layers.BatchNormalization()]
    if p["dropout"]:
        block.append(layers.Dropout(float(p["dropout"]), seed=dropout_seed))
    block.append(layers.ReLU())
    return keras.Sequential(block, name=name)


inputs = layers.Input(shape=[SIZE, SIZE, 3])
skips = down_stack(inputs)
x = skips[-1]
up_stack = [upsample(f, 3, init_seed + i, f"up_{f}") for i, f in enumerate((512, 256, 128, 64))]
for up, skip in zip(up_stack, reversed(skips[:-1]), strict=True):
    x = up(x)
    x = layers.Concatenate()([x, skip])
outputs = layers.Conv2DTranspose(OUTPUT_CLASSES, 3, strides=2, padding="same",
                                 kernel_initializer=keras.initializers.GlorotUniform(seed=init_seed + 9))(x)
model = keras.Model(inputs=inputs, outputs=outputs, name=f"unet_{backbone_name}")
trainable = int(sum(np.prod(w.shape) for w in model.trainable_weights))
print(f"{model.name}: trainable params: {trainable:,}")
model.compile(optimizer=keras.optimizers.Adam(learning_rate=float(p["learning_rate"])),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

x_val_in = preprocess(x_val)
rng = np.random.default_rng([api.seed() or 0, 3011]) if api.seed() is not None else np.random.default_rng()
epochs = int(p["epochs"])
for epoch in range(epochs):
    # tf.image.random_flip_left_right in the seed's pipeline: the same flip for an image and its mask
    flip = rng.random(len(x_train)) < 0.5 if p["flip"] else np.zeros(len(x_train), dtype=bool)
    xe = np.where(flip[:, None, None, None], x_train[:, :, ::-1], x_train)
    ye = np.where(flip[:, None, None, None], y_train[:, :, ::-1], y_train)
    model.fit(preprocess(xe), ye, batch_size=int(p["batch_size"]), epochs=epoch + 1, initial_epoch=epoch,
              verbose=2, validation_data=(x_val_in, y_val))
loss, acc = model.evaluate(x_val_in, y_val, verbose=0)
print(f"validation loss {loss:.4f}, pixel accuracy {acc:.4f}")
