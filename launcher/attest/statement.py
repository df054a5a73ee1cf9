"""An in-toto Statement v1 (https://in-toto.io/Statement/v1): subjects named by digest and a typed predicate.

launcher writes statements as plain JSON (no protobuf at run time); :mod:`launcher.attest.schema` checks
their shape as the specifications define it, and the tests check the same documents with the
in-toto-attestation package's protobuf bindings. Digests are ``sha256:<hex>`` inside launcher and
``{"sha256": "<hex>"}`` in a statement (in-toto's DigestSet).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from launcher.errors import Corrupt
from launcher.hashing import hex_of, sha256_bytes

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"  # the DSSE payloadType of an in-toto statement
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
VSA_TYPE = "https://slsa.dev/verification_summary/v1"
# launcher's own names (build type, builders, verifiers, policies, the bundle's predicate) are URNs under
# this one prefix: launcher has no web address, and a URN claims none.
URI = "urn:launcher"
BUNDLE_TYPE = f"{URI}:bundle:v1"


def digest_set(digest: str) -> dict[str, str]:
    """``sha256:<hex>`` -> in-toto's ``{"sha256": "<hex>"}``."""
    return {"sha256": hex_of(digest)}


def from_digest_set(value: Any) -> str | None:
    """in-toto's ``{"sha256": "<hex>"}`` -> ``sha256:<hex>`` (None without a sha256)."""
    if isinstance(value, Mapping) and isinstance(value.get("sha256"), str):
        return "sha256:" + str(value["sha256"])
    return None


def descriptor(name: str | None = None, digest: str | None = None, *, uri: str | None = None,
               annotations: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An in-toto ResourceDescriptor with only the fields given."""
    out: dict[str, Any] = {}
    if name is not None:
        out["name"] = name
    if uri is not None:
        out["uri"] = uri
    if digest is not None:
        out["digest"] = digest_set(digest)
    if annotations:
        out["annotations"] = dict(annotations)
    return out


def make(subjects: Iterable[Mapping[str, Any]], predicate_type: str, predicate: Mapping[str, Any]) -> dict[str, Any]:
    return {"_type": STATEMENT_TYPE, "subject": [dict(s) for s in subjects], "predicateType": predicate_type,
            "predicate": dict(predicate)}


def encode(statement: Mapping[str, Any]) -> bytes:
    """The statement's bytes as signed: JSON with sorted keys, so the same statement is the same payload."""
    return json.dumps(statement, sort_keys=True, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def decode(payload: bytes, source: str) -> dict[str, Any]:
    try:
        data = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Corrupt(f"{source}: the signed payload is not JSON ({exc})",
                      "ask its author for the statement again") from None
    if not isinstance(data, dict):
        raise Corrupt(f"{source}: the signed payload is not a JSON object", "ask its author for the statement again")
    return data


def statement_digest(statement: Mapping[str, Any]) -> str:
    return sha256_bytes(encode(statement))


def subject_digests(statement: Mapping[str, Any], *, byproducts: bool = True) -> dict[str, str]:
    """name -> ``sha256:<hex>`` of every subject (and of a provenance's byproducts: they are files too)."""
    out: dict[str, str] = {}
    entries = list(statement.get("subject") or [])
    if byproducts and statement.get("predicateType") == PROVENANCE_TYPE:
        entries += list(((statement.get("predicate") or {}).get("runDetails") or {}).get("byproducts") or [])
    for entry in entries:
        digest = from_digest_set(entry.get("digest")) if isinstance(entry, Mapping) else None
        if digest and isinstance(entry.get("name"), str):
            out[entry["name"]] = digest
    return out


def dependency(statement: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """A provenance statement's resolved dependency by name (launcher names them: code, image, ...)."""
    build = (statement.get("predicate") or {}).get("buildDefinition") or {}
    for dep in build.get("resolvedDependencies") or []:
        if isinstance(dep, Mapping) and dep.get("name") == name:
            return dict(dep)
    return None


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Corrupt(f"{path} is missing", "ask its author for it again") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Corrupt(f"{path} is not a JSON document ({exc})", "ask its author for it again") from None
    if not isinstance(data, dict):
        raise Corrupt(f"{path} is not a JSON object", "ask its author for it again")
    return data
