"""The recipe format: ``recipes/<name>/recipe.toml`` beside the training code.

The schema lives in :mod:`launcher.runtime.recipespec` (the runtime in the image reads recipes too);
this module adds what the host needs: finding recipes in a workspace, a plain script as an
ad-hoc recipe, params from the command line, the tree digest, and scaffolding a new recipe.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import BadRecipe, NotFound, UsageError
from launcher.runtime import frameworks
from launcher.runtime import recipespec as rspec
from launcher.runtime.code import code_digest
from launcher.runtime.recipeparams import check_value
from launcher.workspace import Workspace

ParamValue = rspec.ParamValue
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


def is_recipe_name(text: str) -> bool:
    """Whether text is a recipe's name (a folder of recipes/: nothing that reads as a path)."""
    return bool(_NAME.match(text))


class RecipeListing(rspec.RecipeRecord):
    """RecipeSpec.as_dict (launcher.runtime.recipespec) and the recipe's digest: `recipes show`'s Result data."""

    tree_digest: str


@dataclass(frozen=True)
class Recipe:
    spec: rspec.RecipeSpec
    tree_digest: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def path(self) -> Path:
        return self.spec.path

    @property
    def framework(self) -> str:
        return self.spec.framework

    @property
    def entry(self) -> str:
        return self.spec.entry

    @property
    def params(self) -> dict[str, ParamValue]:
        return dict(self.spec.params)

    @property
    def adhoc(self) -> bool:
        return self.spec.adhoc

    @property
    def variant(self) -> str | None:
        """The image variant recipe.toml names as the recipe's default, if any."""
        return self.spec.variant

    def as_dict(self) -> RecipeListing:
        return {**self.spec.as_dict(), "tree_digest": self.tree_digest}


def _bad(exc: rspec.SpecError) -> BadRecipe:
    hint = "fix that key in recipe.toml (the format is in the README, section Recipes)"
    if exc.key is None:
        hint = "see the README, section Recipes, for the format"
    return BadRecipe(str(exc), hint)


def tree_digest(path: Path) -> str:
    """The code digest of a recipe folder (or a lone script) as it is here; a run's manifest
    records the digest the runtime computes inside the container instead."""
    return code_digest(path)


def load_folder(folder: Path) -> Recipe:
    try:
        spec = rspec.load_spec(folder.resolve())
    except rspec.SpecError as exc:
        raise _bad(exc) from None
    return Recipe(spec, tree_digest(spec.path))


def load_script(script: Path) -> Recipe:
    """A plain .py script as a recipe: no params of its own; its framework the host's guess from the
    imports of its code (launcher.specs.imports), the runtime records what it really imported."""
    from launcher.specs import imports

    script = script.resolve()
    return Recipe(rspec.adhoc_spec(script, imports.framework(script)), tree_digest(script))


def list_recipes(ws: Workspace) -> list[Recipe]:
    """Every recipe folder under the workspace's recipes/, by name; a broken one raises BadRecipe."""
    if not ws.recipes.is_dir():
        return []
    folders = sorted(p for p in ws.recipes.iterdir() if (p / rspec.RECIPE_FILE).is_file())
    return [load_folder(p) for p in folders]


def known_names(ws: Workspace) -> list[str]:
    if not ws.recipes.is_dir():
        return []
    return sorted(p.name for p in ws.recipes.iterdir() if (p / rspec.RECIPE_FILE).is_file())


def load_recipe(ws: Workspace, name_or_path: str, entry: str | None = None) -> Recipe:
    """A recipe by name (recipes/<name>), a folder holding recipe.toml, a plain .py script, or
    (with entry) a folder of code without recipe.toml whose script entry runs."""
    given = Path(name_or_path)
    if entry is not None:
        if not given.is_dir():
            raise UsageError(f"--entry needs a folder, and {name_or_path} is not one",
                             f"run `launcher run FOLDER --entry {entry}`, or `launcher run {entry}` for the script")
        if (given / rspec.RECIPE_FILE).is_file():
            raise UsageError(f"{given} holds a recipe.toml, which names its entry already",
                             "drop --entry, or change `entry` in recipe.toml")
        script = given / entry
        if script.suffix != ".py" or not script.is_file():
            raise NotFound(f"no script {entry} in {given}", "name a .py file inside the folder with --entry")
        return load_script(script)
    if given.suffix == ".py":
        if not given.is_file():
            near = _near(given.name, _scripts_in(given.parent))
            raise NotFound(f"no script at {given}" + (f" (did you mean {given.parent / near}?)" if near else ""),
                           f"run `launcher run {given.parent / near}`" if near else "check the path")
        return load_script(given)
    if given.is_dir() and (given / rspec.RECIPE_FILE).is_file():
        return load_folder(given)
    if _NAME.match(name_or_path) and (ws.recipes / name_or_path / rspec.RECIPE_FILE).is_file():
        return load_folder(ws.recipes / name_or_path)
    if given.is_dir():
        raise BadRecipe(f"{given / rspec.RECIPE_FILE}: no recipe.toml in this folder",
                        f"name its script: `launcher run {given} --entry train.py`, or add a recipe.toml "
                        "(see `launcher recipes new NAME`)")
    known = known_names(ws)
    if Path(name_or_path + ".py").is_file():  # `launcher run train` for train.py
        raise NotFound(f"unknown recipe {name_or_path!r}, but {name_or_path}.py is a script here",
                       f"run the script: `launcher run {name_or_path}.py`")
    near = _near(name_or_path, known + _scripts_in(given.parent))
    raise NotFound(f"unknown recipe {name_or_path!r}" + (f" (did you mean {near}?)" if near else "")
                   + (f" (known: {', '.join(known)})" if known else ""),
                   f"run `launcher run {near}`" if near else
                   "list them with `launcher recipes list`, or pass a folder or a .py script")


def _scripts_in(folder: Path) -> list[str]:
    """The names of the .py files in folder (none when it is not one)."""
    try:
        return sorted(p.name for p in folder.iterdir() if p.suffix == ".py" and p.is_file())
    except OSError:
        return []


def _near(word: str, candidates: list[str]) -> str | None:
    """The candidate closest to a mistyped word, if one is close enough to be what was meant (a script
    compared by its name with and without .py: `tarin` finds train.py)."""
    import difflib

    by_key = {c.removesuffix(".py"): c for c in candidates} | {c: c for c in candidates}
    found = difflib.get_close_matches(word, list(by_key), n=1, cutoff=0.75)
    return by_key[found[0]] if found else None


def coerce(raw: str, like: Any = None) -> ParamValue:
    """A command-line value as the type of the default it replaces (or the most natural type)."""
    if isinstance(like, bool):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise UsageError(f"{raw!r} is not a boolean", "use true or false")
    if isinstance(like, int):
        try:
            return int(raw)
        except ValueError:
            raise UsageError(f"{raw!r} is not an integer", f"give a whole number like {like}") from None
    if isinstance(like, float):
        try:
            return float(raw)
        except ValueError:
            raise UsageError(f"{raw!r} is not a number", f"give a number like {like}") from None
    if isinstance(like, str):
        return raw
    if raw in ("true", "false"):
        return raw == "true"
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, int | float) and not isinstance(value, bool) else raw


def split_param(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> (key, raw value)."""
    key, sep, raw = text.partition("=")
    if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]*$", key):
        raise UsageError(f"bad param {text!r}", "write it as KEY=VALUE, e.g. --param epochs=3")
    return key, raw


def parse_param(text: str) -> tuple[str, ParamValue]:
    """``KEY=VALUE`` -> (key, value); the value is typed without a default to go by."""
    key, raw = split_param(text)
    return key, coerce(raw)


def check_values(recipe: Recipe, given: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """``given`` with each value checked against the recipe's param and given its type: a value of
    the wrong type, outside the declared choices or range is a usage error naming the allowed
    values. Keys are not checked here (see :func:`resolve_params`); an ad-hoc script's pass as given."""
    if recipe.adhoc:
        return dict(given)
    out: dict[str, ParamValue] = {}
    for key, value in given.items():
        try:
            out[key] = check_value(recipe.spec, key, value)
        except rspec.ParamError as exc:
            ps = exc.param
            example = ps.choices[0] if ps.choices else ps.default
            shown = example if isinstance(example, str) else json.dumps(example)
            raise UsageError(str(exc), f"use an allowed value, e.g. --param {key}={shown}; "
                             f"`launcher recipes show {recipe.name}` lists every param") from None
    return out


def resolve_params(recipe: Recipe, given: list[str] | dict[str, ParamValue]) -> dict[str, ParamValue]:
    """The recipe's defaults overridden by ``given``; unknown keys are refused for a recipe folder,
    and each value is checked against its param (type, choices, range)."""
    pairs: list[tuple[str, Any]] = (list(given.items()) if isinstance(given, dict)
                                    else [split_param(t) for t in given])
    out: dict[str, ParamValue] = recipe.params
    for key, value in pairs:
        if not recipe.adhoc and key not in out:
            raise UsageError(f"recipe {recipe.name} has no param {key!r}",
                             f"its params: {', '.join(sorted(out)) or 'none'}")
        if recipe.adhoc:
            out[key] = coerce(value, out.get(key)) if isinstance(value, str) else value
        else:
            out.update(check_values(recipe, {key: value}))
    return out


_TOML = '''name = "{name}"
framework = "{framework}"
entry = "train.py"
description = "TODO: one line saying what this trains"
outputs = ["metrics.jsonl", "model/canonical.npz"]

[params]                    # a default, or a table: default, choices, min, max, help
dataset = "builtin"         # builtin (made in train.py) | files (read from --data): the datasets' names
epochs = {{ default = 3, min = 1 }}
batch_size = {{ default = 32, min = 1, help = "samples per gradient step" }}

[[datasets]]
name = "builtin"
source = "builtin"
format = "random arrays made with numpy from a fixed seed"
# fingerprint = "sha256:..."   paste the digest from fingerprints/dataset.json of a first run

[[datasets]]
name = "files"
source = "files"
format = "data.npz with arrays x and y"
'''

def scaffolded_frameworks() -> list[str]:
    """The frameworks `launcher recipes new --framework` writes a train.py for."""
    return [f.name for f in frameworks.all_frameworks() if f.scaffold]


def scaffold_recipe(ws: Workspace, name: str, framework: str = "tensorflow") -> Recipe:
    """Create recipes/<name>/ with a recipe.toml and a train.py that runs as it is."""
    if not _NAME.match(name):
        raise UsageError(f"bad recipe name {name!r}",
                         "start with a letter; use letters, digits, '_' or '-' (at most 64)")
    fw = frameworks.named(framework)
    if fw is None or fw.scaffold is None:
        raise UsageError(f"unknown framework {framework!r}", f"use {' or '.join(scaffolded_frameworks())}")
    folder = ws.recipes / name
    if folder.exists():
        raise UsageError(f"{folder} already exists", "pick another name or edit that recipe")
    folder.mkdir(parents=True)
    toml = _TOML.format(name=name, framework=framework)
    if fw.variant and fw.variant in ws.variants():  # a PyTorch recipe needs a PyTorch image
        toml = toml.replace('entry = "train.py"\n', f'variant = "{fw.variant}"      # the image it runs in '
                            '(--variant overrides)\nentry = "train.py"\n', 1)
    (folder / rspec.RECIPE_FILE).write_text(toml)
    (folder / "train.py").write_text(fw.scaffold.format(name=name))
    return load_folder(folder)
