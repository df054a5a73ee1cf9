"""Every module of the package imports on its own in a fresh interpreter, as pip-tools'
tests/test_circular_imports.py does: an import cycle shows up as an ImportError naming a
partially initialised module, whichever module of the cycle happens to be imported first.
The runtime also imports without launcher's own third-party dependencies."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import launcher

PACKAGE = Path(launcher.__file__).parent
MODULES = sorted(m.name for m in pkgutil.walk_packages(launcher.__path__, "launcher.")
                 if not m.name.endswith("__main__"))


def test_every_module_is_found() -> None:
    assert {"launcher.cli", "launcher.hosts.base", "launcher.runtime.runner"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_on_its_own(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    if "partially initialized module" in done.stderr:
        pytest.fail(f"import cycle through {module}:\n{done.stderr[-800:]}")
    assert done.returncode == 0, f"{module}: {done.stderr[-800:]}"


def test_runtime_imports_without_third_party_packages() -> None:
    # The runtime is copied into images that have only numpy and a framework.
    code = ("import sys; sys.modules.update({m: None for m in ('typer', 'rich', 'docker', 'paramiko', "
            "'piptools')}); import launcher.runtime.runner")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-800:]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """The package's modules that `path` imports anywhere, inside functions too."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return (found & known) - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


# Cycles accepted for now, each with the reason; none today (open_host() moved from hosts/base.py,
# which local.py and ssh.py import, to launcher/hosts/__init__.py).
KNOWN_CYCLES: list[list[str]] = []


def test_no_cycle_hidden_in_function_level_imports() -> None:
    # An import inside a function defers a cycle rather than removing it: the fresh-interpreter
    # imports above pass, yet the modules still cannot be understood (or moved) one at a time.
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {_module_name(p) for p in paths}
    graph = {_module_name(p): _imports(p, known) for p in paths}
    assert _cycles(graph) == KNOWN_CYCLES


BENCHMARKS = sorted((PACKAGE.parent / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_benchmark_scripts_import_and_explain_themselves(script: Path) -> None:
    """The benchmarks are run by hand, so a moved module would otherwise break them unnoticed."""
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage" in done.stdout.lower(), f"{script.name}: {done.stderr[-800:]}"
