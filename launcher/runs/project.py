"""A run's project: the folder its code comes from, what that folder declares it needs beyond the
image (Python requirements, OS packages), locked beside it for the run's variant, and the image the
run then uses: the variant's image plus one thin project layer (:mod:`launcher.images.projectlayer`).

The project is the folder a plain script is sent with (``specs.runspec.script_root``) or a recipe folder.
Its ``requirements.lock`` is made (or made again) by :func:`ensure_lock` before the code is planned,
since the lock is part of the project's code; :func:`image_for` answers the image with the layer, which
the run's plan takes (``runs.plan``), and the launch record and manifest keep it as ``image.project``.

OS packages come from ``launcher.images.aptlock`` and ``launcher.images.debs``: ``[system] apt`` kept
current in ``system.lock`` beside the project
(:func:`ensure_system_lock`), its ``.deb`` files fetched, verified and unpacked, and the unpacked tree
joined to the same layer with the modes and owners the packages give (:func:`system_part`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import ImageOutOfDate, LockFailed, NotFound
from launcher.hosts import dockerapi
from launcher.images import aptlock, buildrecord, projectlock
from launcher.images import pins as images
from launcher.images.projectlock import Requirements
from launcher.progress import NullReporter, Reporter
from launcher.records.records import ImageRecord, ProjectRecord
from launcher.specs.recipes import Recipe
from launcher.specs.request import RunRequest
from launcher.specs.runspec import baked, image_record, script_root
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.images.projectlayer import SystemPart

SYSTEM_LOCK = "system.lock"


def folder(request: RunRequest, recipe: Recipe) -> Path:
    """The project folder of a run: a plain script's code root, or the recipe's folder."""
    return (script_root(request, recipe) if recipe.adhoc else recipe.path).resolve()


def _paths(request: RunRequest) -> tuple[tuple[Path, ...], Path | None]:
    return tuple(Path(p) for p in request.find_links), Path(request.ca_bundle) if request.ca_bundle else None


def ensure_lock(ws: Workspace, request: RunRequest, recipe: Recipe,
                reporter: Reporter | None = None) -> Requirements | None:
    """The project's requirements, with requirements.lock current for the run's variant: locked here
    (one line says why) when it is missing or stale. None when the project declares none. With
    request.build False (--no-build) a stale lock is refused instead."""
    rep = reporter or NullReporter()
    root = folder(request, recipe)
    ensure_system_lock(ws, root, request.variant, request.build, rep)
    req = projectlock.find(root)
    if req is None:
        return None
    reason = projectlock.stale_reason(ws, req, request.variant)
    if reason is None:
        return req
    if not request.build:
        raise ImageOutOfDate(f"the project {root.name}: {reason}",
                             f"lock it with `launcher lock {root} --variant {request.variant}`, or drop --no-build")
    rep.note(f"project {root.name}: {reason}; locking {req.source.name} for the {request.variant} image")
    find_links, ca_bundle = _paths(request)
    projectlock.lock_project(ws, root, request.variant, find_links=find_links, ca_bundle=ca_bundle, reporter=rep)
    return req


def image_for(ws: Workspace, request: RunRequest, recipe: Recipe,
              reporter: Reporter | None = None) -> ImageRecord | None:
    """The image the run uses when it is not the variant's own: the variant's image plus the project layer,
    when the project declares requirements or OS packages (its lock current: ensure_lock first); the
    request's image when it names one; None otherwise (the variant's image)."""
    from launcher.images import build

    if request.image is not None:
        return request.image
    rep = reporter or NullReporter()
    root = folder(request, recipe)
    req = projectlock.find(root)
    with system_part(ws, root, request.variant, rep) as system:
        if req is None and system is None:
            return None
        if system is None and req is not None and not _beyond_image(ws, req, request.variant):
            return None  # every requirement is one the image pins: its own image, no layer
        from launcher.images import projectlayer  # and what builds a layer: only for a project that needs one
        from launcher.images.tree import DEFAULT_EPOCH

        base = image_record(ws, request.variant)
        record = buildrecord.read_record(ws, request.variant)
        extra = record.extra if record is not None else {}
        env_id = str(extra.get("env_image_id") or "")
        installer = env_id if env_id and dockerapi.image_exists(env_id) else str(base["id"])
        epoch = int(extra.get("epoch") or DEFAULT_EPOCH)
        find_links, ca_bundle = _paths(request)
        layer = projectlayer.build_layer(
            lock_path=req.lock_path if req is not None else None, variant_lock=ws.lock_txt(request.variant),
            image_id=installer, pin=images.load(ws).get(request.variant), cache_dir=ws.cache_dir,
            find_links=find_links, ca_bundle=ca_bundle, system=system, epoch=epoch, reporter=rep)
    tag = f"launcher/{build.slug(ws.root.name)}-{request.variant}-project:{build.slug(root.name)}"
    image_id, new = projectlayer.ensure_image(str(base["id"]), layer, tag, ws.cache_dir, epoch)
    if layer.built or new:  # said when the project's image changes; the same one again goes without a word
        count = f"{len(layer.packages)} package{'' if len(layer.packages) == 1 else 's'}"
        names = ", ".join(p.replace("==", " ") for p in layer.packages[:6]) + (", ..." if len(layer.packages) > 6
                                                                               else "")
        how = f"built in {layer.seconds:.1f} s" if layer.built else "from the layer cache"
        debs = [p.replace("=", " ", 1) for p in layer.system_packages]
        os_part = (f" and {len(debs)} OS package{'' if len(debs) == 1 else 's'} ({', '.join(debs[:6])}"
                   f"{', ...' if len(debs) > 6 else ''})") if debs else ""
        rep.note(f"project layer of {root.name}: {count}{f' ({names})' if names else ''}{os_part} beside the "
                 f"{request.variant} image, {how}; the {request.variant} image itself is unchanged")
    project: ProjectRecord = {"folder": root.name, "requirements_lock_sha256": layer.requirements_lock_sha256,
               "system_lock_sha256": layer.system_lock_sha256, "layer": layer.diff_id,
               "packages": list(layer.packages), "system_packages": list(layer.system_packages),
               "variant_image_id": base["id"]}
    return {**base, "id": image_id, "tag": tag, "project": project}


def _beyond_image(ws: Workspace, req: projectlock.Requirements, variant: str) -> bool:
    """Whether the project's lock holds a package the variant's image does not (at that version)."""
    from launcher.images.lock import parse_lock

    held = parse_lock(ws.lock_txt(variant).read_text(), str(ws.lock_txt(variant)))
    locked = parse_lock(req.lock_path.read_text(), str(req.lock_path))
    return bool(projectlock.extra_requirements(locked, held))


def declares(request: RunRequest, recipe: Recipe) -> bool:
    """Whether the run's project declares anything beyond the image (Python requirements, OS packages)."""
    root = folder(request, recipe)
    return projectlock.find(root) is not None or (root / SYSTEM_LOCK).is_file() or \
        bool(aptlock.declared(root).packages)


def prepare(ws: Workspace, request: RunRequest, recipe: Recipe,
            reporter: Reporter | None = None) -> ImageRecord | None:
    """Everything a group of runs shares before any starts: the project's lock, the variant's image
    current, the image with the project layer (once, for an experiment's many runs; image_for's answer)."""
    from launcher.images import build

    ensure_lock(ws, request, recipe, reporter)
    find_links, ca_bundle = _paths(request)
    build.ensure_current(ws, request.variant, recipes=baked(ws, recipe, request.mount), allow_build=request.build,
                         find_links=find_links, ca_bundle=ca_bundle, reporter=reporter)
    return image_for(ws, request, recipe, reporter)


def ensure_system_lock(ws: Workspace, root: Path, variant: str, build: bool, reporter: Reporter) -> None:
    """The project's system.lock current for the variant (locked here when stale, as ensure_lock does)."""
    wanted = aptlock.declared(root).packages
    if not wanted:
        return
    try:
        aptlock.current(ws, root, variant)
    except (LockFailed, NotFound) as exc:
        if not build:
            raise ImageOutOfDate(exc.message, exc.hint) from None
        why = "is missing" if not (root / SYSTEM_LOCK).is_file() else "is out of date"
        reporter.note(f"project {root.name}: {SYSTEM_LOCK} {why}; locking its OS packages ({', '.join(wanted)}) "
                      f"for the {variant} image")
        aptlock.lock_project(ws, root, variant, reporter)


@contextmanager
def system_part(ws: Workspace, root: Path, variant: str,
                reporter: Reporter) -> Iterator[SystemPart | None]:
    """The project's OS packages for its layer: its system.lock's .deb files fetched into the cache (each
    checked against its sha256) and unpacked, without maintainer scripts, into a temporary folder by the
    APT side (aptlock.current, debs.unpack_lock); None when the project has no system.lock."""
    path = root / SYSTEM_LOCK
    if not path.is_file():
        yield None
        return
    tree = Path(tempfile.mkdtemp(prefix="launcher-debs-"))
    try:
        lock = aptlock.current(ws, root, variant) or aptlock.read(path)
        from launcher.images import debs  # with its network client: only for a project with system packages

        unpacked = debs.unpack_lock(lock, ws.cache_dir, tree, reporter)
        meta = {e.path: (e.mode, e.uid, e.gid) for e in unpacked.entries}
        names = tuple(f"{p.name}={p.version}" for p in lock.packages)
        from launcher.images.projectlayer import SystemPart

        yield SystemPart(aptlock.lock_sha256(path), tree, names, meta)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
