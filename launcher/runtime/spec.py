"""The recipe format (``recipe.toml``), read with the standard library only.

The host (``launcher.runs.recipes``) and the runtime inside the image read recipes through this one
module, so they cannot disagree about what a recipe says.

```toml
name = "mnist_convnet"
framework = "tensorflow"        # tensorflow | torch | none
entry = "train.py"
description = "one line"
outputs = ["model/canonical.npz"]   # optional: files the recipe promises under the outputs
volatile = ["plots/*.png"]          # optional: outputs `launcher verify` lists but never compares

[params]                        # defaults; `--param KEY=VALUE` overrides, unknown keys are refused
dataset = "builtin"
epochs = 12

[[datasets]]                    # what each value of a selecting param means
name = "builtin"                # the value of `param` that selects this dataset
param = "dataset"               # default "dataset"
source = "builtin"              # builtin (made in code) | files (read from --data)
format = "how the files look"
fingerprint = "sha256:..."      # optional: the expected dataset digest
files = { "mnist.npz" = "sha256:..." }   # optional: expected digests of single files
```
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None  # type: ignore[assignment]

RECIPE_FILE = "recipe.toml"
FRAMEWORKS = ("tensorflow", "torch", "none")
SOURCES = ("builtin", "files")
TOP_KEYS = frozenset({"name", "framework", "entry", "description", "params", "datasets", "outputs", "volatile"})
DATASET_KEYS = frozenset({"name", "param", "source", "format", "fingerprint", "files", "description"})
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
ParamValue = str | int | float | bool


class SpecError(Exception):
    """A recipe that cannot be used: names the file and, where there is one, the key."""

    def __init__(self, path: Path, message: str, key: str | None = None) -> None:
        where = f"{path}" + (f": key {key!r}" if key else "")
        super().__init__(f"{where}: {message}")
        self.path = path
        self.key = key
        self.detail = message


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    param: str = "dataset"
    source: str = "builtin"
    format: str = ""
    fingerprint: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    description: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "param": self.param, "source": self.source, "format": self.format,
                "fingerprint": self.fingerprint, "files": dict(self.files), "description": self.description}


@dataclass(frozen=True)
class RecipeSpec:
    path: Path  # the recipe folder (or the script, for an ad-hoc recipe)
    name: str
    framework: str
    entry: str
    description: str = ""
    params: dict[str, ParamValue] = field(default_factory=dict)
    datasets: tuple[DatasetSpec, ...] = ()
    outputs: tuple[str, ...] = ()
    adhoc: bool = False
    volatile: tuple[str, ...] = ()  # globs under the outputs that verify lists but does not compare

    @property
    def entry_path(self) -> Path:
        return self.path if self.adhoc else self.path / self.entry

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "framework": self.framework, "entry": self.entry,
                "description": self.description, "params": dict(self.params),
                "datasets": [d.as_dict() for d in self.datasets], "outputs": list(self.outputs),
                "adhoc": self.adhoc, "volatile": list(self.volatile)}


def _need(cond: bool, path: Path, message: str, key: str | None = None) -> None:
    if not cond:
        raise SpecError(path, message, key)


def _check_dataset(path: Path, i: int, raw: Any, params: dict[str, ParamValue]) -> DatasetSpec:
    where = f"datasets[{i}]"
    _need(isinstance(raw, dict), path, "each [[datasets]] entry must be a table", where)
    unknown = sorted(set(raw) - DATASET_KEYS)
    _need(not unknown, path, f"unknown key (known: {', '.join(sorted(DATASET_KEYS))})",
          f"{where}.{unknown[0]}" if unknown else None)
    name = raw.get("name")
    _need(isinstance(name, str) and bool(name), path, "missing or empty dataset name", f"{where}.name")
    param = raw.get("param", "dataset")
    _need(isinstance(param, str) and param in params, path,
          f"names param {param!r}, which [params] does not define", f"{where}.param")
    source = raw.get("source", "builtin")
    _need(source in SOURCES, path, f"must be one of {', '.join(SOURCES)}", f"{where}.source")
    fp = raw.get("fingerprint")
    _need(fp is None or (isinstance(fp, str) and bool(_DIGEST.match(fp))), path,
          "must look like sha256:<64 hex digits>", f"{where}.fingerprint")
    files = raw.get("files", {})
    _need(isinstance(files, dict), path, "must be a table of relative path = digest", f"{where}.files")
    for rel, digest in files.items():
        _need(isinstance(digest, str) and bool(_DIGEST.match(digest)) and not rel.startswith("/")
              and ".." not in Path(rel).parts, path, "must map a relative path to sha256:<hex>",
              f"{where}.files.{rel}")
    for key in ("format", "description"):
        _need(isinstance(raw.get(key, ""), str), path, "must be a string", f"{where}.{key}")
    return DatasetSpec(name=name, param=param, source=source, format=raw.get("format", ""), fingerprint=fp,
                       files=dict(files), description=raw.get("description", ""))


def parse_spec(path: Path, data: dict[str, Any], folder: Path) -> RecipeSpec:
    """Validate the parsed table of a recipe.toml (at ``path``) of the recipe in ``folder``."""
    unknown = sorted(set(data) - TOP_KEYS)
    _need(not unknown, path, f"unknown key (known: {', '.join(sorted(TOP_KEYS))})",
          unknown[0] if unknown else None)
    entry = data.get("entry")
    if not isinstance(entry, str) or not entry:
        raise SpecError(path, "missing entry point (e.g. entry = \"train.py\")", "entry")
    entry_rel = Path(entry)
    _need(not entry_rel.is_absolute() and ".." not in entry_rel.parts, path,
          "must be a path inside the recipe folder", "entry")
    _need((folder / entry_rel).is_file(), path, f"entry point {entry} does not exist in {folder}", "entry")
    name = data.get("name", folder.name)
    _need(isinstance(name, str) and bool(_NAME.match(name)), path,
          "must be letters, digits, '_', '-' or '.'", "name")
    framework = data.get("framework", "tensorflow")
    _need(framework in FRAMEWORKS, path, f"must be one of {', '.join(FRAMEWORKS)}", "framework")
    description = data.get("description", "")
    _need(isinstance(description, str), path, "must be a string", "description")
    params = data.get("params", {})
    _need(isinstance(params, dict), path, "must be a table", "params")
    for key, value in params.items():
        _need(isinstance(value, str | int | float | bool), path,
              "a param default must be a string, number or boolean", f"params.{key}")
    raw_sets = data.get("datasets", [])
    _need(isinstance(raw_sets, list), path, "must be an array of tables ([[datasets]])", "datasets")
    datasets = tuple(_check_dataset(path, i, raw, params) for i, raw in enumerate(raw_sets))
    outputs = data.get("outputs", [])
    _need(isinstance(outputs, list) and all(isinstance(o, str) for o in outputs), path,
          "must be a list of relative paths", "outputs")
    volatile = data.get("volatile", [])
    _need(isinstance(volatile, list) and all(isinstance(g, str) and g for g in volatile), path,
          "must be a list of globs (relative to the outputs)", "volatile")
    return RecipeSpec(path=folder, name=name, framework=framework, entry=entry, description=description,
                      params=dict(params), datasets=datasets, outputs=tuple(outputs), volatile=tuple(volatile))


def load_spec(folder: Path) -> RecipeSpec:
    path = folder / RECIPE_FILE
    if tomllib is None:
        raise SpecError(path, "reading recipe.toml needs Python 3.11 or newer (tomllib)")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SpecError(path, "no recipe.toml in this folder") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(path, f"not valid TOML: {exc}") from None
    return parse_spec(path, data, folder)


def adhoc_spec(script: Path, framework: str = "none") -> RecipeSpec:
    """A plain script run as a recipe: no params of its own, no datasets."""
    return RecipeSpec(path=script, name=script.stem, framework=framework, entry=script.name, adhoc=True)


def merge_params(spec: RecipeSpec, given: dict[str, Any]) -> dict[str, Any]:
    """Defaults overridden by ``given``; an ad-hoc script takes any params, a recipe only its own."""
    if not spec.adhoc:
        unknown = sorted(set(given) - set(spec.params))
        if unknown:
            known = ", ".join(sorted(spec.params))
            raise SpecError(spec.path / RECIPE_FILE, f"unknown param (known: {known})", unknown[0])
    merged: dict[str, Any] = dict(spec.params)
    merged.update(given)
    return merged


def select_dataset(spec: RecipeSpec, params: dict[str, Any]) -> DatasetSpec | None:
    for ds in spec.datasets:
        if str(params.get(ds.param)) == ds.name:
            return ds
    return None


def params_json(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))
