"""A build's record: what ``.launcher/builds/<variant>.json`` holds (:class:`BuildRecordJSON`) and its
in-memory form (:class:`BuildRecord`), converted by one pair of helpers driven by the JSON record's keys."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypedDict, cast

from launcher.errors import Corrupt

if TYPE_CHECKING:
    from launcher.workspace import Workspace

RECORD_VERSION = 1
# a build's SOURCE_DATE_EPOCH unless one is given: 1980-01-01T00:00:00Z, the earliest date a zip entry can carry
DEFAULT_EPOCH = 315532800


class BuildExtra(TypedDict, total=False):
    """A build record's ``extra``: what a later build or check compares; a record written before a
    key existed lacks it (readers fall back: a full rebuild, the default epoch)."""

    recipes_digest: str
    runtime_digest: str
    recipes: dict[str, str]  # recipe folder -> its digest
    env_content: str
    env_image_id: str
    parts: dict[str, str]  # dockerfile, lock, base, runtime, recipes -> digest (Inputs.parts)
    epoch: int
    files: int
    tree: dict[str, str]  # in memory only, after a build: the image's tree (saved beside the record)


class BuildRecordJSON(TypedDict):
    """A build record as written in .launcher/builds/ (BuildRecord less its in-memory ``noop``)."""

    variant: str
    image_id: str
    tag: str
    content: str
    base: str
    lock_sha256: str
    tree_digest: str
    labels: dict[str, str]
    built_at: str
    seconds: float
    record_version: int
    extra: BuildExtra


class BuildData(BuildRecordJSON):
    """The `build` command's Result data: the record, and whether the build was a no-op."""

    noop: bool


@dataclass
class BuildRecord:
    variant: str
    image_id: str
    tag: str
    content: str
    base: str
    lock_sha256: str
    tree_digest: str
    labels: dict[str, str]
    built_at: str
    seconds: float
    noop: bool = False
    record_version: int = RECORD_VERSION
    extra: BuildExtra = field(default_factory=BuildExtra)

    def to_json(self) -> BuildRecordJSON:
        """The record as written: a deep copy of every field that BuildRecordJSON names (all but ``noop``)."""
        return cast(BuildRecordJSON, {key: copy.deepcopy(getattr(self, key)) for key in _JSON_KEYS})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildRecord:
        """A record as read back (a ``noop`` key, if any, is dropped); TypeError for a missing or unknown key."""
        data = dict(data)
        data.pop("noop", None)
        return cls(**data)


_JSON_KEYS = tuple(sorted(BuildRecordJSON.__required_keys__))  # the one list of what a record writes
# the dataclass holds exactly the written keys and the in-memory noop: checked once, at import
assert {f.name for f in fields(BuildRecord)} == {*_JSON_KEYS, "noop"}, "BuildRecord and BuildRecordJSON differ"


def read_record(ws: Workspace, variant: str) -> BuildRecord | None:
    path = ws.build_record(variant)
    if not path.is_file():
        return None
    try:
        return BuildRecord.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise Corrupt(f"build record {path} is unreadable: {exc}",
                      f"delete it and run `launcher build --variant {variant}`") \
            from exc
