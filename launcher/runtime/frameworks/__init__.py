"""The frameworks launcher knows (one module each, see :mod:`.base`), in the order they are listed to
people: TensorFlow/Keras, PyTorch, JAX. :func:`register` adds one (a plugin, or a test's toy)."""

from __future__ import annotations

from launcher.runtime.frameworks.base import DETERMINISTIC, Framework
from launcher.runtime.frameworks.fw_jax import JAX
from launcher.runtime.frameworks.fw_tensorflow import TENSORFLOW
from launcher.runtime.frameworks.fw_torch import TORCH

__all__ = ["DETERMINISTIC", "Framework", "all_frameworks", "deterministic_env", "for_module", "labels", "named",
           "names", "register", "seeders", "unregister"]

_REGISTRY: list[Framework] = [TENSORFLOW, TORCH, JAX]


def all_frameworks() -> tuple[Framework, ...]:
    return tuple(_REGISTRY)


def register(framework: Framework) -> None:
    """Add a framework (replacing one of the same name)."""
    unregister(framework.name)
    _REGISTRY.append(framework)


def unregister(name: str) -> None:
    _REGISTRY[:] = [f for f in _REGISTRY if f.name != name]


def named(name: str) -> Framework | None:
    return next((f for f in _REGISTRY if f.name == name), None)


def for_module(module: str) -> Framework | None:
    """The framework a dotted module name belongs to (by its top-level package), or None."""
    top = module.split(".", 1)[0]
    return next((f for f in _REGISTRY if top in f.modules), None)


def names() -> tuple[str, ...]:
    return tuple(f.name for f in _REGISTRY)


def labels() -> str:
    """"TensorFlow/Keras, PyTorch, JAX"."""
    return ", ".join(f.label for f in _REGISTRY)


def seeders() -> dict[str, tuple[tuple[str, str], ...]]:
    """Every framework's seeding functions, by module (launcher.runtime.seedcalls)."""
    out: dict[str, tuple[tuple[str, str], ...]] = {}
    for f in _REGISTRY:
        for module, funcs in f.seeders.items():
            out[module] = out.get(module, ()) + funcs
    return out


def deterministic_env(threads: str) -> dict[str, str]:
    """The deterministic profile's variables of every framework."""
    out: dict[str, str] = {}
    for f in _REGISTRY:
        out.update(f.env(threads))
    return out
