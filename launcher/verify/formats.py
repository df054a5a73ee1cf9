"""The formats launcher compares by content: each declared once, here.

A :class:`Format` says its name, the file names it claims (suffixes, or a test of the file's base
name), how two files of it are compared, whether it holds a model's weights and, for the formats
launcher's runtime saves a model in, where that native save lies in a run. The places that need
formats read them from here: :func:`launcher.verify.content.file_format` and ``compare_files``
(which comparer a file name picks), the verdict's check that a model file was compared
(:mod:`launcher.verify.verdicts`), the explanations and the consistency check of a run's native
saves (:mod:`launcher.verify.differences`), and the kind of evidence a file is
(:mod:`launcher.verify.evidence`). A new format is one :func:`register` call.

SavedModel directories are compared as a whole (:mod:`launcher.verify.artifacts`), not by file name,
and are not listed here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from launcher.verify.contentfigures import compare_pdf, compare_png, compare_svg
from launcher.verify.contentlogs import ContentDiff, compare_csv, compare_json, compare_jsonl
from launcher.verify.contentmodels import compare_hdf5, compare_keras, compare_npy, compare_safetensors, compare_torch
from launcher.verify.contenttf import compare_events

Compare = Callable[[Path, Path], ContentDiff]


@dataclass(frozen=True)
class Format:
    """One format compared by content."""

    name: str  # as the answers say it (ContentDiff.format, bytes_only groups)
    suffixes: tuple[str, ...]  # lower case, with the dot: ".keras"
    compare: Compare  # reads both files; raises (LauncherError, OSError, ValueError...) when it cannot
    model: bool = False  # holds a model's weights: comparing it counts as comparing a model
    native_save: str | None = None  # where launcher's runtime saves a model in this format (path in a run)
    claims: Callable[[str], bool] | None = None  # a test of the base name (lower case), before any suffix

    def __post_init__(self) -> None:
        bad = [s for s in self.suffixes if not s.startswith(".") or s != s.lower()]
        if bad:
            raise ValueError(f"format {self.name}: suffixes are lower case and start with a dot, not {bad}")


_FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a format; its name and suffixes must be new (a suffix picks one format)."""
    if fmt.name in _FORMATS:
        raise ValueError(f"format {fmt.name} is already registered")
    taken = {s: f.name for f in _FORMATS.values() for s in f.suffixes}
    clash = [f"{s} ({taken[s]})" for s in fmt.suffixes if s in taken]
    if clash:
        raise ValueError(f"format {fmt.name}: suffixes already registered: {', '.join(clash)}")
    _FORMATS[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    """Take a format out again (a test's toy format)."""
    del _FORMATS[name]


def formats() -> tuple[Format, ...]:
    """Every format, in the order registered."""
    return tuple(_FORMATS.values())


def format_of(name: str) -> Format | None:
    """The format a file name (a path or a base name) says, or None (then bytes are compared).

    A format whose ``claims`` accepts the base name wins; otherwise the longest matching suffix.
    """
    low = name.lower()
    base = PurePosixPath(low).name
    for fmt in _FORMATS.values():
        if fmt.claims is not None and fmt.claims(base):
            return fmt
    best: tuple[int, Format] | None = None
    for fmt in _FORMATS.values():
        for suffix in fmt.suffixes:
            if low.endswith(suffix) and (best is None or len(suffix) > best[0]):
                best = (len(suffix), fmt)
    return best[1] if best else None


def holds_model(name: str) -> bool:
    """Whether a file name says a format that holds a model's weights."""
    fmt = format_of(name)
    return fmt is not None and fmt.model


def model_suffixes() -> tuple[str, ...]:
    """The suffixes of the formats that hold a model's weights."""
    return tuple(s for f in _FORMATS.values() if f.model for s in f.suffixes)


def native_saves() -> tuple[str, ...]:
    """Where launcher's runtime saves a model natively, in the order looked for (the order registered)."""
    return tuple(f.native_save for f in _FORMATS.values() if f.native_save is not None)


EVENTS_MARK = "tfevents"


def _event_file(base: str) -> bool:
    """A TensorBoard event file: ``events.out.tfevents.<time>.<host>...``, whatever it ends with."""
    return EVENTS_MARK in base and base.startswith("events.out.")


# The order matters for native saves only: a Keras run saves model.weights.h5 and model.keras, and
# the weights file is the one explained and checked first.
register(Format("hdf5", (".h5", ".hdf5"), compare_hdf5, model=True, native_save="outputs/model/model.weights.h5"))
register(Format("torch", (".pt", ".pth"), compare_torch, model=True, native_save="outputs/model/model.pt"))
register(Format("keras", (".keras",), compare_keras, model=True, native_save="outputs/model/model.keras"))
register(Format("safetensors", (".safetensors",), compare_safetensors, model=True))
register(Format("npy", (".npy",), compare_npy, model=True))
register(Format("npz", (".npz",), compare_npy, model=True))
register(Format("csv", (".csv", ".tsv"), compare_csv))
register(Format("jsonl", (".jsonl",), compare_jsonl))
register(Format("json", (".json",), compare_json))
register(Format("tfevents", (), compare_events, claims=_event_file))
# Figures: what they draw, without the dates and writer names their savers stamp (launcher.verify.contentfigures).
register(Format("png", (".png",), compare_png))
register(Format("pdf", (".pdf",), compare_pdf))
register(Format("svg", (".svg",), compare_svg))
