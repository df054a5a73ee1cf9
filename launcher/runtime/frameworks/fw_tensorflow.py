"""TensorFlow and Keras: the global seed, op determinism (framework-reproducibility's
``enable_determinism``, else TensorFlow's own switch) and the thread pools, set the moment TensorFlow
is imported, before its context starts; Keras' fit() recorded when Keras is imported
(launcher.runtime.keras_fit), which watches training and changes nothing of it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from launcher.runtime.frameworks.base import DETERMINISTIC, Framework

if TYPE_CHECKING:
    from launcher.runtime.record import Recorder
    from launcher.runtime.records import Applied


def apply_tensorflow(tf: Any, profile: str, seed: int | None, threads: int | None) -> Applied:
    """The profile on TensorFlow, just imported (before its context starts): the global seed, op
    determinism, the thread pools. Keras' own part is :func:`apply_keras`."""
    info: Applied = {"name": "tensorflow", "version": tf.__version__}
    if seed is not None:
        tf.random.set_seed(seed)
        info["seeded"] = ["python", "numpy", "tensorflow"]
    info["op_determinism"] = None
    if profile in DETERMINISTIC:
        try:
            from fwr13y.d9m.tensorflow import enable_determinism

            enable_determinism()
            info["op_determinism"] = "fwr13y.d9m.tensorflow.enable_determinism"
        except ImportError:
            tf.config.experimental.enable_op_determinism()
            info["op_determinism"] = "tf.config.experimental.enable_op_determinism"
    if threads is not None:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    info["threads"] = {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                       "inter_op": tf.config.threading.get_inter_op_parallelism_threads()}
    build = dict(tf.sysconfig.get_build_info())
    info["build"] = {k: str(v) for k, v in sorted(build.items())}
    info["cuda"] = str(build.get("cuda_version")) if build.get("cuda_version") else None
    info["cudnn"] = str(build.get("cudnn_version")) if build.get("cudnn_version") else None
    info["devices"] = [f"{d.device_type}:{d.name}" for d in tf.config.list_physical_devices()]
    return info


def apply_keras(keras: Any, rec: Recorder) -> Applied:
    """Keras, just imported: its version and backend, and on TensorFlow the recording of fit()
    (launcher.runtime.keras_fit), which watches training and changes nothing of it."""
    backend = keras.backend.backend() if hasattr(keras, "backend") else None
    info: Applied = {"version": getattr(keras, "__version__", None), "backend": backend}
    if backend == "tensorflow":
        import tensorflow as tf

        from launcher.runtime import keras_fit

        keras_fit.install(keras, tf, rec)
        info["fit_recorded"] = True
    else:
        info["fit_recorded"] = False
    return info


def keras_imported(rt: Any, keras: Any) -> None:
    """Keras was imported: its version and backend in runtime.json, and fit() recorded on TensorFlow."""
    try:
        info = apply_keras(keras, rt.rec)
    except Exception as exc:  # recording is a convenience; training goes on as written
        info = {"error": f"{type(exc).__name__}: {exc}", "fit_recorded": False}
        print(f"launcher: fit() of Keras will not be recorded: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
    if "tensorflow" in rt.applied:
        rt.applied["tensorflow"]["keras"] = info.get("version")
    rt.applied.setdefault("keras", {}).update(info)
    rt.write()


SCAFFOLD = '''"""{name}: a small Keras model trained with model.fit.

The runtime applies the determinism profile before this file runs and records the dataset,
initial weights, batch order, metrics and final weights of every model.fit on arrays.
"""

import numpy as np
import tensorflow as tf

from launcher.runtime import api

keras = tf.keras
p = api.params()
if p["dataset"] == "files":
    path = api.data_dir() / "data.npz"
    if not path.is_file():
        raise api.BadData(f"{{path}}: not found; expected data.npz with arrays x and y")
    with np.load(path) as f:
        x, y = f["x"], f["y"]
else:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    api.record_dataset({{"x": x, "y": y}})

model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dropout(0.2), keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=p["batch_size"], epochs=p["epochs"], validation_split=0.2, verbose=2)
'''


def _env(threads: str) -> dict[str, str]:
    return {"TF_DETERMINISTIC_OPS": "1", "TF_CUDNN_DETERMINISTIC": "1", "TF_NUM_INTRAOP_THREADS": threads,
            "TF_NUM_INTEROP_THREADS": threads}


TENSORFLOW = Framework(
    name="tensorflow", label="TensorFlow/Keras", modules=("tensorflow", "keras", "tf_keras"),
    packages=("tensorflow", "tensorflow-cpu"), variant=None, apply=apply_tensorflow, env=_env,
    seeders={"tensorflow": (("random.set_seed", "tensorflow.random.set_seed"),),
             "keras": (("utils.set_random_seed", "keras.utils.set_random_seed"),),
             # tf.keras is a module of its own, imported on first use
             "keras._tf_keras.keras.utils": (("set_random_seed", "keras.utils.set_random_seed"),)},
    hooks=(("keras", keras_imported),), scaffold=SCAFFOLD)
