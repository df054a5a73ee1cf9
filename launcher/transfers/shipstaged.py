"""The compressed transport of an image to a host over a slow link: the layers the host lacks go as
gzip blobs (made once and kept in the cache by content) into a staging folder beside the host's runs
(``~/.launcher/ship/<image>``), each resumed from the bytes already there and checked by its SHA-256,
then `docker load` runs there. Whether a link is slow is measured (:func:`link_rate`) unless
LAUNCHER_SHIP_COMPRESS says. The transport table that picks it is in :mod:`launcher.transfers.ship`."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import CommandFailed, Corrupt, DiskFull, TransferCut
from launcher.hashing import CHUNK
from launcher.hosts.base import Host
from launcher.hosts.engine import Engine
from launcher.images import blobs
from launcher.progress import Reporter, Task

COMPRESS_ENV = "LAUNCHER_SHIP_COMPRESS"  # auto (the default) | always | never
# Below this link rate gzip'd layers arrive sooner, counting docker load's gunzip on the host;
# below the second, even when the blobs must first be made here (gzip -1 runs at 50-60 MB/s).
SLOW_LINK = 100e6
SLOW_LINK_NO_BLOBS = 35e6
SMALL_SHIP = 64 << 20  # below this, compression saves too little to be worth a link measurement
STAGE_DIR = "ship"  # in launcher's area on the host: what a compressed ship has sent so far


@dataclass
class Sent:
    layers: int = 0
    bytes: int = 0


def load_failed(host: Host, text: str) -> DiskFull | CommandFailed:
    """What a failed `docker load` on the host (its last words in text) is, as launcher's error."""
    if "no space" in text.lower():
        return DiskFull(f"{host.name} ran out of disk while loading the image: {text}",
                        "free space on the host (`docker system prune`) and retry")
    return CommandFailed(f"docker load on {host.name} failed: {text.splitlines()[-1] if text else 'error'}",
                         "check dockerd on the host (`launcher provision --host ...`)")


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


def wanted(host: Host, warm: bool) -> bool:
    """Whether to send gzip'd layers to this host: LAUNCHER_SHIP_COMPRESS, else by the measured link
    (the better of two measurements: a busy machine only ever makes a link look slower than it is)."""
    mode = os.environ.get(COMPRESS_ENV, "auto").strip().lower()
    if mode in ("always", "never"):
        return mode == "always"
    threshold = SLOW_LINK if warm else SLOW_LINK_NO_BLOBS
    return all(link_rate(host, 12 << 20) < threshold for _ in range(2))


def send_compressed(host: Host, eng: Engine, image_id: str, diff_ids: list[str], missing: list[int],
                    cached: tuple[bytes, list[Path | None]] | None, cache_dir: Path, rep: Reporter) -> Sent:
    """Send the layers the host lacks (their indexes in missing) as gzip blobs into the staging folder,
    then `docker load` there. A ship cut half-way leaves the staging folder; the next ship of the image
    to that host sends only the rest."""
    files = cached[1] if cached is not None else []
    making = rep.task(f"compress {len(missing)} layers of {image_id[7:19]} (once, kept in the cache)", unit="B")
    try:
        made, cfg = blobs.ensure(image_id, diff_ids, files, missing, cache_dir,
                                 config=cached[0] if cached is not None else None, on_bytes=making.advance)
    finally:
        making.close()
    stage = host.area(STAGE_DIR, image_id.removeprefix("sha256:")[:32])
    host.makedirs(stage)
    listing = host.run(["sh", "-c", 'cd "$1" && for f in *; do [ -f "$f" ] && echo "$f $(wc -c < "$f")"; done; true',
                        "sh", stage], check=False).out
    there = {name: int(size) for name, _, size in (ln.rpartition(" ") for ln in listing.splitlines()) if size.isdigit()}
    total = blobs.total_size(made)
    task = rep.task(f"ship image {image_id[7:19]} to {host.name} (compressed)", total=float(total) or None, unit="B")
    names = []
    sent = Sent()
    try:
        for i in range(len(diff_ids)):
            if i not in made:
                names.append(f"{i:03d}.empty")  # the host has it: docker load skips it by its chain ID
                continue
            blob, name = made[i], f"{i:03d}.tar.gz"
            names.append(name)
            sent.layers += 1
            if there.get(name) == blob.size:
                task.advance(blob.size)
                continue
            offset = there.get(name + ".part", 0)
            offset = offset if offset <= blob.size else 0
            sent.bytes += _send_from(host, blob, f"{stage}/{name}.part", offset, task)
            check = host.run(["sh", "-c", 'sha256sum "$1" | cut -d" " -f1', "sh", f"{stage}/{name}.part"],
                             check=False).out.strip()
            if check != blob.sha256:
                host.run(["rm", "-f", f"{stage}/{name}.part"], check=False)
                raise Corrupt(f"layer {i} arrived on {host.name} with SHA-256 {check[:12] or 'none'}, "
                              f"not {blob.sha256[:12]}", "run again: the damaged part was removed")
            host.run(["mv", "-f", f"{stage}/{name}.part", f"{stage}/{name}"])
    finally:
        task.close()
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [], "Layers": names}]).encode()
    done = eng.load_staged(stage, [n for n in names if n.endswith(".empty")], manifest.decode(), names, cfg)
    if done.returncode != 0:
        raise load_failed(host, done.last_error_line())
    if not eng.has_image(image_id):
        raise Corrupt(f"after loading, {host.name} does not have image {image_id}",
                      "retry; if it persists, remove the image's layers on the host (`docker image prune`)")
    host.run(["rm", "-rf", stage], check=False)
    return sent


def _send_from(host: Host, blob: blobs.Blob, dest: str, offset: int, task: Task) -> int:
    """Append the blob's bytes from offset to dest on the host (a fresh file when offset is 0); the bytes sent."""
    task.advance(offset)
    sent = offset
    with host.receive_stream(["sh", "-c", 'cat >> "$1"' if offset else 'cat > "$1"', "sh", dest],
                             cut=lambda: f"sending the image to {host.name} stopped after {sent >> 20} MiB",
                             hint="run again: the ship resumes from what arrived") as recv:
        with open(blob.path, "rb") as f:
            f.seek(offset)
            for chunk in iter(lambda: f.read(CHUNK), b""):
                recv.stdin.write(chunk)
                sent += len(chunk)
                task.advance(len(chunk))
        recv.stdin.close()
        if recv.wait() != 0:
            raise TransferCut(f"writing {dest} on {host.name} failed: {recv.stderr_text().strip()}",
                              "check free space on the host, then run again: the ship resumes from what arrived")
    return sent - offset
