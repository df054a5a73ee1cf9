"""The recipes layer: the workspace's recipes as the image's last layer, written by launcher.

The Dockerfile builds the environment (base, locked venv, runtime). The recipes change all
day, so launcher does not send them through the Docker builder: it writes their layer itself
as a canonical tar (sorted entries, owner root, modes 0644/0755, every time the build epoch),
appends it to the normalised environment image's config, and loads the result with the
environment's layers left out (the engine has them). A recipe edit therefore costs one small
tar and one small `docker load`, and the image ID is still a function of content only: the
same recipes on the same environment always give the same layer bytes and the same config.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from launcher.errors import BuildFailed
from launcher.hashing import atomic_path
from launcher.hosts import engine
from launcher.images import layertar
from launcher.images import tree as imagetree
from launcher.runtime import code as codedigest
from launcher.runtime.recipespec import RECIPE_FILE

IMAGE_RECIPES = "opt/launcher/recipes"


@dataclass(frozen=True)
class RecipesLayer:
    diff_id: str
    path: Path  # the layer tar in the layer cache
    entries: list[layertar.Entry]
    digests: dict[str, str]  # recipe folder name -> its code digest


def _dir_info(name: str, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = 0o755, epoch, 0, 0, "", ""
    return info


def write_tar(folder: Path, out: IO[bytes], epoch: int, prefix: str = IMAGE_RECIPES) -> None:
    """The canonical tar of folder's code files (as runtime.code counts them) under prefix."""
    files = list(codedigest.iter_files(folder)) if folder.is_dir() else []
    dirs = {prefix}
    for rel, _ in files:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add(f"{prefix}/{'/'.join(parts[:i])}")
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        entries: list[tuple[str, Path | None]] = [(d, None) for d in dirs]
        entries += [(f"{prefix}/{rel}", p) for rel, p in files]
        for name, path in sorted(entries, key=lambda e: e[0]):
            if path is None:
                tar.addfile(_dir_info(name, epoch))
                continue
            st = path.stat()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = st.st_size, epoch, 0, 0, "", ""
            info.mode = 0o755 if st.st_mode & 0o100 else 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)


def recipe_digests(folder: Path) -> dict[str, str]:
    """The code digest of each recipe folder (a folder holding recipe.toml) under folder."""
    if not folder.is_dir():
        return {}
    return {p.name: codedigest.code_digest(p) for p in sorted(folder.iterdir())
            if p.is_dir() and (p / RECIPE_FILE).is_file()}


def tree_lines(folder: Path, epoch: int) -> dict[str, str]:
    """The recipes layer's entries as a saved tree holds them (path -> line), without writing the layer."""
    buf = io.BytesIO()
    write_tar(folder, buf, epoch)
    entries, _, _ = layertar.rewrite_layer(io.BytesIO(buf.getvalue()), None, epoch, clamp=False)
    return {e.path: e.line() for e in entries}


def write_layer(folder: Path, layer_cache: Path, epoch: int) -> RecipesLayer:
    """Write the recipes layer into the layer cache (by its diff ID) and index it."""
    buf = io.BytesIO()
    write_tar(folder, buf, epoch)
    data = buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    entries, _, _ = layertar.rewrite_layer(io.BytesIO(data), None, epoch, clamp=False)
    target = layer_cache / "layers" / f"{diff_id.removeprefix('sha256:')}.tar"
    if not target.is_file():
        with atomic_path(target) as tmp:
            tmp.write_bytes(data)
    return RecipesLayer(diff_id, target, entries, recipe_digests(folder))


def compose_config(env_config: bytes, layer: RecipesLayer, labels: Mapping[str, str], epoch: int,
                   recipes_digest: str) -> bytes:
    """The environment image's config with the recipes layer and the final labels added."""
    created_by = f"launcher: recipes/ -> /{IMAGE_RECIPES}/ ({recipes_digest})"
    return add_top_layer(env_config, layer.diff_id, labels, epoch, created_by)


def add_top_layer(config: bytes, diff_id: str, labels: Mapping[str, str], epoch: int, created_by: str) -> bytes:
    """An image config with one more layer on top: its diff ID, a history entry dated epoch, labels added."""
    cfg: imagetree.ImageConfig = json.loads(config)
    inner = (cfg.get("config") or imagetree.ContainerConfig()).copy()
    inner["Labels"] = {**(inner.get("Labels") or {}), **labels}
    cfg["config"] = inner
    cfg["history"] = [*cfg.get("history", []), {"created": imagetree.stamp(epoch), "created_by": created_by}]
    cfg["rootfs"] = {"type": "layers", "diff_ids": [*cfg["rootfs"]["diff_ids"], diff_id]}
    return imagetree.config_bytes(cfg)


def image_id_of(config: bytes) -> str:
    return "sha256:" + hashlib.sha256(config).hexdigest()


def load(config: bytes, layer: RecipesLayer, tag: str) -> str:
    """Load the composed image into the local engine, sending the recipes layer alone: the
    engine has the environment's layers, and `docker load` skips a layer it already has."""
    return load_top(config, layer.path, tag, "the recipes layer")


def load_top(config: bytes, top: Path, tag: str, what: str) -> str:
    """Load an image whose layers the engine has all but the last (top), sending that one alone."""
    image_id = image_id_of(config)
    n = len(json.loads(config)["rootfs"]["diff_ids"])
    files: list[Path | None] = [None] * (n - 1) + [top]
    loader = engine.local().load()
    try:
        imagetree.write_load_archive(loader.stdin, image_id, config, files, tag=tag)
        loader.stdin.close()
    except BrokenPipeError:
        pass
    err = loader.stderr_text()
    if loader.wait() != 0:
        raise BuildFailed(f"docker load of {what} failed: {err.strip()[:300]}",
                          "the image below it may be gone from the engine: `launcher build --no-cache`")
    return image_id
