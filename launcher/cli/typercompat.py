"""What launcher uses of Typer beyond its public API, in one place, and what happens without it.

Start-up speed is the one reason: typer 0.29 coerces every parameter but a flag through a pydantic
TypeAdapter, built when the parameter is first processed, even one left at its default of None; importing
pydantic and building some thirty adapters is about 0.13 s of every `launcher run` (benchmarks/
run_overhead.py holds a run to 0.5 s over `docker run`). For str, int (unbounded), Path, Literal and Enum
parameters, and lists of them, :func:`plain` computes what typer's adapter would return, with typer's own
rules for paths and choices; any other type, and any value these rules do not take, goes to typer's
coercion, so values and error messages stay typer's (tests/test_coercion.py compares the two on every
parameter of every command).

Typer's internals used, each present and the same in typer 0.29.0, 0.29.1 and 0.29.2, the releases that
coerce through pydantic (pyproject.toml allows 0.27 on; tests/test_typer_versions.py runs the CLI with the
lowest and the newest release of that range):

  * ``typer._coercion.RuntimeParam``, ``build_runtime_param``: the seam where a parameter's coercion is
    chosen (``_coerce_value``) and typer's own one built, for what :func:`plain` leaves to typer;
  * ``typer.core._TyperParameter._runtime_param``: where a parameter keeps its coercion (set by
    :func:`install` before typer builds its own);
  * ``typer._param_types.coerce_cli_choice``, ``coerce_cli_path``, ``routes_to_path``: typer's rules for
    a choice's matching (case, token normalising) and a path's checks (exists, dir_okay, resolve), so a
    plain value is the one typer's adapter returns;
  * ``typer._click.core.Command``, for type checking only: the class of the commands of Typer's own copy
    of Click (nothing at run time).

Without any of them, :data:`SEAM` is False and :func:`install` leaves every parameter to Typer's own
coercion: the same values and messages. Typer 0.27 and 0.28 have none of them and need none (they coerce
through Click's types, without pydantic); a later Typer that drops one imports pydantic at the first
parameter parsed, 0.13 s slower but right (tests/test_coercion.py runs a command so). What launcher needs
of Click otherwise comes through public names: a parameter's source by its enum member's name, Click's
UsageError as the class typer's public ``BadParameter`` derives from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

import typer
from typer.core import TyperArgument, TyperOption
from typer.models import ParameterInfo

if TYPE_CHECKING:
    from typer._click.core import Command as Command

try:
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_choice, coerce_cli_path, routes_to_path
    from typer.core import _TyperParameter

    SEAM = "_runtime_param" in getattr(_TyperParameter, "__annotations__", {})
except ImportError:  # another Typer: its own coercion for every parameter
    SEAM = False

# Click's UsageError, of the Click that Typer parses with (its own copy from 0.26 on, not a `click` installed
# beside it, which MLflow brings): the base of the public typer.BadParameter, as Click documents it.
CLICK_USAGE_ERROR: type[Any] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")

NOT_PLAIN = object()  # plain()'s answer for what typer's own coercion must decide
_INT = re.compile(r"-?(0|[1-9][0-9]*)")


def typed_on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether the parameter NAME was typed on the command line, not left to a default, an environment
    variable or a default map (Click's ParameterSource, compared by its member's name)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _is_sub(cls: Any, of: type[Any]) -> bool:
    return isinstance(cls, type) and issubclass(cls, of)


def plain(annotation: Any, info: ParameterInfo, value: Any, param: Any = None, ctx: Any = None) -> Any:
    """The value typer's TypeAdapter gives for value, or NOT_PLAIN."""
    if info.parser is not None:
        return NOT_PLAIN
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        out = [plain(item, info, v, param, ctx) for v in (value if isinstance(value, (list, tuple)) else [value])]
        return NOT_PLAIN if any(v is NOT_PLAIN for v in out) else out
    if annotation is str:
        return value if type(value) is str else NOT_PLAIN
    if annotation is int:
        if info.min is not None or info.max is not None or info.clamp:
            return NOT_PLAIN
        if type(value) is int:
            return value
        return int(value) if type(value) is str and _INT.fullmatch(value) else NOT_PLAIN
    if get_origin(annotation) is Literal or _is_sub(annotation, Enum):
        choices = list(get_args(annotation)) if get_origin(annotation) is Literal else list(annotation)
        try:
            return coerce_cli_choice(value, choices=choices, case_sensitive=info.case_sensitive, ctx=ctx)
        except Exception:
            return NOT_PLAIN
    if _is_sub(annotation, Path) and routes_to_path(annotation, info):
        return _plain_path(annotation, info, value, param, ctx)
    return NOT_PLAIN


def _plain_path(annotation: Any, info: ParameterInfo, value: Any, param: Any, ctx: Any) -> Any:
    path_type: Any = info.path_type or annotation
    if not _is_sub(path_type, Path):
        return NOT_PLAIN
    if type(value) is str and value and "\0" not in value:
        value = path_type(value)  # what pydantic's lax Path validation makes of a string
    if not isinstance(value, path_type):
        return NOT_PLAIN
    try:
        return coerce_cli_path(value, info, path_type=path_type, param=param, ctx=ctx)
    except Exception:
        return NOT_PLAIN


if SEAM:

    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        """A parameter's coercion: plain() first, typer's own for the rest (built only then)."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            done = plain(self.annotation, self.parameter_info, value, param, ctx)
            if done is not NOT_PLAIN:
                return done
            return typers_coercion(param)._coerce_value(value, param=param, ctx=ctx)

    def typers_coercion(param: Any) -> Any:
        """The coercion typer itself gives the parameter (its pydantic adapter for most types)."""
        return build_runtime_param(param.type_descriptor)


def install(params: list[Any]) -> list[Any]:
    """params, each of typer's own given the plain coercion unless it already has its coercion (all left
    to typer's own without the seam)."""
    if not SEAM:
        return params
    for p in params:
        if isinstance(p, (TyperArgument, TyperOption)) and p._runtime_param is None \
                and p.type_descriptor.file_annotation is None:
            td = p.type_descriptor
            p._runtime_param = PlainRuntimeParam(parameter_info=td.parameter_info, annotation=td.annotation)
    return params
