"""The launcher's cache on this machine (``~/.cache/launcher`` or ``$LAUNCHER_CACHE``): what it
holds and how to shrink it without losing anything a build, run or ship still needs.

Areas, each a folder of the cache:

- ``images``: layers (``layers/<diff-id>.tar``) and configs (``configs/<image-id>.json``) of
  the images ``launcher build`` made, so an image ships from here without ``docker save``;
- ``blobs``: gzip blobs of layers (``<diff-id>.tar.gz``) made for ships over slow links, once per
  layer, and the configs of their images (``configs/<image-id>.json``);
- ``builds``: build records by content, so another workspace reuses an identical build;
- ``wheels``: the wheelhouse the builds install from, by file name, checked against the lock;
- ``debs``: the .deb files of projects' system locks (``<sha256 hex>.deb``), checked against the lock;
  never pruned: once Debian's archive moves on, the cache is what keeps an older lock buildable;
- ``code``: snapshots of the code folders runs mount, by code digest (small; not pruned);
- ``bootstrap``: debootstrapped root file systems of pinned bases;
- ``registry``: the storage of the local registry that holds bootstrapped bases;
- ``layer-keys``: how the layers of each base are recognised.

Pruning keeps what is still live. A cached image is live while the local Docker engine has it
(a build whose image is gone is rebuilt, and the rebuild writes its layers again); a layer is
live while a live image uses it. Files no image names (an interrupted write, say) go only once
they are an hour old, so a build writing beside the prune loses nothing. Wheels go only when
asked (``wheels=True``), and then only those whose sha256 no lockfile of the workspace names.
The registry's storage and the bootstrapped root file systems are never pruned: the pinned
base digest lives there.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from launcher.hashing import sha256_file
from launcher.images.lock import HASH

AREAS = ("images", "blobs", "builds", "wheels", "debs", "code", "bootstrap", "registry", "layer-keys")
ORPHAN_AGE_S = 3600.0


class AreaRecord(TypedDict):
    """An area in `launcher cache`'s data."""

    name: str
    path: str
    files: int
    bytes: int


class EngineImageRecord(TypedDict):
    """An engine image in `launcher cache`'s data."""

    id: str
    tags: list[str]
    bytes: int
    created: str
    kind: str
    variant: str
    dangling: bool


class RemovalRecord(TypedDict):
    path: str
    bytes: int
    why: str


class PruneRecord(TypedDict):
    """`launcher cache prune`'s data: what was (or, dry, would be) removed, and the images kept."""

    dry_run: bool
    removed: list[RemovalRecord]
    removed_files: int
    removed_bytes: int
    kept_images: list[str]


@dataclass
class Area:
    name: str
    path: Path
    files: int
    bytes: int

    def to_dict(self) -> AreaRecord:
        return {"name": self.name, "path": str(self.path), "files": self.files, "bytes": self.bytes}


def _walk(path: Path) -> Iterable[tuple[Path, int]]:
    """The regular files under path and their sizes: not through a symlink, not into another filesystem mounted
    below it (a root filesystem being bootstrapped in the cache has /proc mounted in it), what cannot be read
    passed over."""
    try:
        top = path.lstat()
    except OSError:
        return
    if stat.S_ISREG(top.st_mode):
        yield path, top.st_size
        return
    if not stat.S_ISDIR(top.st_mode):
        return
    for root, dirs, files in os.walk(path):  # os.walk follows no symlink and skips folders it cannot list
        for name in list(dirs):
            try:
                if os.lstat(os.path.join(root, name)).st_dev != top.st_dev:
                    dirs.remove(name)
            except OSError:
                dirs.remove(name)
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield Path(root, name), st.st_size


ENGINE_LABEL = "org.launcher.version"  # on every image launcher builds (the environment and the image on it)


@dataclass
class EngineImage:
    """An image the Docker engine holds that launcher built."""

    id: str
    tags: list[str]
    bytes: int  # as the engine counts it: layers shared with other images are counted in each
    created: str
    kind: str  # image (recipes included) | environment (the Dockerfile's part)
    variant: str

    def to_dict(self) -> EngineImageRecord:
        return {"id": self.id, "tags": self.tags, "bytes": self.bytes, "created": self.created,
                "kind": self.kind, "variant": self.variant, "dangling": not self.tags}


def engine_images(rows: Iterable[dict[str, Any]]) -> list[EngineImage]:  # Engine.labelled_images' own rows
    """launcher's images among the engine's (rows as Engine.labelled_images gives them)."""
    out = []
    for r in rows:
        labels = r.get("labels") or {}
        kind = "image" if "org.launcher.content" in labels else "environment"
        out.append(EngineImage(r["id"], list(r.get("tags") or []), int(r.get("bytes") or 0), str(r.get("created")),
                               kind, str(labels.get("org.launcher.variant", "?"))))
    return out


def usage(cache_dir: Path) -> list[Area]:
    """Files and bytes per area (known areas first, then anything else found at the top);
    areas that do not exist yet count zero."""
    areas = []
    others = sorted(p.name for p in cache_dir.iterdir() if p.name not in AREAS) if cache_dir.is_dir() else []
    for name in (*AREAS, *others):
        path = cache_dir / name
        files = list(_walk(path))
        areas.append(Area(name, path, len(files), sum(size for _, size in files)))
    return areas


@dataclass
class Removal:
    path: Path
    bytes: int
    why: str

    def to_dict(self) -> RemovalRecord:
        return {"path": str(self.path), "bytes": self.bytes, "why": self.why}


@dataclass
class PruneResult:
    removed: list[Removal] = field(default_factory=list)
    kept_images: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.removed)

    def to_dict(self) -> PruneRecord:
        return {
            "dry_run": self.dry_run,
            "removed": [r.to_dict() for r in self.removed],
            "removed_files": len(self.removed),
            "removed_bytes": self.bytes,
            "kept_images": self.kept_images,
        }


def _image_layers(config: Path) -> list[str] | None:
    try:
        data = json.loads(config.read_text())
        return [str(d).removeprefix("sha256:") for d in data["rootfs"]["diff_ids"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _old(path: Path, now: float) -> bool:
    try:
        return now - path.stat().st_mtime >= ORPHAN_AGE_S
    except FileNotFoundError:
        return False


def locked_hashes(lockfiles: Iterable[Path]) -> set[str]:
    """Every sha256 that these pip-tools lockfiles allow."""
    found: set[str] = set()
    for lf in lockfiles:
        found.update(HASH.findall(lf.read_text()))
    return found


def prune(
    cache_dir: Path,
    *,
    engine_has: Callable[[str], bool],
    wheels_allowed: set[str] | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> PruneResult:
    """Remove what nothing live needs. engine_has(image_id) says whether the engine has an image;
    wheels_allowed, when given, is the set of sha256 hex digests whose wheels are kept."""
    plan = _Plan(time.time() if now is None else now)
    result = PruneResult(dry_run=dry_run)
    live_layers = _plan_images(cache_dir / "images", engine_has, plan, result.kept_images)
    _plan_blobs(cache_dir / "blobs", engine_has, live_layers, plan)
    _plan_builds(cache_dir / "builds", engine_has, plan)
    if wheels_allowed is not None:
        for wheel in sorted((cache_dir / "wheels").glob("*")):
            if wheel.is_file() and sha256_file(wheel).removeprefix("sha256:") not in wheels_allowed:
                plan.drop(wheel, "no lockfile of this workspace names it")
    _plan_partials(cache_dir, plan)
    for r in plan.removals:
        if not dry_run:
            r.path.unlink(missing_ok=True)
        result.removed.append(r)
    return result


@dataclass
class _Plan:
    """What a prune removes, in the order found; files older than ORPHAN_AGE_S at ``now`` are old."""

    now: float
    removals: list[Removal] = field(default_factory=list)

    def drop(self, path: Path, why: str) -> None:
        try:
            self.removals.append(Removal(path, path.stat().st_size, why))
        except FileNotFoundError:
            pass

    def old(self, path: Path) -> bool:
        return _old(path, self.now)


def _plan_images(images: Path, engine_has: Callable[[str], bool], plan: _Plan, kept: list[str]) -> set[str]:
    """The cached images' configs and layers the engine no longer needs; the layers still live."""
    live_layers: set[str] = set()
    dead_layers: set[str] = set()
    for config in sorted((images / "configs").glob("*.json")):
        image_id = "sha256:" + config.stem
        layers = _image_layers(config)
        if layers is not None and engine_has(image_id):
            live_layers.update(layers)
            kept.append(image_id)
        else:
            dead_layers.update(layers or [])
            plan.drop(config, "the Docker engine no longer has this image" if layers is not None else "unreadable")
    for layer in sorted((images / "layers").glob("*")):
        diff = layer.name.removesuffix(".tar")
        if not layer.is_file() or diff in live_layers:
            continue
        if diff in dead_layers:
            plan.drop(layer, "only images the engine no longer has use it")
        elif plan.old(layer):  # named by no image: a young one may belong to a build under way
            plan.drop(layer, "no cached image uses it")
    return live_layers


def _plan_blobs(blob_dir: Path, engine_has: Callable[[str], bool], live_layers: set[str], plan: _Plan) -> None:
    """The gzip blobs (and their images' configs) of layers no image the engine has uses."""
    live_blobs = set(live_layers)
    for config in sorted((blob_dir / "configs").glob("*.json")):
        layers = _image_layers(config)
        if layers is not None and engine_has("sha256:" + config.stem):
            live_blobs.update(layers)
        else:
            plan.drop(config, "the Docker engine no longer has this image" if layers is not None else "unreadable")
    for blob in sorted(blob_dir.glob("*.tar.gz")):
        diff = blob.name.removesuffix(".tar.gz")
        if diff not in live_blobs and plan.old(blob):
            plan.drop(blob, "no image the Docker engine has uses this layer")
            plan.drop(blob.with_name(blob.name + ".sha256"), "its blob goes")


def _plan_builds(builds: Path, engine_has: Callable[[str], bool], plan: _Plan) -> None:
    """Build records (and their trees) whose image the engine no longer has."""
    for record in sorted(builds.glob("*.json")):
        try:
            image_id = str(json.loads(record.read_text())["image_id"])
        except (OSError, ValueError, KeyError, TypeError):
            if plan.old(record):
                plan.drop(record, "unreadable")
            continue
        if not engine_has(image_id):
            plan.drop(record, "the Docker engine no longer has its image")
            plan.drop(record.with_suffix(".tree.json.gz"), "the Docker engine no longer has its image")


def _plan_partials(cache_dir: Path, plan: _Plan) -> None:
    """Files an interrupted write left (not in the registry's storage, which is never pruned)."""
    for partial in sorted(cache_dir.rglob("*.partial")):
        if partial.is_file() and plan.old(partial) and not partial.is_relative_to(cache_dir / "registry"):
            if all(r.path != partial for r in plan.removals):
                plan.drop(partial, "left by an interrupted write")

