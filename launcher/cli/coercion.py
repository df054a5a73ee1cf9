"""Typer's parameter coercion, without pydantic, for the plain types launcher's commands declare.

typer 0.29 coerces every parameter but a flag through a pydantic TypeAdapter, built when the parameter
is first processed, even one left at its default of None: importing pydantic and building some thirty
adapters is about 0.13 s of every `launcher run`. For str, int (unbounded), Path, Literal and Enum
parameters, and lists of them, :func:`plain` computes what typer's adapter would return, with typer's
own helpers for paths and choices; any other type, and any value these rules do not take, goes to
typer's coercion, so values and error messages stay typer's (tests/test_coercion.py compares the two
on every parameter of every command). typer is pinned to 0.29.x (pyproject.toml), whose coercion
seam (`typer._coercion.RuntimeParam`) this uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_origin

from typer._coercion import RuntimeParam, build_runtime_param
from typer._param_types import coerce_cli_choice, coerce_cli_path, lenient_issubclass, routes_to_path
from typer._typing import is_literal_type, literal_values
from typer.core import _TyperParameter
from typer.models import ParameterInfo

NOT_PLAIN = object()  # plain()'s answer for what typer's own coercion must decide
_INT = re.compile(r"-?(0|[1-9][0-9]*)")


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
    if is_literal_type(annotation) or lenient_issubclass(annotation, Enum):
        choices = literal_values(annotation) if is_literal_type(annotation) else list(annotation)
        try:
            return coerce_cli_choice(value, choices=choices, case_sensitive=info.case_sensitive, ctx=ctx)
        except Exception:
            return NOT_PLAIN
    if lenient_issubclass(annotation, Path) and routes_to_path(annotation, info):
        path_type: Any = info.path_type or annotation
        if not lenient_issubclass(path_type, Path):
            return NOT_PLAIN
        if type(value) is str and value and "\0" not in value:
            value = path_type(value)  # what pydantic's lax Path validation makes of a string
        if not isinstance(value, path_type):
            return NOT_PLAIN
        try:
            return coerce_cli_path(value, info, path_type=path_type, param=param, ctx=ctx)
        except Exception:
            return NOT_PLAIN
    return NOT_PLAIN


@dataclass(frozen=True)
class PlainRuntimeParam(RuntimeParam):
    """A parameter's coercion: plain() first, typer's own for the rest (built only then)."""

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        done = plain(self.annotation, self.parameter_info, value, param, ctx)
        if done is not NOT_PLAIN:
            return done
        return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)


def install(params: list[Any]) -> list[Any]:
    """params, each of typer's own given the plain coercion unless it already has its coercion."""
    for p in params:
        if isinstance(p, _TyperParameter) and p._runtime_param is None and p.type_descriptor.file_annotation is None:
            td = p.type_descriptor
            p._runtime_param = PlainRuntimeParam(parameter_info=td.parameter_info, annotation=td.annotation)
    return params
