"""Figures compared by what they draw: PNG, PDF and SVG with the stamps their writers add set aside.

A plotting library stamps every save: a PDF's ``/CreationDate`` and ``/Producer``, a PNG's ``tIME``
chunk and ``Software`` text, an SVG's ``<dc:date>``, its creator comment and the ids matplotlib draws
at random for clip paths and markers (``svg.hashsalt`` unset). The determinism profile sets
``SOURCE_DATE_EPOCH``, which most writers honour, but a figure from another writer, or from a run
without the profile, still carries them. So each format is read here without those parts (named as
the volatile parts of the answer) and compared by the rest: a PNG by its header and decompressed
pixels, a PDF by its bytes with the stamps and the byte offsets (xref) masked, an SVG by its text
with the stamps removed and the ids renumbered in document order.

A file that still differs says where (a PNG's pixel rows, a PDF's object, an SVG's line) and, when
the differing bytes look like a date, says so (:func:`date_hint`): a writer that stamps the time
and does not honour SOURCE_DATE_EPOCH.
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

from launcher.verify.contentlogs import ContentDiff

MAX_FIGURE_BYTES = 512 << 20  # read whole; a larger file is not compared by content (unreadable)
MAX_PIXEL_BYTES = 1 << 30  # a PNG whose pixels would decompress to more is refused (a decompression bomb)

# A date or time written into a file: PDF's D:YYYYMMDDHHmmSS, ISO 8601, EXIF's YYYY:MM:DD HH:MM:SS,
# ctime's "Sat Nov 28 10:55:00 2026", and a Unix time in seconds (2001 to 2033).
_DATE = re.compile(
    rb"D:\d{8,14}"
    rb"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
    rb"|\d{4}:\d{2}:\d{2} \d{2}:\d{2}:\d{2}"
    rb"|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d{2}:\d{2}:\d{2}"
    rb"|(?<![0-9])1[0-9]{9}(?![0-9])")
_DATE_WINDOW = 40  # bytes around the first difference searched for a date


def _read(path: Path) -> bytes:
    size = path.stat().st_size
    if size > MAX_FIGURE_BYTES:
        raise ValueError(f"{size} bytes: larger than the {MAX_FIGURE_BYTES >> 20} MiB compared by content")
    return path.read_bytes()


def first_difference(a: bytes, b: bytes) -> int | None:
    """The offset of the first byte where a and b differ (the shorter's length if one is a prefix); None if equal."""
    if a == b:
        return None
    n = min(len(a), len(b))
    lo, hi = 0, n  # a[:lo] == b[:lo]; halving keeps the comparisons to slices, not a byte loop
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return lo


def _date_at(data: bytes, offset: int) -> bytes | None:
    start = max(0, offset - _DATE_WINDOW)
    for found in _DATE.finditer(data, start, offset + _DATE_WINDOW):
        if found.start() <= offset + 1 and found.end() >= offset:
            return found.group(0)
    return None


def date_hint(a: bytes, b: bytes, offset: int | None = None) -> str | None:
    """When the bytes where a and b first differ are a date or time in both, a phrase naming both; else None."""
    at = first_difference(a, b) if offset is None else offset
    if at is None:
        return None
    da, db = _date_at(a, at), _date_at(b, at)
    if da is None or db is None or da == db:
        return None
    show = (da.decode("ascii", "replace"), db.decode("ascii", "replace"))
    return (f"the differing bytes look like a date ({show[0]} -> {show[1]}): the writer stamps the time and does not "
            "honour SOURCE_DATE_EPOCH")


def file_date_hint(a: Path, b: Path, limit: int = 64 << 20) -> str | None:
    """:func:`date_hint` for two files of a format not compared by content (each read up to limit bytes)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return date_hint(fa.read(limit), fb.read(limit))


# ---------------------------------------------------------------- PNG

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_TEXT_CHUNKS = (b"tEXt", b"zTXt", b"iTXt")
# Text keywords a writer fills with its own name or the time (PNG's own, ImageMagick's, XMP's).
_PNG_VOLATILE_KEYS = frozenset({"creation time", "software", "date", "date:create", "date:modify", "date:timestamp",
                                "modify date", "create date", "producer", "creator tool"})
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("no PNG signature")
    out, at = [], len(PNG_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if at + 12 + length > len(data):
            raise ValueError(f"chunk {kind!r} runs past the end of the file")
        out.append((kind, data[at + 8:at + 8 + length]))
        at += 12 + length
        if kind == b"IEND":
            break
    return out


def _png_key(kind: bytes, body: bytes) -> str:
    return body.split(b"\0", 1)[0].decode("latin-1") if kind in _TEXT_CHUNKS else ""


def _png_parts(data: bytes) -> tuple[bytes, list[tuple[bytes, bytes]], dict[str, bytes], bytes]:
    """(IHDR, the other chunks in order, the volatile parts by name, the compressed pixel stream)."""
    header, kept, volatile, idat = b"", [], {}, []
    for kind, body in _png_chunks(data):
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"tIME":
            volatile["tIME chunk (modification time)"] = body
        elif kind in _TEXT_CHUNKS and _png_key(kind, body).lower() in _PNG_VOLATILE_KEYS:
            volatile[f"text {_png_key(kind, body)}"] = body
        elif kind != b"IEND":
            kept.append((kind, body))
    if len(header) != 13:
        raise ValueError("no IHDR chunk")
    return header, kept, volatile, b"".join(idat)


def _png_geometry(header: bytes) -> tuple[int, int, int, bool]:
    """(width, height, bytes per row with its filter byte, interlaced) from IHDR."""
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if colour not in _CHANNELS:
        raise ValueError(f"colour type {colour} is not a PNG colour type")
    stride = 1 + (width * _CHANNELS[colour] * depth + 7) // 8
    if stride * height > MAX_PIXEL_BYTES:
        raise ValueError(f"{width}x{height} pixels: more than {MAX_PIXEL_BYTES >> 20} MiB decompressed")
    return width, height, stride, interlace == 1


def _inflate(stream: bytes, limit: int) -> bytes:
    z = zlib.decompressobj()
    out = z.decompress(stream, limit + 1)
    if len(out) > limit:
        raise ValueError("the pixel data decompresses to more than its header allows")
    return out


def _describe_ihdr(header: bytes) -> str:
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    return f"{width}x{height}, {depth}-bit colour type {colour}" + (", interlaced" if interlace else "")


def _pixel_rows(pa: bytes, pb: bytes, stride: int, height: int) -> str:
    rows = [r for r in range(height) if pa[r * stride:(r + 1) * stride] != pb[r * stride:(r + 1) * stride]]
    if not rows:
        return f"pixel data differs in length ({len(pa)} -> {len(pb)} bytes)"
    return f"pixels differ in {len(rows)} of {height} rows (first row {rows[0]})"


def compare_png(a: Path, b: Path) -> ContentDiff:
    da, db = _read(a), _read(b)
    ha, ka, va, ia = _png_parts(da)
    hb, kb, vb, ib = _png_parts(db)
    volatile = [name for name in dict.fromkeys([*va, *vb]) if va.get(name) != vb.get(name)]
    if ha != hb:
        return ContentDiff("png", False, volatile, f"image header: {_describe_ihdr(ha)} -> {_describe_ihdr(hb)}")
    _, height, stride, interlaced = _png_geometry(ha)
    pa, pb = _inflate(ia, stride * height), _inflate(ib, stride * height)
    if pa != pb:
        where = "pixels differ (interlaced image)" if interlaced else _pixel_rows(pa, pb, stride, height)
        return ContentDiff("png", False, volatile, where)
    if ka != kb:
        i = next((i for i, (x, y) in enumerate(zip(ka, kb, strict=False)) if x != y), min(len(ka), len(kb)))
        kind, body = ka[i] if i < len(ka) else kb[i]
        key = _png_key(kind, body)
        hint = date_hint(ka[i][1], kb[i][1]) if i < min(len(ka), len(kb)) else None
        return ContentDiff("png", False, volatile, f"chunk {kind.decode('latin-1')}{' ' + key if key else ''} differs"
                           + (f"; {hint}" if hint else ""))
    if ia != ib and not volatile:
        volatile = ["pixel compression (the same pixels)"]
    return ContentDiff("png", True, volatile)


# ---------------------------------------------------------------- PDF

# Info-dictionary entries a writer fills with the time or its own name: the value (a literal string
# with balanced parentheses and escapes, or a hex string) is masked.
_PDF_LITERAL = rb"\((?:\\.|[^\\()]|\((?:\\.|[^\\()])*\))*\)"
_PDF_HEX = rb"<[0-9A-Fa-f\s]*>"
_PDF_STRING = _PDF_LITERAL + rb"|" + _PDF_HEX
_PDF_STAMPS = {
    "/CreationDate": "creation date", "/ModDate": "modification date", "/Producer": "producer",
    "/Creator": "creator",
}
_PDF_STAMP = re.compile(rb"(/CreationDate|/ModDate|/Producer|/Creator)\s*(" + _PDF_STRING + rb")")
_PDF_ID = re.compile(rb"/ID\s*\[\s*(?:" + _PDF_STRING + rb")\s*(?:" + _PDF_STRING + rb")\s*\]")
# XMP metadata left uncompressed: its dates, the writer's name and the document's random ids.
_XMP_STAMP = re.compile(rb"<(xmp:CreateDate|xmp:ModifyDate|xmp:MetadataDate|pdf:Producer|xmp:CreatorTool|"
                        rb"xmpMM:DocumentID|xmpMM:InstanceID)>[^<]*</\1>")
_XMP_NAMES = {b"xmp:CreateDate": "XMP dates", b"xmp:ModifyDate": "XMP dates", b"xmp:MetadataDate": "XMP dates",
              b"pdf:Producer": "producer", b"xmp:CreatorTool": "creator", b"xmpMM:DocumentID": "XMP document ids",
              b"xmpMM:InstanceID": "XMP document ids"}
# Byte offsets that move when a masked value changes length: the xref table (to its trailer), an
# xref stream's object, and startxref's number.
_PDF_XREF = re.compile(rb"(?:^|[\r\n])xref\s*[\r\n].*?(?=trailer)", re.DOTALL)
_PDF_STARTXREF = re.compile(rb"startxref\s+\d+")
_PDF_OBJ = re.compile(rb"(?<![0-9])(\d+)\s+(\d+)\s+obj\b")


def _pdf_masked(data: bytes) -> tuple[bytes, dict[str, list[bytes]]]:
    """The file with its stamps and offsets masked, and the masked values by what they are."""
    if not data.startswith(b"%PDF-"):
        raise ValueError("no %PDF- header")
    found: dict[str, list[bytes]] = {}

    def stamp(m: re.Match[bytes]) -> bytes:
        found.setdefault(_PDF_STAMPS[m.group(1).decode()], []).append(m.group(2))
        return m.group(1) + b" (masked)"

    def xmp(m: re.Match[bytes]) -> bytes:
        found.setdefault(_XMP_NAMES[m.group(1)], []).append(m.group(0))
        return b"<" + m.group(1) + b"/>"

    def ident(m: re.Match[bytes]) -> bytes:
        found.setdefault("document ids", []).append(m.group(0))
        return b"/ID [masked]"

    out = _PDF_STAMP.sub(stamp, data)
    out = _XMP_STAMP.sub(xmp, out)
    out = _PDF_ID.sub(ident, out)
    out = _PDF_XREF.sub(b"\nxref masked\n", out)
    out = _PDF_STARTXREF.sub(b"startxref masked", out)
    return out, found


def _pdf_object_at(data: bytes, offset: int) -> str:
    """Which object holds the byte at offset (the last `N G obj` before it), and whether it is in its stream."""
    last = None
    for m in _PDF_OBJ.finditer(data, 0, offset + 1):
        last = m
    if last is None:
        return "before the first object (the header)"
    head = data[last.start():offset]
    inside = b"stream" in head and b"endstream" not in head.rsplit(b"stream", 1)[-1]
    return f"object {int(last.group(1))}" + (" (in its stream)" if inside else "")


def compare_pdf(a: Path, b: Path) -> ContentDiff:
    da, db = _read(a), _read(b)
    ma, fa = _pdf_masked(da)
    mb, fb = _pdf_masked(db)
    volatile = [what for what in dict.fromkeys([*fa, *fb]) if fa.get(what) != fb.get(what)]
    at = first_difference(ma, mb)
    if at is None:
        return ContentDiff("pdf", True, volatile or (["byte offsets (xref)"] if da != db else []))
    hint = date_hint(ma, mb, at)
    return ContentDiff("pdf", False, volatile, f"{_pdf_object_at(ma, at)} differs" + (f"; {hint}" if hint else ""))


# ---------------------------------------------------------------- SVG

# A comment naming the writer (Inkscape's "Created with", Illustrator's "Generator:"); other comments
# are content (matplotlib writes each tick label's text as one).
_SVG_COMMENT = re.compile(r"<!--\s*(?:Created with|Generator:|Generated by)[^>]*?-->", re.IGNORECASE)
_SVG_STAMPS = (
    ("date", re.compile(r"<dc:date>[^<]*</dc:date>")),
    ("creator", re.compile(r"<dc:creator>.*?</dc:creator>", re.DOTALL)),
    ("XMP dates", re.compile(r"<xmp:(CreateDate|ModifyDate|MetadataDate)>[^<]*</xmp:\1>")),
    ("creator", re.compile(r"<xmp:CreatorTool>[^<]*</xmp:CreatorTool>")),
    ("creator", re.compile(r"\binkscape:version=\"[^\"]*\"")),
)
_SVG_ID = re.compile(r"\bid=\"([^\"]+)\"")
_SVG_REF = re.compile(r"(\bid=\"|#)([^\"'()\s,;]+)")


def _svg_normal(text: str) -> tuple[str, dict[str, list[str]], bool]:
    """(the text without stamps, ids renumbered in document order; the stamps; whether ids were renamed)."""
    found: dict[str, list[str]] = {}
    comments = _SVG_COMMENT.findall(text)
    if comments:
        found["the writer's comment"] = comments
    text = _SVG_COMMENT.sub("", text)
    for name, pattern in _SVG_STAMPS:
        hits = [m.group(0) for m in pattern.finditer(text)]
        if hits:
            found.setdefault(name, []).extend(hits)
            text = pattern.sub("", text)
    ids = {old: f"id{n}" for n, old in enumerate(dict.fromkeys(_SVG_ID.findall(text)), 1)}

    def rename(m: re.Match[str]) -> str:
        new = ids.get(m.group(2))
        return m.group(1) + new if new is not None else m.group(0)

    renamed = _SVG_REF.sub(rename, text)
    return renamed, found, any(old != new for old, new in ids.items())


def _svg_line(na: str, nb: str) -> str:
    la, lb = na.splitlines(), nb.splitlines()
    for n, (x, y) in enumerate(zip(la, lb, strict=False), 1):
        if x != y:
            hint = date_hint(x.encode(), y.encode())
            return f"line {n}: {_clip(x)} -> {_clip(y)}" + (f"; {hint}" if hint else "")
    return f"{len(la)} lines -> {len(lb)}"


def _clip(line: str, width: int = 60) -> str:
    line = line.strip()
    return repr(line if len(line) <= width else line[:width - 3] + "...")


def compare_svg(a: Path, b: Path) -> ContentDiff:
    ta, tb = _read(a).decode("utf-8"), _read(b).decode("utf-8")
    if "<svg" not in ta or "<svg" not in tb:
        raise ValueError("no <svg> element")
    na, fa, ra = _svg_normal(ta)
    nb, fb, rb = _svg_normal(tb)
    volatile = [what for what in dict.fromkeys([*fa, *fb]) if fa.get(what) != fb.get(what)]
    if na != nb:
        return ContentDiff("svg", False, volatile, _svg_line(na, nb))
    if (ra or rb) and _SVG_ID.findall(ta) != _SVG_ID.findall(tb):
        volatile.append("element ids (drawn at random: matplotlib's svg.hashsalt unset)")
    return ContentDiff("svg", True, volatile)

