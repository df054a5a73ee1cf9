"""The answer of a content comparison (ContentDiff); JSON, JSON-lines and CSV logs compared without volatile fields."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from launcher.verify.modeldiff import FirstDifference, ModelDiff

# Fields of JSON and CSV logs that change on every run by nature: compared neither in JSON
# objects (any depth) nor as CSV columns; a difference in them is listed as volatile bytes.
VOLATILE_FIELDS = frozenset({
    "time", "timestamp", "wall_time", "walltime", "date", "datetime", "date_saved", "created", "hostname",
    "pid", "elapsed", "duration", "start", "end",
})
VOLATILE_FIELD_SUFFIXES = ("_time", "_at", "_timestamp", "_date", "_duration", "_elapsed", "_seconds")


def volatile_field(name: str) -> bool:
    low = name.lower()
    return low in VOLATILE_FIELDS or low.endswith(VOLATILE_FIELD_SUFFIXES)


class ContentRecord(TypedDict):
    """A content comparison as written in verify's JSON (an artifact cell's or a differing file's ``content``)."""

    format: str
    same: bool
    volatile: list[str]
    difference: str | None
    first_difference: FirstDifference | None
    arrays_differing: NotRequired[int]  # for a model whose arrays differ
    arrays_total: NotRequired[int]
    unreadable: NotRequired[str]  # only when the files could not be read
    fix: NotRequired[str | None]
    evidence: NotRequired[str]  # what an identical comparison proves about training (launcher's weight digests)


@dataclass
class ContentDiff:
    """The comparison of two files of one format."""

    format: str
    same: bool  # the content is equal
    volatile: list[str] = field(default_factory=list)  # what differs in the bytes only
    difference: str | None = None  # where the content differs first, one phrase
    model: ModelDiff | None = None  # for arrays: the diff naming the layer and array
    unreadable: str | None = None  # why the files could not be read: then nothing was compared
    fix: str | None = None  # the one fix for unreadable, where launcher knows it
    evidence: str | None = None  # what the comparison proves about training, where it proves something

    @property
    def first_difference(self) -> FirstDifference | None:
        first = self.model.first_difference if self.model is not None else None
        return {"layer": first.layer, "array": first.array} if first else None

    def to_dict(self) -> ContentRecord:
        out: ContentRecord = {"format": self.format, "same": self.same, "volatile": list(self.volatile),
                               "difference": self.difference, "first_difference": self.first_difference}
        if self.model is not None and not self.model.identical:
            out["arrays_differing"] = len(self.model.differing)
            out["arrays_total"] = len(self.model.arrays)
        if self.unreadable is not None:
            out["unreadable"] = self.unreadable
            out["fix"] = self.fix
        if self.evidence is not None:
            out["evidence"] = self.evidence
        return out


def model_result(fmt: str, model: ModelDiff, volatile: list[str]) -> ContentDiff:
    first = model.first_difference
    if first is None:
        return ContentDiff(fmt, True, volatile, model=model)
    what = {"differs": f"{first.differing} of {first.total} elements differ", "shape": "shape or dtype differ",
            "missing": "in one file only"}.get(first.status, first.status)
    return ContentDiff(fmt, False, volatile, f"layer {first.layer} array {first.array}: {what}", model)


def same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


# ---------------------------------------------------------------- JSON and CSV


def _strip_volatile(value: Any, path: str, removed: set[str]) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, str) and volatile_field(k):
                removed.add(f"{path}.{k}" if path else k)
                continue
            out[k] = _strip_volatile(v, f"{path}.{k}" if path else str(k), removed)
        return out
    if isinstance(value, list):
        return [_strip_volatile(v, f"{path}[{i}]", removed) for i, v in enumerate(value)]
    return value


def first_json_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first path where two parsed JSON values differ, with both values (shortened)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                return f"{sub}: only in {'the run' if k not in a else 'the reference'}"
            found = first_json_difference(a[k], b[k], sub)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_json_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path or 'value'}: {len(a)} items -> {len(b)}"
        return None
    if a == b and type(a) is type(b):
        return None
    return f"{path or 'value'}: {short(a)} -> {short(b)}"


def short(v: Any) -> str:
    try:
        text = json.dumps(v) if not isinstance(v, str) else repr(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _volatile_diffs(removed_a: set[str], removed_b: set[str], a: Any, b: Any) -> list[str]:
    """The volatile fields whose values differ (or that only one file has)."""
    out = []
    for path in sorted(removed_a | removed_b):
        if _lookup(a, path) != _lookup(b, path):
            out.append(path)
    return out


def _lookup(value: Any, path: str) -> Any:
    cur = value
    for part in path.replace("[", ".[").split("."):
        if not part:
            continue
        if part.startswith("["):
            idx = int(part[1:-1])
            cur = cur[idx] if isinstance(cur, list) and idx < len(cur) else None
        else:
            cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def compare_json_values(fmt: str, a: Any, b: Any, byte_equal: bool) -> ContentDiff:
    ra: set[str] = set()
    rb: set[str] = set()
    sa, sb = _strip_volatile(a, "", ra), _strip_volatile(b, "", rb)
    volatile = [f"field {p}" for p in _volatile_diffs(ra, rb, a, b)][:10]
    diff = first_json_difference(sa, sb)
    if diff is None and not volatile and not byte_equal:
        volatile = ["formatting (key order, spacing)"]
    return ContentDiff(fmt, diff is None, volatile, diff)


def compare_json(a: Path, b: Path) -> ContentDiff:
    ba, bb = a.read_bytes(), b.read_bytes()
    return compare_json_values("json", json.loads(ba), json.loads(bb), ba == bb)


def compare_jsonl(a: Path, b: Path) -> ContentDiff:
    ba, bb = a.read_bytes(), b.read_bytes()
    rows_a = [json.loads(line) for line in ba.splitlines() if line.strip()]
    rows_b = [json.loads(line) for line in bb.splitlines() if line.strip()]
    result = compare_json_values("jsonl", rows_a, rows_b, ba == bb)
    if result.difference and result.difference.startswith("["):
        line, _, rest = result.difference[1:].partition("]")
        result.difference = f"line {int(line) + 1}{rest}"
    result.volatile = [v.replace("field [", "field line ").replace("].", ": ") for v in result.volatile]
    return result


def compare_csv(a: Path, b: Path) -> ContentDiff:
    ba, bb = a.read_bytes(), b.read_bytes()
    delim = "\t" if a.name.lower().endswith(".tsv") else ","
    rows_a = list(csv.reader(io.StringIO(ba.decode("utf-8")), delimiter=delim))
    rows_b = list(csv.reader(io.StringIO(bb.decode("utf-8")), delimiter=delim))
    header = rows_a[0] if rows_a else []
    skip = {i for i, name in enumerate(header) if volatile_field(name.strip())}
    volatile: set[str] = set()
    difference = None
    if header != (rows_b[0] if rows_b else []):
        difference = f"header: {short(header)} -> {short(rows_b[0] if rows_b else [])}"
    for r, (ra, rb) in enumerate(zip(rows_a, rows_b, strict=False)):
        if difference:
            break
        for c in range(max(len(ra), len(rb))):
            x = ra[c] if c < len(ra) else None
            y = rb[c] if c < len(rb) else None
            if x == y:
                continue
            col = header[c] if c < len(header) else str(c)
            if c in skip:
                volatile.add(f"column {col}")
                continue
            difference = f"row {r} column {col}: {short(x)} -> {short(y)}"
            break
    if difference is None and len(rows_a) != len(rows_b):
        difference = f"{len(rows_a)} rows -> {len(rows_b)}"
    vol = sorted(volatile)
    if difference is None and not vol and ba != bb:
        vol = ["formatting (line endings, quoting)"]
    return ContentDiff("csv", difference is None, vol, difference)
