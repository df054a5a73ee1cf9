"""launcher.cli.typercompat's coercion: the same values and errors as typer's own, without importing pydantic;
and, without the Typer internals it uses, typer's own coercion for every parameter."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
import typer
import typer.main
from typer.core import TyperArgument, TyperOption

from launcher.cli import app
from launcher.cli.typercompat import NOT_PLAIN, PlainRuntimeParam, plain, typers_coercion

REPO = Path(__file__).resolve().parents[1]


def _params(group: Any) -> Iterator[tuple[Any, Any]]:
    """(command, parameter) for every typer parameter of every command, hidden ones too."""
    for cmd in group.commands.values():
        if hasattr(cmd, "commands"):
            yield from _params(cmd)
        for p in cmd.params:
            if isinstance(p, (TyperArgument, TyperOption)):
                yield cmd, p


def _values(annotation: Any) -> list[Any]:
    leaf = get_args(annotation)[0] if get_origin(annotation) is list else annotation
    words = ["x", "", " 5", "7", "-3", "+4", "007", "0", "1_000", "1e3", "abc", "/tmp", "rel/dir", "-", "~/x"]
    if get_origin(leaf) is Literal:
        words += [str(v) for v in get_args(leaf)] + [str(v).upper() for v in get_args(leaf)]
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
            want = _outcome(typers_coercion(p), v, p, ctx)
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


def test_without_typers_internals_every_parameter_is_left_to_typers_own_coercion(tmp_path: Path) -> None:
    # a Typer without the coercion seam (its class gone, so importing it fails): the same values and usage
    # errors, by typer's own coercion, which imports pydantic
    code = (
        "import atexit, sys\n"
        "import typer._coercion\n"
        "del typer._coercion.RuntimeParam\n"
        "from launcher.cli import main, typercompat\n"
        "atexit.register(lambda: print('seam', typercompat.SEAM, 'pydantic' in sys.modules))\n"
        f"sys.argv = ['launcher', '-w', {str(tmp_path)!r}, 'run', 'x', '--determinism', 'strict'] + sys.argv[1:]\n"
        "main()\n"
    )
    for extra, code_wanted in ((["--seed", "abc"], 2), (["--seed", "3", "--threads", "2"], None)):
        done = subprocess.run([sys.executable, "-c", code, *extra], capture_output=True, text=True, cwd=REPO,
                              timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        assert "seam False True" in done.stdout, done.stdout + done.stderr
        if code_wanted == 2:
            assert done.returncode == 2 and "Invalid value for '--seed'" in done.stderr, done.stderr
        else:  # parsed, then refused for the workspace: not a usage error
            assert done.returncode not in (0, 2) and "error:" in done.stderr, done.stderr
