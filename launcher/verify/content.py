"""Compare the files ML code writes by their content, not their bytes.

Two saves of the same weights rarely have the same bytes: a ``.keras`` zip carries entry dates
and a ``date_saved``, a PyTorch zip a random serialization id, a TensorBoard event file a wall
time in every record (and the time, host and pid in its name), a SavedModel graph ids that
change on every export. :func:`compare_files` reads both files in their format and answers
whether their content is equal, what differs in the bytes only, and where the content differs
(for weights, the first differing layer and array, through :mod:`launcher.verify.modeldiff`). This
module picks the comparer by file name from the formats declared in :mod:`launcher.verify.formats`;
the comparers are in :mod:`launcher.verify.contentlogs`, :mod:`launcher.verify.contentmodels` and
:mod:`launcher.verify.contenttf`.

Formats: ``.keras``; HDF5 ``.h5``/``.hdf5`` (Keras full-model and weights saves); SavedModel
directories (``variables/`` read by hand from TensorFlow's tensor bundle; ``saved_model.pb``
and ``fingerprint.pb`` are not compared); PyTorch ``.pt``/``.pth`` zips (read without torch);
safetensors; ``.npy``/``.npz``; TensorBoard event files; CSV, JSON and JSON-lines logs; PNG, PDF
and SVG figures (:mod:`launcher.verify.contentfigures`, their dates and writer names set aside). A
format not listed, or a file that cannot be read as its name says, is compared by bytes.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

from launcher.errors import LauncherError, MissingExtra
from launcher.verify.contentlogs import (
    VOLATILE_FIELD_SUFFIXES,
    VOLATILE_FIELDS,
    ContentDiff,
    compare_csv,
    compare_json,
    compare_jsonl,
    first_json_difference,
    volatile_field,
)
from launcher.verify.contentmodels import compare_hdf5, compare_keras, compare_npy, compare_safetensors, compare_torch
from launcher.verify.contenttf import (
    SAVED_MODEL_PB,
    SAVED_MODEL_UNCOMPARED,
    compare_events,
    compare_savedmodel,
    load_tensor_bundle,
    proto_fields,
    read_records,
    read_table,
    savedmodel_root,
)
from launcher.verify.formats import format_of

# The comparers' names stay importable from here, where verify and the tests import them.
__all__ = [
    "SAVED_MODEL_PB",
    "SAVED_MODEL_UNCOMPARED",
    "VOLATILE_FIELDS",
    "VOLATILE_FIELD_SUFFIXES",
    "ContentDiff",
    "compare_csv",
    "compare_events",
    "compare_files",
    "compare_hdf5",
    "compare_json",
    "compare_jsonl",
    "compare_keras",
    "compare_npy",
    "compare_safetensors",
    "compare_savedmodel",
    "compare_torch",
    "file_format",
    "first_json_difference",
    "load_tensor_bundle",
    "proto_fields",
    "read_records",
    "read_table",
    "savedmodel_root",
    "unreadable",
    "volatile_field",
]


def file_format(name: str) -> str | None:
    """The format a file name says, or None (then bytes are compared)."""
    fmt = format_of(name)
    return fmt.name if fmt else None


def compare_files(a: Path, b: Path, name: str | None = None) -> ContentDiff | None:
    """Compare two files by the content their format holds; None when the format is not known.

    Files that cannot be read as their format are not compared: the answer says why
    (``unreadable``) and, for a missing package, the fix; it never says they differ.
    """
    fmt = format_of(name or a.name)
    if fmt is None:
        return None
    try:
        return fmt.compare(a, b)
    except (LauncherError, OSError, ValueError, KeyError, zipfile.BadZipFile, struct.error) as exc:
        return unreadable(fmt.name, exc)


def unreadable(fmt: str, exc: BaseException) -> ContentDiff:
    """The answer for files launcher could not read: not compared, with why and (a missing package) the fix."""
    if isinstance(exc, MissingExtra):
        return ContentDiff(fmt, False, [], unreadable=f"cannot be read as {fmt}: {exc.message}", fix=exc.hint)
    why = exc.one_line() if isinstance(exc, LauncherError) else f"{type(exc).__name__}: {exc}"
    return ContentDiff(fmt, False, [], unreadable=f"cannot be read as {fmt}: {why}")

