"""The recipe format (``recipe.toml``), read with the standard library only.

The host (``launcher.specs.recipes``) and the runtime inside the image read recipes through this one
module, so they cannot disagree about what a recipe says.

```toml
name = "mnist_convnet"
framework = "tensorflow"        # tensorflow | torch | none
entry = "train.py"
description = "one line"
variant = "cpu"                     # optional: the image variant the recipe needs by default
outputs = ["model/canonical.npz"]   # optional: files the recipe promises under the outputs
volatile = ["plots/*.png"]          # optional: outputs `launcher verify` lists but never compares

[params]                        # defaults; `--param KEY=VALUE` overrides, unknown keys are refused
dataset = "builtin"             # a plain default: its type (bool, int, float, str) is the param's
epochs = { default = 12, min = 1, help = "passes over the training data" }
device = { default = "auto", choices = ["auto", "cpu", "cuda"] }
learning_rate = { default = 1.0, min = 0.0, max = 10.0 }
dropout_seed = { default = 7, min = 0, also = ["none"] }   # an integer, or the word none

[[datasets]]                    # what each value of a selecting param means
name = "builtin"                # the value of `param` that selects this dataset
param = "dataset"               # default "dataset"
source = "builtin"              # builtin (made in code) | files (read from --data)
format = "how the files look"
fingerprint = "sha256:..."      # optional: the expected dataset digest
files = { "mnist.npz" = "sha256:..." }   # optional: expected digests of single files

[probes]                        # optional: held-out examples whose outputs the runtime records
split = "validation"            # the validation data Keras' fit() receives (the only split so far)
count = 16                      # the first N examples of the split (default 16), or:
indices = [0, 5, 9]             #   exactly these examples (instead of count)
gradcam = true                  # a Grad-CAM heatmap per probe image (default true; needs image inputs)
layer = "conv2d_4"              # the Grad-CAM layer (default: the last convolutional feature map)
fingerprint = "sha256:..."      # optional: the expected digest of the probe inputs

[system]                        # optional: Debian packages the recipe needs in its image
apt = ["tree", "libsndfile1=1.2.0-1"]   # names, optionally NAME=VERSION; `launcher lock` resolves them
```

A param is a plain default or a table (inline as above, or a ``[params.NAME]`` section after the
plain ones) with ``default`` and optionally ``choices`` (the only values allowed), ``min`` / ``max``
(inclusive bounds of a number), ``also`` (words allowed beside the type's values) and ``help``.
Every value is checked against its param before anything runs, on the host (``launcher run``
refuses with exit 2 before a build, an upload or a start) and again here in the runtime: it must
have the default's type (a string from the command line is converted: ``true``/``false``/``1``/``0``
for a boolean, a whole number for an int, any number for a float) and lie inside the declared
choices and bounds. A text param that ``[[datasets]]`` entries select takes as choices, unless it
declares its own, the names of those datasets (and its default), so a value that selects no
dataset is refused instead of silently running on the default data; declared choices must name
every dataset that selects by the param.

``[probes]`` makes the runtime record, at the end of training and without code in the recipe, the
model's outputs on a fixed set of held-out examples (``probes/``, see launcher.runtime.probes), which
``launcher verify`` compares to say what a difference in the weights does to predictions and
explanations. ``launcher run --probes SPEC`` overrides the table (or gives a plain script one); both
are checked by launcher.runtime.probespec.

``[system]`` names OS packages (launcher.runtime.systemspec checks the names; a plain script's project
declares them the same way in a ``launcher.toml`` beside its code). ``launcher lock PATH`` resolves them
against the base image's Debian release into ``system.lock`` beside the recipe (launcher.images.aptlock).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from launcher.runtime.probespec import ProbeError, ProbeSpec, check_probes
from launcher.runtime.systemspec import SystemSpecError, check_system

if TYPE_CHECKING:
    from launcher.runtime.records import DatasetRecord, ProbeConfig

RECIPE_FILE = "recipe.toml"


def known_frameworks() -> tuple[str, ...]:
    """What recipe.toml's `framework` may say: a framework of launcher.runtime.frameworks, or none."""
    from launcher.runtime import frameworks

    return (*frameworks.names(), "none")
SOURCES = ("builtin", "files")
TOP_KEYS = frozenset({"name", "framework", "entry", "description", "params", "datasets", "outputs", "volatile",
                      "variant", "probes", "system"})
PARAM_KEYS = frozenset({"default", "choices", "min", "max", "also", "help"})
DATASET_KEYS = frozenset({"name", "param", "source", "format", "fingerprint", "files", "description"})
# patterns compiled at first use (and cached by re): a plain script's run checks none
_DIGEST = r"^sha256:[0-9a-f]{64}$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_VARIANT = r"^[a-z0-9][a-z0-9._-]{0,63}$"  # as launcher.workspace.VARIANT_NAME (not importable here)
ParamValue = str | int | float | bool
_TYPE_WORDS = {"bool": "a boolean", "int": "an integer", "float": "a number", "str": "a string"}
_ANY_WORDS = {"int": "any integer", "float": "any number"}


class SpecError(Exception):
    """A recipe that cannot be used: names the file and, where there is one, the key."""

    def __init__(self, path: Path, message: str, key: str | None = None) -> None:
        where = f"{path}" + (f": key {key!r}" if key else "")
        super().__init__(f"{where}: {message}")
        self.path = path
        self.key = key
        self.detail = message


class ParamError(ValueError):
    """A param value its recipe does not allow: names the param, the value and the allowed values."""

    def __init__(self, recipe: str, param: ParamSpec, value: Any, problem: str) -> None:
        shown = value if isinstance(value, str) else json.dumps(value, default=repr)
        if not shown or shown != " ".join(shown.split()) or " " in shown:
            shown = repr(shown)
        super().__init__(f"recipe {recipe}: param {param.name}={shown} {problem} (allowed: {param.allowed()})")
        self.recipe = recipe
        self.param = param
        self.value = value


def type_name(value: Any) -> str:
    """bool, int, float or str: the type of a param's default, which is the param's type."""
    for kind in (bool, int, float, str):  # bool before int: True is an int too
        if isinstance(value, kind):
            return kind.__name__
    raise TypeError(f"not a param value: {value!r}")


def _text(value: ParamValue) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class ParamRecord(TypedDict):
    """A param as `launcher recipes show` lists it (ParamSpec.as_dict)."""

    name: str
    type: str
    default: ParamValue
    choices: list[ParamValue]
    min: int | float | None
    max: int | float | None
    also: list[str]
    help: str
    from_datasets: bool
    allowed: str


class RecipeRecord(TypedDict):
    """A recipe as `launcher recipes show` lists it (RecipeSpec.as_dict)."""

    name: str
    path: str
    framework: str
    entry: str
    description: str
    params: dict[str, ParamValue]
    datasets: list[DatasetRecord]
    outputs: list[str]
    adhoc: bool
    volatile: list[str]
    variant: str | None
    probes: ProbeConfig | None
    apt: list[str]
    param_specs: dict[str, ParamRecord]


@dataclass(frozen=True)
class ParamSpec:
    """One param of a recipe: its default (whose type is the param's) and what else it allows."""

    name: str
    default: ParamValue
    choices: tuple[ParamValue, ...] = ()  # empty: any value of the type (within min/max)
    min: int | float | None = None
    max: int | float | None = None
    also: tuple[str, ...] = ()  # words allowed beside the type's values, e.g. "none" for an int
    help: str = ""
    from_datasets: bool = False  # the choices are the names of the datasets the param selects

    @property
    def type(self) -> str:
        return type_name(self.default)

    def allowed(self) -> str:
        """What the param takes, in words: "digits, mnist", "an integer >= 1", "true or false"."""
        if self.choices:
            text = ", ".join(_text(c) for c in self.choices)
        elif self.type == "bool":
            text = "true or false"
        elif self.type == "str":
            text = "any string"
        else:
            word = _TYPE_WORDS[self.type]
            lo, hi = self.min, self.max
            text = (f"{word} from {lo} to {hi}" if lo is not None and hi is not None
                    else f"{word} >= {lo}" if lo is not None else f"{word} <= {hi}" if hi is not None
                    else _ANY_WORDS[self.type])
        return text + "".join(f", or {w}" for w in self.also)

    def _typed(self, value: Any) -> ParamValue | None:
        """``value`` as the param's type (a string is parsed), or None where it is not one."""
        kind = self.type
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.strip().lower() in ("true", "1", "yes")
            return None
        if kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, str):
                try:
                    return int(value.strip())
                except ValueError:
                    return None
            return None
        if kind == "float":
            if isinstance(value, str):
                try:
                    value = float(value.strip())
                except ValueError:
                    return None
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                return float(value)
            return None
        if isinstance(value, str):
            return value
        # the command line types KEY=VALUE without the recipe (7, 0.5, true): a text param takes the text back
        return json.dumps(value) if isinstance(value, int | float | bool) else None

    def convert(self, value: Any, recipe: str) -> ParamValue:
        """``value`` checked against this param and given its type; raises ParamError."""
        if isinstance(value, str) and value in self.also:
            return value
        typed = self._typed(value)
        if typed is None:
            raise ParamError(recipe, self, value, f"is not {_TYPE_WORDS[self.type]}")
        if self.choices and typed not in self.choices:
            what = "selects no dataset of the recipe" if self.from_datasets else "is not one of the allowed values"
            raise ParamError(recipe, self, value, what)
        if isinstance(typed, int | float) and not isinstance(typed, bool) and (
                (self.min is not None and typed < self.min) or (self.max is not None and typed > self.max)):
            raise ParamError(recipe, self, value, "is out of range")
        return typed

    def as_dict(self) -> ParamRecord:
        return {"name": self.name, "type": self.type, "default": self.default, "choices": list(self.choices),
                "min": self.min, "max": self.max, "also": list(self.also), "help": self.help,
                "from_datasets": self.from_datasets, "allowed": self.allowed()}


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    param: str = "dataset"
    source: str = "builtin"
    format: str = ""
    fingerprint: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    description: str = ""

    def as_dict(self) -> DatasetRecord:
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
    param_specs: dict[str, ParamSpec] = field(default_factory=dict)  # each param's type and allowed values
    variant: str | None = None  # the image variant the recipe needs by default (e.g. "torch-cpu")
    probes: ProbeSpec | None = None  # the held-out examples whose outputs the runtime records
    apt: tuple[str, ...] = ()  # [system] apt: Debian packages, NAME or NAME=VERSION, sorted

    @property
    def entry_path(self) -> Path:
        return self.path if self.adhoc else self.path / self.entry

    def as_dict(self) -> RecipeRecord:
        return {"name": self.name, "path": str(self.path), "framework": self.framework, "entry": self.entry,
                "description": self.description, "params": dict(self.params),
                "datasets": [d.as_dict() for d in self.datasets], "outputs": list(self.outputs),
                "adhoc": self.adhoc, "volatile": list(self.volatile), "variant": self.variant,
                "probes": self.probes.as_dict() if self.probes else None, "apt": list(self.apt),
                "param_specs": {k: p.as_dict() for k, p in self.param_specs.items()}}


def _need(cond: bool, path: Path, message: str, key: str | None = None) -> None:
    if not cond:
        raise SpecError(path, message, key)


def _check_param(path: Path, key: str, raw: Any) -> ParamSpec:
    """A [params] entry: a plain default, or a table with default, choices, min, max, also, help."""
    where = f"params.{key}"
    if not isinstance(raw, dict):
        _need(isinstance(raw, str | int | float | bool), path,
              "a param default must be a string, number or boolean (or a table with default = ...)", where)
        return ParamSpec(name=key, default=raw)
    unknown = sorted(set(raw) - PARAM_KEYS)
    _need(not unknown, path, f"unknown key (known: {', '.join(sorted(PARAM_KEYS))})",
          f"{where}.{unknown[0]}" if unknown else None)
    default: ParamValue = raw.get("default")  # type: ignore[assignment]  # checked next
    _need(isinstance(default, str | int | float | bool), path,
          "a declared param needs default = a string, number or boolean", f"{where}.default")
    probe = ParamSpec(name=key, default=default)
    kind = probe.type
    choices = raw.get("choices", [])
    _need(isinstance(choices, list), path, "must be a list of the allowed values", f"{where}.choices")
    typed_choices: list[ParamValue] = []
    for c in choices:
        same = type_name(c) == kind if isinstance(c, str | int | float | bool) else False
        _need(same or (kind == "float" and type_name(c) == "int"), path,
              f"every choice must be {_TYPE_WORDS[kind]}, like the default {default!r}", f"{where}.choices")
        typed_choices.append(float(c) if kind == "float" else c)
    bounds: dict[str, int | float | None] = {}
    for end in ("min", "max"):
        value = raw.get(end)
        _need(value is None or (kind in ("int", "float") and isinstance(value, int | float)
                                and not isinstance(value, bool)), path,
              "a bound is a number, and only a number param (int or float default) has one", f"{where}.{end}")
        bounds[end] = value
    lo, hi = bounds["min"], bounds["max"]
    _need(lo is None or hi is None or lo <= hi, path, "min is above max", f"{where}.min")
    also = raw.get("also", [])
    _need(isinstance(also, list) and all(isinstance(w, str) and w for w in also), path,
          "must be a list of words allowed beside the type's values", f"{where}.also")
    help_text = raw.get("help", "")
    _need(isinstance(help_text, str), path, "must be a string", f"{where}.help")
    spec = ParamSpec(name=key, default=default, choices=tuple(dict.fromkeys(typed_choices)), min=lo, max=hi,
                     also=tuple(also), help=help_text)
    try:
        spec.convert(default, "")
    except ParamError:
        raise SpecError(path, f"the default {default!r} is not among the values the param allows "
                        f"({spec.allowed()})", f"{where}.default") from None
    return spec


def _with_dataset_choices(path: Path, specs: dict[str, ParamSpec],
                          datasets: tuple[DatasetSpec, ...]) -> dict[str, ParamSpec]:
    """A text param that datasets select allows the names of those datasets (and its default)
    unless it declares choices, which must then name each of them."""
    out = dict(specs)
    for key, ps in specs.items():
        names = [d.name for d in datasets if d.param == key]
        if not names or ps.type != "str":
            continue
        if ps.choices:
            for i, d in enumerate(datasets):
                _need(d.param != key or d.name in ps.choices, path,
                      f"dataset {d.name!r} is not among params.{key}.choices, so it could never be selected",
                      f"datasets[{i}].name")
            continue
        choices = tuple(dict.fromkeys([ps.default, *names] if ps.default not in names else names))
        out[key] = ParamSpec(name=key, default=ps.default, choices=choices, also=ps.also, help=ps.help,
                             from_datasets=True)
    return out


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
    _need(fp is None or (isinstance(fp, str) and bool(re.match(_DIGEST, fp))), path,
          "must look like sha256:<64 hex digits>", f"{where}.fingerprint")
    files = raw.get("files", {})
    _need(isinstance(files, dict), path, "must be a table of relative path = digest", f"{where}.files")
    for rel, digest in files.items():
        _need(isinstance(digest, str) and bool(re.match(_DIGEST, digest)) and not rel.startswith("/")
              and ".." not in Path(rel).parts, path, "must map a relative path to sha256:<hex>",
              f"{where}.files.{rel}")
    for key in ("format", "description"):
        _need(isinstance(raw.get(key, ""), str), path, "must be a string", f"{where}.{key}")
    return DatasetSpec(name=name, param=param, source=source, format=raw.get("format", ""), fingerprint=fp,
                       files=dict(files), description=raw.get("description", ""))


def _check_probes(path: Path, raw: Any) -> ProbeSpec:
    """recipe.toml's [probes], checked by launcher.runtime.probespec (as `launcher run --probes` is)."""
    try:
        return check_probes(raw)
    except ProbeError as exc:
        raise SpecError(path, exc.detail, exc.key) from None


def parse_spec(path: Path, data: dict[str, Any], folder: Path) -> RecipeSpec:
    """Validate the parsed table of a recipe.toml (at ``path``) of the recipe in ``folder``."""
    # data stays a plain dict of Any: any TOML the user wrote, each key checked below before it is used
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
    _need(isinstance(name, str) and bool(re.match(_NAME, name)), path,
          "must be letters, digits, '_', '-' or '.'", "name")
    framework = data.get("framework", "tensorflow")
    _need(framework in known_frameworks(), path, f"must be one of {', '.join(known_frameworks())}", "framework")
    description = data.get("description", "")
    _need(isinstance(description, str), path, "must be a string", "description")
    variant = data.get("variant")
    _need(variant is None or (isinstance(variant, str) and bool(re.match(_VARIANT, variant))), path,
          "must name an image variant: lowercase letters, digits, '.', '_' or '-' (e.g. \"torch-cpu\")",
          "variant")
    raw_params = data.get("params", {})
    _need(isinstance(raw_params, dict), path, "must be a table", "params")
    param_specs = {key: _check_param(path, key, raw) for key, raw in raw_params.items()}
    params: dict[str, ParamValue] = {key: ps.default for key, ps in param_specs.items()}
    raw_sets = data.get("datasets", [])
    _need(isinstance(raw_sets, list), path, "must be an array of tables ([[datasets]])", "datasets")
    datasets = tuple(_check_dataset(path, i, raw, params) for i, raw in enumerate(raw_sets))
    param_specs = _with_dataset_choices(path, param_specs, datasets)
    outputs = data.get("outputs", [])
    _need(isinstance(outputs, list) and all(isinstance(o, str) for o in outputs), path,
          "must be a list of relative paths", "outputs")
    volatile = data.get("volatile", [])
    _need(isinstance(volatile, list) and all(isinstance(g, str) and g for g in volatile), path,
          "must be a list of globs (relative to the outputs)", "volatile")
    probes = _check_probes(path, data["probes"]) if "probes" in data else None
    try:
        apt = check_system(data["system"]) if "system" in data else ()
    except SystemSpecError as exc:
        raise SpecError(path, exc.detail, exc.key) from None
    return RecipeSpec(path=folder, name=name, framework=framework, entry=entry, description=description,
                      params=params, datasets=datasets, outputs=tuple(outputs), volatile=tuple(volatile),
                      param_specs=param_specs, variant=variant, probes=probes, apt=apt)


def load_spec(folder: Path) -> RecipeSpec:
    path = folder / RECIPE_FILE
    try:  # imported here: a plain script's run reads no recipe.toml and does not pay for the parser
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise SpecError(path, "reading recipe.toml needs Python 3.11 or newer (tomllib)") from None
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
