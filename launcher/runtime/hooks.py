"""Imported first in the recipe's interpreter: seeds Python and NumPy, then applies the determinism
profile to each framework the moment the code imports it, from whichever module of the project
(:mod:`launcher.runtime.importwatch`), and writes ``_launcher/runtime.json``: what was imported,
what was applied, the seeds the code set itself, and whether determinism was in force.

Which framework a script uses is learnt from what it imports while it runs, never from its text:
a ``train.py`` that imports Keras through its own ``model_def.py`` is seeded like one that imports
it directly. Code that imports no framework launcher knows gets Python and NumPy seeding only, and
runtime.json says that determinism was not guaranteed.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import platform
import random
import sys
import types
from collections.abc import Callable
from typing import Any

from launcher.runtime import checkpoint, importwatch, optrace, seedcalls, steps
from launcher.runtime import fingerprints as fp
from launcher.runtime.record import Recorder, recorder

DETERMINISTIC = ("strict", "deterministic")
SEEDED = (*DETERMINISTIC, "seeded")
FRAMEWORKS = ("tensorflow", "torch", "jax")
KNOWN = "TensorFlow/Keras, PyTorch, JAX"
ENV_KEYS = ("LAUNCHER_PROFILE", "LAUNCHER_SEED", "LAUNCHER_THREADS", "PYTHONHASHSEED", "TF_DETERMINISTIC_OPS",
            "TF_CUDNN_DETERMINISTIC", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "XLA_FLAGS",
            "CUDA_VISIBLE_DEVICES")


def settings() -> tuple[str, int | None, int | None]:
    profile = os.environ.get("LAUNCHER_PROFILE", "off")
    seed = os.environ.get("LAUNCHER_SEED")
    threads = os.environ.get("LAUNCHER_THREADS")
    return profile, int(seed) if seed else None, int(threads) if threads else None


def _seed_python_numpy(seed: int) -> dict[str, Any]:
    random.seed(seed)
    applied: dict[str, Any] = {"python_random": seed}
    if importlib.util.find_spec("numpy") is not None:
        import numpy as np

        np.random.seed(seed)
        applied["numpy"] = seed
    return applied


def apply_tensorflow(tf: Any, profile: str, seed: int | None, threads: int | None) -> dict[str, Any]:
    """The profile on TensorFlow, just imported (before its context starts): the global seed, op
    determinism, the thread pools. Keras' own part is :func:`apply_keras`."""
    info: dict[str, Any] = {"name": "tensorflow", "version": tf.__version__}
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


def apply_keras(keras: Any, rec: Recorder) -> dict[str, Any]:
    """Keras, just imported: its version and backend, and on TensorFlow the recording of fit()
    (launcher.runtime.keras_fit), which watches training and changes nothing of it."""
    backend = keras.backend.backend() if hasattr(keras, "backend") else None
    info: dict[str, Any] = {"version": getattr(keras, "__version__", None), "backend": backend}
    if backend == "tensorflow":
        import tensorflow as tf

        from launcher.runtime import keras_fit

        keras_fit.install(keras, tf, rec)
        info["fit_recorded"] = True
    else:
        info["fit_recorded"] = False
    return info


def apply_torch(torch: Any, profile: str, seed: int | None, threads: int | None) -> dict[str, Any]:
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


def apply_jax(jax: Any, profile: str, seed: int | None, threads: int | None) -> dict[str, Any]:
    """JAX has no global random state to seed (its PRNG keys are the program's own); its kernels are
    made deterministic by the profile's XLA_FLAGS, read when its backend starts."""
    info: dict[str, Any] = {"name": "jax", "version": getattr(jax, "__version__", None),
                            "xla_flags": os.environ.get("XLA_FLAGS"),
                            "deterministic_ops": profile in DETERMINISTIC
                            and "--xla_gpu_deterministic_ops=true" in os.environ.get("XLA_FLAGS", "")}
    info["seeded"] = ["python", "numpy"] if seed is not None else []
    info["note"] = "JAX's PRNG keys come from the program: launcher cannot seed them"
    return info


def _importer() -> str | None:
    """The file of the program's own code whose import brought a framework in (the first frame
    outside the import machinery, launcher's runtime and installed packages), as path:line."""
    frame = sys._getframe(1)
    skip = ("<frozen ", os.path.dirname(__file__), *{p for p in sys.path if p.endswith("-packages")})
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip) and "importlib" not in name:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _applied_phrase(info: dict[str, Any], rt: Runtime) -> str:
    """What the profile did to a framework, in a few words for the log."""
    if rt.profile not in SEEDED:
        return f"profile {rt.profile}, nothing applied"
    parts = [f"seed {rt.seed}"] if rt.seed is not None else []
    if info.get("op_determinism") or info.get("deterministic_algorithms") or info.get("deterministic_ops"):
        parts.append("deterministic ops")
    threads = info.get("threads")
    if isinstance(threads, dict) and threads.get("intra_op"):
        parts.append(f"{threads['intra_op']} threads")
    return f"{rt.profile} profile ({', '.join(parts) or 'seeded'})"


class Runtime:
    """What the runtime applied in this interpreter, written to runtime.json whenever it changes."""

    def __init__(self, profile: str, seed: int | None, threads: int | None, rec: Recorder) -> None:
        self.profile, self.seed, self.threads, self.rec = profile, seed, threads, rec
        self.seeded: dict[str, Any] = {}
        self.frameworks: list[str] = []
        self.applied: dict[str, dict[str, Any]] = {}
        self.seed_calls = seedcalls.SeedCalls()

    def determinism(self) -> dict[str, Any]:
        """Whether the profile was in force on the code that ran, and why (or why not)."""
        if self.profile not in SEEDED:
            return {"in_force": False, "reason": f"profile {self.profile}: nothing was seeded or made deterministic"}
        failed = [name for name in self.frameworks if "error" in self.applied.get(name, {})]
        if failed:
            return {"in_force": False, "reason": f"the profile could not be applied to {', '.join(failed)}: "
                    + str(self.applied[failed[0]]["error"])}
        if not self.frameworks:
            return {"in_force": False, "reason": f"no known framework was imported ({KNOWN}): only Python and NumPy "
                    "were seeded"}
        if self.profile == "seeded":
            return {"in_force": True, "reason": f"seeded only (profile seeded) for {', '.join(self.frameworks)}: "
                    "op determinism off"}
        return {"in_force": True, "reason": f"{self.profile} profile applied to {', '.join(self.frameworks)}"}

    def document(self) -> dict[str, Any]:
        first = self.applied.get(self.frameworks[0]) if self.frameworks else None
        return {
            "profile": self.profile,
            "seed": self.seed,
            "threads": self.threads,
            "seeded": self.seeded,
            "framework": first,
            "frameworks": list(self.frameworks),
            "applied": self.applied,
            "seed_calls": list(self.seed_calls.calls),
            "seed_calls_total": self.seed_calls.count,
            "determinism": self.determinism(),
            "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                       "executable": sys.executable},
            "platform": {"system": platform.system(), "machine": platform.machine(),
                         "release": platform.release(), "cpu_count": os.cpu_count()},
            "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        }

    def write(self) -> None:
        fp.write_json(self.rec.path("_launcher/runtime.json"), self.document())

    def framework_imported(self, name: str, apply: Callable[[], dict[str, Any]]) -> None:
        """A framework was just imported: apply the profile to it and record what was applied. A
        failure to apply is recorded and printed, and the run goes on without the guarantee."""
        if name in self.applied:
            return
        self.frameworks.append(name)
        by = _importer()
        try:
            self.applied[name] = {**apply(), **({"imported_by": by} if by else {})}
        except Exception as exc:  # the code's own import must not fail because of launcher
            self.applied[name] = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
            print(f"launcher: could not apply the {self.profile} profile to {name}: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        else:
            info = self.applied[name]
            where = f" by {by}" if by else ""
            print(f"launcher: {name} {info.get('version') or ''} imported{where}: {_applied_phrase(info, self)}",
                  file=sys.stderr, flush=True)
        self.write()

    def torch_imported(self, torch: types.ModuleType) -> None:
        """Step fingerprints of whatever the code trains (launcher.runtime.steps); with checkpoints
        asked for, a refusal at the first optimizer step of code that does not use the checkpoint api."""
        try:
            trace = self.rec.optrace
            ops = optrace.install_torch(torch, trace) if trace is not None else None
            self.rec.torch_steps = steps.install_torch(torch, self.rec.trace, ops)
        except Exception as exc:  # recording is a convenience; training goes on as written
            print(f"launcher: training steps will not be fingerprinted: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        if self.rec.checkpoints.active:
            _refuse_unresumable_torch(self.rec)

    def keras_imported(self, keras: types.ModuleType) -> None:
        try:
            info = apply_keras(keras, self.rec)
        except Exception as exc:  # recording is a convenience; training goes on as written
            info = {"error": f"{type(exc).__name__}: {exc}", "fit_recorded": False}
            print(f"launcher: fit() of Keras will not be recorded: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        if "tensorflow" in self.applied:
            self.applied["tensorflow"]["keras"] = info.get("version")
        self.applied.setdefault("keras", {}).update(info)
        self.write()


def _refuse_unresumable_torch(rec: Recorder) -> None:
    """Checkpoints asked for, and a torch optimizer steps before launcher.runtime.api.resume_point was
    called: the script's own loop cannot be checkpointed or resumed by launcher, so it stops there."""
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook
    except ImportError:
        return

    def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not rec.checkpoints.engaged:
            raise checkpoint.NotResumable(
                "--checkpoint-every needs a PyTorch script to call launcher.runtime.api.resume_point(model, "
                "optimizer, generator) before its epoch loop and api.checkpoint(epoch, ...) at each epoch's end "
                "(docs/recipes.md); this one trains without them, so it cannot be resumed bit for bit")

    register_optimizer_step_pre_hook(before_step)


def install() -> Runtime:
    """Seed Python and NumPy now; apply the profile to each framework when the code imports it."""
    profile, seed, threads = settings()
    rt = Runtime(profile, seed, threads, recorder())
    rt.rec.checkpoints  # noqa: B018 - read now: a resumed run keeps the first segment's records
    if seed is not None:
        rt.seeded = _seed_python_numpy(seed)
    watch = importwatch.install()
    watch.on_import("tensorflow", lambda m: rt.framework_imported(
        "tensorflow", lambda: apply_tensorflow(m, profile, seed, threads)))
    watch.on_import("keras", rt.keras_imported)
    watch.on_import("torch", lambda m: rt.framework_imported("torch", lambda: apply_torch(m, profile, seed, threads)))
    watch.on_import("torch", rt.torch_imported)
    watch.on_import("jax", lambda m: rt.framework_imported("jax", lambda: apply_jax(m, profile, seed, threads)))
    for name in seedcalls.SEEDERS:  # after launcher's own seeding (above, and at each import): not listed
        watch.on_import(name, rt.seed_calls.wrap_module)
    rt.write()
    atexit.register(rt.write)  # the seed calls made up to the end
    return rt
