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
import os
import re
import tarfile
import time
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
from launcher.images import blobs
from launcher.images import tree as imagetree
from launcher.proc import widen_pipe
from launcher.progress import CountingReader, NullReporter, Reporter, Task

LAYER_MAP_FILE = "layer-dirs.json"
COMPRESS_ENV = "LAUNCHER_SHIP_COMPRESS"  # auto (the default) | always | never
# Below this link rate gzip'd layers arrive sooner, counting docker load's gunzip on the host;
# below the second, even when the blobs must first be made here (gzip -1 runs at 50-60 MB/s).
SLOW_LINK = 100e6
SLOW_LINK_NO_BLOBS = 35e6
SMALL_SHIP = 64 << 20  # below this, compression saves too little to be worth a link measurement
STAGE_DIR = "ship"  # under ~/.launcher on the host: what a compressed ship has sent so far


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
    if cache_dir is not None and host.kind != "local" and need >= SMALL_SHIP:
        diff_ids = [str(d) for d in diffs]
        wanted = [i for i, c in enumerate(chains) if c not in present]
        warm = all(blobs.cached(cache_dir, diff_ids[i]) is not None for i in wanted)
        if _compress(host, warm):
            task.close()
            _send_compressed(host, eng, image_id, diff_ids, wanted, cached, cache_dir, rep, result)
            return result
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


def link_rate(host: Host, size: int = 24 << 20) -> float:
    """Bytes per second into the host over its bulk path: 1 MiB to open the stream, then size more, timed."""
    p = host.start(["sh", "-c", "head -c 1048576 >/dev/null && echo ready && cat >/dev/null && echo done"],
                   bulk=True)
    try:
        p.stdin.write(os.urandom(1 << 20))
        p.stdin.flush()
        p.stdout.readline()
        started = time.monotonic()
        block = os.urandom(1 << 20)
        for _ in range(size >> 20):
            p.stdin.write(block)
        p.stdin.close()
        p.stdout.readline()
        took = time.monotonic() - started
    except (BrokenPipeError, OSError):
        return float("inf")  # no measure: ship as on a fast link
    finally:
        p.kill()
    return size / max(took, 1e-6)


def _compress(host: Host, warm: bool) -> bool:
    """Whether to send gzip'd layers to this host: LAUNCHER_SHIP_COMPRESS, else by the measured link
    (the better of two measurements: a busy machine only ever makes a link look slower than it is)."""
    mode = os.environ.get(COMPRESS_ENV, "auto").strip().lower()
    if mode in ("always", "never"):
        return mode == "always"
    threshold = SLOW_LINK if warm else SLOW_LINK_NO_BLOBS
    return all(link_rate(host, 12 << 20) < threshold for _ in range(2))


def _send_compressed(host: Host, eng: Engine, image_id: str, diff_ids: list[str], wanted: list[int],
                     cached: tuple[bytes, list[Path | None]] | None, cache_dir: Path, rep: Reporter,
                     result: ShipResult) -> None:
    """Send the layers the host lacks as gzip blobs into a staging folder on the host, each resumed from
    the bytes already there and checked by its SHA-256, then `docker load` there. A ship cut half-way
    leaves the staging folder; the next ship of the image to that host sends only the rest."""
    files = cached[1] if cached is not None else []
    making = rep.task(f"compress {len(wanted)} layers of {image_id[7:19]} (once, kept in the cache)", unit="B")
    try:
        made, cfg = blobs.ensure(image_id, diff_ids, files, wanted, cache_dir,
                                 config=cached[0] if cached is not None else None, on_bytes=making.advance)
    finally:
        making.close()
    stage = f"{host.runs_root().rsplit('/', 1)[0]}/{STAGE_DIR}/{image_id.removeprefix('sha256:')[:32]}"
    host.makedirs(stage)
    listing = host.run(["sh", "-c", 'cd "$1" && for f in *; do [ -f "$f" ] && echo "$f $(wc -c < "$f")"; done; true',
                        "sh", stage], check=False).out
    there = {name: int(size) for name, _, size in (ln.rpartition(" ") for ln in listing.splitlines()) if size.isdigit()}
    total = blobs.total_size(made)
    task = rep.task(f"ship image {image_id[7:19]} to {host.name} (compressed)", total=float(total) or None, unit="B")
    names = []
    try:
        for i in range(len(diff_ids)):
            if i not in made:
                names.append(f"{i:03d}.empty")  # the host has it: docker load skips it by its chain ID
                continue
            blob, name = made[i], f"{i:03d}.tar.gz"
            names.append(name)
            result.layers_sent += 1
            if there.get(name) == blob.size:
                task.advance(blob.size)
                continue
            offset = there.get(name + ".part", 0)
            offset = offset if offset <= blob.size else 0
            _send_from(host, blob, f"{stage}/{name}.part", offset, task, result)
            check = host.run(["sh", "-c", 'sha256sum "$1" | cut -d" " -f1', "sh", f"{stage}/{name}.part"],
                             check=False).out.strip()
            if check != blob.sha256:
                host.run(["rm", "-f", f"{stage}/{name}.part"], check=False)
                raise Corrupt(f"layer {i} arrived on {host.name} with SHA-256 {check[:12] or 'none'}, "
                              f"not {blob.sha256[:12]}", "run again: the damaged part was removed")
            host.run(["mv", "-f", f"{stage}/{name}.part", f"{stage}/{name}"])
    finally:
        task.close()
    result.layers_skipped = len(diff_ids) - result.layers_sent
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [], "Layers": names}]).encode()
    script = ('cd "$1" && for f in $2; do : > "$f"; done && cat > config.json && printf %s "$3" > manifest.json '
              "&& tar -cf - config.json manifest.json $4 | docker load -q")
    done = host.run(["sh", "-c", script, "sh", stage, " ".join(n for n in names if n.endswith(".empty")),
                     manifest.decode(), " ".join(names)], input=cfg, check=False, timeout=3600)
    if done.returncode != 0:
        text = done.last_error_line()
        if "no space" in text.lower():
            raise DiskFull(f"{host.name} ran out of disk while loading the image: {text}",
                           "free space on the host (`docker system prune`) and retry")
        raise CommandFailed(f"docker load on {host.name} failed: {text}",
                            "check dockerd on the host (`launcher provision --host ...`)")
    if not eng.has_image(image_id):
        raise Corrupt(f"after loading, {host.name} does not have image {image_id}",
                      "retry; if it persists, remove the image's layers on the host (`docker image prune`)")
    host.run(["rm", "-rf", stage], check=False)


def _send_from(host: Host, blob: blobs.Blob, dest: str, offset: int, task: Task, result: ShipResult) -> None:
    """Append the blob's bytes from offset to dest on the host (a fresh file when offset is 0)."""
    recv = host.start(["sh", "-c", 'cat >> "$1"' if offset else 'cat > "$1"', "sh", dest], bulk=True)
    widen_pipe(recv.stdin)
    task.advance(offset)
    sent = offset
    try:
        with open(blob.path, "rb") as f:
            f.seek(offset)
            for chunk in iter(lambda: f.read(CHUNK), b""):
                recv.stdin.write(chunk)
                sent += len(chunk)
                result.bytes_sent += len(chunk)
                task.advance(len(chunk))
        recv.stdin.close()
    except (BrokenPipeError, ConnectionError, OSError) as exc:
        recv.kill()
        raise TransferCut(f"sending the image to {host.name} stopped after {sent >> 20} MiB: "
                          f"{recv.stderr_text().strip() or exc}",
                          "run again: the ship resumes from what arrived") from None
    if recv.wait() != 0:
        raise TransferCut(f"writing {dest} on {host.name} failed: {recv.stderr_text().strip()}",
                          "check free space on the host, then run again: the ship resumes from what arrived")
