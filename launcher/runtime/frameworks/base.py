"""What launcher needs to know of a machine-learning framework, in one place.

A framework is one module in this package declaring a :class:`Framework`: the import names that mean
it (read statically on the host, watched at import in the container), the distributions that make it
importable (read in a variant's lock), the image variant its recipes run in, the environment that
makes it deterministic, the seeding functions a script may call itself, and what the runtime does
the moment the code imports it (``apply``: seed it and switch determinism on; ``hooks``: recording).
Adding a framework is one such module, listed in :mod:`launcher.runtime.frameworks`, plus its image
variant (lockfiles/NAME.in, dockerfiles/NAME.Dockerfile).

This package is copied into every image: nothing here imports a framework or launcher's host side
at module level.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from launcher.runtime.records import Applied

# apply(module, profile, seed, threads) -> what was applied, recorded in runtime.json `applied`
Apply = Callable[[Any, str, "int | None", "int | None"], "Applied"]
# hook(runtime, module): recording installed when a module is imported (the runtime is hooks.Runtime)
Hook = Callable[[Any, Any], None]
# a module's seeding functions: (attribute path inside it, the name a call is listed under)
Seeders = Mapping[str, tuple[tuple[str, str], ...]]

DETERMINISTIC = ("strict", "deterministic")


class Framework(NamedTuple):
    """A frozen record (a NamedTuple rather than a dataclass: the recipe's interpreter reads every
    framework before the recipe's first line, and dataclasses' import of inspect would be paid there)."""

    name: str  # as recipe.toml (`framework = ...`), runtime.json and the CLI name it
    label: str  # for people: "TensorFlow/Keras"
    modules: tuple[str, ...]  # top-level import names that mean it; the first is the one the profile is applied on
    packages: tuple[str, ...]  # distributions that make it importable (a variant's lock lists one of them)
    variant: str | None  # the image variant its recipes run in (None: the workspace's default variant)
    apply: Apply
    env: Callable[[str], dict[str, str]] = lambda threads: {}  # the deterministic profile's variables for it
    seeders: Seeders = MappingProxyType({})
    hooks: tuple[tuple[str, Hook], ...] = ()  # (module, hook) run when that module is imported, after apply
    scaffold: str | None = None  # train.py of `launcher recipes new --framework NAME` ({name} filled in)

    @property
    def watched(self) -> str:
        """The module whose import applies the profile."""
        return self.modules[0]
