"""The seeds a script sets itself, seen as it sets them.

The seeding functions of Python, NumPy and the frameworks are wrapped once their module is
imported: each call goes to the original function unchanged and is listed (the outermost call
only, so ``keras.utils.set_random_seed`` is one call, not four). launcher seeds before it wraps, so
its own seeding is not listed. ``launcher experiment --seeds different`` warns when a script
overrides the seed it was given, and ``runtime.json`` keeps the list (``seed_calls``).
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.runtime.records import SeedCall

# module -> (attribute path inside it, the name a call is listed under): Python's and NumPy's here,
# each framework's in its module (launcher.runtime.frameworks); a module's functions are wrapped when
# it is imported
SEEDERS: dict[str, tuple[tuple[str, str], ...]] = {
    "random": (("seed", "random.seed"),),
    "numpy.random": (("seed", "numpy.random.seed"),),
}


def seeders() -> dict[str, tuple[tuple[str, str], ...]]:
    from launcher.runtime import frameworks

    return {**SEEDERS, **frameworks.seeders()}


class SeedCalls:
    """The calls listed so far."""

    LISTED = 50  # a script that reseeds in a loop is listed by its first calls and counted

    def __init__(self) -> None:
        self.calls: list[SeedCall] = []
        self.count = 0
        self._depth = threading.local()

    def wrap_module(self, module: types.ModuleType) -> None:
        """Wrap the seeding functions seeders() lists for this module (one already loaded)."""
        for path, api in seeders().get(module.__name__, ()):
            owner: Any = module
            *parents, attr = path.split(".")
            try:
                for part in parents:
                    owner = getattr(owner, part)
                func = getattr(owner, attr)
            except (AttributeError, ImportError):
                continue
            if getattr(func, "__launcher_seed_call__", None) is not None or not callable(func):
                continue
            try:
                setattr(owner, attr, self._wrapper(func, api))
            except (AttributeError, TypeError):  # a read-only module attribute: leave it
                continue

    def _wrapper(self, func: Callable[..., Any], api: str) -> Callable[..., Any]:
        @functools.wraps(func)
        def seeded(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            if depth == 0:
                self.count += 1
                if len(self.calls) < self.LISTED:
                    value = args[0] if args else kwargs.get("seed", kwargs.get("a"))
                    self.calls.append({"api": api, "seed": value if isinstance(value, int) and not isinstance(
                        value, bool) else None if value is None else repr(value)[:80]})
            self._depth.n = depth + 1
            try:
                return func(*args, **kwargs)
            finally:
                self._depth.n = depth

        seeded.__launcher_seed_call__ = api  # type: ignore[attr-defined]
        return seeded
