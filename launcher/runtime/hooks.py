"""Imported first in the recipe's interpreter: applies the determinism profile from the
environment, hooks the framework so the run records its fingerprints, and writes
``_launcher/runtime.json`` (what was actually applied).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import random
import sys
from typing import Any

from launcher.runtime import fingerprints as fp
from launcher.runtime.record import Recorder, recorder

DETERMINISTIC = ("strict", "deterministic")
ENV_KEYS = ("LAUNCHER_PROFILE", "LAUNCHER_SEED", "LAUNCHER_THREADS", "PYTHONHASHSEED", "TF_DETERMINISTIC_OPS",
            "TF_CUDNN_DETERMINISTIC", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "XLA_FLAGS",
            "CUDA_VISIBLE_DEVICES")


def settings() -> tuple[str, int | None, int | None]:
    profile = os.environ.get("LAUNCHER_PROFILE", "off")
    seed = os.environ.get("LAUNCHER_SEED")
    threads = os.environ.get("LAUNCHER_THREADS")
    return profile, int(seed) if seed else None, int(threads) if threads else None


def detect_framework(source: str) -> str:
    """For a plain script: which framework it imports (read, not executed)."""
    if "tensorflow" in source or "keras" in source:
        return "tensorflow"
    if "torch" in source:
        return "torch"
    return "none"


def _seed_python_numpy(seed: int) -> dict[str, Any]:
    random.seed(seed)
    applied: dict[str, Any] = {"python_random": seed}
    if importlib.util.find_spec("numpy") is not None:
        import numpy as np

        np.random.seed(seed)
        applied["numpy"] = seed
    return applied


def apply_tensorflow(profile: str, seed: int | None, threads: int | None, rec: Recorder) -> dict[str, Any]:
    import tensorflow as tf

    keras = tf.keras
    info: dict[str, Any] = {"name": "tensorflow", "version": tf.__version__,
                            "keras": getattr(keras, "__version__", None)}
    if seed is not None:
        keras.utils.set_random_seed(seed)  # python, numpy and the TF/Keras global seed
        info["seeded"] = ["python", "numpy", "tensorflow", "keras"]
    if profile in DETERMINISTIC:
        try:
            from fwr13y.d9m.tensorflow import enable_determinism

            enable_determinism()
            info["op_determinism"] = "fwr13y.d9m.tensorflow.enable_determinism"
        except ImportError:
            tf.config.experimental.enable_op_determinism()
            info["op_determinism"] = "tf.config.experimental.enable_op_determinism"
    else:
        info["op_determinism"] = None
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
    from launcher.runtime import keras_fit

    keras_fit.install(keras, tf, rec)
    return info


def apply_torch(profile: str, seed: int | None, threads: int | None) -> dict[str, Any]:
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    info: dict[str, Any] = {"name": "torch", "version": torch.__version__, "cuda": torch.version.cuda,
                            "cudnn": cudnn}
    if seed is not None:
        torch.manual_seed(seed)  # seeds CPU and every CUDA device
        info["seeded"] = ["python", "numpy", "torch"]
    if profile in DETERMINISTIC:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        info["deterministic_algorithms"] = True
    else:
        info["deterministic_algorithms"] = False
    if threads is not None:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # only settable before the first parallel work
            pass
    info["threads"] = {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    info["cudnn_flags"] = {"deterministic": torch.backends.cudnn.deterministic,
                           "benchmark": torch.backends.cudnn.benchmark}
    info["devices"] = ["cpu"] + [f"cuda:{i}:{torch.cuda.get_device_name(i)}"
                                 for i in range(torch.cuda.device_count())]
    return info


def install(framework: str) -> dict[str, Any]:
    """Apply the profile for ``framework`` (tensorflow | torch | none); returns runtime.json's content."""
    profile, seed, threads = settings()
    rec = recorder()
    applied: dict[str, Any] = {}
    if seed is not None:
        applied.update(_seed_python_numpy(seed))
    fw: dict[str, Any] | None = None
    if framework == "tensorflow":
        fw = apply_tensorflow(profile, seed, threads, rec)
    elif framework == "torch":
        fw = apply_torch(profile, seed, threads)
    doc = {
        "profile": profile,
        "seed": seed,
        "threads": threads,
        "seeded": applied,
        "framework": fw,
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "machine": platform.machine(),
                     "release": platform.release(), "cpu_count": os.cpu_count()},
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
    }
    fp.write_json(rec.path("_launcher/runtime.json"), doc)
    return doc
