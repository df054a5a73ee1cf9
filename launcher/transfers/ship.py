"""Shipping images to hosts: only the layers a host lacks travel, by `docker load` or a registry pull.

How an image travels is a transport, and :data:`TRANSPORTS` lists them in the order they are
tried; :func:`choose_transport` takes the first that fits, in this one place:

- ``registry`` (``--ship-via REGISTRY``): pushed to a registry here, pulled by the host's engine
  through a reverse SSH tunnel, so neither side reads the layers the other already has;
- ``compressed`` (a slow link, measured, or LAUNCHER_SHIP_COMPRESS): gzip blobs staged on the host
  and resumed after a cut (:mod:`launcher.transfers.shipstaged`);
- ``cache``: a `docker load` archive made from the build's layer cache, without `docker save`;
- ``stream``: `docker save` streamed through a tar rewriter into `docker load` on the host.

The engine skips loading a layer it already has by chain ID, so a layer tarball the host holds
is replaced by an empty file. Which `<dir>/layer.tar` holds which chain ID is only told by
`manifest.json` at the end of the archive; the directory name is itself a hash of that
chain ID, so the mapping learned from any earlier ship stays true and is kept in the cache.
A Slurm cluster's nodes get an image from a registry (:func:`push_to_registry`) or from an archive
on the shared filesystem (:func:`save_to_archive`); :mod:`launcher.targets.slurm` chooses between them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, TypedDict, cast

from launcher.errors import (
    CommandFailed,
    Corrupt,
    DiskFull,
    LauncherError,
    RegistryUnavailable,
    UsageError,
)
from launcher.hashing import CHUNK, atomic_write_json
from launcher.hosts import engine
from launcher.hosts.base import Host, write_atomic_argv
from launcher.hosts.engine import Engine, chain_ids
from launcher.progress import CountingReader, NullReporter, Reporter, Task
from launcher.records.records import ImageSource, ShipRecord

if TYPE_CHECKING:
    import tarfile

# What only sending an image to another host needs (tarfile, the layer cache, staged loads) is imported
# where it is sent: a run on the local engine ships nothing.

LAYER_MAP_FILE = "layer-dirs.json"
SHIP_REPO = "launcher/ship"


@dataclass
class ShipResult:
    image_id: str
    skipped: bool
    bytes_sent: int = 0
    layers_sent: int = 0
    layers_skipped: int = 0
    seconds: float = 0.0

    def to_dict(self) -> ShipRecord:
        return {
            "image_id": self.image_id,
            "skipped": self.skipped,
            "bytes_sent": self.bytes_sent,
            "layers_sent": self.layers_sent,
            "layers_skipped": self.layers_skipped,
            "seconds": round(self.seconds, 3),
        }


def _load_layer_map(cache_dir: Path | None) -> dict[str, str]:
    if cache_dir is None:
        return {}
    try:
        data = json.loads((cache_dir / LAYER_MAP_FILE).read_text())
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_layer_map(cache_dir: Path | None, mapping: dict[str, str]) -> None:
    if cache_dir is not None:
        try:
            atomic_write_json(cache_dir / LAYER_MAP_FILE, mapping)
        except (OSError, LauncherError):
            pass  # a lost memo only costs a whole-layer send next time


class SavedImage(TypedDict, total=False):
    """An entry of a `docker save` archive's manifest.json (Docker's format; only what is read here)."""

    Config: str
    RepoTags: list[str] | None
    Layers: list[str]


def rewrite_save_stream(
    src: IO[bytes],
    dst: IO[bytes],
    skip_dirs: Callable[[str], bool],
    on_member: Callable[[tarfile.TarInfo, bool], None] | None = None,
) -> SavedImage:
    """Copy a `docker save` stream, emptying `<dir>/layer.tar` where skip_dirs(dir); return manifest.json's
    (first) entry, {} where the stream had none."""
    import tarfile

    manifest: list[SavedImage] = []
    with (
        tarfile.open(fileobj=src, mode="r|", bufsize=CHUNK) as tin,
        tarfile.open(fileobj=dst, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tout,
    ):
        for member in tin:
            parts = member.name.split("/")
            emptied = member.isfile() and len(parts) == 2 and parts[1] == "layer.tar" and skip_dirs(parts[0])
            if emptied:
                info = tarfile.TarInfo(member.name)
                info.mode, info.mtime, info.uid, info.gid = member.mode, member.mtime, member.uid, member.gid
                info.size = 0
                tout.addfile(info)
            elif member.isfile():
                f = tin.extractfile(member)
                if member.name == "manifest.json" and f is not None:
                    data = f.read()
                    manifest = _saved_images(json.loads(data))
                    tout.addfile(member, _BytesReader(data))
                else:
                    tout.addfile(member, f)
            else:
                tout.addfile(member)
            if on_member is not None:
                on_member(member, emptied)
    return manifest[0] if manifest else {}


def _saved_images(doc: object) -> list[SavedImage]:
    """manifest.json's entries that are JSON objects with a list of layers (the one field read)."""
    items = doc if isinstance(doc, list) else []
    return [cast(SavedImage, e) for e in items if isinstance(e, dict) and isinstance(e.get("Layers", []), list)]


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        chunk = self.data[self.pos : end]
        self.pos += len(chunk)
        return chunk


@dataclass
class Shipment:
    """One image on its way to one host: what the host has of it and what the cache here holds."""

    host: Host
    eng: Engine
    info: dict[str, Any]  # `docker image inspect`'s JSON, as launcher.hosts.engine answers it
    rep: Reporter
    cache_dir: Path | None
    via: str | None = None  # a registry to ship through (--ship-via)
    only_missing_layers: bool = True

    @property
    def image_id(self) -> str:
        return str(self.info["Id"])

    @cached_property
    def diff_ids(self) -> list[str]:
        return [str(d) for d in self.info.get("RootFS", {}).get("Layers") or []]

    @cached_property
    def chains(self) -> list[str]:
        return chain_ids(self.diff_ids)

    @cached_property
    def present(self) -> set[str]:
        """The chain IDs of the layers the host's engine has."""
        return self.eng.chain_ids() if self.only_missing_layers else set()

    @property
    def missing(self) -> list[int]:
        return [i for i, c in enumerate(self.chains) if c not in self.present]

    @cached_property
    def need(self) -> int:
        """About how many bytes of the image the host lacks."""
        size, missing = int(self.info.get("Size", 0)), len(self.missing)
        return size if missing == len(self.chains) else size * missing // max(len(self.chains), 1)

    @cached_property
    def cached(self) -> tuple[bytes, list[Path | None]] | None:
        """The image's config and layer files in the build's layer cache, when it was built with it."""
        from launcher.images import tree as imagetree

        return imagetree.cached_image(self.cache_dir / "images", self.image_id) if self.cache_dir else None

    def check_room(self) -> None:
        free = self.host.free_bytes(self.eng.root_dir())
        if free < self.need * 2 + (256 << 20):
            raise DiskFull(
                f"{self.host.name} has {free >> 20} MiB free for Docker; the image needs about {self.need >> 20} "
                "MiB plus room to unpack",
                "free space on the host (`docker system prune`) and retry",
            )

    def check_arrived(self) -> None:
        if not self.eng.has_image(self.image_id):
            raise Corrupt(f"after loading, {self.host.name} does not have image {self.image_id}",
                          "retry; if it persists, remove the image's layers on the host (`docker image prune`)")


class Transport(Protocol):
    """One way an image travels to a host."""

    name: str

    def fits(self, s: Shipment) -> bool:
        """Whether this transport is the one for s (asked in the order of TRANSPORTS)."""

    def send(self, s: Shipment) -> ShipResult:
        """Give the host the image; what travelled."""


class ViaRegistry:
    """Push to a registry here; the host's engine pulls through a reverse SSH tunnel (only what it lacks).
    The host's engine skips a layer only if it got it by a pull before (layers it got from `docker load`
    are pulled once more)."""

    name = "registry"

    def fits(self, s: Shipment) -> bool:
        return bool(s.via)

    def send(self, s: Shipment) -> ShipResult:
        import random

        from launcher.images import registry as registry_mod
        from launcher.images.imageref import is_loopback

        host, registry, image_id = s.host, str(s.via), s.image_id
        if not host.can_reverse_tunnel():
            raise UsageError("shipping through a registry needs an SSH host and the OpenSSH client",
                             "ship with docker save/load instead (the default)")
        if not registry_mod.ping(registry):
            if s.cache_dir is None or not is_loopback(registry):
                raise RegistryUnavailable(f"no registry answers on {registry}",
                                          "start one, or ship without --ship-via")
            registry_mod.start_local_registry(s.cache_dir / "registry", registry)
        task = s.rep.task(f"ship image {image_id[7:19]} to {host.name} via {registry}")
        try:
            digest = push_to_registry(image_id, registry)
            for _ in range(5):
                port = random.randint(20000, 60000)
                done = s.eng.pull_through_tunnel(f"127.0.0.1:{port}/{SHIP_REPO}@{digest}", port, registry)
                if done.returncode == 255 and "forwarding" in done.err:
                    continue
                break
        finally:
            task.close()
        if done.returncode != 0:
            raise CommandFailed(f"docker pull on {host.name} through the tunnel failed: {done.last_error_line()}",
                                "check dockerd on the host")
        lines = done.out.splitlines()
        if not s.eng.has_image(image_id):
            raise Corrupt(f"after the pull, {host.name} does not have image {image_id}",
                          "the registry may hold a different image under that tag; retry")
        return ShipResult(image_id, skipped=False, layers_sent=sum("Pull complete" in ln for ln in lines),
                          layers_skipped=sum("Already exists" in ln for ln in lines))


class Compressed:
    """gzip'd layers staged on the host, resumed after a cut: for a remote host on a slow link."""

    name = "compressed"

    def fits(self, s: Shipment) -> bool:
        from launcher.images import blobs
        from launcher.transfers import shipstaged

        if s.cache_dir is None or s.host.kind == "local" or s.need < shipstaged.SMALL_SHIP:
            return False
        warm = all(blobs.cached(s.cache_dir, s.diff_ids[i]) is not None for i in s.missing)
        return shipstaged.wanted(s.host, warm)

    def send(self, s: Shipment) -> ShipResult:
        from launcher.transfers import shipstaged

        assert s.cache_dir is not None
        sent = shipstaged.send_compressed(s.host, s.eng, s.image_id, s.diff_ids, s.missing, s.cached, s.cache_dir,
                                          s.rep)
        return ShipResult(s.image_id, skipped=False, bytes_sent=sent.bytes, layers_sent=sent.layers,
                          layers_skipped=len(s.diff_ids) - sent.layers)


class FromCache:
    """A `docker load` archive made from the build's layer cache: no `docker save`, so a rebuild whose
    recipe layer alone changed sends (and reads) that layer and little else."""

    name = "cache"

    def fits(self, s: Shipment) -> bool:
        return s.cached is not None and all(
            f is not None or c in s.present for f, c in zip(s.cached[1], s.chains, strict=False))

    def send(self, s: Shipment) -> ShipResult:
        from launcher.images import tree as imagetree

        assert s.cached is not None
        cfg, files = s.cached
        result = ShipResult(s.image_id, skipped=False)
        send: list[Path | None] = []
        for path, chain in zip(files, s.chains, strict=True):
            if chain in s.present or path is None:
                send.append(None)
                result.layers_skipped += 1
            else:
                send.append(path)
                result.layers_sent += 1
                result.bytes_sent += path.stat().st_size
        task = _ship_task(s)
        try:
            with _docker_load(s.host) as load:
                imagetree.write_load_archive(load, s.image_id, cfg, send,
                                             reader=lambda f: cast(IO[bytes], CountingReader(f, task.advance)))
        finally:
            task.close()
        s.check_arrived()
        return result


class SaveStream:
    """`docker save` here, streamed through a tar rewriter that empties the layers the host has, into
    `docker load` there."""

    name = "stream"

    def fits(self, s: Shipment) -> bool:
        return True

    def send(self, s: Shipment) -> ShipResult:
        layer_map = _load_layer_map(s.cache_dir)
        result = ShipResult(s.image_id, skipped=False)

        def skip(dirname: str) -> bool:
            return layer_map.get(dirname) in s.present

        def on_member(member: tarfile.TarInfo, emptied: bool) -> None:
            if member.name.endswith("/layer.tar"):
                if emptied:
                    result.layers_skipped += 1
                else:
                    result.layers_sent += 1
                    result.bytes_sent += member.size

        task = _ship_task(s)
        save = engine.local().save(s.image_id)
        try:
            with _docker_load(s.host) as load:
                manifest = rewrite_save_stream(cast(IO[bytes], CountingReader(save.stdout, task.advance)), load,
                                               skip, on_member)
                if save.wait() != 0:
                    raise CommandFailed(f"docker save {s.image_id[:19]} failed: {save.stderr_text().strip()}",
                                        "check the local Docker engine")
        finally:
            task.close()
            save.kill()  # only if still running
            save.wait()
        for dirname_layer, chain in zip(manifest.get("Layers", []), s.chains, strict=False):
            layer_map[dirname_layer.split("/")[0]] = chain
        _save_layer_map(s.cache_dir, layer_map)
        s.check_arrived()
        return result


TRANSPORTS: tuple[Transport, ...] = (ViaRegistry(), Compressed(), FromCache(), SaveStream())


def choose_transport(s: Shipment) -> Transport:
    """The first transport of TRANSPORTS that fits the shipment (the last one always does)."""
    return next(t for t in TRANSPORTS if t.fits(s))


def ship_image(
    host: Host,
    image: str,
    *,
    via: str | None = None,
    tag: str | None = None,
    reporter: Reporter | None = None,
    cache_dir: Path | None = None,
    only_missing_layers: bool = True,
) -> ShipResult:
    """Make sure the host has the image (same ID), sending only what it lacks; via: a registry to
    ship through (else the transport is chosen by the host, the link and the cache)."""
    started = time.monotonic()
    info = engine.local().inspect_image(image)
    image_id = str(info["Id"])
    eng = Engine(host)
    if host.kind == "local":  # the engine just inspected: it has the image, with the tags inspected
        if tag and tag not in (info.get("RepoTags") or []):
            eng.tag(image_id, tag)
        return ShipResult(image_id, skipped=True, seconds=time.monotonic() - started)
    if not eng.has_image(image_id):
        # one ship of an image to a host at a time: runs started together send it once, the others wait (the lock
        # named by the machine too: hosts that share a home, as a cluster's nodes do, each load their own engine)
        machine = re.sub(r"[^A-Za-z0-9_.-]", "_", host.run(["uname", "-n"], check=False).out.strip()) or "host"
        with host.exclusive(f"ship-{image_id.removeprefix('sha256:')[:16]}-{machine}"):
            if not eng.has_image(image_id):
                s = Shipment(host, eng, info, reporter or NullReporter(), cache_dir, via, only_missing_layers)
                if not via:
                    s.check_room()
                result = choose_transport(s).send(s)
                if tag:
                    eng.tag(image_id, tag)
                result.seconds = time.monotonic() - started
                return result
    if tag:
        eng.tag(image_id, tag)
    return ShipResult(image_id, skipped=True, seconds=time.monotonic() - started)


def _ship_task(s: Shipment) -> Task:
    return s.rep.task(f"ship image {s.image_id[7:19]} to {s.host.name}", total=float(s.info.get("Size", 0)) or None,
                      unit="B")


@contextmanager
def _docker_load(host: Host) -> Iterator[IO[bytes]]:
    """`docker load -q` on the host, fed an archive by the block; a cut stream or a failed load raised
    as launcher's errors."""
    with Engine(host).load_stream(cut=f"docker load on {host.name} stopped",
                                  hint="check free disk space and dockerd on the host") as load:
        yield load.stdin
        load.stdin.close()
        out = load.stdout.read().decode("utf-8", "replace")
        if load.wait() != 0:
            from launcher.transfers import shipstaged

            raise shipstaged.load_failed(host, (load.stderr_text() + out).strip())


def save_to_archive(host: Host, image_id: str, archive: str, reporter: Reporter | None, *, where: str) -> ShipResult:
    """`docker save` here into a file on the host, under its name only once whole (the archive a Slurm
    cluster's nodes load from its shared filesystem)."""
    rep = reporter or NullReporter()
    started = time.monotonic()
    local = engine.local()
    size = int(local.inspect_image(image_id).get("Size") or 0)
    task = rep.task(f"image to {where}", total=size or None, unit="B")
    save = local.save(image_id)
    sent = 0
    try:
        with host.receive_stream(write_atomic_argv(archive),
                                 cut=lambda: f"sending the image to {host.name} stopped after {sent >> 20} MiB",
                                 hint="run again; the archive is written under a temporary name") as recv:
            for block in iter(lambda: save.stdout.read(CHUNK), b""):
                recv.stdin.write(block)
                sent += len(block)
                task.advance(len(block))
            if save.wait() != 0:  # before the archive's end reaches the host, which then names it
                raise CommandFailed(f"docker save {image_id[:19]} failed here: {save.stderr_text()}",
                                    "check the local Docker engine")
            recv.stdin.close()
            if recv.wait() != 0:
                raise CommandFailed(f"writing {archive} on {host.name} failed: {recv.stderr_text()}",
                                    f"check free space under {host.area()} on the cluster")
    finally:
        task.close()
        save.kill()  # only if still running
    return ShipResult(image_id=image_id, skipped=False, bytes_sent=sent, seconds=time.monotonic() - started)


REGISTRY_SOURCE = "registry"  # an ImageSource's kind: the cluster's nodes pull the image by digest


def push_for_nodes(image_id: str, registry: str, source: ImageSource,
                   reporter: Reporter | None) -> tuple[ShipResult, ImageSource]:
    """Push from here for a cluster's nodes to pull by manifest digest (the same digest names the same image ID):
    the result, and the image source the tasks get. Once per placement: when ``source`` already names this image
    in this registry (the replicates of a group share one push), nothing travels."""
    if source.get("image_id") == image_id and source.get("registry") == registry:
        return ShipResult(image_id=image_id, skipped=True), source
    rep = reporter or NullReporter()
    started = time.monotonic()
    task = rep.task(f"image {image_id[7:19]} to registry {registry} (the nodes pull it by digest)")
    try:
        digest = push_to_registry(image_id, registry)
    finally:
        task.close()
    pushed: ImageSource = {"kind": REGISTRY_SOURCE, "registry": registry, "ref": f"{registry}/{SHIP_REPO}@{digest}",
                           "image_id": image_id}
    return ShipResult(image_id=image_id, skipped=False, seconds=time.monotonic() - started), pushed


def push_to_registry(image_id: str, registry: str) -> str:
    """Push the image to a registry (only layers it lacks travel); return the manifest digest."""
    ref = f"{registry}/{SHIP_REPO}:{image_id.removeprefix('sha256:')[:32]}"
    local = engine.local()
    local.tag(image_id, ref, check=True)
    done = local.push(ref)
    if done.returncode != 0:
        raise RegistryUnavailable(f"docker push to {registry} failed: {done.last_error_line()}",
                                  "check that the registry runs and answers on that address (a TLS registry "
                                  f"with its own CA: put the CA in /etc/docker/certs.d/{registry}/ca.crt here)")
    match = re.search(r"digest: (sha256:[0-9a-f]{64})", done.out)
    if not match:
        raise RegistryUnavailable(f"docker push to {registry} printed no digest", "check the local registry")
    return match.group(1)
