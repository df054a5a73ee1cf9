"""`launcher cache ls|prune`: what the machine-wide cache holds, and shrinking it safely."""

from __future__ import annotations

from typing import Annotated, NotRequired, TypedDict

import typer
from rich.filesize import decimal
from rich.table import Table
from rich.text import Text

from launcher import cache as cache_mod
from launcher.cli.common import command, options, render, stdout
from launcher.cli.params import group
from launcher.result import Result
from launcher.workspace import Workspace, default_cache_dir

app = group(
    "cache",
    "The cache shared by every workspace on this machine (~/.cache/launcher, or $LAUNCHER_CACHE): "
    "image layers for shipping, build records, wheels, bootstrapped bases.",
)



class EngineListing(TypedDict):
    images: list[cache_mod.EngineImageRecord]
    bytes: int
    error: NotRequired[str]  # the engine could not be asked: its images unknown


class CacheListing(TypedDict):
    """`cache ls`'s Result data."""

    cache_dir: str
    areas: list[cache_mod.AreaRecord]
    bytes: int
    engine: EngineListing


class PruneListing(cache_mod.PruneRecord):
    """`cache prune`'s Result data: what prune did, in which cache."""

    cache_dir: str


@command(app, "ls", aliases=("list",))
def ls_cmd(ctx: typer.Context) -> None:
    """Show each area of the cache with its files and size, and the images launcher built that the
    local Docker engine holds (tags, size, variant; an untagged one is marked dangling)."""
    from launcher.errors import LauncherError
    from launcher.hosts import engine

    root = default_cache_dir()
    areas = cache_mod.usage(root)
    total = sum(a.bytes for a in areas)
    try:
        images = cache_mod.engine_images(engine.local().labelled_images(cache_mod.ENGINE_LABEL))
        listed: EngineListing = {"images": [i.to_dict() for i in images], "bytes": sum(i.bytes for i in images)}
    except LauncherError as exc:
        images = []
        listed = {"images": [], "bytes": 0, "error": exc.one_line()}
    data: CacheListing = {"cache_dir": str(root), "areas": [a.to_dict() for a in areas], "bytes": total,
                          "engine": listed}

    def text(result: Result[CacheListing]) -> None:
        table = Table("area", "files", "size", "path", box=None)
        for a in areas:
            table.add_row(a.name, str(a.files), decimal(a.bytes), str(a.path))
        stdout.print(table)
        stdout.print(result.summary, markup=False)
        if "error" in data["engine"]:
            stdout.print(f"Docker engine: {data['engine']['error']}", markup=False)
            return
        stdout.print(f"\nin the Docker engine: {len(images)} images launcher built (a size counts the layers an "
                     "image shares with others too; `docker rmi` removes one)", markup=False)
        if images:
            shown = Table("image", "id", "size", "kind", "variant", box=None)
            for i in sorted(images, key=lambda i: (not i.tags, i.tags)):
                shown.add_row(Text(", ".join(i.tags) or "<none> (dangling)"), i.id.removeprefix("sha256:")[:12],
                              decimal(i.bytes), i.kind, i.variant)
            stdout.print(shown)

    render(ctx, Result("cache ls", data, summary=f"{decimal(total)} in {root}"), text)


@command(app, "prune")
def prune_cmd(
    ctx: typer.Context,
    wheels: Annotated[
        bool,
        typer.Option(
            "--wheels",
            help="Also remove wheels whose sha256 no lockfile of this workspace (lockfiles/*.txt) names.",
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would go; remove nothing.")] = False,
) -> None:
    """Remove cached images the Docker engine no longer has, their layers and build records.

    An image still in the engine keeps its layers: shipping it stays a no-save stream from the
    cache. Anything removed is made again by the next `launcher build`. The local registry's
    storage and bootstrapped bases are never touched (the pinned base lives there).
    """
    from launcher.hosts import engine

    root = default_cache_dir()
    allowed = None
    if wheels:
        ws = Workspace.discover(options(ctx).workspace)
        allowed = cache_mod.locked_hashes(sorted((ws.root / "lockfiles").glob("*.txt")))
    ids = set(engine.local().image_ids(intermediate=True))
    done = cache_mod.prune(root, engine_has=ids.__contains__, wheels_allowed=allowed, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    summary = (
        f"{verb} {len(done.removed)} files, {decimal(done.bytes)}; "
        f"kept {len(done.kept_images)} cached images the engine still has"
    )

    def text(result: Result[PruneListing]) -> None:
        for r in done.removed:
            stdout.print(f"  {verb} {r.path} ({decimal(r.bytes)}): {r.why}", markup=False)
        stdout.print(result.summary, markup=False)

    data: PruneListing = {"cache_dir": str(root), **done.to_dict()}
    render(ctx, Result("cache prune", data, summary=summary), text)
