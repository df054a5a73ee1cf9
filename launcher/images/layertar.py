"""Reading and rewriting one layer tarball in a single streaming pass: its entries, its diff IDs,
and every time clamped to an epoch without changing a size.

A header is patched in place (mtime, the GNU atime/ctime, a pax record's times zero-padded to the
same length) and its checksum recomputed; file data is copied as it is and hashed per entry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from launcher.errors import BuildFailed

BLOCK = 512
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


def _clamp_pax_time(value: bytes, epoch: int) -> bytes:
    """epoch in place of a later time, zero-padded to the same length so no size changes."""
    try:
        if float(value) <= epoch:
            return value
    except ValueError:
        return value
    return str(epoch).encode().rjust(len(value), b"0")


def rewrite_layer(src: IO[bytes], sink: Callable[[bytes], object] | None, epoch: int,
                  *, clamp: bool = True) -> tuple[list[Entry], str, str]:
    """Stream one layer tar from src to sink with times clamped to epoch (sizes never change).

    Returns the entries, the sha256 of the input and the sha256 of the output (the diff IDs).
    With clamp=False the bytes pass through unchanged (a base layer) and are only indexed.
    """
    h_in, h_out = hashlib.sha256(), hashlib.sha256()
    entries: list[Entry] = []
    pending_pax: dict[str, bytes] = {}
    long_name: str | None = None
    long_link: str | None = None

    def emit(b: bytes) -> None:
        h_out.update(b)
        if sink is not None:
            sink(b)

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
                if clamp:
                    recs = [(k, _clamp_pax_time(v, epoch) if k in ("mtime", "atime", "ctime") else v)
                            for k, v in recs]
                    payload = _pax_encode(recs)
            emit(bytes(header))
            emit(payload.ljust(padded, b"\0"))
            continue
        if clamp:
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

