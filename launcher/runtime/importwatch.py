"""Run a function the moment a module has been imported, from wherever in the program it is imported.

A ``sys.meta_path`` finder that answers only for the watched top-level names: it asks the other
finders for the module's spec and wraps the spec's loader, so that right after the module's own code
has run (and before the importer gets it back) the watcher's callbacks run with the module. Nothing
else about the import changes: the same file, loader, package path and module object.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence

# importlib.abc.Loader is this class (importlib.abc re-exports it); importlib.abc itself would bring
# importlib.resources in before the recipe's first line
from importlib._abc import Loader as _AbcLoader
from typing import Any

Callback = Callable[[types.ModuleType], None]


class _Loader(_AbcLoader):
    """The module's own loader, then the callbacks."""

    def __init__(self, inner: Any, done: Callable[[types.ModuleType], None]) -> None:
        self.inner = inner
        self.done = done

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        create = getattr(self.inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        self.done(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, get_code...: the inner loader's
        return getattr(self.inner, name)


class ImportWatch:
    """Callbacks per top-level module name, each called once, after that module is first imported.

    A meta path finder by its methods (``find_spec``, ``invalidate_caches``), as the import system
    asks of one; importlib.abc.MetaPathFinder adds nothing else."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callback]] = {}
        self._resolving: set[str] = set()

    def on_import(self, name: str, callback: Callback) -> None:
        """Call callback(module) once name is imported; at once if it is imported already."""
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None:
            callback(module)
            return
        self.callbacks.setdefault(name, []).append(callback)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.callbacks or fullname in self._resolving:
            return None
        self._resolving.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._resolving.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self._imported)
        return spec

    def invalidate_caches(self) -> None:
        """Nothing cached here (importlib.invalidate_caches() asks every finder)."""

    def _imported(self, module: types.ModuleType) -> None:
        for callback in self.callbacks.pop(module.__name__, []):
            callback(module)


def install() -> ImportWatch:
    """The process's watch, first on sys.meta_path (made once)."""
    for finder in sys.meta_path:
        if isinstance(finder, ImportWatch):
            return finder
    watch = ImportWatch()
    sys.meta_path.insert(0, watch)
    return watch
