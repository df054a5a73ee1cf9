"""Datasets that live on the user's machine, sent to a host by content.

`launcher run --data-from DIR` hashes every file under DIR into one digest. A host keeps each
dataset it was sent under ``~/.launcher/data/<digest>/``: a second run with the same files
sends nothing, a changed file makes a new digest. The upload streams a tar into ``tar -x`` on
the host under a temporary name; the host then hashes what it received, and only when every
file matches is the folder renamed to its digest. So a folder under that name is always
complete, and an interrupted upload is never mistaken for one.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypedDict, cast

from launcher.errors import BadData, CommandFailed, Corrupt, DiskFull
from launcher.hashing import CHUNK, sha256_file
from launcher.hosts.base import Host
from launcher.hosts.scripts import text as host_script
from launcher.progress import CountingReader, NullReporter, Reporter
from launcher.records.records import DataSource

HEADROOM_BYTES = 256 << 20  # left free on the host after an upload


@dataclass
class LocalDataset:
    root: Path
    files: dict[str, tuple[int, str]] = field(default_factory=dict)  # rel -> (size, sha256:hex)

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.files.values())

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for rel in sorted(self.files):
            size, digest = self.files[rel]
            h.update(f"{digest} {size} {rel}\n".encode())
        return "sha256:" + h.hexdigest()


_SCANNED: dict[tuple[str, tuple[tuple[str, int, int], ...]], LocalDataset] = {}
_SCAN_LOCK = threading.Lock()


def scan(root: Path) -> LocalDataset:
    """Every regular file under root with its size and sha256. Symlinks and special files are
    refused: what is sent must be exactly what the digest names. A folder whose names, sizes
    and mtimes are unchanged since the last scan in this process is not hashed again (an
    experiment sends one dataset to many hosts)."""
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise BadData(
            f"the dataset folder {root} {what}",
            "give a folder on this machine to --data-from (or --data for a path on the host)",
        )
    real = root.resolve()
    listing: list[tuple[str, int, int]] = []
    for top, dirs, files in os.walk(real):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            full = Path(top) / name
            rel = full.relative_to(real).as_posix()
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                raise BadData(
                    f"the dataset holds a symlink, {rel}", "copy the file it points to into the folder instead"
                )
            if not stat.S_ISREG(st.st_mode):
                raise BadData(f"the dataset holds {rel}, which is not a regular file", "remove it from the folder")
            listing.append((rel, st.st_size, st.st_mtime_ns))
    key = (str(real), tuple(listing))
    with _SCAN_LOCK:
        if key in _SCANNED:
            return _SCANNED[key]
        ds = LocalDataset(real, {rel: (size, sha256_file(real / rel)) for rel, size, _ in listing})
        while len(_SCANNED) >= 8:  # a dataset and a code folder or two are what a process sends
            _SCANNED.pop(next(iter(_SCANNED)))
        _SCANNED[key] = ds
        return ds


@dataclass
class Placed:
    path: str  # the folder on the host
    digest: str
    files: int
    bytes: int
    sent: bool

    def source(self, local: Path) -> DataSource:
        """The data source record of a folder sent from local (launch.json's ``data_source``)."""
        return {"kind": "sent", "local": str(local.resolve()), "path": self.path, "digest": self.digest,
                "files": self.files, "bytes": self.bytes, "sent": self.sent}


def place(host: Host, local: Path, reporter: Reporter | None = None, *, area: str = "data",
          name: str | None = None) -> Placed:
    """Make the folder at local available on host under ~/.launcher/<area>/<name> (datasets by
    their digest; code snapshots under "code", named by their code digest); returns where. Sends
    it only when the host does not hold these exact files already."""
    rep = reporter or NullReporter()
    what = "dataset" if area == "data" else area
    task = rep.task(f"hash {what} {local}")
    try:
        ds = scan(local)
    finally:
        task.close()
    if host.kind == "local":
        return Placed(str(ds.root), ds.digest, len(ds.files), ds.bytes, sent=False)
    root = host.area(area)
    final = f"{root}/{name or ds.digest.removeprefix('sha256:')}"
    if host.exists(final) and _sizes(host, final) == {rel: size for rel, (size, _) in ds.files.items()}:
        return Placed(final, ds.digest, len(ds.files), ds.bytes, sent=False)
    host.makedirs(root)
    free = host.free_bytes(root)
    if free < ds.bytes + HEADROOM_BYTES:
        raise DiskFull(
            f"{host.name} has {free >> 20} MiB free under {root}; the {what} needs {ds.bytes >> 20} MiB "
            f"and {HEADROOM_BYTES >> 20} MiB must stay free",
            "free space on the host"
            + (", or put the data there yourself and pass --data PATH" if area == "data" else ""),
        )
    tmp = f"{root}/.{ds.digest.removeprefix('sha256:')}.partial-{uuid.uuid4().hex[:8]}"
    host.run(["rm", "-rf", final])  # an incomplete or altered copy under the final name
    host.makedirs(tmp)
    try:
        _send(host, ds, tmp, rep, what, root)
        got = {e.path: e.sha256 for e in host.list_dir(tmp, hashes=True) if e.kind == "file"}
        want = {rel: digest for rel, (_, digest) in ds.files.items()}
        if got != want:
            bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            raise Corrupt(
                f"the {what} arrived on {host.name} altered ({len(bad)} files differ, first {bad[0]})",
                "run again; the upload starts over",
            )
        host.run(["mv", "-T", tmp, final])
    except BaseException:
        host.run(["rm", "-rf", tmp], check=False)
        raise
    return Placed(final, ds.digest, len(ds.files), ds.bytes, sent=True)


def _sizes(host: Host, path: str) -> dict[str, int]:
    return {e.path: e.size for e in host.list_dir(path, hashes=False) if e.kind == "file"}


def _send(host: Host, ds: LocalDataset, tmp: str, rep: Reporter, what: str, root: str) -> None:
    task = rep.task(f"send {what} to {host.name}", total=float(ds.bytes), unit="B")
    try:
        with host.receive_stream(["tar", "-x", "-C", tmp, "-f", "-"], cut=f"sending the {what} to {host.name} was cut",
                                 hint="run again; the upload starts over") as p:
            with tarfile.open(fileobj=p.stdin, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:
                for rel in sorted(ds.files):
                    size, _ = ds.files[rel]
                    info = tarfile.TarInfo(rel)
                    info.size, info.mode, info.mtime = size, 0o644, 0
                    with open(ds.root / rel, "rb") as f:
                        tar.addfile(info, cast(IO[bytes], CountingReader(f, task.advance)))
            p.stdin.close()
    finally:
        task.close()
    rc = p.wait()
    if rc != 0:
        raise CommandFailed(
            f"unpacking the {what} on {host.name} failed (exit {rc}): {p.stderr_text().strip()}",
            f"check free space and permissions under {root} on the host",
        )


class PruneEntry(TypedDict):
    """A folder prune_host removed or kept, in its answer (``launcher prune``'s JSON)."""

    path: str
    bytes: int
    why: str


class PruneRecord(TypedDict):
    removed: list[PruneEntry]
    kept: list[PruneEntry]
    removed_bytes: int


@dataclass
class HostPrune:
    removed: list[PruneEntry] = field(default_factory=list)
    kept: list[PruneEntry] = field(default_factory=list)

    def to_dict(self) -> PruneRecord:
        return {"removed": self.removed, "kept": self.kept, "removed_bytes": sum(r["bytes"] for r in self.removed)}


def prune_host(host: Host, *, dry_run: bool = False) -> HostPrune:
    """Remove the datasets `--data-from` left on host that no container there mounts (running or
    stopped: a stopped run may be restarted or inspected), and uploads interrupted over an hour ago.
    Whatever goes is sent again by the next run that needs it."""
    result = HostPrune()
    if host.kind == "local":
        return result  # nothing is copied for the local engine
    from launcher.hosts.engine import Engine

    engine = Engine(host)
    engine.require()  # without it, what containers mount cannot be told
    root = host.area("data")
    mounted = engine.mount_sources(engine.container_ids())
    listing = host.run([host.python, "-c", host_script("datalist.py"), root], check=False).out
    for line in listing.splitlines():
        size_s, age_s, name = line.split(" ", 2)
        path, size = f"{root}/{name}", int(size_s)
        if name.startswith("."):
            if int(age_s) < 3600:
                result.kept.append({"path": path, "bytes": size, "why": "an upload under way"})
                continue
            why = "an interrupted upload"
        elif path in mounted:
            result.kept.append({"path": path, "bytes": size, "why": "a container on the host mounts it"})
            continue
        else:
            why = "no container on the host mounts it"
        if not dry_run:
            host.run(["rm", "-rf", "--", path])
        result.removed.append({"path": path, "bytes": size, "why": why})
    return result
