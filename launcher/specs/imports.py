"""Which frameworks a plain script's code imports, read without running it.

The host needs a guess before anything runs: to refuse a PyTorch script in the TensorFlow image
before a build, and to take a variant that has the framework. The guess follows the code the way
Python would find it: the script's own imports, then the project's modules it imports (beside the
script, which is ``sys.path[0]``, or inside the code folder, relative imports included), and so on,
reading each file's syntax tree. What really ran is what the runtime records in the container
(launcher.runtime.hooks); this module never decides a verdict.
"""

from __future__ import annotations

import ast
from pathlib import Path

from launcher.runtime.frameworks import for_module

MAX_FILES = 2000
MAX_DEPTH = 200


def _imported_names(tree: ast.AST, package: list[str]) -> list[str]:
    """Dotted module names a module imports, in source order, relative ones made absolute."""
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level > len(package):  # beyond the top package, or relative in the script itself
                continue
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])]) if node.level else (
                node.module or "")
            if mod:
                names = [mod, *(f"{mod}.{alias.name}" for alias in node.names if alias.name != "*")]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__"):
                names = [node.args[0].value]
        found += [(getattr(node, "lineno", 0), getattr(node, "col_offset", 0), n) for n in names]
    return [name for _, _, name in sorted(found, key=lambda t: (t[0], t[1]))]


def _module_file(name: str, roots: list[Path]) -> tuple[Path, list[str]] | None:
    """The project file a dotted name imports (module.py or package/__init__.py), and its package."""
    parts = name.split(".")
    for root in roots:
        base = root.joinpath(*parts)
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), parts[:-1]
        if (base / "__init__.py").is_file():
            return base / "__init__.py", parts
    return None


def frameworks(script: Path, code_root: Path | None = None) -> list[str]:
    """The frameworks the script's code imports, in the order Python would first import them
    (depth first through the project's own modules, each file once); [] for none."""
    script = script.resolve()
    roots = [script.parent] + ([code_root.resolve()] if code_root and code_root.resolve() != script.parent else [])
    found: list[str] = []
    seen: set[Path] = {script}

    def visit(path: Path, package: list[str], depth: int) -> None:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
        except (SyntaxError, ValueError, OSError):
            return
        for name in _imported_names(tree, package):
            known = for_module(name)
            framework = known.name if known else None
            if framework is not None:
                if framework not in found:
                    found.append(framework)
                continue
            parts = name.split(".")
            for n in range(1, len(parts) + 1):  # a.b.c runs a's and a.b's __init__ first
                hit = _module_file(".".join(parts[:n]), roots)
                if hit is not None and hit[0] not in seen and len(seen) < MAX_FILES and depth < MAX_DEPTH:
                    seen.add(hit[0])
                    visit(hit[0], hit[1], depth + 1)

    visit(script, [], 0)
    return found


def framework(script: Path, code_root: Path | None = None) -> str:
    """The script's framework as a recipe names it: the first one its code imports, else "none"."""
    found = frameworks(script, code_root)
    return found[0] if found else "none"
