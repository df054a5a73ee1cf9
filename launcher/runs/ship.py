"""Shipping images to hosts: only the layers a host lacks travel, by `docker load` or a registry pull.

Shipping streams `docker save` through a tar rewriter into `docker load` on the host. The
engine skips loading a layer it already has by chain ID, so a layer tarball the host holds
is replaced by an empty file. Which `<dir>/layer.tar` holds which chain ID is only told by
`manifest.json` at the end of the archive; the directory name is itself a hash of that
chain ID, so the mapping learned from any earlier ship stays true and is kept in the cache.
An image normalised with the build's layer cache is sent from that cache, without `docker save`.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from launcher.errors import (
    CommandFailed,
    Corrupt,
    DiskFull,
    LauncherError,
    RegistryUnavailable,
    TransferCut,
    UsageError,
)
from launcher.hashing import CHUNK, atomic_write_json
from launcher.hosts import engine
from launcher.hosts.base import Host
from launcher.hosts.engine import Engine, chain_ids
from launcher.images import tree as imagetree
from launcher.proc import widen_pipe
from launcher.progress import CountingReader, NullReporter, Reporter, Task

LAYER_MAP_FILE = "layer-dirs.json"


@dataclass
class ShipResult:
    image_id: str
    skipped: bool
    bytes_sent: int = 0
    layers_sent: int = 0
    layers_skipped: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
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


def rewrite_save_stream(
    src: IO[bytes],
    dst: IO[bytes],
    skip_dirs: Callable[[str], bool],
    on_member: Callable[[tarfile.TarInfo, bool], None] | None = None,
) -> dict[str, Any]:
    """Copy a `docker save` stream, emptying `<dir>/layer.tar` where skip_dirs(dir); return manifest.json."""
    manifest: list[Any] = []
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
                    manifest = json.loads(data)
                    tout.addfile(member, _BytesReader(data))
                else:
                    tout.addfile(member, f)
            else:
                tout.addfile(member)
            if on_member is not None:
                on_member(member, emptied)
    return manifest[0] if manifest else {}


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        chunk = self.data[self.pos : end]
        self.pos += len(chunk)
        return chunk


def ship_image(
    host: Host,
    image: str,
    *,
    tag: str | None = None,
    reporter: Reporter | None = None,
    cache_dir: Path | None = None,
    only_missing_layers: bool = True,
) -> ShipResult:
    """Make sure the host has the image (same ID), sending only what it lacks."""
    import time

    started = time.monotonic()
    rep = reporter or NullReporter()
    info = engine.local().inspect_image(image)
    image_id = str(info["Id"])
    eng = Engine(host)
    if not eng.has_image(image_id):
        # one ship of an image to a host at a time: runs started together send it once, the others wait
        with host.exclusive(f"ship-{image_id.removeprefix('sha256:')[:16]}"):
            if not eng.has_image(image_id):
                result = _send(host, eng, info, image_id, rep, cache_dir, only_missing_layers)
                if tag:
                    eng.tag(image_id, tag)
                result.seconds = time.monotonic() - started
                return result
    if tag:
        eng.tag(image_id, tag)
    return ShipResult(image_id, skipped=True, seconds=time.monotonic() - started)


def _send(host: Host, eng: Engine, info: dict[str, Any], image_id: str, rep: Reporter, cache_dir: Path | None,
          only_missing_layers: bool) -> ShipResult:
    """Send what the host lacks of the image (by docker load from the layer cache or a rewritten save)."""
    diffs = list(info.get("RootFS", {}).get("Layers") or [])
    chains = chain_ids(diffs)
    present = eng.chain_ids() if only_missing_layers else set()
    layer_map = _load_layer_map(cache_dir)
    missing = [c for c in chains if c not in present]
    need = int(info.get("Size", 0)) if len(missing) == len(chains) else 0
    if need == 0 and missing:
        need = int(info.get("Size", 0)) * len(missing) // max(len(chains), 1)
    free = host.free_bytes(eng.root_dir())
    if free < need * 2 + (256 << 20):
        raise DiskFull(
            f"{host.name} has {free >> 20} MiB free for Docker; the image needs about {need >> 20} MiB "
            "plus room to unpack",
            "free space on the host (`docker system prune`) and retry",
        )

    result = ShipResult(image_id, skipped=False)

    def skip(dirname: str) -> bool:
        return layer_map.get(dirname) in present

    task = rep.task(
        f"ship image {image_id[7:19]} to {host.name}", total=float(info.get("Size", 0)) or None, unit="B"
    )

    def on_bytes(n: int) -> None:
        task.advance(n)

    def on_member(member: tarfile.TarInfo, emptied: bool) -> None:
        if member.name.endswith("/layer.tar"):
            if emptied:
                result.layers_skipped += 1
            else:
                result.layers_sent += 1
                result.bytes_sent += member.size

    cached = imagetree.cached_image(cache_dir / "images", image_id) if cache_dir is not None else None
    if cached is not None and all(f is not None or c in present for f, c in zip(cached[1], chains, strict=False)):
        _ship_from_cache(eng, image_id, cached, chains, present, task, result)
        task.close()
        if not eng.has_image(image_id):
            raise Corrupt(f"after loading, {host.name} does not have image {image_id}",
                          "retry; if it persists, remove the image's layers on the host (`docker image prune`)")
        return result

    save = engine.local().save(image_id)
    load = eng.load()
    widen_pipe(load.stdin)
    try:
        try:
            reader = cast(IO[bytes], CountingReader(save.stdout, on_bytes))
            manifest = rewrite_save_stream(reader, load.stdin, skip, on_member)
            load.stdin.close()
        except (BrokenPipeError, ConnectionError, OSError) as exc:
            load.kill()
            raise TransferCut(
                f"docker load on {host.name} stopped: {load.stderr_text().strip() or exc}",
                "check free disk space and dockerd on the host",
            ) from None
        save_rc = save.wait()
        load_out = load.stdout.read().decode("utf-8", "replace")
        load_rc = load.wait()
    finally:
        task.close()
        save.kill()  # only if still running
        save.wait()
    if save_rc != 0:
        err = save.stderr_text().strip()
        raise CommandFailed(f"docker save {image_id[:19]} failed: {err}", "check the local Docker engine")
    if load_rc != 0:
        text = (load.stderr_text() + load_out).strip()
        if "no space" in text.lower():
            raise DiskFull(
                f"{host.name} ran out of disk while loading the image: {text}",
                "free space on the host (`docker system prune`) and retry",
            )
        raise CommandFailed(
            f"docker load on {host.name} failed: {text.splitlines()[-1] if text else load_rc}",
            "check dockerd on the host (`launcher provision --host ...`)",
        )
    for dirname_layer, chain in zip(manifest.get("Layers", []), chains, strict=False):
        layer_map[dirname_layer.split("/")[0]] = chain
    _save_layer_map(cache_dir, layer_map)
    if not eng.has_image(image_id):
        raise Corrupt(
            f"after loading, {host.name} does not have image {image_id}",
            "retry; if it persists, remove the image's layers on the host (`docker image prune`)",
        )
    return result


def _ship_from_cache(eng: Engine, image_id: str, cached: tuple[bytes, list[Path | None]], chains: list[str],
                     present: set[str], task: Task, result: ShipResult) -> None:
    """Stream a `docker load` archive made from the build's layer cache: no `docker save`, so a
    rebuild whose recipe layer alone changed sends (and reads) that layer and little else."""
    cfg, files = cached
    send: list[Path | None] = []
    for path, chain in zip(files, chains, strict=True):
        if chain in present or path is None:
            send.append(None)
            result.layers_skipped += 1
        else:
            send.append(path)
            result.layers_sent += 1
            result.bytes_sent += path.stat().st_size
    host = eng.host
    load = eng.load()
    widen_pipe(load.stdin)
    try:
        imagetree.write_load_archive(load.stdin, image_id, cfg, send,
                                     reader=lambda f: cast(IO[bytes], CountingReader(f, task.advance)))
        load.stdin.close()
    except (BrokenPipeError, ConnectionError, OSError) as exc:
        load.kill()
        raise TransferCut(f"docker load on {host.name} stopped: {load.stderr_text().strip() or exc}",
                            "check free disk space and dockerd on the host") from None
    out = load.stdout.read().decode("utf-8", "replace")
    if load.wait() != 0:
        text = (load.stderr_text() + out).strip()
        if "no space" in text.lower():
            raise DiskFull(f"{host.name} ran out of disk while loading the image: {text}",
                           "free space on the host (`docker system prune`) and retry")
        raise CommandFailed(f"docker load on {host.name} failed: {text.splitlines()[-1] if text else 'error'}",
                            "check dockerd on the host (`launcher provision --host ...`)")


SHIP_REPO = "launcher/ship"


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


def ship_image_via_registry(host: Host, image: str, *, registry: str, tag: str | None = None,
                            reporter: Reporter | None = None, cache_dir: Path | None = None) -> ShipResult:
    """Ship through a local registry and a reverse SSH tunnel: the host's engine pulls only what it lacks.

    Unlike `docker save`, neither side reads the layers the other already has, so a rebuild whose
    recipe layer alone changed costs about that layer. The host's engine skips a layer only if it
    got it by a pull before (layers it got from `docker load` are pulled once more).
    """
    import random
    import time

    started = time.monotonic()
    rep = reporter or NullReporter()
    image_id = str(engine.local().inspect_image(image)["Id"])
    eng = Engine(host)
    if eng.has_image(image_id):
        if tag:
            eng.tag(image_id, tag)
        return ShipResult(image_id, skipped=True, seconds=time.monotonic() - started)
    if not host.can_reverse_tunnel():
        raise UsageError("shipping through a registry needs an SSH host and the OpenSSH client",
                         "ship with docker save/load instead (the default)")
    from launcher.images import registry as registry_mod

    if not registry_mod.ping(registry):
        if cache_dir is None or not registry_mod.is_loopback(registry):
            raise RegistryUnavailable(f"no registry answers on {registry}",
                                      "start one, or ship without --ship-via")
        registry_mod.start_local_registry(cache_dir / "registry", registry)
    task = rep.task(f"ship image {image_id[7:19]} to {host.name} via {registry}")
    try:
        digest = push_to_registry(image_id, registry)
        for _ in range(5):
            port = random.randint(20000, 60000)
            done = eng.pull_through_tunnel(f"127.0.0.1:{port}/{SHIP_REPO}@{digest}", port, registry)
            if done.returncode == 255 and "forwarding" in done.err:
                continue
            break
    finally:
        task.close()
    if done.returncode != 0:
        raise CommandFailed(f"docker pull on {host.name} through the tunnel failed: {done.last_error_line()}",
                            "check dockerd on the host")
    lines = done.out.splitlines()
    result = ShipResult(image_id, skipped=False,
                        layers_sent=sum("Pull complete" in ln for ln in lines),
                        layers_skipped=sum("Already exists" in ln for ln in lines))
    if not eng.has_image(image_id):
        raise Corrupt(f"after the pull, {host.name} does not have image {image_id}",
                      "the registry may hold a different image under that tag; retry")
    if tag:
        eng.tag(image_id, tag)
    result.seconds = time.monotonic() - started
    return result

