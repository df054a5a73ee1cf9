"""The .deb files of a system lock: fetched on this machine into launcher's cache (`<cache>/debs/<sha256
hex>.deb`), each verified against the sha256 the lock took from the archive's Packages index, and
unpacked into a folder for the project layer by reading the .deb itself (ar + tar, in Python).

Nothing is installed: no maintainer script (preinst, postinst, triggers) runs, so what those scripts would
do (alternatives links, users and groups, the ld.so cache, services) does not happen; `unpack` lists the
scripts it skipped. The ld.so cache is not needed for libraries in Debian's own directories: Debian's
dynamic loader searches the multiarch folders (/usr/lib/<triplet>) without it. A package that adds a
folder of its own through /etc/ld.so.conf.d is reported in `Unpacked.ld_conf`.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import ssl
import stat
import tarfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from launcher import proc
from launcher.errors import BuildFailed, Corrupt, HostUnreachable, LockFailed, NotFound, UnsafePath
from launcher.hashing import CHUNK, atomic_path
from launcher.images.aptplan import DebPackage
from launcher.progress import NullReporter, Reporter

AREA = "debs"
TIMEOUT_S = 60.0
SCRIPTS = ("preinst", "postinst", "prerm", "postrm", "config", "triggers")


class SystemLock(Protocol):
    """What this module needs of a system lock (launcher.images.aptlock.SystemLock, which imports this)."""

    @property
    def packages(self) -> Sequence[DebPackage]: ...

    @property
    def base_links(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Entry:
    """One unpacked entry, as a layer writer needs it (modes and owners as the .deb has them)."""

    path: str  # relative posix path in the image, merged-/usr links applied
    kind: str  # dir | file | symlink | hardlink
    mode: int  # permission bits, setuid/setgid/sticky included
    uid: int
    gid: int
    target: str = ""  # a symlink's target as written; a hardlink's image path
    package: str = ""


@dataclass(frozen=True)
class Unpacked:
    root: Path
    entries: tuple[Entry, ...]  # sorted by path; a later .deb's entry replaces an earlier one's
    scripts: dict[str, tuple[str, ...]] = field(default_factory=dict)  # package -> maintainer scripts not run
    ld_conf: tuple[str, ...] = ()  # files under etc/ld.so.conf.d the packages ship


def cache_path(cache_dir: Path, sha256: str) -> Path:
    return cache_dir / AREA / f"{sha256.removeprefix('sha256:')}.deb"


def _hash_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
            size += len(block)
    return "sha256:" + h.hexdigest(), size


def verify(path: Path, pkg: DebPackage) -> None:
    """Corrupt unless the cached file is exactly the locked .deb; a bad one is renamed *.corrupt, so
    nothing is left looking complete (the next fetch downloads it again)."""
    digest, size = _hash_file(path)
    if digest != pkg.sha256 or size != pkg.size:
        bad = path.with_name(path.name + ".corrupt")
        os.replace(path, bad)
        raise Corrupt(f"the cached {pkg.filename} ({path}) does not match system.lock: sha256 {digest[7:23]}... "
                      f"({size} bytes), locked {pkg.sha256[7:23]}... ({pkg.size} bytes); moved aside to {bad.name}",
                      "run the command again to download it afresh; if the archive serves the same bytes, "
                      "the lock or the mirror was tampered with")


def _opener(ca_bundle: Path | None) -> urllib.request.OpenerDirector:
    """urllib with this machine's proxy variables (http_proxy, no_proxy...) and CA bundle, as pip is given."""
    context = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
    return urllib.request.build_opener(urllib.request.ProxyHandler(), urllib.request.HTTPSHandler(context=context))


def download(pkg: DebPackage, target: Path, opener: urllib.request.OpenerDirector) -> None:
    """pkg's .deb into target, verified on the way (a temporary name, renamed only when it matches)."""
    if not pkg.url.startswith(("http://", "https://")):
        raise LockFailed(f"{pkg.name} {pkg.version} comes from {pkg.url}, which launcher cannot download here",
                         "use apt sources served over http(s) in the base image")
    try:
        with opener.open(pkg.url, timeout=TIMEOUT_S) as resp, atomic_path(target) as tmp:
            h = hashlib.sha256()
            size = 0
            with open(tmp, "wb") as out:
                for block in iter(lambda: resp.read(CHUNK), b""):
                    h.update(block)
                    size += len(block)
                    out.write(block)
            if "sha256:" + h.hexdigest() != pkg.sha256 or size != pkg.size:
                raise Corrupt(f"{pkg.url} served {size} bytes with sha256 {h.hexdigest()[:16]}..., but system.lock "
                              f"locks {pkg.name} {pkg.version} as {pkg.size} bytes, {pkg.sha256[7:23]}...; "
                              "nothing was kept",
                              "check the mirror or proxy; if the archive changed the file, regenerate the lock "
                              "with `launcher lock PROJECT --upgrade`")
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            raise NotFound(f"the archive no longer serves {pkg.name} {pkg.version} (HTTP {exc.code} for {pkg.url}); "
                           "Debian keeps only current versions and this .deb is not in launcher's cache",
                           "lock the current versions with `launcher lock PROJECT --upgrade`, or put the .deb "
                           f"into {target.parent} as {target.name}") from None
        raise HostUnreachable(f"downloading {pkg.url} failed: HTTP {exc.code} {exc.reason}",
                              "check the network and proxy (http_proxy), then run the command again") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HostUnreachable(f"cannot download {pkg.name} {pkg.version} from {pkg.url}: {reason}",
                              "check the network and proxy (http_proxy, no_proxy), then run the command again; "
                              ".debs already in the cache need no network") from None


def fetch(lock: SystemLock, cache_dir: Path, reporter: Reporter | None = None, *,
          ca_bundle: Path | None = None) -> list[Path]:
    """The lock's .debs in launcher's cache (`cache_dir/debs/<hex>.deb`), in the lock's order, each verified
    against its sha256: cached ones without the network, the rest downloaded on this machine."""
    rep = reporter or NullReporter()
    paths = [cache_path(cache_dir, p.sha256) for p in lock.packages]
    missing = [(p, path) for p, path in zip(lock.packages, paths, strict=True) if not path.is_file()]
    for p, path in zip(lock.packages, paths, strict=True):
        if path.is_file():
            verify(path, p)
    if missing:
        from launcher.images.lock import default_ca_bundle

        opener = _opener(ca_bundle or default_ca_bundle())
        task = rep.task(f"downloading {len(missing)} .deb file(s)", total=len(missing))
        try:
            for p, path in missing:
                download(p, path, opener)
                task.advance(1)
        finally:
            task.close()
    return paths


def ar_members(data: bytes, source: str) -> dict[str, bytes]:
    """The members of an ar archive (a .deb's outer format), by name."""
    if not data.startswith(b"!<arch>\n"):
        raise Corrupt(f"{source} is not a .deb (no ar header)", "delete it and fetch it again")
    out: dict[str, bytes] = {}
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        if header[58:60] != b"`\n":
            raise Corrupt(f"{source}: damaged ar member header at byte {pos}", "delete it and fetch it again")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip() or 0)
        out[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
    return out


def _tar(members: dict[str, bytes], prefix: str, source: str) -> tarfile.TarFile:
    name = next((n for n in members if n.startswith(prefix)), None)
    if name is None:
        raise Corrupt(f"{source} has no {prefix}* member", "delete it and fetch it again")
    blob = members[name]
    if name.endswith(".zst"):  # Python's tarfile reads gz, xz and bz2; zstd needs the zstd tool
        blob = proc.run(["zstd", "-dc"], input=blob).stdout
    return tarfile.open(fileobj=io.BytesIO(blob), mode="r:*")


def _image_path(name: str, base_links: Mapping[str, str], source: str) -> str:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise UnsafePath(f"{source} holds an entry outside its root: {name!r}", "do not use this .deb")
    if parts and parts[0] in base_links:  # ./lib/x.so on a merged-/usr base is usr/lib/x.so
        parts = [*base_links[parts[0]].split("/"), *parts[1:]]
    return "/".join(parts)


def _no_link_above(root: Path, rel: str, source: str) -> Path:
    """root/rel, refused when a folder on the way is a symlink (an entry must not write through a link)."""
    here = root
    for part in rel.split("/")[:-1]:
        here = here / part
        if here.is_symlink():
            raise UnsafePath(f"{source}: {rel} would be written through the symlink {here.relative_to(root)}",
                             "do not use this .deb")
        if not here.exists():
            here.mkdir(mode=0o755)
    return root / rel


def _clear(path: Path, source: str) -> None:
    """Make room for a file or link at path: a file or link there goes (a later .deb's wins), a folder stays."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        raise BuildFailed(f"{source} holds a file at {path.name} where another package has a folder",
                          "leave one of the two packages out of [system] apt")


def _extract(tar: tarfile.TarFile, root: Path, base_links: Mapping[str, str], package: str,
             entries: dict[str, Entry], source: str) -> None:
    for m in tar:
        rel = _image_path(m.name, base_links, source)
        if not rel:
            continue
        path = _no_link_above(root, rel, source)
        mode = stat.S_IMODE(m.mode)
        if m.isdir():
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                path.unlink()
            path.mkdir(exist_ok=True)
            os.chmod(path, mode)
            entries[rel] = Entry(rel, "dir", mode, m.uid, m.gid, package=package)
        elif m.isreg():
            _clear(path, source)
            src = tar.extractfile(m)
            assert src is not None
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
            os.chmod(path, mode)
            os.utime(path, (m.mtime, m.mtime))
            entries[rel] = Entry(rel, "file", mode, m.uid, m.gid, package=package)
        elif m.issym():
            _clear(path, source)
            os.symlink(m.linkname, path)
            entries[rel] = Entry(rel, "symlink", 0o777, m.uid, m.gid, m.linkname, package)
        elif m.islnk():
            target = _image_path(m.linkname, base_links, source)
            _clear(path, source)
            os.link(_no_link_above(root, target, source), path)
            entries[rel] = Entry(rel, "hardlink", mode, m.uid, m.gid, target, package)
        else:
            raise BuildFailed(f"{source} holds {rel}, a device or fifo, which a project layer cannot carry",
                              "leave that package out of [system] apt")


def unpack(debs: Sequence[Path], into: Path, *, base_links: Mapping[str, str]) -> Unpacked:
    """The files of each .deb (in the order given: the lock's) extracted into `into`, with the paths they
    take in the image: top-level folders that are links in the base (merged /usr: `lib` -> `usr/lib`,
    from `SystemLock.base_links`) followed, so the layer never replaces such a link with a folder.
    Modes kept; owners are the .deb's in `Unpacked.entries` (set on disk only when running as root).
    The same .debs give the same files and entries. No maintainer script is run."""
    into.mkdir(parents=True, exist_ok=True)
    entries: dict[str, Entry] = {}
    scripts: dict[str, tuple[str, ...]] = {}
    for deb in debs:
        members = ar_members(deb.read_bytes(), str(deb))
        with _tar(members, "control.tar", str(deb)) as control:
            names = {Path(n).name: n for n in control.getnames()}
            package = _control_field(control, names.get("control"), "Package") or deb.stem
            scripts[package] = tuple(s for s in SCRIPTS if s in names)
        with _tar(members, "data.tar", str(deb)) as data:
            _extract(data, into, base_links, package, entries, str(deb))
    for rel in list(entries):  # folders made on the way (a .deb normally lists each of its own)
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent not in entries:
                entries[parent] = Entry(parent, "dir", 0o755, 0, 0, package=entries[rel].package)
    if os.geteuid() == 0:
        for e in entries.values():
            os.lchown(into / e.path, e.uid, e.gid)
            if e.kind != "symlink":
                os.chmod(into / e.path, e.mode)  # chown clears setuid and setgid
    ordered = tuple(entries[k] for k in sorted(entries))
    ld_conf = tuple(e.path for e in ordered if e.path.startswith("etc/ld.so.conf.d/") and e.kind != "dir")
    return Unpacked(into, ordered, {k: v for k, v in sorted(scripts.items()) if v}, ld_conf)


def _control_field(control: tarfile.TarFile, member: str | None, key: str) -> str | None:
    if member is None:
        return None
    f = control.extractfile(member)
    text = f.read().decode("utf-8", "replace") if f is not None else ""
    for line in text.splitlines():
        if line.startswith(f"{key}:"):
            return line.split(":", 1)[1].strip()
    return None


def unpack_lock(lock: SystemLock, cache_dir: Path, into: Path, reporter: Reporter | None = None,
                **fetch_kw: Any) -> Unpacked:
    """fetch, then unpack: the lock's files in `into`, ready for a layer."""
    return unpack(fetch(lock, cache_dir, reporter, **fetch_kw), into, base_links=lock.base_links)
