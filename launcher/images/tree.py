"""The filesystem tree digest of an image, and normalising an image so that a rebuild
from the same inputs gets the same image ID.

(One layer's tar headers are rewritten by :mod:`launcher.images.layertar`.)

The classic builder leaves three things varying between two builds of the same inputs:
file mtimes inside layers, creation dates in the config and history, and the parent
(intermediate) image IDs. Everything else (entry order, owners, content) is already a
function of the inputs, so normalising rewrites tar headers in a single streaming pass
and copies file data as is.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NotRequired, TypedDict, cast

from launcher.errors import BuildFailed
from launcher.hosts import engine
from launcher.images.buildrecord import DEFAULT_EPOCH as DEFAULT_EPOCH  # its home; named here as always
from launcher.images.layertar import BLOCK, Entry, rewrite_layer

STAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # every date an image launcher makes carries: the build epoch, in UTC


def stamp(epoch: int) -> str:
    """The epoch as an image config's date (``created``, each history entry's)."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime(STAMP_FORMAT)


class RootFs(TypedDict):
    type: str
    diff_ids: list[str]


class HistoryEntry(TypedDict, total=False):
    """A step of an image's history; every key is optional in the image spec."""

    created: str
    created_by: str
    comment: str
    empty_layer: bool


class ContainerConfig(TypedDict, total=False):
    """An image config's ``config``: how a container of it starts; every key is optional in the
    image spec (launcher reads the labels and clears the builder's Image and Hostname)."""

    Labels: dict[str, str] | None
    Env: list[str]
    Cmd: list[str] | None
    Entrypoint: list[str] | None
    WorkingDir: str
    User: str
    Image: str
    Hostname: str


class ImageConfig(TypedDict):
    """An image's config JSON (``images/configs/<id>.json``, whose sha256 is the image ID): the keys
    launcher reads or rewrites; any other key the builder wrote is kept as it is."""

    architecture: str
    os: str
    rootfs: RootFs
    created: NotRequired[str]
    config: NotRequired[ContainerConfig | None]
    history: NotRequired[list[HistoryEntry]]
    container: NotRequired[str]  # the builder's intermediate container: dropped by normalising
    container_config: NotRequired[ContainerConfig]


def config_bytes(config: ImageConfig) -> bytes:
    """An image config as launcher writes it: canonical JSON, so equal configs, equal image IDs."""
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class Tree:
    entries: dict[str, Entry] = field(default_factory=dict)

    def apply_layer(self, layer: list[Entry]) -> None:
        for e in layer:
            parent, _, base = e.path.rpartition("/")
            if base == ".wh..wh..opq":
                prefix = parent + "/"
                for p in [p for p in self.entries if p.startswith(prefix)]:
                    del self.entries[p]
                continue
            if base.startswith(".wh."):
                victim = (parent + "/" if parent else "") + base[4:]
                for p in [p for p in self.entries if p == victim or p.startswith(victim + "/")]:
                    del self.entries[p]
                continue
            old = self.entries.get(e.path)
            if old is not None and old.kind == "d" and e.kind != "d":  # a directory replaced by a file
                for p in [p for p in self.entries if p.startswith(e.path + "/")]:
                    del self.entries[p]
            self.entries[e.path] = e

    def digest(self) -> str:
        return lines_digest(self.lines())

    def lines(self) -> dict[str, str]:
        return {p: self.entries[p].line() for p in sorted(self.entries)}


def lines_digest(lines: dict[str, str]) -> str:
    """The tree digest of a saved tree (path -> Entry.line())."""
    h = hashlib.sha256()
    for path in sorted(lines):
        h.update(lines[path].encode("utf-8", "surrogateescape") + b"\n")
    return "sha256:" + h.hexdigest()


def apply_entries(lines: dict[str, str], layer: list[Entry]) -> dict[str, str]:
    """A saved tree with one more layer (without whiteouts) applied on top."""
    out = dict(lines)
    for e in layer:
        out[e.path] = e.line()
    return {p: out[p] for p in sorted(out)}



@dataclass(frozen=True)
class Normalized:
    image_id: str
    tree_digest: str
    tree: dict[str, str]
    config: bytes = b""


def _normalize_config(config: ImageConfig, diff_ids: list[str], epoch: int) -> bytes:
    date = stamp(epoch)
    cfg = config.copy()
    cfg.pop("container", None)
    cfg.pop("container_config", None)
    cfg["created"] = date
    inner = (cfg.get("config") or ContainerConfig()).copy()
    inner["Image"] = ""
    inner["Hostname"] = ""
    cfg["config"] = inner
    cfg["history"] = [{**h, "created": date} for h in cfg.get("history", [])]
    cfg["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    return config_bytes(cfg)


def _layer_key(size: int, head: bytes) -> str:
    return f"{size}:{hashlib.sha256(head).hexdigest()}"


HEAD = 1 << 16


def base_layer_keys(base: str, cache: Path | None = None) -> set[str]:
    """Size + sha256 of the first 64 KiB of each layer of base: how its layers are recognised
    in a `docker save` stream before they have been read whole (cached per base image ID)."""
    base_id = str(engine.local().inspect_image(base)["Id"])
    path = cache / "layer-keys" / f"{base_id.removeprefix('sha256:')}.json" if cache else None
    if path is not None and path.is_file():
        return set(json.loads(path.read_text()))
    keys: set[str] = set()
    p = engine.local().save(base)
    with tarfile.open(fileobj=p.stdout, mode="r|") as tar:
        for member in tar:
            if member.name.endswith("/layer.tar"):
                stream = tar.extractfile(member)
                assert stream is not None
                keys.add(_layer_key(member.size, stream.read(HEAD)))
    if p.wait() != 0:
        raise BuildFailed(f"docker save {base} failed", "check the Docker engine")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(sorted(keys)))
    return keys


class _Prefixed(io.RawIOBase):
    """A stream with already-read bytes put back in front."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head, self._rest = head, rest

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._head:
            out, self._head = (self._head, b"") if n < 0 or n >= len(self._head) else \
                (self._head[:n], self._head[n:])
            return out
        return self._rest.read(n)


class _Discard(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        return len(b)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_image(layer_cache: Path, image_id: str) -> tuple[bytes, list[Path | None]] | None:
    """The config and layer files of an image normalised with this layer cache (None for a
    layer the cache does not hold, such as a base layer); None when the config is not there."""
    cfg_path = layer_cache / "configs" / f"{image_id.removeprefix('sha256:')}.json"
    if not cfg_path.is_file():
        return None
    cfg = cfg_path.read_bytes()
    if "sha256:" + hashlib.sha256(cfg).hexdigest() != image_id:
        return None
    diff_ids = json.loads(cfg)["rootfs"]["diff_ids"]
    files: list[Path | None] = []
    for d in diff_ids:
        p = layer_cache / "layers" / f"{d.removeprefix('sha256:')}.tar"
        files.append(p if p.is_file() else None)
    return cfg, files


def _member(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def normalize(image: str, *, tag: str, base_keys: set[str] | None = None, epoch: int = DEFAULT_EPOCH,
              layer_cache: Path | None = None, load: bool = True) -> Normalized:
    """Rewrite image so its ID depends only on its content, and load it as tag.

    One streaming pass, `docker save | rewrite | docker load`, nothing on disk and nothing
    whole in memory: headers are patched in place, file data is copied as it is, and layers
    of the base (recognised by base_keys) pass through untouched so the image still sits on
    the pinned base. With layer_cache, the image's own layers and config are also kept there
    by digest, so shipping it later needs no `docker save` (see ship.ship_image).
    """
    local = engine.local()
    save = local.save(image)
    loader = local.load() if load else None
    # Without load (a verification), only the digests are wanted: the bytes go nowhere.
    out = cast(IO[bytes], loader.stdin if loader is not None else _Discard())
    try:
        saved = _Saved(out, base_keys or set(), epoch, layer_cache)
        saved.read(save.stdout)
        if save.wait() != 0:
            err = save.stderr_text()
            raise BuildFailed(f"docker save {image} failed: {err.strip()[:200]}", "check the Docker engine")
        if len(saved.manifest) != 1:
            raise BuildFailed(f"docker save {image} gave {len(saved.manifest)} images", "save exactly one image")
        normalized = saved.normalized()
        saved.write_tail(normalized.image_id, normalized.config, tag)
    except BrokenPipeError:
        pass
    finally:
        save.kill()  # only if still running
    if loader is None:
        return normalized
    err = loader.stderr_text()
    if loader.wait() != 0:
        raise BuildFailed(f"docker load of the normalised image failed: {err.strip()[:300]}",
                          "check the Docker engine's disk space")
    return normalized


class SaveManifestEntry(TypedDict):
    """An image of a `docker save` archive's manifest.json."""

    Config: str
    RepoTags: list[str] | None
    Layers: list[str]


class _Saved:
    """One pass over a `docker save` stream, rewritten to out as it is read: each layer's headers
    normalised (kept in the layer cache when given), its manifest and configs gathered."""

    def __init__(self, out: IO[bytes], keys: set[str], epoch: int, layer_cache: Path | None) -> None:
        self.out, self.keys, self.epoch, self.layer_cache = out, keys, epoch, layer_cache
        self.layers: dict[str, tuple[list[Entry], str]] = {}  # member name -> (entries, diff ID after)
        self.manifest: list[SaveManifestEntry] = []
        self.configs: dict[str, bytes] = {}

    def read(self, stream: IO[bytes]) -> None:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                data = tar.extractfile(member) if member.isfile() else None
                if data is None:
                    continue
                if member.name.endswith("/layer.tar"):
                    self.layers[member.name] = self._layer(member, data)
                elif member.name == "manifest.json":
                    self.manifest = json.loads(data.read())
                elif member.name.endswith(".json") and "/" not in member.name:
                    self.configs[member.name] = data.read()

    def _layer(self, member: tarfile.TarInfo, stream: IO[bytes]) -> tuple[list[Entry], str]:
        """One layer rewritten to out (a base layer's dates left as they are); its entries and diff ID."""
        out, layer_cache = self.out, self.layer_cache
        head = stream.read(HEAD)
        is_base = _layer_key(member.size, head) in self.keys
        out.write(_member(member.name, member.size))
        written = 0
        keep = None if is_base or layer_cache is None else tempfile.NamedTemporaryFile(
            dir=_mkdir(layer_cache / "layers"), prefix=".", suffix=".partial", delete=False)

        def sink(b: bytes, keep: IO[bytes] | None = keep) -> None:
            nonlocal written
            written += len(b)
            out.write(b)
            if keep is not None:
                keep.write(b)

        try:
            entries, _d_in, d_out = rewrite_layer(cast(IO[bytes], _Prefixed(head, stream)), sink, self.epoch,
                                                  clamp=not is_base)
        except BaseException:
            if keep is not None:
                keep.close()
                Path(keep.name).unlink(missing_ok=True)
            raise
        if keep is not None and layer_cache is not None:
            keep.close()
            Path(keep.name).replace(layer_cache / "layers" / f"{d_out.removeprefix('sha256:')}.tar")
        if written != member.size:
            raise BuildFailed(f"normalising layer {member.name} changed its size",
                              "report this with the image's Dockerfile")
        out.write(b"\0" * (-written % BLOCK))
        return entries, d_out

    def normalized(self) -> Normalized:
        """The image's tree and normalised config (kept in the layer cache when given)."""
        order = self.manifest[0]["Layers"]
        tree = Tree()
        for name in order:
            tree.apply_layer(self.layers[name][0])
        cfg_bytes = _normalize_config(json.loads(self.configs[self.manifest[0]["Config"]]),
                                      [self.layers[name][1] for name in order], self.epoch)
        image_id = "sha256:" + hashlib.sha256(cfg_bytes).hexdigest()
        if self.layer_cache is not None:
            (_mkdir(self.layer_cache / "configs") / f"{image_id[7:]}.json").write_bytes(cfg_bytes)
        return Normalized(image_id=image_id, tree_digest=tree.digest(), tree=tree.lines(), config=cfg_bytes)

    def write_tail(self, image_id: str, cfg_bytes: bytes, tag: str) -> None:
        """The normalised config and the manifest naming it as tag, then the archive's end."""
        man = json.dumps([{"Config": f"{image_id[7:]}.json", "RepoTags": [tag],
                           "Layers": self.manifest[0]["Layers"]}]).encode()
        for name, data in ((f"{image_id[7:]}.json", cfg_bytes), ("manifest.json", man)):
            self.out.write(_member(name, len(data)))
            self.out.write(data + b"\0" * (-len(data) % BLOCK))
        self.out.write(b"\0" * (2 * BLOCK))
        self.out.close()


def write_load_archive(out: IO[bytes], image_id: str, config: bytes, files: list[Path | None], *,
                       tag: str | None = None, reader: Callable[[IO[bytes]], IO[bytes]] | None = None) -> None:
    """A `docker load` archive of the image whose config is config, streamed to out. A layer
    given as None goes as an empty file: `docker load` skips a layer the engine already has, so
    only the layers the receiving engine lacks need to travel (it checks their diff IDs)."""
    names = [f"{i:03d}/layer.tar" for i in range(len(files))]
    man = json.dumps([{"Config": f"{image_id[7:]}.json", "RepoTags": [tag] if tag else [],
                       "Layers": names}]).encode()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=1 << 20) as tout:
        for name, path in zip(names, files, strict=True):
            info = tarfile.TarInfo(name)
            if path is None:
                tout.addfile(info)
                continue
            info.size = path.stat().st_size
            with open(path, "rb") as f:
                tout.addfile(info, reader(f) if reader is not None else f)
        for name, data in ((f"{image_id[7:]}.json", config), ("manifest.json", man)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tout.addfile(info, io.BytesIO(data))


def save_tree(path: Path, tree: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".partial")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(tree, f, sort_keys=True)
    shutil.move(tmp, path)


def load_tree(path: Path) -> dict[str, str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data: dict[str, str] = json.load(f)
    return data


def diff_trees(old: dict[str, str], new: dict[str, str]) -> list[dict[str, str]]:
    changes: list[dict[str, str]] = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        change = "added" if a is None else "removed" if b is None else "changed"
        changes.append({"path": "/" + path, "change": change})
    return changes
