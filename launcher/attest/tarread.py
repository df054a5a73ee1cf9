"""A bundle's tar read as a stranger's file: every header first, then the signed envelope, then only the
files the envelope names, each checked as it is written.

1. ``BundleTar`` reads every header before anything is written: regular files and folders only (no link,
   device, FIFO or sparse member, whose few archived bytes could unpack to a disk's worth), names that stay
   inside the folder and hold no ``.git`` part (git on this machine would take it for its own metadata:
   hooks, fsmonitor), no name twice, no name that is both a file and a folder;
2. ``read`` gives one member's bytes in memory (the envelope, at most MAX_ENVELOPE): the caller verifies it;
3. ``extract`` writes the members the verified statement names, and no others, into a temporary folder
   beside the target: the free disk checked against their sizes first, each hashed while written and never
   longer than its header says; renamed into place once every one matches, removed otherwise.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from launcher.errors import Corrupt, DigestMismatch, DiskFull, UnsafePath
from launcher.progress import NullReporter, Reporter

MAX_ENVELOPE = 64 << 20
CHUNK = 1 << 20
_TAR_ERRORS = (tarfile.TarError, EOFError, ValueError, OverflowError, UnicodeError)


def safe_name(name: str, source: str) -> str:
    """A member's name as a relative posix path inside the bundle's folder; UnsafePath otherwise."""
    p = PurePosixPath(name)
    if not name or name.startswith("/") or ".." in p.parts or "\\" in name or "\0" in name or not p.parts:
        raise UnsafePath(f"{source} holds the entry {name!r}, which leaves the bundle's folder",
                         "do not use this bundle: launcher never writes such an entry")
    if any(part.lower() == ".git" for part in p.parts):
        raise UnsafePath(f"{source} holds {name}: a .git entry, which git on this machine would read as a "
                         "repository's own configuration (its hooks and fsmonitor run commands)",
                         "do not use this bundle: launcher never bundles git's metadata")
    return p.as_posix()


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    executable: bool
    info: tarfile.TarInfo


def _clash(files: Mapping[str, Member], folders: set[str]) -> str | None:
    """A name that is both a file and a folder (a tar holding `a` then `a/b`)."""
    parents = {p.as_posix() for n in files for p in PurePosixPath(n).parents if p.as_posix() != "."}
    both = sorted(set(files) & (parents | folders))
    return both[0] if both else None


class BundleTar:
    """An open bundle whose headers are all read and checked (see the module's text)."""

    def __init__(self, path: Path, tar: tarfile.TarFile) -> None:
        self.path, self.tar = path, tar
        self.members: dict[str, Member] = {}
        folders: set[str] = set()
        for info in tar:
            name = safe_name(info.name, str(path))
            if info.isdir():
                folders.add(name)
            elif info.issparse():
                raise UnsafePath(f"{path} holds {name} as a sparse member ({info.size} bytes once unpacked from "
                                 "far fewer in the archive)",
                                 "do not use this bundle: launcher writes no sparse member")
            elif not info.isreg():
                raise UnsafePath(f"{path} holds {name}, which is not a regular file (a link or a device)",
                                 "do not use this bundle: launcher bundles regular files only")
            elif name in self.members:
                raise Corrupt(f"{path} holds {name} twice", "ask its author for the bundle again")
            else:
                self.members[name] = Member(name, info.size, bool(info.mode & 0o100), info)
        clash = _clash(self.members, folders)
        if clash is not None:
            raise Corrupt(f"{path} holds {clash} as a file and as a folder", "ask its author for the bundle again")

    def read(self, name: str, limit: int) -> bytes:
        member = self.members[name]
        if member.size > limit:
            raise Corrupt(f"{self.path}: {name} is {member.size} bytes, more than the {limit} launcher reads",
                          "ask its author for the bundle again")
        try:
            src = self.tar.extractfile(member.info)
            if src is None:
                raise Corrupt(f"{self.path}: {name} cannot be read", "ask its author for the bundle again")
            with src:
                return src.read(member.size)
        except _TAR_ERRORS as exc:
            raise _broken(self.path, exc) from None

    def _write(self, member: Member, target: Path, digest: str) -> bool:
        """member's bytes into target, hashed as they go; whether they are the signed ones."""
        src = self.tar.extractfile(member.info)
        if src is None:
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        h, left = hashlib.sha256(), member.size
        with src, open(target, "wb") as out:
            while left > 0:
                block = src.read(min(CHUNK, left))
                if not block:
                    break
                h.update(block)
                out.write(block)
                left -= len(block)
        target.chmod(0o755 if member.executable else 0o644)
        return left == 0 and "sha256:" + h.hexdigest() == digest

    def extract(self, wanted: Mapping[str, str], into: Path, reporter: Reporter | None = None) -> None:
        """The members named in wanted (name -> sha256) into the folder into (absent or empty), all or none."""
        members = [m for m in self.members.values() if m.name in wanted]
        total = sum(m.size for m in members)
        where = next(p for p in [into, *into.parents] if p.exists())
        free = shutil.disk_usage(where).free
        if total > free:
            raise DiskFull(f"{self.path} unpacks to {total / 1e6:.1f} MB and {where} has {free / 1e6:.1f} MB free",
                           "free some space there, or open the bundle in another folder")
        into.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".unbundling-", dir=into.parent))
        task = (reporter or NullReporter()).task(f"unpacking {self.path.name}", total=total, unit="B")
        try:
            wrong = []
            for m in sorted(members, key=lambda m: m.info.offset):
                try:
                    if not self._write(m, tmp / m.name, wanted[m.name]):
                        wrong.append(m.name)
                except _TAR_ERRORS as exc:
                    raise _broken(self.path, exc) from None
                task.advance(m.size)
            if wrong:
                raise DigestMismatch(f"{self.path}: {len(wrong)} files differ from what its signature covers: "
                                     + "; ".join(f"{n} (changed)" for n in wrong[:4]),
                                     "nothing was built; ask its author for the bundle again (it was changed "
                                     "after signing)")
            if into.exists():
                into.rmdir()  # an empty folder given to open the bundle in
            tmp.rename(into)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            task.close()


def _broken(path: Path, exc: BaseException) -> Corrupt:
    return Corrupt(f"{path} is not a complete tar ({exc})", "ask its author for the bundle again")


@contextmanager
def open_tar(path: Path) -> Iterator[BundleTar]:
    """The bundle at path with its headers read; a tar launcher cannot read is Corrupt."""
    try:
        tar = tarfile.open(path, mode="r:")
    except (*_TAR_ERRORS, OSError) as exc:
        raise _broken(path, exc) from None
    with tar:
        try:
            opened = BundleTar(path, tar)
        except _TAR_ERRORS as exc:
            raise _broken(path, exc) from None
        yield opened
