"""Figures compared by what they draw (launcher.verify.contentfigures): matplotlib's PDF, PNG and SVG saves
of one figure at two dates are identical in content with their stamps named; a figure of other values
differs and says where; differing bytes that look like a date say so; a hostile file is unreadable, never
a difference. Figures are made here by matplotlib (the dev extra), as a script's savefig makes them."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import pytest
from conftest import need
from runfactory import make_workspace, pair, refresh_manifest

from launcher.errors import ExitCode
from launcher.verify.content import compare_files
from launcher.verify.contentfigures import date_hint, first_difference
from launcher.verify.differences import IDENTICAL_CONTENT, UNREADABLE
from launcher.verify.evidence import KIND_FIGURE, kind_of
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace


def _figure(monkeypatch: pytest.MonkeyPatch, fmt: str, epoch: int, values: tuple[float, ...] = (1, 3, 2),
            **kwargs: object) -> bytes:
    """A line plot saved as fmt with matplotlib, its clock set by SOURCE_DATE_EPOCH."""
    try:
        import matplotlib
    except ImportError:
        need(False, "matplotlib is not installed (pip install -e '.[dev]')")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(epoch))
    fig, ax = plt.subplots(figsize=(3, 2), dpi=50)
    ax.plot(range(len(values)), values)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, **kwargs)  # type: ignore[arg-type]
    plt.close(fig)
    return buf.getvalue()


def _pair(tmp_path: Path, name: str, a: bytes, b: bytes) -> tuple[Path, Path]:
    (tmp_path / "a").mkdir(exist_ok=True)
    (tmp_path / "b").mkdir(exist_ok=True)
    (tmp_path / "a" / name).write_bytes(a)
    (tmp_path / "b" / name).write_bytes(b)
    return tmp_path / "a" / name, tmp_path / "b" / name


@pytest.mark.parametrize(("fmt", "stamps"), [
    ("pdf", ["creation date"]),
    ("svg", ["date", "element ids (drawn at random: matplotlib's svg.hashsalt unset)"]),
    ("png", ["text Creation Time"]),
])
def test_two_saves_of_one_figure_at_two_dates_are_identical_in_content(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, stamps: list[str]) -> None:
    # matplotlib writes no date into a PNG; a caller can (PIL and others do): here by hand
    dated = (lambda when: {"metadata": {"Creation Time": when}}) if fmt == "png" else (lambda when: {})
    first = _figure(monkeypatch, fmt, 315532800, **dated("1980-01-01T00:00:00"))
    second = _figure(monkeypatch, fmt, 1764320000, **dated("2025-11-28T10:53:20"))
    assert first != second
    a, b = _pair(tmp_path, f"plot.{fmt}", first, second)
    got = compare_files(a, b)
    assert got is not None and got.unreadable is None, got
    assert got.same and got.difference is None
    assert got.volatile == stamps


def test_the_same_figure_with_source_date_epoch_is_the_same_bytes_in_pdf_and_png(monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    # what the determinism profile's SOURCE_DATE_EPOCH buys: matplotlib's PDF and PNG carry no wall-clock date
    for fmt in ("pdf", "png"):
        assert _figure(monkeypatch, fmt, 315532800) == _figure(monkeypatch, fmt, 315532800)


@pytest.mark.parametrize(("fmt", "where"), [
    ("png", "pixels differ in "),
    ("pdf", "(in its stream) differs"),
    ("svg", "line "),
])
def test_a_figure_of_other_values_differs_and_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         fmt: str, where: str) -> None:
    a, b = _pair(tmp_path, f"plot.{fmt}", _figure(monkeypatch, fmt, 1), _figure(monkeypatch, fmt, 2, (1, 3, 2.5)))
    got = compare_files(a, b)
    assert got is not None and got.unreadable is None
    assert not got.same and got.difference is not None and where in got.difference, got.difference
    if fmt == "png":
        assert " of 100 rows (first row " in got.difference  # 2 inches at 50 dpi


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(width: int, height: int, rows: bytes, *extra: bytes) -> bytes:
    header = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    return (b"\x89PNG\r\n\x1a\n" + header + b"".join(extra) + _png_chunk(b"IDAT", zlib.compress(rows))
            + _png_chunk(b"IEND", b""))


def test_a_png_time_chunk_and_writer_are_volatile_other_text_is_content(tmp_path: Path) -> None:
    rows = b"\0\1\2\0\3\4"  # 2x2 grey, filter 0 per row
    dated = _png(2, 2, rows, _png_chunk(b"tIME", b"\x07\xea\x0b\x1c\x0a\x00\x00"),
                 _png_chunk(b"tEXt", b"Software\0writer 1.0"))
    redated = _png(2, 2, rows, _png_chunk(b"tIME", b"\x07\xea\x0b\x1c\x0b\x00\x00"),
                   _png_chunk(b"tEXt", b"Software\0writer 1.1"))
    got = compare_files(*_pair(tmp_path, "a.png", dated, redated))
    assert got is not None and got.same and got.volatile == ["tIME chunk (modification time)", "text Software"]
    titled = _png(2, 2, rows, _png_chunk(b"tEXt", b"Title\0loss at epoch 1"))
    retitled = _png(2, 2, rows, _png_chunk(b"tEXt", b"Title\0loss at epoch 2"))
    got = compare_files(*_pair(tmp_path, "b.png", titled, retitled))
    assert got is not None and not got.same and got.difference == "chunk tEXt Title differs"


def test_differing_bytes_that_look_like_a_date_are_said_to(tmp_path: Path) -> None:
    def pdf(subject: bytes) -> bytes:
        return (b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Subject (" + subject + b") >>\nendobj\n"
                b"trailer\n<< /Root 1 0 R >>\n%%EOF\n")

    got = compare_files(*_pair(tmp_path, "r.pdf", pdf(b"made 2026-11-28T10:55:01"), pdf(b"made 2026-11-28T10:57:44")))
    assert got is not None and not got.same and got.difference is not None
    assert got.difference.startswith("object 1 differs; the differing bytes look like a date "
                                     "(2026-11-28T10:55:01 -> 2026-11-28T10:57:44)")
    assert "SOURCE_DATE_EPOCH" in got.difference
    got = compare_files(*_pair(tmp_path, "s.pdf", pdf(b"loss 0.25"), pdf(b"loss 0.31")))
    assert got is not None and got.difference == "object 1 differs"  # a number, not a date
    assert date_hint(b"at 1764320000.", b"at 1764320123.") is not None
    assert date_hint(b"D:20261128105500Z", b"D:20261128105500Z") is None
    assert first_difference(b"a" * 1000 + b"x", b"a" * 1000 + b"y") == 1000
    assert first_difference(b"abc", b"abcd") == 3 and first_difference(b"same", b"same") is None


@pytest.mark.parametrize(("name", "a", "b", "why"), [
    # claims 100000 x 100000 pixels: refused before anything is decompressed
    ("bomb.png", _png(100000, 100000, b""), _png(100000, 100000, b"\0"), "decompressed"),
    ("cut.png", _png(2, 2, b"\0\1\2\0\3\4")[:30], _png(2, 2, b"\0\1\2\0\3\5")[:30], "past the end"),
    ("fake.png", b"not a png at all", b"not a png either", "no PNG signature"),
    ("fake.pdf", b"%!PS-Adobe-3.0 one", b"%!PS-Adobe-3.0 two", "no %PDF- header"),
    ("fake.svg", b"<html>one</html>", b"<html>two</html>", "no <svg> element"),
])
def test_a_hostile_or_broken_figure_is_unreadable_never_different(tmp_path: Path, name: str, a: bytes, b: bytes,
                                                                   why: str) -> None:
    got = compare_files(*_pair(tmp_path, name, a, b))
    assert got is not None and got.unreadable is not None and why in got.unreadable and not got.same


def test_verify_names_a_figure_saved_at_two_dates_identical_in_content(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    a, b = pair(ws.runs)
    for d, epoch in ((a, 1), (b, 2)):
        (d / "outputs/predict1.pdf").write_bytes(_figure(monkeypatch, "pdf", epoch))
        (d / "outputs/curve.svg").write_bytes(_figure(monkeypatch, "svg", epoch))
        refresh_manifest(d)
    assert kind_of("outputs/predict1.pdf") == KIND_FIGURE  # a picture of predictions, not predictions
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.OK, report.summary_line()
    rows = {r.path: r for r in report.artifacts}
    assert rows["outputs/predict1.pdf"].cells[b.name]["status"] == IDENTICAL_CONTENT
    line = report.summary_line()
    assert "predict1.pdf (creation date)" in line and "curve.svg (date, element ids" in line, line
    assert report.evidence()["kinds"][KIND_FIGURE]["identical"] == 2


def test_a_broken_figure_in_a_run_is_not_compared(tmp_path: Path) -> None:
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    a, b = pair(ws.runs)
    for d in (a, b):
        (d / "outputs/plot.png").write_bytes(b"\x89PNG\r\n\x1a\n" + d.name.encode())
        refresh_manifest(d)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.OK
    assert {r.path: r for r in report.artifacts}["outputs/plot.png"].cells[b.name]["status"] == UNREADABLE
