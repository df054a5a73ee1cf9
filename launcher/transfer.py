"""Moving bytes to and from hosts: images out (only the layers a host lacks), outputs back (verified).

Shipping streams `docker save` through a tar rewriter into `docker load` on the host. The
engine skips loading a layer it already has by chain ID, so a layer tarball the host holds
is replaced by an empty file. Which `<dir>/layer.tar` holds which chain ID is only told by
`manifest.json` at the end of the archive; the directory name is itself a hash of that
chain ID, so the mapping learned from any earlier ship stays true and is kept in the cache.

Pulling streams each file from a small python3 script on the host that hashes what it
sends; the client hashes what it writes, writes under a temporary name, compares, renames.
Nothing is ever read whole into memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import struct
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

from launcher import imagetree
from launcher.errors import (
    CommandFailed,
    Corrupt,
    DiskFull,
    LauncherError,
    RegistryUnavailable,
    TransferCut,
    UnsafePath,
    UsageError,
)
from launcher.hashing import CHUNK, atomic_write_json, sha256_file
from launcher.hosts import engine
from launcher.hosts.base import Host, RemoteEntry
from launcher.hosts.engine import Engine, chain_ids
from launcher.progress import CountingReader, NullReporter, Reporter, Task

LAYER_MAP_FILE = "layer-dirs.json"


# ---------------------------------------------------------------- images


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
    if eng.has_image(image_id):
        if tag:
            eng.tag(image_id, tag)
        return ShipResult(image_id, skipped=True, seconds=time.monotonic() - started)
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
        if tag:
            eng.tag(image_id, tag)
        result.seconds = time.monotonic() - started
        return result

    save = engine.local().save(image_id)
    load = eng.load()
    _widen_pipe(load.stdin)
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
    if tag:
        eng.tag(image_id, tag)
    result.seconds = time.monotonic() - started
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
    _widen_pipe(load.stdin)
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


def _push_to_registry(image_id: str, registry: str) -> str:
    """Push the image to the local registry (only layers it lacks travel); return the manifest digest."""
    ref = f"{registry}/{SHIP_REPO}:{image_id.removeprefix('sha256:')[:32]}"
    local = engine.local()
    local.tag(image_id, ref, check=True)
    done = local.push(ref)
    if done.returncode != 0:
        raise RegistryUnavailable(f"docker push to {registry} failed: {done.last_error_line()}",
                            "check that the local registry runs and answers on that address")
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
    from launcher import registry as registry_mod

    if not registry_mod.ping(registry):
        if cache_dir is None or not registry_mod.is_loopback(registry):
            raise RegistryUnavailable(f"no registry answers on {registry}",
                                      "start one, or ship without --ship-via")
        registry_mod.start_local_registry(cache_dir / "registry", registry)
    task = rep.task(f"ship image {image_id[7:19]} to {host.name} via {registry}")
    try:
        digest = _push_to_registry(image_id, registry)
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


# ---------------------------------------------------------------- outputs

# Runs on the host (python3, stdlib only). Reads a JSON list of relative paths on stdin; for
# each regular file under root sends: a JSON header line, chunks framed by an 8-byte length,
# a zero-length chunk, and a JSON trailer line with the size and sha256 of what it sent.
PULL_SCRIPT = r"""
import hashlib, json, os, queue, stat, struct, sys, threading
root = os.path.realpath(sys.argv[1])

def produce(f, q, h):
    # reading and hashing on one thread, writing to the pipe on the other: they overlap
    while True:
        block = f.read(1 << 20)
        h.update(block)
        q.put(block)
        if not block:
            return

paths = json.loads(sys.stdin.read())
out = sys.stdout.buffer
try:  # a bigger pipe to sshd: fewer wake-ups per MB
    import fcntl
    fcntl.fcntl(out.fileno(), 1031, 1 << 20)  # F_SETPIPE_SZ
except (ImportError, OSError, ValueError):
    pass
for rel in paths:
    full = os.path.join(root, rel)
    err = None
    if rel.startswith("/") or ".." in rel.split("/") or os.path.realpath(full) != os.path.normpath(full) \
            or not os.path.realpath(full).startswith(root + os.sep):
        err = "escapes the run directory"
    else:
        try:
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            err = exc.strerror or str(exc)
        else:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                err = "not a regular file"
    if err is not None:
        out.write((json.dumps({"path": rel, "error": err}) + "\n").encode())
        continue
    out.write((json.dumps({"path": rel}) + "\n").encode())
    h, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as f:
        q = queue.Queue(16)
        worker = threading.Thread(target=produce, args=(f, q, h))
        worker.start()
        while True:
            block = q.get()
            if not block:
                break
            size += len(block)
            out.write(struct.pack(">Q", len(block)))
            out.write(block)
        worker.join()
    out.write(struct.pack(">Q", 0))
    out.write((json.dumps({"size": size, "sha256": "sha256:" + h.hexdigest()}) + "\n").encode())
out.flush()
"""

STATE_FILE = ".pulled.json"


def safe_relpath(rel: str) -> PurePosixPath:
    """A path that stays under its root: relative, no `..`, no empty or odd parts."""
    p = PurePosixPath(rel)
    if (
        not rel
        or rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or p.is_absolute()
        or any(part in ("..", "") for part in rel.split("/"))
        or rel.split("/")[0] == "."
    ):
        raise UnsafePath(
            f"the host sent an output path that escapes the run directory: {rel!r}",
            "inspect the run's outputs on the host; nothing was written outside runs/",
        )
    return p


def _dest(root: Path, rel: str) -> Path:
    p = safe_relpath(rel)
    target = root.joinpath(*p.parts)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    real_root = root.resolve()
    if parent.resolve() != real_root and real_root not in parent.resolve().parents:
        raise UnsafePath(
            f"{rel!r} would be written outside {root}", "remove the symlinks in the local run directory"
        )
    if target.is_symlink():
        target.unlink()
    return target


@dataclass
class PullResult:
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # rel -> {size, sha256}
    transferred: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": len(self.files),
            "transferred": len(self.transferred),
            "skipped": len(self.skipped),
            "refused": self.refused,
            "bytes": self.bytes,
        }


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError("stream ended early")
        buf += chunk
    return bytes(buf)


def _json_line(line: bytes) -> dict[str, Any]:
    if not line.endswith(b"\n"):
        raise EOFError("stream ended inside a record")
    try:
        data = json.loads(line)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise Corrupt(f"the host sent a malformed record: {line[:80]!r}", "run `launcher pull RUN` again")
    return data


class _HashingWriter:
    """Hashes and writes blocks on a worker thread, so reading the network never waits for the disk."""

    def __init__(self, f: IO[bytes], depth: int = 16) -> None:
        self.f = f
        self.h = hashlib.sha256()
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while (block := self.q.get()) is not None:
            if self.error is None:
                try:
                    self.h.update(block)
                    self.f.write(block)
                except BaseException as exc:  # handed to the reading thread
                    self.error = exc

    def write(self, block: bytes) -> None:
        if self.error is not None:
            raise self.error
        self.q.put(block)

    def finish(self, *, abort: bool = False) -> str:
        if self.thread.is_alive():
            self.q.put(None)
            self.thread.join()
        if self.error is not None and not abort:
            raise self.error
        return "sha256:" + self.h.hexdigest()


def receive_files(
    stream: IO[bytes],
    dest: Path,
    on_bytes: Callable[[int], None] | None = None,
    on_file: Callable[[str, int, str], None] | None = None,
) -> list[tuple[str, str]]:
    """Read the pull protocol from stream into dest. Returns (path, error) for files the host refused."""
    errors: list[tuple[str, str]] = []
    while True:
        line = stream.readline()
        if not line:
            return errors
        header = _json_line(line)
        rel = str(header.get("path", ""))
        if "error" in header:
            errors.append((rel, str(header["error"])))
            continue
        target = _dest(dest, rel)
        size = 0
        with tempfile.NamedTemporaryFile(
            dir=target.parent, prefix=f".{target.name}.", suffix=".partial", delete=False
        ) as tmp:
            tmp_path = Path(tmp.name)
            sink = _HashingWriter(tmp)
            try:
                while True:
                    (n,) = struct.unpack(">Q", _read_exact(stream, 8))
                    if n == 0:
                        break
                    remaining = n
                    while remaining:
                        block = stream.read(min(remaining, CHUNK))
                        if not block:
                            raise EOFError("stream ended inside a file")
                        sink.write(block)
                        remaining -= len(block)
                        size += len(block)
                        if on_bytes is not None:
                            on_bytes(len(block))
                trailer = _json_line(stream.readline())
                digest = sink.finish()
            except OSError as exc:
                sink.finish(abort=True)
                tmp_path.unlink(missing_ok=True)
                if getattr(exc, "errno", None) in (28, 122):
                    raise DiskFull(
                        f"no space left while writing {target}", "free space and run `launcher pull` again"
                    ) from exc
                raise
            except BaseException:
                sink.finish(abort=True)
                tmp_path.unlink(missing_ok=True)
                raise
        if trailer.get("sha256") != digest or trailer.get("size") != size:
            tmp_path.unlink(missing_ok=True)
            raise Corrupt(
                f"{rel}: received {size} bytes with {digest}, the host sent {trailer}",
                "run `launcher pull RUN` again",
            )
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, target)
        if on_file is not None:
            on_file(rel, size, digest)


def _widen_pipe(stream: Any) -> None:
    """Give a pipe from a child 1 MiB of buffer (Linux), so bulk reads wake up less often."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), 1031, 1 << 20)  # F_SETPIPE_SZ
    except (ImportError, AttributeError, OSError, ValueError):
        pass  # not a pipe, not Linux, or a paramiko channel


def classify(entries: Iterable[RemoteEntry]) -> tuple[list[RemoteEntry], list[str]]:
    """Split a listing into regular files that are safe to pull and refused entries (with reasons)."""
    files: list[RemoteEntry] = []
    refused: list[str] = []
    for e in entries:
        try:
            safe_relpath(e.path)
        except UnsafePath:
            refused.append(f"{e.path} (escapes the run directory)")
            continue
        if e.kind == "symlink":
            refused.append(f"{e.path} (a symlink to {e.target})")
        elif e.kind == "file":
            files.append(e)
        elif e.kind != "dir":
            refused.append(f"{e.path} (not a regular file)")
    return files, refused


def pull_outputs(
    host: Host,
    remote_dir: str,
    dest: Path,
    *,
    state_file: Path | None = None,
    reporter: Reporter | None = None,
    on_file: Callable[[str, int, str], None] | None = None,
) -> PullResult:
    """Copy every regular file under remote_dir into dest, verified; skip files verified before."""
    rep = reporter or NullReporter()
    state_path = state_file or dest.parent / STATE_FILE
    state: dict[str, dict[str, Any]] = {}
    if state_path.is_file():
        try:
            state = json.loads(state_path.read_text())
        except ValueError:
            state = {}
    result = PullResult()
    files, result.refused = classify(host.list_dir(remote_dir, hashes=False))
    todo: list[RemoteEntry] = []
    for e in files:
        prev = state.get(e.path)
        local = dest.joinpath(*PurePosixPath(e.path).parts)
        if (
            prev
            and prev.get("size") == e.size
            and prev.get("mtime_ns") == e.mtime_ns
            and local.is_file()
            and local.stat().st_size == e.size
            and sha256_file(local) == prev.get("sha256")
        ):
            result.files[e.path] = {"size": e.size, "sha256": prev["sha256"]}
            result.skipped.append(e.path)
        else:
            todo.append(e)
    mtimes = {e.path: e.mtime_ns for e in todo}
    if todo:
        dest.mkdir(parents=True, exist_ok=True)
        task = rep.task(
            f"pull {len(todo)} files from {host.name}", total=float(sum(e.size for e in todo)), unit="B"
        )

        def done(rel: str, size: int, digest: str) -> None:
            result.files[rel] = {"size": size, "sha256": digest}
            result.transferred.append(rel)
            result.bytes += size
            state[rel] = {"size": size, "sha256": digest, "mtime_ns": mtimes.get(rel, 0)}
            atomic_write_json(state_path, state)
            if on_file is not None:
                on_file(rel, size, digest)

        p = host.start([host.python, "-c", PULL_SCRIPT, remote_dir], bulk=True)
        _widen_pipe(p.stdout)
        try:
            p.stdin.write(json.dumps([e.path for e in todo]).encode())
            p.stdin.close()
            errors = receive_files(p.stdout, dest, on_bytes=lambda n: task.advance(n), on_file=done)
        except EOFError:
            p.kill()
            raise TransferCut(
                f"the transfer from {host.name} was cut: {p.stderr_text().strip()}",
                "run `launcher pull RUN` again; verified files are kept",
            ) from None
        finally:
            task.close()
        rc = p.wait()
        if rc != 0:
            raise CommandFailed(
                f"pulling from {host.name} failed (exit {rc}): {p.stderr_text().strip()}",
                "run `launcher pull RUN` again; verified files are kept",
            )
        result.refused += [f"{rel} ({why})" for rel, why in errors if why != "No such file or directory"]
    return result


def check_remote_digests(host: Host, remote_dir: str, files: dict[str, dict[str, Any]]) -> list[str]:
    """Paths whose sha256 on the host now differs from what was pulled (the host hashes them again)."""
    remote = {e.path: e.sha256 for e in host.list_dir(remote_dir, hashes=True) if e.kind == "file"}
    return [rel for rel, rec in files.items() if remote.get(rel) not in (None, rec["sha256"])]
