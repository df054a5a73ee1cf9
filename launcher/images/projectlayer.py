"""The project layer: a project's own packages as one thin layer on top of its run's image.

The variant's image holds the framework; a project's extra wheels (those of its
``requirements.lock`` the image does not hold already) are downloaded on this machine into the
wheel cache, hash-checked (:mod:`launcher.images.wheels`), and installed by the image's own pip in a
short container without network (``--no-index --require-hashes --no-deps --no-compile --target``).
launcher tars what pip wrote canonically (sorted entries, owner root, modes 0644/0755, every time
the build epoch) under ``/opt/launcher/project/site-packages``, with the lock beside it and a
``launcher-project.pth`` in the image's site-packages that puts that folder on the import path
(after the image's own packages, which therefore always win). OS packages join the same layer:
a :class:`SystemPart` is a folder of unpacked ``.deb`` files (the APT side of the seam, see
runs/project.py) tarred at ``/``.

The layer is kept in the layer cache by its diff ID and found again by a key over the lock, the
image it is installed in and the system lock, so an unchanged project costs nothing and a changed
``requirements.in`` costs one small install: the environment image is never rebuilt. The same lock
on the same image gives the same bytes, diff ID and image ID on any machine.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, TypedDict

from launcher.errors import BuildFailed, NotFound
from launcher.hashing import atomic_path, atomic_write_bytes, atomic_write_json, sha256_bytes
from launcher.hosts import dockerapi, engine
from launcher.hosts.containerspec import ContainerSpec, Mount
from launcher.images import pins as images
from launcher.images import projectdriver, recipelayer, wheels, wheelsources
from launcher.images.lock import parse_lock
from launcher.images.projectlock import LOCK_NAME, extra_requirements
from launcher.images.tree import DEFAULT_EPOCH
from launcher.progress import NullReporter, Reporter

IMAGE_PROJECT = "opt/launcher/project"
SITE = f"{IMAGE_PROJECT}/site-packages"
PTH = "launcher-project.pth"
LAYOUT = 1  # the layer's layout; part of its cache key
INSTALL_TIMEOUT_S = 1800.0
LABEL = "org.launcher."


@dataclass(frozen=True)
class SystemPart:
    """OS packages for the layer: a folder of unpacked .deb files whose content goes at / in the layer,
    the digest of the system.lock they come from, and each package as name=version."""


    lock_sha256: str
    tree: Path
    packages: tuple[str, ...] = ()
    modes: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)  # path -> (mode, uid, gid) as the
    # .deb gives them (setuid bits and owners kept); a path without one gets the canonical mode, owner root


class LayerExtra(TypedDict, total=False):
    """A project layer's ``extra`` (kept in its memo file): where the image's pip put packages
    (None: no wheels were installed, only OS packages)."""

    purelib: str | None


class InstallAnswer(TypedDict):
    """The project driver's answer (images/projectdriver.py, ANSWER in its output tar)."""

    ok: bool
    output: str  # pip's output, its end
    purelib: str  # the image's site-packages
    python: str


class _ExtractOptions(TypedDict, total=False):
    filter: Literal["data"]  # Python's safe extraction, where this Python has it


@dataclass(frozen=True)
class ProjectLayer:
    diff_id: str
    path: Path  # the layer tar in the layer cache
    packages: tuple[str, ...]  # name==version of each wheel installed in the layer
    requirements_lock_sha256: str | None
    system_lock_sha256: str | None = None
    system_packages: tuple[str, ...] = ()
    built: bool = True  # False: found in the cache
    seconds: float = 0.0
    extra: LayerExtra = field(default_factory=LayerExtra)


def layer_key(lock_sha: str | None, image_id: str, system_sha: str | None) -> str:
    """What a layer is a function of: the project lock, the image its pip ran in, the system lock."""
    parts = json.dumps({"layout": LAYOUT, "lock": lock_sha, "image": image_id, "system": system_sha}, sort_keys=True)
    return hashlib.sha256(parts.encode()).hexdigest()


def _memo(cache_dir: Path, key: str) -> Path:
    return cache_dir / "images" / "project-layers" / f"{key}.json"


def cached_layer(cache_dir: Path, key: str) -> ProjectLayer | None:
    try:
        data = json.loads(_memo(cache_dir, key).read_text())
        layer = ProjectLayer(**{**data, "path": Path(data["path"]), "packages": tuple(data["packages"]),
                                "system_packages": tuple(data["system_packages"]), "built": False})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return layer if layer.path.is_file() else None


def build_layer(*, lock_path: Path | None, variant_lock: Path, image_id: str, pin: images.BasePin, cache_dir: Path,
                find_links: Sequence[Path] = (), ca_bundle: Path | None = None, system: SystemPart | None = None,
                epoch: int = DEFAULT_EPOCH, reporter: Reporter | None = None) -> ProjectLayer:
    """The project layer for this lock on this image (image_id: the image whose pip installs it), from the
    cache when it was made before; else downloaded, installed offline, tarred and cached by diff ID."""
    rep = reporter or NullReporter()
    lock_bytes = lock_path.read_bytes() if lock_path is not None else None
    lock_sha = sha256_bytes(lock_bytes) if lock_bytes is not None else None
    key = layer_key(lock_sha, image_id, system.lock_sha256 if system else None)
    found = cached_layer(cache_dir, key)
    if found is not None:
        return found
    started = time.monotonic()
    extras = []
    if lock_bytes is not None and lock_path is not None:
        extras = extra_requirements(parse_lock(lock_bytes.decode(), str(lock_path)),
                                    parse_lock(variant_lock.read_text(), str(variant_lock)))
    with tempfile.TemporaryDirectory(prefix="launcher-project-") as tmp:
        site, purelib = Path(tmp) / "site-packages", None
        site.mkdir()
        if extras and lock_bytes is not None:
            stage = Path(tmp) / "wheels"
            stage.mkdir()
            indexes = "".join(f"{o} {u}\n" for o, u in wheelsources.index_options(lock_bytes.decode()))
            req_file = stage / LOCK_NAME
            req_file.write_text(indexes + "".join(
                f"{r.name}=={r.version} " + " ".join(f"--hash=sha256:{h}" for h in r.hashes) + "\n" for r in extras))
            house = wheels.download(req_file, cache_dir / "wheels", python=pin.python, platform=pin.platform,
                                    ca_bundle=ca_bundle, find_links=find_links, reporter=rep)
            wheels.link_into(house, stage)
            purelib = install(image_id, pin, stage, site, len(extras), rep)
        files = {f"{IMAGE_PROJECT}/{LOCK_NAME}": lock_bytes} if lock_bytes is not None else {}
        if purelib:
            files[f"{purelib.strip('/')}/{PTH}"] = f"/{SITE}\n".encode()
        trees = [(site, SITE)] + ([(system.tree, "")] if system is not None else [])
        buf = io.BytesIO()
        write_tar(buf, epoch, trees, {k: v for k, v in files.items() if v is not None}, dirs=[IMAGE_PROJECT],
                  modes=system.modes if system is not None else None)
    data = buf.getvalue()
    diff_id = sha256_bytes(data)
    target = cache_dir / "images" / "layers" / f"{diff_id.removeprefix('sha256:')}.tar"
    if not target.is_file():
        with atomic_path(target) as tmp_path:
            tmp_path.write_bytes(data)
    layer = ProjectLayer(diff_id, target, tuple(f"{r.name}=={r.version}" for r in extras), lock_sha,
                         system.lock_sha256 if system else None, system.packages if system else (),
                         built=True, seconds=round(time.monotonic() - started, 2), extra={"purelib": purelib})
    atomic_write_json(_memo(cache_dir, key), {**asdict(layer), "path": str(target), "built": True})
    return layer


def install(image_id: str, pin: images.BasePin, stage: Path, into: Path, count: int, reporter: Reporter) -> str:
    """Install the wheels in stage (and its requirements.lock) with the image's own pip, offline, in a short
    container; what pip wrote lands in into. The image's site-packages folder (for the .pth)."""
    task = reporter.task(f"installing {count} project wheels offline with the image's pip")
    try:
        spec = ContainerSpec(image_id, ("-c", _driver_source()), entrypoint="python", network="none",
                             platform=pin.platform, env={"PYTHONDONTWRITEBYTECODE": "1"},
                             mounts=(Mount(str(stage), projectdriver.WHEELS, read_only=True),))
        done = engine.local().run_to_end(spec, timeout=INSTALL_TIMEOUT_S)
    finally:
        task.close()
    try:
        tar = tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r:")
        first = tar.next()
        stream = tar.extractfile(first) if first is not None and first.name == projectdriver.ANSWER else None
        answer: InstallAnswer | None = json.loads(stream.read()) if stream is not None else None
    except (tarfile.TarError, ValueError):
        answer = None
    if not isinstance(answer, dict) or not answer:
        raise BuildFailed(f"installing the project's wheels in the image failed: {done.last_error_line()}",
                          "check that the image has python and pip (`docker run --rm IMAGE python -m pip -V`)")
    if not answer.get("ok"):
        lines = [ln for ln in str(answer.get("output", "")).splitlines() if ln.strip()]
        reason = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "?")
        raise BuildFailed(f"the image's pip could not install the project's wheels: {reason.removeprefix('ERROR: ')}",
                          "lock the project again (`launcher lock PROJECT_FOLDER`); a wheel that needs another "
                          "Python or platform than the image's cannot be installed there")
    members = [m for m in tar.getmembers() if m.name == "site-packages" or m.name.startswith("site-packages/")]
    extra: _ExtractOptions = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    tar.extractall(into.parent, members=members, **extra)  # noqa: S202 - members checked by the data filter
    return str(answer["purelib"])


def _driver_source() -> str:
    return (Path(__file__).parent / "projectdriver.py").read_text()


def write_tar(out: IO[bytes], epoch: int, trees: Sequence[tuple[Path, str]], files: Mapping[str, bytes],
              dirs: Iterable[str] = (), modes: Mapping[str, tuple[int, int, int]] | None = None) -> None:
    """A canonical tar: each tree's entries under its prefix ("" for /), the given files and folders,
    sorted by name; owner root, modes 0755 (folders, executables) or 0644, symlinks as they are, every
    time the epoch; modes: (mode, uid, gid) by path for entries that keep their own (OS packages').
    The same content always gives the same bytes."""
    entries: dict[str, tuple[str, Any]] = {d: ("d", None) for d in dirs}
    for root, prefix in trees:
        if prefix:
            entries[prefix] = ("d", None)
        for top, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in [*dirnames, *filenames]:
                path = Path(top) / name
                rel = path.relative_to(root).as_posix()
                member = f"{prefix}/{rel}" if prefix else rel
                st = path.lstat()
                if stat.S_ISLNK(st.st_mode):
                    entries[member] = ("l", os.readlink(path))
                elif stat.S_ISDIR(st.st_mode):
                    entries[member] = ("d", None)
                elif stat.S_ISREG(st.st_mode):
                    entries[member] = ("f", path)
    for name, data in files.items():
        entries[name] = ("b", data)
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            kind, payload = entries[name]
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            if kind == "d":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "l":
                info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, payload
            elif kind == "b":
                info.size, info.mode = len(payload), 0o644
            else:
                st = payload.stat()
                info.size, info.mode = st.st_size, 0o755 if st.st_mode & 0o111 else 0o644
            if modes and name in modes and kind != "l":
                info.mode, info.uid, info.gid = modes[name]
            if kind == "f":
                with open(payload, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info, io.BytesIO(payload) if kind == "b" else None)


def compose_config(base_config: bytes, layer: ProjectLayer, labels: Mapping[str, str], epoch: int) -> bytes:
    """The run image's config with the project layer on top and its labels added."""
    what = f"{len(layer.packages)} packages ({layer.requirements_lock_sha256})"
    if layer.system_lock_sha256:
        what += f", {len(layer.system_packages)} OS packages ({layer.system_lock_sha256})"
    return recipelayer.add_top_layer(base_config, layer.diff_id, labels, epoch, f"launcher: project layer, {what}")


def labels_of(layer: ProjectLayer) -> dict[str, str]:
    labels = {LABEL + "project-layer": layer.diff_id}
    if layer.requirements_lock_sha256:
        labels[LABEL + "project-lock-sha256"] = layer.requirements_lock_sha256
    if layer.system_lock_sha256:
        labels[LABEL + "system-lock-sha256"] = layer.system_lock_sha256
    return labels


def ensure_image(base_image_id: str, layer: ProjectLayer, tag: str, cache_dir: Path,
                 epoch: int = DEFAULT_EPOCH) -> tuple[str, bool]:
    """The image base_image_id + the layer, in the local engine under tag (loaded with the layer alone
    when the engine lacks it; its config kept in the layer cache, so ships send only missing layers),
    and whether the tag names it only now. The image the tag named before is removed when nothing else
    uses it."""
    configs = cache_dir / "images" / "configs"
    try:
        base = (configs / f"{base_image_id.removeprefix('sha256:')}.json").read_bytes()
    except OSError:
        raise NotFound(f"the config of image {base_image_id[7:19]} is not in launcher's layer cache",
                       "build the variant's image again: `launcher build --variant VARIANT --no-cache`") from None
    config = compose_config(base, layer, labels_of(layer), epoch)
    image_id = recipelayer.image_id_of(config)
    atomic_write_bytes(configs / f"{image_id.removeprefix('sha256:')}.json", config)
    previous = dockerapi.tagged_id(tag)
    if not dockerapi.image_exists(image_id):
        recipelayer.load_top(config, layer.path, tag, "the project layer")
    elif previous != image_id:
        engine.local().tag(image_id, tag, check=True)
    if previous is not None and previous != image_id:
        dockerapi.remove_unreferenced([previous], launcher_only=True)
    return image_id, previous != image_id
