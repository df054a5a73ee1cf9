"""`launcher init`, `lock`, `base resolve|bootstrap`, `build`, `rebuild`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from launcher.cli.common import command, render, reporter, stdout, workspace_of
from launcher.cli.params import VariantOpt, check_variant, complete_variants, group, typed
from launcher.errors import NotFound, PinMismatch, UsageError, verdict_exit_code
from launcher.images import aptlock, registry, wheelsources
from launcher.images import bootstrap as bootstrap_mod
from launcher.images import build as build_mod
from launcher.images import lock as lock_mod
from launcher.images import pins as images
from launcher.images.imageref import ImageRef
from launcher.progress import Reporter
from launcher.result import D, Result

if TYPE_CHECKING:
    from launcher.images.buildrecord import BuildData
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace

CA_HELP = "CA bundle for TLS to the package index (behind an intercepting proxy). Default: pip's own settings."
CaBundleOpt = Annotated[Path | None, typer.Option("--ca-bundle", metavar="FILE", help=CA_HELP)]
LOCK_CA_HELP = ("CA bundle (PEM) that pip inside the base image trusts for the package index, e.g. a "
                "TLS-intercepting proxy's. Default: this machine's (PIP_CERT, SSL_CERT_FILE, the system bundle).")
LockCaBundleOpt = Annotated[Path | None, typer.Option("--ca-bundle", metavar="FILE", help=LOCK_CA_HELP)]
FIND_LINKS_HELP = ("A folder of wheels to use beside the indexes (repeatable): a wheel from it counts only when "
                   "its sha256 is locked. For indexes this machine cannot reach, e.g. download.pytorch.org.")
FindLinksOpt = Annotated[list[Path] | None, typer.Option("--find-links", metavar="DIR", help=FIND_LINKS_HELP)]
ProjectArg = Annotated[Path | None, typer.Argument(
    metavar="[PROJECT]", show_default=False,
    help="A project folder (a plain script's code folder, or a recipe folder), or a script in it: lock its own "
         "requirements (requirements.in, requirements.txt or pyproject.toml \\[project] dependencies) into "
         "PROJECT/requirements.lock and its OS packages (\\[system] apt in its launcher.toml or recipe.toml) into "
         "PROJECT/system.lock, for one variant's image (--variant, else its recipe's, else the default).")]
# `launcher build gpu`, as the README once wrote it: the positional variant still works, hidden.
OldVariantArg = Annotated[str | None, typer.Argument(hidden=True, show_default=False)]
VariantsOpt = Annotated[str, typer.Option(
    "--variant", autocompletion=complete_variants, help="One image variant of the workspace, or all of them.")]

app = typer.Typer()
base_app = group("base", "Pin base images by digest in lockfiles/images.lock.")
app.add_typer(base_app)


def _variant(ctx: typer.Context, ws: Workspace, variant: str, positional: str | None) -> str:
    """--variant, or the older positional spelling (`build gpu`); a usage error when they disagree."""
    if positional is not None and positional != variant:
        if typed(ctx, "variant"):
            raise UsageError(f"two variants given: {positional!r} and --variant {variant!r}",
                             "give one, as --variant NAME")
        variant = positional
    return check_variant(ws, variant)


@command(app, "init")
def init_cmd(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Where to create the workspace.")] = Path("."),
    from_workspace: Annotated[Path | None, typer.Option(
        "--from", metavar="DIR",
        help="Copy the locks, Dockerfiles and recipes of this workspace instead of the templates.")] = None,
) -> None:
    """Create a workspace in DIR (`launcher recipes new NAME` then scaffolds a recipe in it)."""
    src = Workspace.discover(from_workspace) if from_workspace else None
    res = init_workspace(directory, from_workspace=src)
    result = Result("init", {"root": str(res.root), "created": res.created, "skipped": res.skipped,
                             "next": res.next_steps},
                    summary=f"workspace ready at {res.root} ({len(res.created)} files created, "
                            f"{len(res.skipped)} kept); next, in it: " + "; ".join(f"`{s}`" for s in res.next_steps)
                            + " (where Docker Hub cannot be reached, `launcher base bootstrap --start-registry` "
                            "first)")
    render(ctx, result)


def _project_variant(ctx: typer.Context, ws: Workspace, folder: Path, variants: str) -> str:
    """--variant typed for a project, else its recipe's `variant`, else the default variant (launcher.toml,
    LAUNCHER_VARIANT, cpu): a project is locked for the one image it runs in."""
    from launcher import config
    from launcher.runtime import recipespec as rspec

    if typed(ctx, "variants") and variants != "all":
        return check_variant(ws, variants)
    if (folder / rspec.RECIPE_FILE).is_file():
        try:
            wanted = rspec.load_spec(folder).variant
        except rspec.SpecError:
            wanted = None  # the run names the recipe's problem
        if wanted:
            return check_variant(ws, wanted)
    default = next(v.value for v in config.resolve(ws).values if v.setting.key == "variant")
    return check_variant(ws, str(default))


def _locked_system(ws: Workspace, folder: Path, variant: str, upgrade: bool, rep: Reporter) -> tuple[Any, str]:
    """The project's OS packages locked (aptlock.lock_project): its --json data and its summary line."""
    res = aptlock.lock_project(ws, folder, variant, rep, upgrade=upgrade)
    if res is None:
        return None, f"{folder}: no OS packages declared ([system] apt in launcher.toml or recipe.toml)"
    lk = res.lock
    summary = (f"{res.path}: {len(lk.packages)} .deb(s) for {' '.join(lk.requested)} on Debian {lk.debian} "
               f"({variant} base {lk.base_digest[:19]}…), {'updated' if res.changed else 'unchanged'} "
               f"({res.sha256[:19]}…); fetched and verified in {ws.cache_dir / 'debs'}")
    if lk.in_base:
        summary += f"\nalready in the base image: {', '.join(lk.in_base)}"
    return res.to_dict(), summary


def _lock_project(ctx: typer.Context, ws: Workspace, project: Path, variants: str, upgrade: bool,
                  upgrade_package: list[str] | None, ca_bundle: Path | None, find_links: list[Path] | None) -> None:
    from launcher.images import projectlock
    from launcher.specs.code import git_toplevel

    if not project.exists():
        raise UsageError(f"{project} does not exist", "name a project folder (or a script in it)")
    folder = project.resolve()
    if folder.is_file():  # a script: its project, as `launcher run` takes it
        folder = git_toplevel(folder.parent) or folder.parent
    variant = _project_variant(ctx, ws, folder, variants)
    res = None
    with reporter(ctx) as rep:
        if projectlock.find(folder) is not None:
            res = projectlock.lock_project(ws, folder, variant, upgrade=upgrade,
                                           upgrade_packages=tuple(upgrade_package or ()), ca_bundle=ca_bundle,
                                           find_links=wheelsources.check_dirs(find_links or ()), reporter=rep)
        system, system_summary = _locked_system(ws, folder, variant, upgrade, rep)
    data = {"project": str(folder), "variant": variant, "python": res.to_dict() if res else None, "system": system}
    if res is None:
        summary = (f"{folder}: no Python requirements declared (requirements.in, requirements.txt or pyproject.toml "
                   "[project] dependencies)")
    else:
        summary = (f"{res.path}: {res.packages} packages ({res.extra} not in the {variant} image), "
                   f"{'updated' if res.changed else 'unchanged'} ({res.sha256[:19]}…, resolved by {res.target} in "
                   "the base image, constrained by " + f"lockfiles/{variant}.txt)")
    summary += "\n" + system_summary
    if res is None and system is None:
        summary += "; nothing to lock"
    render(ctx, Result("lock", data, summary=summary))


@command(app, "lock")
def lock_cmd(
    ctx: typer.Context,
    project: ProjectArg = None,
    variants: VariantsOpt = "all",
    upgrade: Annotated[bool, typer.Option("--upgrade", help="Pick the newest allowed versions of everything.")] = False,
    upgrade_package: Annotated[list[str] | None, typer.Option(
        "--upgrade-package", "-P", metavar="NAME", help="Upgrade only this package (repeatable).")] = None,
    ca_bundle: LockCaBundleOpt = None,
    find_links: FindLinksOpt = None,
) -> None:
    """Lock Python dependencies: every package pinned with == and its sha256 hashes.

    pip-tools runs in a container of the pinned base image (images.lock), so the
    image's own Python and platform resolve it, whatever this machine runs; the
    header records the base digest and that interpreter. Locking again with
    nothing changed rewrites nothing. No base yet: `launcher base bootstrap`.

    With PROJECT, lock that project's own dependencies instead: its Python requirements, constrained by
    the variant's lock (the image's packages cannot move), into PROJECT/requirements.lock; its OS packages
    ([system] apt = [...]), resolved by apt in the variant's base image, into PROJECT/system.lock, their
    .deb files fetched and verified. `launcher run` puts both in one thin layer on the variant's image.
    """
    ws = workspace_of(ctx)
    if project is not None:
        _lock_project(ctx, ws, project, variants, upgrade, upgrade_package, ca_bundle, find_links)
        return
    variant = check_variant(ws, variants, all_ok=True)
    if variant != "all":
        images.check_variant(variant)
    with reporter(ctx) as rep:
        results = lock_mod.lock(ws, variant, upgrade=upgrade, upgrade_packages=tuple(upgrade_package or ()),
                                ca_bundle=ca_bundle, find_links=wheelsources.check_dirs(find_links or ()),
                                reporter=rep)
    data = {"locks": [{"variant": r.variant, "path": str(r.path), "changed": r.changed, "packages": r.packages,
                       "sha256": r.sha256, "target": r.target, "base": r.base} for r in results]}
    lines = [f"{r.path.relative_to(ws.root)}: {r.packages} packages, {'updated' if r.changed else 'unchanged'} "
             f"({r.sha256[:19]}…, resolved by {r.target} in the base image)" for r in results]
    render(ctx, Result("lock", data, summary="\n".join(lines)))


@command(base_app, "resolve")
def base_resolve(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(metavar="REF", help="A public image tag, e.g. python:3.11-slim-bookworm.")],
    variants: VariantsOpt = "all",
    python: Annotated[str, typer.Option("--python", metavar="X.Y", help="The image's Python (major.minor).")] = "3.11",
    ca_bundle: Annotated[Path | None, typer.Option(
        "--ca-bundle", metavar="FILE", help="CA bundle for the registry's TLS.")] = None,
) -> None:
    """Resolve REF's tag to its registry digest and pin it in images.lock."""
    ws = workspace_of(ctx)
    variant = check_variant(ws, variants, all_ok=True)
    parsed = ImageRef.parse(ref)
    digest = registry.resolve_digest(ref, ca_bundle=ca_bundle)
    if parsed.digest and parsed.digest != digest:
        raise PinMismatch(f"{ref} names {parsed.digest} but the registry serves {digest}",
                                 "drop the @digest part to pin what the tag points to now")
    pinned = parsed.pinned(digest)
    pinned_variants = list(ws.variants()) if variant == "all" else [images.check_variant(variant)]
    try:
        lock = images.load(ws)
    except NotFound:
        lock = images.ImagesLock()
    for v in pinned_variants:
        lock.pins[v] = images.BasePin(v, pinned, python=python)
    changed = images.save(ws, lock)
    render(ctx, Result("base resolve",
                       {"ref": pinned, "digest": digest, "variants": pinned_variants, "changed": changed},
                       summary=f"{', '.join(pinned_variants)} base pinned: {pinned}"))


@command(base_app, "bootstrap")
def base_bootstrap(
    ctx: typer.Context,
    variants: VariantsOpt = "all",
    registry_addr: Annotated[str, typer.Option(
        "--registry", metavar="HOST:PORT", help="Registry to push to.")] = registry.DEFAULT_LOCAL,
    start_registry: Annotated[bool, typer.Option(
        "--start-registry", help="Start a local registry on --registry (loopback) if none answers.")] = False,
    suite: Annotated[str, typer.Option("--suite", metavar="NAME", help="Debian suite.")] = bootstrap_mod.DEFAULT_SUITE,
    mirror: Annotated[str, typer.Option(
        "--mirror", metavar="URL", help="Debian mirror.")] = bootstrap_mod.DEFAULT_MIRROR,
) -> None:
    """Build a minimal Debian + Python base with debootstrap, push it and pin its digest.

    For machines without Docker Hub, and for teams that cannot use public registries.
    """
    ws = workspace_of(ctx)
    variant = check_variant(ws, variants, all_ok=True)
    pinned_variants = list(ws.variants()) if variant == "all" else [images.check_variant(variant)]
    started = None
    if start_registry:
        started = registry.start_local_registry(ws.cache_dir / "registry", registry_addr)
    with reporter(ctx) as rep:
        res = bootstrap_mod.bootstrap(ws.cache_dir, registry_address=registry_addr, suite=suite, mirror=mirror,
                                      reporter=rep)
    try:
        lock = images.load(ws)
    except NotFound:
        lock = images.ImagesLock()
    for v in pinned_variants:
        lock.pins[v] = images.BasePin(v, res.ref, python=res.python, source="bootstrap")
    images.save(ws, lock)
    data = {"ref": res.ref, "digest": res.digest, "image_id": res.image_id, "python": res.python,
            "variants": pinned_variants, "rootfs_cached": res.rootfs_cached, "registry": started}
    render(ctx, Result("base bootstrap", data, summary=f"{', '.join(pinned_variants)} base pinned: {res.ref}"))


@command(app, "build")
def build_cmd(
    ctx: typer.Context,
    positional: OldVariantArg = None,
    variant: VariantOpt = "cpu",
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Build every step again.")] = False,
    ca_bundle: CaBundleOpt = None,
    find_links: FindLinksOpt = None,
) -> None:
    """Build dockerfiles/VARIANT.Dockerfile FROM the pinned base, installing offline from the lock.

    The tag is a hash of the Dockerfile, the lockfile, the base digest and the recipes, so
    building unchanged inputs again is a no-op. The build record lands in .launcher/builds/.
    """
    ws = workspace_of(ctx)
    variant = _variant(ctx, ws, variant, positional)
    with reporter(ctx) as rep:
        rec = build_mod.build(ws, variant, nocache=no_cache, ca_bundle=ca_bundle,
                              find_links=wheelsources.check_dirs(find_links or ()), reporter=rep)
    data: BuildData = {**rec.to_json(), "noop": rec.noop}
    data["extra"].pop("tree", None)
    verb = "up to date" if rec.noop else f"built in {rec.seconds:.0f} s"
    render(ctx, Result("build", data, summary=f"{rec.tag} {verb}\n  image {rec.image_id}\n  tree  {rec.tree_digest}"))


@command(app, "rebuild")
def rebuild_cmd(
    ctx: typer.Context,
    positional: OldVariantArg = None,
    variant: VariantOpt = "cpu",
    verify: Annotated[bool, typer.Option("--verify/--no-verify",
                                         help="Compare with the recorded build (exit 3 if it differs).")] = True,
    ca_bundle: CaBundleOpt = None,
    find_links: FindLinksOpt = None,
) -> None:
    """Rebuild the image from scratch from the same lock and digest, and prove it is the same.

    Compares the filesystem tree digest (paths, types, modes, owners, sizes, content
    hashes, link targets; no mtimes) and the image ID with the recorded build.
    """
    ws = workspace_of(ctx)
    variant = _variant(ctx, ws, variant, positional)
    with reporter(ctx) as rep:
        from launcher.images import rebuild as rebuild_mod

        rep_ = rebuild_mod.rebuild(ws, variant, verify=verify, ca_bundle=ca_bundle,
                                 find_links=wheelsources.check_dirs(find_links or ()), reporter=rep)
    code = verdict_exit_code(rep_.tree_matches)
    data = {"variant": variant, "tree_matches": rep_.tree_matches, "image_id_matches": rep_.id_matches,
            "recorded_image_id": rep_.recorded_image_id, "rebuilt_image_id": rep_.rebuilt_image_id,
            "recorded_tree": rep_.recorded_tree, "rebuilt_tree": rep_.rebuilt_tree, "changes": rep_.changes,
            "seconds": rep_.seconds}

    def text(_: Result[D]) -> None:  # the rebuild's own fields, not the data
        if rep_.tree_matches:
            stdout.print(f"[green]reproducible[/]: filesystem tree {rep_.rebuilt_tree}")
        else:
            table = Table("path", "change", title=f"{len(rep_.changes)} paths differ from the recorded build")
            for c in rep_.changes[:50]:
                table.add_row(c["path"], c["change"])
            stdout.print(table)
            stdout.print(f"[red]not reproducible[/]: tree {rep_.recorded_tree[:19]}… -> {rep_.rebuilt_tree[:19]}…")
        same = "the same" if rep_.id_matches else "a different"
        stdout.print(f"image ID: {same} ({rep_.rebuilt_image_id})")

    render(ctx, Result("rebuild", data, exit_code=code), text)


@command(base_app, "registry")
def base_registry(
    ctx: typer.Context,
    address: Annotated[str, typer.Option(
        "--registry", "--address", metavar="HOST:PORT",
        help="The loopback address to listen on, as base bootstrap --registry names it.")] = registry.DEFAULT_LOCAL,
    storage: Annotated[Path | None, typer.Option(
        "--storage", metavar="DIR", help="Where blobs live. Default: the cache dir.")] = None,
) -> None:
    """Start a local registry (Debian's docker-registry) on loopback, if none answers there."""
    from launcher.workspace import default_cache_dir

    info = registry.start_local_registry(storage or default_cache_dir() / "registry", address)
    verb = "started" if info.get("started") else "already running"
    render(ctx, Result("base registry", dict(info), summary=f"registry {verb} on {address}"))
