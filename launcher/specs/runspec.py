"""A run's spec before it starts: its options, its params checked against the recipe, its image, its code plan."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher import __version__
from launcher.errors import Corrupt, LauncherError, NotFound, UsageError
from launcher.images.lock import parse_lock
from launcher.records.records import BAKED, CodePlan, DataSource, ImageRecord, ProbesRecord, StartFrom
from launcher.runtime import frameworks
from launcher.runtime.probespec import ProbeError, ProbeSpec, parse_option
from launcher.runtime.steps import EPOCH, parse_every
from launcher.specs import recipes
from launcher.specs.recipes import ParamValue, Recipe
from launcher.workspace import Workspace, check_variant_name


@dataclass
class RunSpec:
    recipe: str
    variant: str = "cpu"
    seed: int | None = None
    profile: str = "deterministic"
    threads: int | None = None
    data: str | None = None
    params: dict[str, ParamValue] = field(default_factory=dict)
    group: str | None = None
    replicate: int = 0
    detach: bool = False
    ship_via: str | None = None  # None: docker save | load; or a registry address such as 127.0.0.1:5000
    data_from: str | None = None  # a dataset folder on this machine, sent to the host by content
    data_source: DataSource | None = None  # where the data came from (set when the placement receives it)
    args: list[str] = field(default_factory=list)  # the script's own argv (after `--`)
    code: str | None = None  # --code DIR: the folder a plain script is sent with
    entry: str | None = None  # --entry FILE: the script of a folder without recipe.toml
    mount: bool = False  # mount the workspace recipe read-only instead of running the baked copy
    build: bool = True  # rebuild a stale image first; False: refuse to run stale code
    code_plan: CodePlan | None = None  # what code runs and where the host has it (set by Placement.send_code)
    probes: str | None = None  # --probes SPEC as given: off, N or KEY=VALUE,...; None: the recipe's [probes]
    trace_every: str | None = None  # --trace-every: epoch (None), off or a step count (launcher.runtime.steps)
    optrace: str | None = None  # LO:HI: trace these steps op by op (a `launcher diverge` re-execution)
    checkpoint_every: int | None = None  # --checkpoint-every N: a checkpoint after every N-th epoch
    keep_checkpoints: bool = False  # --keep-checkpoints: every checkpoint kept, not only the latest
    start_from: StartFrom | None = None  # a run's checkpoint the run starts from (a `launcher diverge` re-execution)
    env: dict[str, str] = field(default_factory=dict)  # --env: the user's variables, recorded with their values
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)  # --secret-env: recorded by sha256 only
    find_links: list[str] = field(default_factory=list)  # --find-links DIR: wheels no reachable index serves
    ca_bundle: str | None = None  # --ca-bundle FILE: the CA pip trusts for the index (locks and downloads)
    image: ImageRecord | None = None  # the image the runs use when it is not the variant's (a project layer)


def parse_params(pairs: Sequence[str]) -> dict[str, ParamValue]:
    """KEY=VALUE strings -> typed values (JSON numbers, booleans, else the string itself)."""
    return dict(recipes.parse_param(p) for p in pairs)


def probe_option(text: str | None) -> ProbeSpec | None:
    """--probes SPEC as a probe set (None for off, or when not given); a bad SPEC is a UsageError,
    checked as recipe.toml's [probes] is."""
    if text is None:
        return None
    try:
        return parse_option(text)
    except ProbeError as exc:
        raise UsageError(f"--probes {text}: {exc}",
                         "give off, a count (--probes 8) or KEY=VALUE pairs with recipe.toml's [probes] keys "
                         "(--probes count=8,gradcam=false, --probes indices=0;3;7,layer=conv2d)") from None


def trace_option(text: str | None) -> str:
    """--trace-every as the runtime reads it: ``epoch`` (the default), ``off`` or a step count;
    anything else is a UsageError."""
    try:
        every = parse_every(text)
    except ValueError:
        raise UsageError(f"--trace-every {text}: not a number of steps, 'epoch' or 'off'",
                         "give a step count of at least 1 (--trace-every 10), epoch (the default) or off") from None
    return EPOCH if every is None else str(every)


def checkpoint_option(every: int | None, keep: bool = False) -> int | None:
    """--checkpoint-every N: None, or N when it is at least 1 (else a UsageError); --keep-checkpoints only with it."""
    if every is not None and every < 1:
        raise UsageError(f"--checkpoint-every {every}: not a number of epochs of at least 1",
                         "give how many epochs go between checkpoints (--checkpoint-every 1), or drop it")
    if keep and every is None:
        raise UsageError("--keep-checkpoints without --checkpoint-every: there are no checkpoints to keep",
                         "add --checkpoint-every N, or drop --keep-checkpoints")
    return every


def probes_record(spec: RunSpec, recipe: Recipe) -> ProbesRecord:
    """The probe set a run records, for its launch record and manifest: where it came from (option,
    recipe or none) and its config (None: no probes)."""
    if spec.probes is not None:
        chosen = probe_option(spec.probes)
        return {"source": "option", "option": spec.probes, "config": chosen.as_dict() if chosen else None}
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


def plan_code(ws: Workspace, spec: RunSpec, recipe: Recipe) -> CodePlan:
    """What code the run executes: the recipe baked into the image, or a folder to mount (a plain
    script's project, a recipe folder from outside the workspace, or --mount), snapshotted here
    by its code digest."""
    from launcher.specs import code

    if spec.code and not recipe.adhoc:
        raise UsageError("--code is for plain scripts", f"{recipe.name} is a recipe folder: it is its own code")
    if baked(ws, recipe, spec.mount):
        return {"source": BAKED, "git": code.git_state(recipe.path)}
    tree = code.select(script_root(spec, recipe), recipe.path) if recipe.adhoc else code.select(recipe.path)
    local = code.snapshot(tree, ws.cache_dir)
    return tree.plan(local)


def script_root(spec: RunSpec, recipe: Recipe) -> Path:
    """The project folder a plain script is sent with: --code DIR, else the enclosing git work tree,
    else the folder named with --entry, else the script's own folder."""
    from launcher.specs import code

    if spec.code:
        return Path(spec.code)
    top = code.git_toplevel(recipe.path.parent)
    if top is not None:
        return top
    return Path(spec.recipe) if spec.entry else recipe.path.parent


def code_identity(spec: RunSpec, recipe: Recipe) -> str | None:
    """A plain script's ``project/path`` (specs.identity) before its code is planned; None for a recipe."""
    from launcher.specs import identity

    return identity.script_identity(script_root(spec, recipe), recipe.path) if recipe.adhoc else None

