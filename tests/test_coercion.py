"""launcher.cli.coercion: the same values and errors as typer's own coercion, without importing pydantic."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import typer
import typer.main
from typer._coercion import build_runtime_param
from typer._typing import is_literal_type, literal_values
from typer.core import _TyperParameter

from launcher.cli import app
from launcher.cli.coercion import NOT_PLAIN, PlainRuntimeParam, plain

REPO = Path(__file__).resolve().parents[1]


def _params(group: Any) -> Iterator[tuple[Any, Any]]:
    """(command, parameter) for every typer parameter of every command, hidden ones too."""
    for cmd in group.commands.values():
        if hasattr(cmd, "commands"):
            yield from _params(cmd)
        for p in cmd.params:
            if isinstance(p, _TyperParameter):
                yield cmd, p


def _values(annotation: Any) -> list[Any]:
    leaf = get_args(annotation)[0] if get_origin(annotation) is list else annotation
    words = ["x", "", " 5", "7", "-3", "+4", "007", "0", "1_000", "1e3", "abc", "/tmp", "rel/dir", "-", "~/x"]
    if is_literal_type(leaf):
        words += [str(v) for v in literal_values(leaf)] + [str(v).upper() for v in literal_values(leaf)]
    one: list[Any] = [*words, 3, Path("/tmp")]
    if get_origin(annotation) is list:
        return [*one, ["a", "7"], ("7", "-3"), [], ["x", ""]]
    return one


def _outcome(runtime: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        got = runtime._coerce_value(value, param=param, ctx=ctx)
    except Exception as exc:  # typer's coercion errors: BadParameter and friends
        return "error", (type(exc).__name__, str(exc))
    return "value", (type(got).__name__, got)


PARAMS = list(_params(typer.main.get_command(app)))


def test_every_parameter_of_every_command_coerces_as_typer_does() -> None:
    assert len(PARAMS) > 200
    plain_answers = 0
    for cmd, p in PARAMS:
        td = p.type_descriptor
        if td.file_annotation is not None:
            continue
        ctx = typer.Context(cmd)
        fast = PlainRuntimeParam(parameter_info=td.parameter_info, annotation=td.annotation)
        for v in _values(td.annotation):
            want = _outcome(build_runtime_param(td), v, p, ctx)
            got = _outcome(fast, v, p, ctx)
            assert got == want, (cmd.name, p.name, td.annotation, v)
            plain_answers += plain(td.annotation, td.parameter_info, v, p, ctx) is not NOT_PLAIN
    assert plain_answers > 1000  # the plain rules do answer most of them, not typer's fallback


def test_a_run_parses_its_options_without_importing_pydantic(tmp_path: Path) -> None:
    code = (
        "import atexit, sys\n"
        "from launcher.cli import main\n"
        "atexit.register(lambda: print('pydantic', 'imported' if 'pydantic' in sys.modules else 'not imported'))\n"
        f"sys.argv = ['launcher', '-w', {str(tmp_path)!r}, 'run', 'no_such_recipe', '--seed', '3', '--seed', '4',"
        " '--determinism', 'strict', '--threads', '2', '--data-from', '/tmp', '--param', 'a=1', '-n', '2',"
        " '--find-links', '/tmp', '--port', '22', '--env', 'A=1']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "pydantic not imported" in done.stdout, done.stdout + done.stderr  # said by the exit function
    assert done.returncode != 0  # parsed, then refused: there is no workspace there


@pytest.mark.parametrize(("args", "message"), [
    (["--seed", "abc"], "Invalid value for '--seed'"),
    (["--determinism", "sometimes"], "Invalid value for '--determinism'"),
    (["-n", "1.5"], "Invalid value for '--runs'"),
])
def test_a_bad_value_is_still_typers_usage_error(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "launcher", "run", "x", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
