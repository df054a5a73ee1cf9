"""A run's params resolved against its recipe's spec: defaults merged with what was given, each
value checked against its param, the dataset the params select and the params as the script reads them.
Standard library only (the runtime in the image resolves params too)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from launcher.runtime.recipespec import RECIPE_FILE, DatasetSpec, ParamSpec, ParamValue, RecipeSpec, SpecError

if TYPE_CHECKING:
    from launcher.runtime.records import JsonValue


def check_value(spec: RecipeSpec, key: str, value: Any) -> ParamValue:
    """``value`` for the recipe's param ``key``, given the param's type; raises ParamError when the
    param does not allow it (an ad-hoc script's params, and a param without a spec, pass as given)."""
    ps = spec.param_specs.get(key)
    if ps is None:
        if key in spec.params:  # a RecipeSpec made in code with defaults only
            ps = ParamSpec(name=key, default=spec.params[key])
        else:
            return cast("str | int | float | bool", value)
    return ps.convert(value, spec.name)


def merge_params(spec: RecipeSpec, given: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
    """Defaults overridden by ``given``; an ad-hoc script takes any params, a recipe only its own,
    each checked against its declared type and allowed values (SpecError, ParamError)."""
    if not spec.adhoc:
        unknown = sorted(set(given) - set(spec.params))
        if unknown:
            known = ", ".join(sorted(spec.params))
            raise SpecError(spec.path / RECIPE_FILE, f"unknown param (known: {known})", unknown[0])
    merged: dict[str, JsonValue] = dict(spec.params)
    for key, value in given.items():
        merged[key] = value if spec.adhoc else check_value(spec, key, value)
    return merged


def select_dataset(spec: RecipeSpec, params: Mapping[str, JsonValue]) -> DatasetSpec | None:
    for ds in spec.datasets:
        if str(params.get(ds.param)) == ds.name:
            return ds
    return None


def params_json(params: Mapping[str, JsonValue]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))
