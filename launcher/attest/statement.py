"""An in-toto Statement v1 (https://in-toto.io/Statement/v1): subjects named by digest and a typed predicate.

launcher writes statements as plain JSON (no protobuf at run time); :mod:`launcher.attest.schema` checks
their shape as the specifications define it, and the tests check the same documents with the
in-toto-attestation package's protobuf bindings. Digests are ``sha256:<hex>`` inside launcher and
``{"sha256": "<hex>"}`` in a statement (in-toto's DigestSet).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Generic, NotRequired, TypedDict, TypeVar, cast

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
VERIFIER = f"{URI}:verifier:"  # a verification summary's verifier.id: this, then the signing key's id
CHECKED_DIGESTS = ("sha256", "sha384", "sha512")
# a verification summary's levels (verifiedLevels): the verdict, and whether another image ran it
REPRODUCED = "LAUNCHER_REPRODUCED_"
OTHER_IMAGE = "LAUNCHER_OTHER_IMAGE"  # the DigestSet algorithms a file is checked by


P = TypeVar("P")


class DigestSet(TypedDict):
    """in-toto's DigestSet as launcher writes it (a statement read may carry other algorithms too)."""

    sha256: NotRequired[str]


class ResourceDescriptor(TypedDict, total=False):
    """An in-toto ResourceDescriptor: a subject, dependency or byproduct; only the fields given are written."""

    name: str
    uri: str
    digest: DigestSet
    annotations: dict[str, Any]  # free-form JSON by the spec (host facts, a dependency's path, packages, ...)


class Statement(TypedDict, Generic[P]):
    """An in-toto Statement v1 (provenance.json, verification.json, a bundle's statement), its predicate of type P."""

    _type: str
    subject: list[ResourceDescriptor]
    predicateType: str
    predicate: P


def digest_set(digest: str) -> DigestSet:
    """``sha256:<hex>`` -> in-toto's ``{"sha256": "<hex>"}``."""
    return {"sha256": hex_of(digest)}


def from_digest_set(value: object) -> str | None:
    """in-toto's ``{"sha256": "<hex>"}`` -> ``sha256:<hex>`` (None without a sha256)."""
    if isinstance(value, Mapping) and isinstance(value.get("sha256"), str):
        return "sha256:" + str(value["sha256"])
    return None


def descriptor(name: str | None = None, digest: str | None = None, *, uri: str | None = None,
               annotations: Mapping[str, Any] | None = None) -> ResourceDescriptor:
    """An in-toto ResourceDescriptor with only the fields given."""
    out: ResourceDescriptor = {}
    if name is not None:
        out["name"] = name
    if uri is not None:
        out["uri"] = uri
    if digest is not None:
        out["digest"] = digest_set(digest)
    if annotations:
        out["annotations"] = dict(annotations)
    return out


def make(subjects: Iterable[ResourceDescriptor], predicate_type: str, predicate: P) -> Statement[P]:
    return {"_type": STATEMENT_TYPE, "subject": list(subjects), "predicateType": predicate_type,
            "predicate": predicate}


def encode(statement: Statement[P]) -> bytes:
    """The statement's bytes as signed: JSON with sorted keys, so the same statement is the same payload."""
    return json.dumps(statement, sort_keys=True, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def decode(payload: bytes, source: str) -> dict[str, Any]:
    """The JSON object of a signed payload, not yet checked against a schema (schema.check does)."""
    try:
        data = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Corrupt(f"{source}: the signed payload is not JSON ({exc})",
                      "ask its author for the statement again") from None
    if not isinstance(data, dict):
        raise Corrupt(f"{source}: the signed payload is not a JSON object", "ask its author for the statement again")
    return data


def statement_digest(statement: Statement[P]) -> str:
    return sha256_bytes(encode(statement))


def _byproducts(predicate: object) -> list[object]:
    """A provenance predicate's runDetails.byproducts, read defensively (it may be someone else's)."""
    run = predicate.get("runDetails") if isinstance(predicate, Mapping) else None
    found = run.get("byproducts") if isinstance(run, Mapping) else None
    return list(found) if isinstance(found, list) else []


def _entries(statement: Statement[P], byproducts: bool) -> list[object]:
    entries: list[object] = list(statement["subject"])
    if byproducts and statement["predicateType"] == PROVENANCE_TYPE:
        entries += _byproducts(statement["predicate"])
    return entries


def _twice(name: str) -> Corrupt:
    return Corrupt(f"the statement names {name} twice: which digest was signed for it is ambiguous",
                   "ask its author for the statement again")


def subject_digests(statement: Statement[P], *, byproducts: bool = True) -> dict[str, str]:
    """name -> ``sha256:<hex>`` of every subject (and of a provenance's byproducts: they are files too);
    a name given twice is Corrupt (the first, wrong digest would otherwise go unchecked)."""
    out: dict[str, str] = {}
    for entry in _entries(statement, byproducts):
        if not isinstance(entry, Mapping):
            continue
        digest, name = from_digest_set(entry.get("digest")), entry.get("name")
        if digest and isinstance(name, str):
            if name in out:
                raise _twice(name)
            out[name] = digest
    return out


def checkable(statement: Statement[P], *, byproducts: bool = True) -> dict[str, dict[str, str]]:
    """name -> {algorithm: hex} of every subject (and byproduct), for checking files: each must have a name
    and a digest of an algorithm launcher checks (CHECKED_DIGESTS), else Corrupt (it would be skipped)."""
    out: dict[str, dict[str, str]] = {}
    for i, entry in enumerate(_entries(statement, byproducts)):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        digests = entry.get("digest") if isinstance(entry, Mapping) else None
        wanted = {k: str(v) for k, v in digests.items() if k in CHECKED_DIGESTS} if isinstance(digests, Mapping) else {}
        if not isinstance(name, str) or not name or not wanted:
            what = f"subject {name!r}" if isinstance(name, str) and name else f"subject {i} (it has no name)"
            raise Corrupt(f"the statement's {what} names no file by a digest launcher checks "
                          f"({', '.join(CHECKED_DIGESTS)}): there would be nothing to check",
                          "ask its author for a statement whose subjects are files named by sha256")
        if name in out:
            raise _twice(name)
        out[name] = wanted
    return out


def dependency(statement: Statement[P], name: str) -> ResourceDescriptor | None:
    """A provenance statement's resolved dependency by name (launcher names them: code, image, ...)."""
    pred = statement["predicate"]
    build = pred.get("buildDefinition") if isinstance(pred, Mapping) else None
    deps = build.get("resolvedDependencies") if isinstance(build, Mapping) else None
    for dep in deps if isinstance(deps, list) else []:
        if isinstance(dep, Mapping) and dep.get("name") == name:
            # checked as a descriptor by schema.check when the statement was read
            return cast(ResourceDescriptor, dict(dep))
    return None
