"""What a run's request is resolved with before it starts (launcher.runs.plan): its recipe, its params checked
against it, its variant and framework, its probes record, its image record, its code plan."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher import __version__
from launcher.errors import Corrupt, LauncherError, NotFound, UsageError
from launcher.images.lock import parse_lock
from launcher.records.records import BAKED, CodePlan, ImageRecord, ProbesRecord
from launcher.runtime import frameworks
from launcher.specs import recipes
from launcher.specs.recipes import ParamValue, Recipe
from launcher.specs.request import RunRequest
from launcher.workspace import Workspace, check_variant_name


def parse_params(pairs: Sequence[str]) -> dict[str, ParamValue]:
    """KEY=VALUE strings -> typed values (JSON numbers, booleans, else the string itself)."""
    return dict(recipes.parse_param(p) for p in pairs)


def probes_record(request: RunRequest, recipe: Recipe) -> ProbesRecord:
    """The probe set a run records, for its launch record and manifest: where it came from (option,
    recipe or none) and its config (None: no probes)."""
    if request.probes is not None:
        chosen = request.probes.config
        return {"source": "option", "option": request.probes.text, "config": chosen.as_dict() if chosen else None}
    declared = recipe.spec.probes
    return {"source": "recipe" if declared else "none", "config": declared.as_dict() if declared else None}


def load_recipe(ws: Workspace, name_or_path: str, entry: str | None = None) -> Recipe:
    return recipes.load_recipe(ws, name_or_path, entry=entry)


def check_params(recipe: Recipe, given: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    if recipe.adhoc and given:
        raise UsageError(
            f"--param {next(iter(given))}=... given, but the plain script {recipe.entry} declares no params",
            f"pass its own arguments after `--` (launcher run {recipe.entry} -- --{next(iter(given))} VALUE), "
            "or declare params in a recipe.toml",
        )
    if not recipe.adhoc:
        unknown = sorted(set(given) - set(recipe.params))
        if unknown:
            raise UsageError(
                f"recipe {recipe.name} has no param {unknown[0]!r}",
                f"its params are: {', '.join(sorted(recipe.params)) or 'none'}",
            )
    return recipes.check_values(recipe, given)


def framework_packages(framework: str) -> tuple[str, ...]:
    """The distributions that make a framework importable in an image (a lock's package names)."""
    found = frameworks.named(framework)
    return found.packages if found else ()


def holds_framework(ws: Workspace, variant: str, framework: str) -> bool:
    """Whether the variant's lock holds the framework's distribution (True for a framework launcher
    has no package names for, and for a variant not locked yet: nothing to refuse on)."""
    wanted = framework_packages(framework)
    path = ws.lock_txt(variant)
    if not wanted or not path.is_file():
        return True
    try:
        text = path.read_text()
    except OSError:
        return False
    return any(r.name in wanted for r in parse_lock(text, str(path)))


def framework_variant(ws: Workspace, recipe: Recipe, default: str) -> str | None:
    """For a plain script whose code imports a framework the default variant lacks (a PyTorch script
    and the cpu image): the one other variant that has it and runs where the default runs (the same
    accelerator); None when the default has it, or when none or several would do."""
    if not recipe.adhoc or holds_framework(ws, default, recipe.framework):
        return None
    try:
        accelerator = ws.accelerator(default)
        found = [v for v in ws.variants() if v != default and ws.accelerator(v) == accelerator
                 and ws.lock_txt(v).is_file() and holds_framework(ws, v, recipe.framework)]
    except LauncherError:
        return None
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class VariantChoice:
    variant: str
    note: str | None = None  # why another variant than the default was taken, for the user


def choose_variant(ws: Workspace, recipe_ref: str, default: str, *, given: bool,
                   entry: str | None = None) -> VariantChoice:
    """The image variant of a run: the one given on the command line (given), else the one the recipe's
    recipe.toml names (`variant = "torch-cpu"`: a PyTorch recipe needs a PyTorch image), else, for a
    plain script whose code imports a framework the default lacks, the one variant that has it (with a
    note saying so), else the default (LAUNCHER_VARIANT, launcher.toml, cpu). A variant the workspace
    does not have is a usage error naming those it has."""
    if not given:
        try:
            loaded = recipes.load_recipe(ws, recipe_ref, entry=entry)
        except LauncherError:
            return VariantChoice(ws.known_variant(default))  # the run names the recipe's problem itself
        if loaded.variant:
            return VariantChoice(ws.known_variant(loaded.variant))
        chosen = framework_variant(ws, loaded, default)
        if chosen:
            return VariantChoice(ws.known_variant(chosen), f"{recipe_ref} imports {loaded.framework}, which the "
                                 f"{default} image lacks: running in the {chosen} image (--variant to choose another)")
    return VariantChoice(ws.known_variant(default))


def check_framework(ws: Workspace, recipe: Recipe, variant: str) -> None:
    """Refuse, before any build or upload, a recipe whose framework the variant's lock does not hold
    (a PyTorch recipe in the TensorFlow image); the hint names the variants that hold it."""
    if holds_framework(ws, variant, recipe.framework):
        return
    wanted = framework_packages(recipe.framework)
    others = [v for v in ws.variants() if v != variant and ws.lock_txt(v).is_file()
              and holds_framework(ws, v, recipe.framework)]
    if others:
        hint = f"run it with --variant {' or --variant '.join(others)}" + (
            f', or name the image in its recipe.toml (variant = "{others[0]}")' if not recipe.adhoc else "")
    else:
        hint = (f"add a variant with {wanted[0]} (lockfiles/NAME.in listing it, dockerfiles/NAME.Dockerfile, "
                "then `launcher lock --variant NAME`), or copy one from launcher's repository (torch-cpu)")
    name = f"{recipe.path.parent.name}/{recipe.path.name}" if recipe.adhoc else recipe.name
    raise UsageError(
        f"{name} uses {recipe.framework}, which the {variant} image does not have "
        f"({ws.lock_txt(variant).relative_to(ws.root)} lists no {wanted[0]})", hint)


def image_record(ws: Workspace, variant: str) -> ImageRecord:
    check_variant_name(variant)
    path = ws.build_record(variant)
    try:
        rec = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotFound(
            f"no {variant} image has been built in this workspace",
            f"build it with `launcher build --variant {variant}`",
        ) from None
    except ValueError:
        raise Corrupt(f"{path} is not valid JSON", f"rebuild with `launcher build --variant {variant}`") from None
    labels = rec.get("labels") or {}
    return {
        "id": rec["image_id"],
        "tag": rec.get("tag"),
        "variant": variant,
        "base_digest": labels.get("org.launcher.base-digest"),
        "lock_sha256": labels.get("org.launcher.lock-sha256"),
        "git_commit": labels.get("org.launcher.git-commit"),
        # outside git the commit is "unknown", and so is whether the tree was clean
        "git_dirty": (str(labels.get("org.launcher.git-dirty", "")).lower() in ("1", "true", "yes")
                      if labels.get("org.launcher.git-commit", "unknown") != "unknown" else None),
        "launcher_version": labels.get("org.launcher.version") or __version__,
        "recipes": dict((rec.get("extra") or {}).get("recipes") or {}),
    }


def baked(ws: Workspace, recipe: Recipe, mount: bool = False) -> bool:
    """Whether the run executes the copy of the recipe baked into the image (a workspace recipe,
    not mounted), rather than code mounted from the host."""
    return not mount and not recipe.adhoc and recipe.path.parent == ws.recipes.resolve()


def plan_code(ws: Workspace, request: RunRequest, recipe: Recipe) -> CodePlan:
    """What code the run executes: the recipe baked into the image, or a folder to mount (a plain
    script's project, a recipe folder from outside the workspace, or --mount), snapshotted here
    by its code digest."""
    from launcher.specs import code

    if request.code and not recipe.adhoc:
        raise UsageError("--code is for plain scripts", f"{recipe.name} is a recipe folder: it is its own code")
    if baked(ws, recipe, request.mount):
        return {"source": BAKED, "git": code.git_state(recipe.path)}
    tree = code.select(script_root(request, recipe), recipe.path) if recipe.adhoc else code.select(recipe.path)
    local = code.snapshot(tree, ws.cache_dir)
    return tree.plan(local)


def script_root(request: RunRequest, recipe: Recipe) -> Path:
    """The project folder a plain script is sent with: --code DIR, else the enclosing git work tree,
    else the folder named with --entry, else the script's own folder."""
    from launcher.specs import code

    if request.code:
        return Path(request.code)
    top = code.git_toplevel(recipe.path.parent)
    if top is not None:
        return top
    return Path(request.recipe) if request.entry else recipe.path.parent


def code_identity(request: RunRequest, recipe: Recipe) -> str | None:
    """A plain script's ``project/path`` (specs.identity) before its code is planned; None for a recipe."""
    from launcher.specs import identity

    return identity.script_identity(script_root(request, recipe), recipe.path) if recipe.adhoc else None

