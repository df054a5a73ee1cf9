"""One registry of the formats compared by content: a format declared once, by one register() call, is
picked by file name, compared with its own comparer, and (declared a model) counts as a model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from runfactory import keep_only, make_workspace, pair

from launcher.errors import ExitCode
from launcher.verify import formats
from launcher.verify.content import compare_files, file_format
from launcher.verify.contentlogs import ContentDiff
from launcher.verify.differences import IDENTICAL_CONTENT
from launcher.verify.evidence import KIND_MODEL, KIND_OTHER, kind_of
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace


def compare_toy(a: Path, b: Path) -> ContentDiff:
    """A toy format: lines of text, of which `saved_at=...` is volatile."""
    def kept(p: Path) -> list[str]:
        return [line for line in p.read_text().splitlines() if not line.startswith("saved_at=")]
    ka, kb = kept(a), kept(b)
    volatile = ["saved_at"] if a.read_bytes() != b.read_bytes() else []
    first = next((i for i, (x, y) in enumerate(zip(ka, kb, strict=False)) if x != y), None)
    return ContentDiff("toy", ka == kb, volatile, None if ka == kb else f"line {first}")


def _toy(text: str, saved_at: str) -> bytes:
    return f"{text}\nsaved_at={saved_at}\n".encode()


@pytest.fixture(params=[True, False], ids=["model", "not-model"])
def toy(request: pytest.FixtureRequest) -> Iterator[formats.Format]:
    fmt = formats.register(formats.Format("toy", (".toy",), compare_toy, model=request.param))
    try:
        yield fmt
    finally:
        formats.unregister("toy")


def test_a_file_of_an_unregistered_format_is_compared_by_bytes(tmp_path: Path) -> None:
    a, b = tmp_path / "a.toy", tmp_path / "b.toy"
    a.write_bytes(_toy("w=1", "10:00"))
    b.write_bytes(_toy("w=1", "10:05"))
    assert file_format("outputs/w.toy") is None and formats.format_of("w.toy") is None
    assert compare_files(a, b) is None
    assert not formats.holds_model("outputs/w.toy") and kind_of("outputs/w.toy") == KIND_OTHER


def test_one_registration_is_picked_by_name_and_compared(toy: formats.Format, tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.TOY", tmp_path / "b.toy", tmp_path / "c.toy"
    a.write_bytes(_toy("w=1", "10:00"))
    b.write_bytes(_toy("w=1", "10:05"))
    c.write_bytes(_toy("w=2", "10:00"))
    assert file_format("outputs/ckpt/W.TOY") == "toy" and formats.format_of("w.toy") is toy
    same = compare_files(a, b)
    assert same is not None and same.format == "toy" and same.same and same.volatile == ["saved_at"]
    differs = compare_files(a, c)
    assert differs is not None and not differs.same and differs.difference == "line 0"
    assert formats.holds_model("outputs/w.toy") is toy.model
    assert kind_of("outputs/w.toy") == (KIND_MODEL if toy.model else KIND_OTHER)
    assert formats.native_saves() == ("outputs/model/model.weights.h5", "outputs/model/model.pt",
                                      "outputs/model/model.keras")  # the toy declared none


def test_a_registered_model_format_is_the_evidence_of_a_verdict(toy: formats.Format, tmp_path: Path) -> None:
    ws = Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")
    a, b = pair(ws.runs)
    for d, when in ((a, "10:00"), (b, "10:05")):
        (d / "outputs/w.toy").write_bytes(_toy("w=1", when))
        keep_only(d, "w.toy")  # the toy save is all training left
    report = verify_checksums(ws)
    row = next(r for r in report.artifacts if r.path == "outputs/w.toy")
    assert row.cells[b.name]["status"] == IDENTICAL_CONTENT
    assert row.cells[b.name]["content"]["format"] == "toy"
    if toy.model:
        assert row.kind == KIND_MODEL and report.exit_code == ExitCode.OK, report.summary_line()
        assert report.checks()["models"]["checked"] == 2  # the reference's and the other run's
    else:
        assert row.kind == KIND_OTHER and report.exit_code == ExitCode.INCONCLUSIVE
        assert report.checks()["models"]["checked"] == 1


def test_a_format_name_or_suffix_is_registered_once() -> None:
    with pytest.raises(ValueError, match="already registered"):
        formats.register(formats.Format("keras", (".kz",), compare_toy))
    with pytest.raises(ValueError, match=r"\.pth \(torch\)"):
        formats.register(formats.Format("toy", (".toy", ".pth"), compare_toy))
    with pytest.raises(ValueError, match="lower case"):
        formats.Format("toy", ("TOY",), compare_toy)
    assert formats.format_of("w.toy") is None


def test_the_registry_holds_the_formats_the_three_places_listed() -> None:
    suffixes = {s: f.name for f in formats.formats() for s in f.suffixes}
    assert suffixes == {".keras": "keras", ".h5": "hdf5", ".hdf5": "hdf5", ".pt": "torch", ".pth": "torch",
                        ".safetensors": "safetensors", ".npy": "npy", ".npz": "npz", ".csv": "csv", ".tsv": "csv",
                        ".jsonl": "jsonl", ".json": "json", ".png": "png", ".pdf": "pdf", ".svg": "svg"}
    assert {f.name for f in formats.formats() if f.model} == {"keras", "hdf5", "torch", "safetensors", "npz", "npy"}
    assert file_format("logs/events.out.tfevents.1732269600.host.123.0.v2") == "tfevents"
    assert file_format("events.out.tfevents.1.host.json") == "tfevents"  # the name test before any suffix
    assert file_format("model.onnx") is None and kind_of("outputs/model.onnx") == KIND_MODEL
