"""Typer's internals stay in launcher/cli/typercompat.py, and the CLI works with each end of the Typer range
pyproject.toml allows: the lowest release and the newest one the package index has, each installed on its
own and run through help, a usage error (as text and as the --json envelope) and a completion query."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import need
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
COMPAT = REPO / "launcher" / "cli" / "typercompat.py"
# modules whose private parts launcher may reach only through typercompat (atexit: its _run_exitfuncs)
GUARDED = ("typer", "click", "atexit")


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def _private(dotted: str) -> bool:
    head, *rest = dotted.split(".")
    return head in GUARDED and any(p.startswith("_") and not p.startswith("__") for p in rest)


def private_uses(source: str, rel: str) -> list[str]:
    """Where the module imports or reaches a private module or name of typer, click or atexit (a line each)."""
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(source, rel)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Attribute):
            names = [_dotted(node)]
        for name in filter(_private, names):
            found.setdefault(node.lineno, f"{rel}:{node.lineno}: {name}")
    return [found[line] for line in sorted(found)]


def test_only_typercompat_reaches_typers_internals() -> None:
    files = [p for d in ("launcher", "tests", "benchmarks", "scripts") for p in (REPO / d).rglob("*.py")]
    found = [hit for path in sorted(files) if path != COMPAT
             for hit in private_uses(path.read_text(), path.relative_to(REPO).as_posix())]
    assert found == [], "reach Typer's internals through launcher/cli/typercompat.py, saying why and what falls back"
    assert private_uses(COMPAT.read_text(), "typercompat.py"), "the check no longer sees what typercompat uses"


def test_the_check_finds_what_it_looks_for() -> None:
    sample = ("import typer._click.core\n"
              "from typer._coercion import RuntimeParam\n"
              "from typer.core import _TyperParameter, TyperOption\n"
              "from typer import _click\n"
              "import atexit\n"
              "atexit._run_exitfuncs()\n"
              "from typer.core import TyperArgument\n"
              "x = typer.main.get_command\n"
              "y = typer.core._TyperParameter\n"
              "z = obj._private\n"
              "from click.exceptions import UsageError\n")
    assert [h.split(": ", 1)[0] for h in private_uses(sample, "m.py")] == \
        ["m.py:1", "m.py:2", "m.py:3", "m.py:4", "m.py:6", "m.py:9"]


def typer_range() -> Requirement:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "typer"]
    return req


def test_the_range_is_bounded_on_both_sides() -> None:
    # an open range would claim releases nobody ran the CLI with (Typer changes its internals in minor releases)
    ops = {s.operator for s in typer_range().specifier}
    assert ">=" in ops and "<" in ops


def _install(spec: str, target: Path) -> str:
    """Typer as spec (alone: its dependencies are the environment's) into target; the version installed."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary", ":all:",
                           "--target", str(target), spec], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    need(done.returncode == 0, f"pip could not install {spec} from the package index: {done.stderr[-300:]}")
    (dist,) = target.glob("typer-*.dist-info")
    return dist.name.removeprefix("typer-").removesuffix(".dist-info")


def _launcher(typer_dir: Path, ws: Path, *args: str,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = "import sys, typer\nsys.argv[0] = 'launcher'\nprint('typer', typer.__version__, file=sys.stderr)\n" \
           "from launcher.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ws, timeout=120,
                          env={"PYTHONPATH": str(typer_dir), "COLUMNS": "200", "PATH": "/usr/bin:/bin", **(env or {})})


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("end", ["lowest", "highest"])
def test_the_cli_works_with_each_end_of_the_typer_range(end: str, tmp_path: Path) -> None:
    req = typer_range()
    lowest = min(s.version for s in req.specifier if s.operator == ">=")
    spec = f"typer=={lowest}" if end == "lowest" else str(req)
    version = _install(spec, tmp_path / "typer")
    assert version in req.specifier, version
    ws = tmp_path / "ws"
    (ws / "lockfiles").mkdir(parents=True)
    (ws / "recipes").mkdir()

    helped = _launcher(tmp_path / "typer", ws, "--help")
    assert f"typer {version}" in helped.stderr  # the installed release, not the environment's
    assert helped.returncode == 0 and "Usage: launcher" in helped.stdout and "reproduce" in helped.stdout

    wrong = _launcher(tmp_path / "typer", ws, "run", "x", "--seed", "abc")
    assert wrong.returncode == 2 and "Invalid value for '--seed'" in wrong.stderr, wrong.stderr
    as_json = _launcher(tmp_path / "typer", ws, "--json", "run", "x", "--determinism", "sometimes")
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["exit_code"] == 2, as_json.stdout + as_json.stderr
    bare = _launcher(tmp_path / "typer", ws, "--json", "recipes")  # no arguments: its help, not an error
    assert "Usage: launcher recipes" in bare.stdout and '"schema"' not in bare.stdout, bare.stdout + bare.stderr

    completed = _launcher(tmp_path / "typer", ws, env={
        "_LAUNCHER_COMPLETE": "complete_bash", "COMP_WORDS": "launcher run x --determinism st", "COMP_CWORD": "4"})
    assert completed.returncode == 0 and completed.stdout.split() == ["strict"], completed.stdout + completed.stderr
