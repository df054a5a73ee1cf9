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
    pass_ = _Rewrite(src, sink, epoch if clamp else None)
    pass_.run()
    return pass_.entries, "sha256:" + pass_.h_in.hexdigest(), "sha256:" + pass_.h_out.hexdigest()


def _text(field: bytes | bytearray) -> str:
    return bytes(field).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


class _Rewrite:
    """One streaming pass over a layer tar: each block read once, hashed in and out, headers patched."""

    def __init__(self, src: IO[bytes], sink: Callable[[bytes], object] | None, epoch: int | None) -> None:
        self.src, self.sink, self.epoch = src, sink, epoch
        self.h_in, self.h_out = hashlib.sha256(), hashlib.sha256()
        self.entries: list[Entry] = []
        # what the meta entries (pax 'x', GNU long name 'L' / long link 'K') say of the next entry
        self.pax: dict[str, bytes] = {}
        self.long_name: str | None = None
        self.long_link: str | None = None

    def emit(self, b: bytes) -> None:
        self.h_out.update(b)
        if self.sink is not None:
            self.sink(b)

    def read(self, n: int) -> bytes:
        data = _read_exact(self.src, n)
        self.h_in.update(data)
        return data

    def run(self) -> None:
        while True:
            block = self.src.read(BLOCK)
            if not block:
                return
            self.h_in.update(block)
            if len(block) < BLOCK:
                self.emit(block)
                return
            if block == b"\0" * BLOCK:
                self.emit(block)
                self.copy_rest()
                return
            header = bytearray(block)
            typeflag = bytes(header[156:157])
            if typeflag in (b"x", b"g", b"L", b"K"):
                self.meta(header, typeflag)
            else:
                self.entry(header, typeflag)

    def copy_rest(self) -> None:
        """After the end-of-archive block: the rest passes through as it is."""
        rest = self.src.read(1 << 20)
        while rest:
            self.h_in.update(rest)
            self.emit(rest)
            rest = self.src.read(1 << 20)

    def meta(self, header: bytearray, typeflag: bytes) -> None:
        size = _num(bytes(header[124:136]))
        padded = _padded(size)
        payload = self.read(padded)[:size]
        if typeflag == b"L":
            self.long_name = _text(payload)
        elif typeflag == b"K":
            self.long_link = _text(payload)
        elif typeflag == b"x":
            recs = _pax_records(payload)
            self.pax.update(recs)
            if self.epoch is not None:
                epoch = self.epoch
                recs = [(k, _clamp_pax_time(v, epoch) if k in ("mtime", "atime", "ctime") else v) for k, v in recs]
                payload = _pax_encode(recs)
        self.emit(bytes(header))
        self.emit(payload.ljust(padded, b"\0"))

    def clamp(self, header: bytearray) -> None:
        if self.epoch is None:
            return
        if _num(bytes(header[136:148])) > self.epoch:
            header[136:148] = _octal(self.epoch, 12)
        if bytes(header[257:265]) == b"ustar  \0":  # GNU format keeps atime/ctime here
            header[345:369] = b"\0" * 24
        _checksum(header)

    def entry(self, header: bytearray, typeflag: bytes) -> None:
        self.clamp(header)
        self.emit(bytes(header))
        name, link = _text(header[0:100]), _text(header[157:257])
        if bytes(header[257:263]) == b"ustar\x00" and (prefix := _text(header[345:500])):
            name = f"{prefix}/{name}"
        size = _num(bytes(header[124:136]))
        if "path" in self.pax:
            name = self.pax["path"].decode("utf-8", "surrogateescape")
        if "linkpath" in self.pax:
            link = self.pax["linkpath"].decode("utf-8", "surrogateescape")
        if "size" in self.pax:
            size = int(self.pax["size"])
        name = self.long_name if self.long_name is not None else name
        link = self.long_link if self.long_link is not None else link
        self.pax, self.long_name, self.long_link = {}, None, None
        digest = self.copy_data(size)
        kind = TYPES.get(typeflag, "?")
        path = name.removeprefix("./").rstrip("/")
        if not path:
            return
        self.entries.append(Entry(
            path=path, kind=kind, mode=_num(bytes(header[100:108])) & 0o7777,
            uid=_num(bytes(header[108:116])), gid=_num(bytes(header[116:124])),
            size=size if kind == "f" else 0,
            digest=digest if kind == "f" else "-",
            link=link if kind in ("l", "h") else "",
        ))

    def copy_data(self, size: int) -> str:
        """Copy one entry's data blocks through; the sha256 of its first `size` bytes."""
        h_file = hashlib.sha256()
        remaining, left = _padded(size), size
        while remaining:
            chunk = self.src.read(min(remaining, 1 << 20))
            if not chunk:
                raise BuildFailed("an image layer ended early", "check the Docker engine's disk and try again")
            self.h_in.update(chunk)
            self.emit(chunk)
            h_file.update(chunk[:left] if left < len(chunk) else chunk)
            left = max(0, left - len(chunk))
            remaining -= len(chunk)
        return "sha256:" + h_file.hexdigest()
