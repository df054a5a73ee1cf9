"""The filesystem tree digest of an image, and normalising an image so that a rebuild
from the same inputs gets the same image ID.

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
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from launcher import proc
from launcher.errors import BuildFailed

BLOCK = 512
DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z, the earliest date a zip entry can carry
TYPES = {b"0": "f", b"\0": "f", b"7": "f", b"1": "h", b"2": "l", b"3": "c", b"4": "b", b"5": "d", b"6": "p"}


@dataclass(frozen=True)
class Entry:
    path: str
    kind: str
    mode: int
    uid: int
    gid: int
    size: int
    digest: str
    link: str

    def line(self) -> str:
        return f"{self.kind} {self.path} {self.mode:o} {self.uid}:{self.gid} {self.size} {self.digest} {self.link}"


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
        h = hashlib.sha256()
        for path in sorted(self.entries):
            h.update(self.entries[path].line().encode("utf-8", "surrogateescape") + b"\n")
        return "sha256:" + h.hexdigest()

    def lines(self) -> dict[str, str]:
        return {p: self.entries[p].line() for p in sorted(self.entries)}


def _num(field: bytes) -> int:
    if field and field[0] & 0x80:
        return int.from_bytes(field, "big") & ~(0x80 << (8 * (len(field) - 1)))
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _octal(value: int, width: int) -> bytes:
    return f"{value:0{width - 1}o}".encode() + b"\0"


def _checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}".encode() + b"\0 "


def _pax_records(data: bytes) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    pos = 0
    while pos < len(data):
        sp = data.index(b" ", pos)
        length = int(data[pos:sp])
        key, _, value = data[sp + 1:pos + length - 1].partition(b"=")
        out.append((key.decode(), value))
        pos += length
    return out


def _pax_encode(records: list[tuple[str, bytes]]) -> bytes:
    out = b""
    for key, value in records:
        body = f" {key}=".encode() + value + b"\n"
        n = len(body)
        while len(str(n + len(str(n)))) != len(str(n)):
            n += 1
        total = n + len(str(n))
        total = len(str(total)) + len(body)
        out += str(total).encode() + body
    return out


def _read_exact(src: IO[bytes], n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = src.read(n - len(buf))
        if not chunk:
            raise BuildFailed("an image layer ended early", "check the Docker engine's disk and try again")
        buf += chunk
    return bytes(buf)


def rewrite_layer(src: IO[bytes], dst: IO[bytes] | None, epoch: int) -> tuple[list[Entry], str, str]:
    """Stream one layer tar from src to dst with mtimes clamped to epoch.

    Returns the entries, the sha256 of the input and the sha256 of the output (the diff IDs).
    """
    h_in, h_out = hashlib.sha256(), hashlib.sha256()
    entries: list[Entry] = []
    pending_pax: dict[str, bytes] = {}
    long_name: str | None = None
    long_link: str | None = None

    def emit(b: bytes) -> None:
        h_out.update(b)
        if dst is not None:
            dst.write(b)

    while True:
        block = src.read(BLOCK)
        if not block:
            break
        h_in.update(block)
        if len(block) < BLOCK:
            emit(block)
            break
        if block == b"\0" * BLOCK:
            emit(block)
            rest = src.read(1 << 20)
            while rest:
                h_in.update(rest)
                emit(rest)
                rest = src.read(1 << 20)
            break
        header = bytearray(block)
        typeflag = bytes(header[156:157])
        size = _num(bytes(header[124:136]))
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        if typeflag in (b"x", b"g", b"L", b"K"):
            data = _read_exact(src, padded)
            h_in.update(data)
            payload = data[:size]
            if typeflag == b"L":
                long_name = payload.rstrip(b"\0").decode("utf-8", "surrogateescape")
            elif typeflag == b"K":
                long_link = payload.rstrip(b"\0").decode("utf-8", "surrogateescape")
            elif typeflag == b"x":
                recs = _pax_records(payload)
                pending_pax.update(recs)
                recs = [(k, v) for k, v in recs if k not in ("atime", "ctime")]
                recs = [(k, str(min(int(float(v)), epoch)).encode() if k == "mtime" else v) for k, v in recs]
                payload = _pax_encode(recs)
                size = len(payload)
                padded = (size + BLOCK - 1) // BLOCK * BLOCK
                header[124:136] = _octal(size, 12)
            _checksum(header)
            emit(bytes(header))
            emit(payload.ljust(padded, b"\0"))
            continue
        mtime = _num(bytes(header[136:148]))
        if mtime > epoch:
            header[136:148] = _octal(epoch, 12)
        if bytes(header[257:265]) == b"ustar  \0":  # GNU format keeps atime/ctime here
            header[345:369] = b"\0" * 24
        _checksum(header)
        emit(bytes(header))
        name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if bytes(header[257:263]) == b"ustar\x00":
            prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if prefix:
                name = f"{prefix}/{name}"
        link = header[157:257].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if "path" in pending_pax:
            name = pending_pax["path"].decode("utf-8", "surrogateescape")
        if "linkpath" in pending_pax:
            link = pending_pax["linkpath"].decode("utf-8", "surrogateescape")
        if "size" in pending_pax:
            size = int(pending_pax["size"])
            padded = (size + BLOCK - 1) // BLOCK * BLOCK
        name = long_name if long_name is not None else name
        link = long_link if long_link is not None else link
        pending_pax, long_name, long_link = {}, None, None
        h_file = hashlib.sha256()
        remaining = padded
        left = size
        while remaining:
            chunk = src.read(min(remaining, 1 << 20))
            if not chunk:
                raise BuildFailed("an image layer ended early", "check the Docker engine's disk and try again")
            h_in.update(chunk)
            emit(chunk)
            h_file.update(chunk[:left] if left < len(chunk) else chunk)
            left = max(0, left - len(chunk))
            remaining -= len(chunk)
        kind = TYPES.get(typeflag, "?")
        path = name.removeprefix("./").rstrip("/")
        if not path:
            continue
        entries.append(Entry(
            path=path, kind=kind, mode=_num(bytes(header[100:108])) & 0o7777,
            uid=_num(bytes(header[108:116])), gid=_num(bytes(header[116:124])),
            size=size if kind == "f" else 0,
            digest=("sha256:" + h_file.hexdigest()) if kind == "f" else "-",
            link=link if kind in ("l", "h") else "",
        ))
    return entries, "sha256:" + h_in.hexdigest(), "sha256:" + h_out.hexdigest()


@dataclass(frozen=True)
class Normalized:
    image_id: str
    tree_digest: str
    tree: dict[str, str]


def _normalize_config(config: dict[str, Any], diff_ids: list[str], epoch: int) -> bytes:
    from datetime import datetime, timezone

    stamp = datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cfg = dict(config)
    cfg.pop("container", None)
    cfg.pop("container_config", None)
    cfg["created"] = stamp
    inner = dict(cfg.get("config") or {})
    inner["Image"] = ""
    inner["Hostname"] = ""
    cfg["config"] = inner
    cfg["history"] = [{**h, "created": stamp} for h in cfg.get("history", [])]
    cfg["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    return json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()


def _iter_save(image: str) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    p = proc.popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    with tarfile.open(fileobj=p.stdout, mode="r|") as tar:
        for member in tar:
            yield member, tar.extractfile(member) if member.isfile() else None
    err = p.stderr.read().decode() if p.stderr else ""
    if p.wait() != 0:
        raise BuildFailed(f"docker save {image} failed: {err.strip()[:200]}", "check the Docker engine")


def normalize(image: str, *, tag: str, base_diff_ids: list[str], epoch: int = DEFAULT_EPOCH,
              workdir: Path | None = None) -> Normalized:
    """Rewrite image so its ID depends only on its content; load it as tag."""
    base = set(base_diff_ids)
    with tempfile.TemporaryDirectory(prefix="launcher-norm-", dir=workdir) as tmp:
        tmpdir = Path(tmp)
        layers: dict[str, tuple[list[Entry], str, str, Path | None]] = {}
        manifest: list[dict[str, Any]] = []
        configs: dict[str, bytes] = {}
        for n, (member, stream) in enumerate(_iter_save(image)):
            if stream is None:
                continue
            if member.name.endswith("/layer.tar"):
                out = tmpdir / f"layer{n}.tar"
                with open(out, "wb") as dst:
                    entries, d_in, d_out = rewrite_layer(stream, dst, epoch)
                if d_in in base:
                    out.unlink()
                    layers[member.name] = (entries, d_in, d_in, None)
                else:
                    layers[member.name] = (entries, d_in, d_out, out)
            elif member.name == "manifest.json":
                manifest = json.loads(stream.read())
            elif member.name.endswith(".json") and "/" not in member.name:
                configs[member.name] = stream.read()
        if len(manifest) != 1:
            raise BuildFailed(f"docker save {image} gave {len(manifest)} images", "save exactly one image")
        config = json.loads(configs[manifest[0]["Config"]])
        order = manifest[0]["Layers"]
        tree = Tree()
        diff_ids: list[str] = []
        for name in order:
            entries, _d_in, d_out, _path = layers[name]
            tree.apply_layer(entries)
            diff_ids.append(d_out)
        cfg_bytes = _normalize_config(config, diff_ids, epoch)
        image_id = "sha256:" + hashlib.sha256(cfg_bytes).hexdigest()
        _load(tag, cfg_bytes, image_id, [layers[name][3] for name in order], tmpdir)
        return Normalized(image_id=image_id, tree_digest=tree.digest(), tree=tree.lines())


def _load(tag: str, cfg_bytes: bytes, image_id: str, layer_files: list[Path | None], tmpdir: Path) -> None:
    p = proc.popen(["docker", "load", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE)
    assert p.stdin is not None
    names = [f"{i:03d}/layer.tar" for i in range(len(layer_files))]
    man = [{"Config": f"{image_id[7:]}.json", "RepoTags": [tag], "Layers": names}]
    try:
        with tarfile.open(fileobj=p.stdin, mode="w|", format=tarfile.PAX_FORMAT) as out:
            for name, path in zip(names, layer_files, strict=True):
                info = tarfile.TarInfo(name)
                if path is None:  # the engine has this layer already: an empty file is enough
                    info.size = 0
                    out.addfile(info, io.BytesIO(b""))
                else:
                    info.size = path.stat().st_size
                    with open(path, "rb") as f:
                        out.addfile(info, f)
            for name, data in ((man[0]["Config"], cfg_bytes), ("manifest.json", json.dumps(man).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
        p.stdin.close()
    except BrokenPipeError:
        pass
    err = p.stderr.read().decode() if p.stderr else ""
    if p.wait() != 0:
        raise BuildFailed(f"docker load of the normalised image failed: {err.strip()[:300]}",
                          "check the Docker engine's disk space")


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
