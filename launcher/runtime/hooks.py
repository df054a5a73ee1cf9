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
import functools
import importlib
import os
import random
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.runtime import fingerprints as fp
from launcher.runtime import frameworks, importwatch, seedcalls
from launcher.runtime.frameworks import DETERMINISTIC, Framework
from launcher.runtime.outfiles import RUNTIME_JSON
from launcher.runtime.record import Recorder, recorder

if TYPE_CHECKING:
    from launcher.runtime.records import Applied, Determinism, PlatformInfo, PythonInfo, RuntimeDocument

SEEDED = (*DETERMINISTIC, "seeded")
# the variables runtime.json keeps: launcher's, the profile's common ones, and every framework's
ENV_KEYS = ("LAUNCHER_PROFILE", "LAUNCHER_SEED", "LAUNCHER_THREADS", "PYTHONHASHSEED", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "SOURCE_DATE_EPOCH")


def settings() -> tuple[str, int | None, int | None]:
    profile = os.environ.get("LAUNCHER_PROFILE", "off")
    seed = os.environ.get("LAUNCHER_SEED")
    threads = os.environ.get("LAUNCHER_THREADS")
    return profile, int(seed) if seed else None, int(threads) if threads else None


def _seed_numpy_at_import(watch: importwatch.ImportWatch, rt: Runtime, seed: int) -> None:
    """NumPy's global generator seeded the moment the code imports NumPy, not before: an interpreter
    whose code never imports it does not pay for its import. The generator lives in numpy.random,
    which NumPy 2 loads only on first use: the import of numpy brings it in, and its seeding runs
    right after numpy.random's own code, before the code's seed calls are wrapped (registered after
    this) and before any code can draw from it."""

    def seed_numpy(module: types.ModuleType) -> None:
        module.seed(seed)
        rt.seeded["numpy"] = seed
        rt.write()

    def bring_random(module: types.ModuleType) -> None:
        importlib.import_module("numpy.random")

    watch.on_import("numpy.random", seed_numpy)
    watch.on_import("numpy", bring_random)


def python_info() -> PythonInfo:
    """The interpreter, as the platform module names it. CPython's version is the first word of
    sys.version, which is what platform reads (with ".0" added to a two-part version); any other
    interpreter is left to platform itself, whose import is otherwise paid before the code's first line."""
    version = sys.version.split(None, 1)[0] if sys.version else ""
    if sys.implementation.name == "cpython" and version.count(".") == 2 and "PyPy" not in sys.version \
            and "IronPython" not in sys.version and not sys.platform.startswith("java") \
            and version.replace(".", "").replace("+", "").isalnum():
        return {"version": version, "implementation": "CPython", "executable": sys.executable}
    import platform

    return {"version": platform.python_version(), "implementation": platform.python_implementation(),
            "executable": sys.executable}


def platform_info() -> PlatformInfo:
    """The machine, as the platform module names it: on a POSIX system os.uname()'s fields (platform
    takes them unchanged there), elsewhere platform's own answer."""
    uname = getattr(os, "uname", None)
    if uname is not None and sys.platform.startswith(("linux", "darwin")):
        u = uname()
        return {"system": u.sysname, "machine": u.machine, "release": u.release, "cpu_count": os.cpu_count()}
    import platform

    return {"system": platform.system(), "machine": platform.machine(), "release": platform.release(),
            "cpu_count": os.cpu_count()}


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


def _applied_phrase(info: Applied, rt: Runtime) -> str:
    """What the profile did to a framework, in a few words for the log."""
    if rt.profile not in SEEDED:
        return f"profile {rt.profile}, nothing applied"
    parts = [f"seed {rt.seed}"] if rt.seed is not None else []
    if info.get("op_determinism") or info.get("deterministic_algorithms") or info.get("deterministic_ops"):
        parts.append("deterministic ops")
    threads = info.get("threads")
    if isinstance(threads, dict) and threads.get("intra_op"):
        parts.append(f"{threads['intra_op']} thread{'' if threads['intra_op'] == 1 else 's'}")
    return f"{rt.profile} profile ({', '.join(parts) or 'seeded'})"


class Runtime:
    """What the runtime applied in this interpreter, written to runtime.json whenever it changes."""

    def __init__(self, profile: str, seed: int | None, threads: int | None, rec: Recorder) -> None:
        self.profile, self.seed, self.threads, self.rec = profile, seed, threads, rec
        self.seeded: dict[str, int] = {}  # what launcher seeded itself: python_random, numpy
        self.frameworks: list[str] = []
        self.applied: dict[str, Applied] = {}
        self.seed_calls = seedcalls.SeedCalls()

    def determinism(self) -> Determinism:
        """Whether the profile was in force on the code that ran, and why (or why not)."""
        if self.profile not in SEEDED:
            return {"in_force": False, "reason": f"profile {self.profile}: nothing was seeded or made deterministic"}
        failed = [name for name in self.frameworks if "error" in self.applied.get(name, {})]
        if failed:
            return {"in_force": False, "reason": f"the profile could not be applied to {', '.join(failed)}: "
                    + str(self.applied[failed[0]]["error"])}
        if not self.frameworks:
            return {"in_force": False, "reason": f"no known framework was imported ({frameworks.labels()}): "
                    "only Python and NumPy "
                    "were seeded"}
        if self.profile == "seeded":
            return {"in_force": True, "reason": f"seeded only (profile seeded) for {', '.join(self.frameworks)}: "
                    "op determinism off"}
        return {"in_force": True, "reason": f"{self.profile} profile applied to {', '.join(self.frameworks)}"}

    def document(self) -> RuntimeDocument:
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
            "python": python_info(),
            "platform": platform_info(),
            "env": {k: os.environ[k] for k in (*ENV_KEYS, *frameworks.deterministic_env("1")) if k in os.environ},
        }

    def write(self) -> None:
        fp.write_json(self.rec.path(RUNTIME_JSON), self.document())

    def framework_imported(self, name: str, apply: Callable[[], Applied]) -> None:
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

def watch_framework(watch: importwatch.ImportWatch, rt: Runtime, framework: Framework) -> None:
    """When the code imports the framework: the profile applied to it, then its recording hooks."""
    profile, seed, threads = rt.profile, rt.seed, rt.threads

    def imported(module: types.ModuleType) -> None:
        rt.framework_imported(framework.name, lambda: framework.apply(module, profile, seed, threads))

    watch.on_import(framework.watched, imported)
    for name, hook in framework.hooks:
        watch.on_import(name, functools.partial(_run_hook, rt, framework, hook))


def _run_hook(rt: Runtime, framework: Framework, hook: Any, module: types.ModuleType) -> None:
    try:
        hook(rt, module)
    except Exception as exc:  # recording is a convenience; training goes on as written
        print(f"launcher: {framework.label} will not be recorded: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


def install() -> Runtime:
    """Seed Python now, and NumPy and each framework (the profile applied) when the code imports it."""
    profile, seed, threads = settings()
    rt = Runtime(profile, seed, threads, recorder())
    rt.rec.checkpoints  # noqa: B018 - read now: a resumed run keeps the first segment's records
    watch = importwatch.install()
    if seed is not None:
        random.seed(seed)
        rt.seeded["python_random"] = seed
        _seed_numpy_at_import(watch, rt, seed)
    for framework in frameworks.all_frameworks():
        watch_framework(watch, rt, framework)
    for name in seedcalls.seeders():  # after launcher's own seeding (above, and at each import): not listed
        watch.on_import(name, rt.seed_calls.wrap_module)
    rt.write()
    atexit.register(rt.write)  # the seed calls made up to the end
    return rt
