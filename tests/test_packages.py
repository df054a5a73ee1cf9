"""The packages of launcher/ show the stages of a run and point one way: each imports only packages of a
lower layer, so the graph of packages has no cycle. Every import counts, deferred ones (inside a function,
under TYPE_CHECKING) too: a deferred import hides a dependency, it does not remove it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import launcher

PACKAGE = Path(launcher.__file__).parent

# Lowest first. A package (a folder of launcher/, or a module at its top) may import packages of lower layers
# only; packages of one layer do not import each other.
LAYERS: list[set[str]] = [
    {"launcher"},  # launcher/__init__.py: the version, nothing else
    {"errors"},
    {"hashing", "proc", "progress", "result", "memo", "workspace"},
    {"runtime"},  # copied into images: imports nothing of launcher outside it
    {"determinism"},  # the profiles as the host checks them, over the runtime's table
    {"config", "hosts"},
    {"images", "vms"},
    {"cache", "scaffold", "records"},  # records: a run folder's records, their one reader and writer each
    {"specs"},  # what a run is before it is placed: recipe or script, code plan, spec, container
    {"transfers"},  # images out, datasets and code out, outputs back
    {"targets"},  # where runs go: placements, the target registry, Slurm
    {"runs", "verify"},  # a run's life; the verdicts on finished runs
    {"attest", "report"},
    {"workflows"},  # running and verifying together: experiment, diverge, reproduce
    {"cli"},
    {"__main__"},
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imported(path: Path) -> set[str]:
    """Every launcher module or package `path` names in an import statement, wherever the statement is."""
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
    return {m for m in found if m == "launcher" or m.startswith("launcher.")}


def package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the imports that make the edge ("module -> module")."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        graph[_package(module)]  # every package is a node, even one that imports nothing
        for target in sorted(_imported(path)):
            if target != "launcher" and _package(target) != _package(module):
                graph[_package(module)][_package(target)].append(f"{module} -> {target}")
    return graph


def _cycle(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """One cycle of the graph as a path (first node repeated at its end), or [] when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_every_package_has_a_layer() -> None:
    layered = set().union(*LAYERS)
    assert sorted(set(package_graph()) - layered) == [], "give each new package its layer in LAYERS"
    assert sorted(layered - set(package_graph())) == [], "a package in LAYERS that launcher/ no longer has"


def test_packages_import_only_lower_layers() -> None:
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    wrong = [f"{edge} (layer {layer[a]} imports layer {layer[b]})"
             for a, targets in sorted(package_graph().items()) for b, edges in sorted(targets.items())
             if a in layer and b in layer and layer[b] >= layer[a] for edge in edges]
    assert wrong == []


def test_no_cycle_among_packages() -> None:
    # implied by the layers, and checked on its own: the message then names the cycle itself
    assert _cycle(package_graph()) == []


def test_the_guard_sees_a_deferred_import_and_a_cycle(tmp_path: Path) -> None:
    """The two checks above can fail: an import inside a function is seen, and a cycle is found."""
    tree = tmp_path / "launcher"
    (tree / "low").mkdir(parents=True)
    (tree / "__init__.py").write_text("")
    (tree / "low" / "__init__.py").write_text("")
    (tree / "low" / "mod.py").write_text("def f() -> None:\n    from launcher.high import thing\n")
    path = tree / "low" / "mod.py"
    global PACKAGE
    saved, PACKAGE = PACKAGE, tree
    try:
        assert _imported(path) == {"launcher.high"}
    finally:
        PACKAGE = saved
    assert _cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b": []}, "b": {}}) == []


def test_design_names_every_module() -> None:
    """docs/design.md says which module owns what: a module it does not name is one nobody can find there."""
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    unnamed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py":
            rel = rel.removesuffix("__init__.py")
        if rel and f"`{rel}" not in design and f" {rel}" not in design and f"({rel}" not in design:
            unnamed.append(rel)
    assert unnamed == []
