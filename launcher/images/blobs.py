"""Compressed layer blobs, made once per layer and kept by content, as a registry keeps them.

A blob is a layer's tar (what `docker save` holds as ``<dir>/layer.tar``) compressed with gzip,
the compression `docker load` itself undoes; it is named by the layer's diff ID (the SHA-256 of
the uncompressed tar) and stored with the SHA-256 of its own bytes. Compression is deterministic
(level 1, no name, mtime 0), so a blob made twice has the same bytes: a ship cut half-way can
resume from the bytes the host already holds. Blobs are made from the build's layer cache where
it holds the layer, else from one `docker save` of the image.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from launcher.errors import CommandFailed
from launcher.hashing import CHUNK
from launcher.hosts import engine

LEVEL = 1  # gzip -1: about a third of a TensorFlow image's bytes, at 50-60 MB/s on one core
DIR = "blobs"


@dataclass(frozen=True)
class Blob:
    diff_id: str
    path: Path
    sha256: str
    size: int


def blob_path(cache_dir: Path, diff_id: str) -> Path:
    return cache_dir / DIR / f"{diff_id.removeprefix('sha256:')}.tar.gz"


def cached(cache_dir: Path, diff_id: str) -> Blob | None:
    """The blob of that layer, if one was made and is whole (its recorded hash file is written last)."""
    path = blob_path(cache_dir, diff_id)
    try:
        digest = path.with_name(path.name + ".sha256").read_text().strip()
        size = path.stat().st_size
    except OSError:
        return None
    return Blob(diff_id, path, digest, size) if len(digest) == 64 else None


def compress(src: IO[bytes], cache_dir: Path, *, on_bytes: Callable[[int], None] | None = None,
             expect: str | None = None) -> Blob:
    """Compress one layer tar from src into the cache; its diff ID is computed on the way (and must
    equal expect when given). Written under a temporary name, the hash file last."""
    out_dir = cache_dir / DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".part-{os.getpid()}-{id(src)}"
    raw, packed = hashlib.sha256(), hashlib.sha256()
    z = zlib.compressobj(LEVEL, zlib.DEFLATED, 31)  # 31: a gzip wrapper; zlib writes mtime 0 and no name
    try:
        with open(tmp, "wb") as out:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                raw.update(chunk)
                data = z.compress(chunk)
                packed.update(data)
                out.write(data)
                if on_bytes is not None:
                    on_bytes(len(chunk))
            data = z.flush()
            packed.update(data)
            out.write(data)
        diff_id = "sha256:" + raw.hexdigest()
        if expect is not None and diff_id != expect:
            raise CommandFailed(f"a layer read for compression has diff ID {diff_id[:19]}, not {expect[:19]}",
                                "rebuild the image (`launcher build`); its layer cache does not match it")
        final = blob_path(cache_dir, diff_id)
        os.replace(tmp, final)
        final.with_name(final.name + ".sha256").write_text(packed.hexdigest() + "\n")
        return Blob(diff_id, final, packed.hexdigest(), final.stat().st_size)
    finally:
        tmp.unlink(missing_ok=True)


def config_path(cache_dir: Path, image_id: str) -> Path:
    return cache_dir / DIR / "configs" / f"{image_id.removeprefix('sha256:')}.json"


def _cached_config(cache_dir: Path, image_id: str) -> bytes | None:
    try:
        data = config_path(cache_dir, image_id).read_bytes()
    except OSError:
        return None
    return data if "sha256:" + hashlib.sha256(data).hexdigest() == image_id else None


def ensure(image_id: str, diff_ids: Sequence[str], layer_files: Sequence[Path | None], wanted: Sequence[int],
           cache_dir: Path, *, config: bytes | None = None,
           on_bytes: Callable[[int], None] | None = None) -> tuple[dict[int, Blob], bytes]:
    """The blobs of the layers at the wanted positions, and the image's config, made where missing:
    a blob from the build's layer cache file of its layer when there is one, else the rest (and
    the config) from one `docker save` of the image."""
    out: dict[int, Blob] = {}
    rest: dict[str, list[int]] = {}
    config = config or _cached_config(cache_dir, image_id)
    for i in wanted:
        blob = cached(cache_dir, diff_ids[i])
        source = layer_files[i] if i < len(layer_files) else None
        if blob is None and source is not None:
            with open(source, "rb") as f:
                blob = compress(f, cache_dir, on_bytes=on_bytes, expect=diff_ids[i])
        if blob is None:
            rest.setdefault(diff_ids[i], []).append(i)
        else:
            out[i] = blob
    if rest or config is None:
        config = _from_save(image_id, rest, out, cache_dir, config, on_bytes)
    elif _cached_config(cache_dir, image_id) is None:
        _keep_config(cache_dir, image_id, config)
    return out, config


def _keep_config(cache_dir: Path, image_id: str, config: bytes) -> None:
    path = config_path(cache_dir, image_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(config)


def _from_save(image_id: str, rest: dict[str, list[int]], out: dict[int, Blob], cache_dir: Path,
               config: bytes | None, on_bytes: Callable[[int], None] | None) -> bytes:
    config_name = f"{image_id.removeprefix('sha256:')}.json"
    save = engine.local().save(image_id)
    try:
        with tarfile.open(fileobj=save.stdout, mode="r|", bufsize=CHUNK) as tin:
            for member in tin:
                f = tin.extractfile(member) if member.isfile() else None
                if f is None:
                    continue
                if member.name == config_name:
                    config = f.read()
                elif member.name.endswith("/layer.tar") and rest:
                    blob = compress(f, cache_dir, on_bytes=on_bytes)
                    for i in rest.pop(blob.diff_id, []):
                        out[i] = blob
                if not rest and config is not None:
                    break
    finally:
        save.kill()
        save.wait()
    if rest or config is None or "sha256:" + hashlib.sha256(config).hexdigest() != image_id:
        raise CommandFailed(f"docker save {image_id[:19]} did not hold all of the image's layers and config",
                            "check the local Docker engine (`docker image inspect`)")
    _keep_config(cache_dir, image_id, config)
    return config


def total_size(blobs: dict[int, Blob]) -> int:
    return sum(b.size for b in blobs.values())
