"""The shapes `attest verify` checks, written from the specifications: in-toto Statement v1 and its
ResourceDescriptor, SLSA Provenance v1 and SLSA Verification Summary (VSA) v1.

Unknown fields are refused where the specifications' protobuf definitions have none (a
ResourceDescriptor, the predicates' own objects), so a typo is not signed and verified unnoticed. The
suite checks the same documents with the in-toto-attestation package's protobuf bindings.

What is checked is JSON of unknown shape (someone's signed payload): every value is an ``object`` here
until an isinstance check narrows it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from launcher.attest.statement import PROVENANCE_TYPE, STATEMENT_TYPE, VSA_TYPE
from launcher.errors import Corrupt

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
_HEX = re.compile(r"^[0-9a-f]+$")
_DESCRIPTOR_KEYS = {"name", "uri", "digest", "content", "downloadLocation", "mediaType", "annotations"}
VSA_RESULTS = ("PASSED", "FAILED")


class _Bad(ValueError):
    pass


def _obj(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise _Bad(f"{where} is not an object")
    return value


def _str(value: object, where: str, *, required: bool = True) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or (required and not value):
        raise _Bad(f"{where} is not a non-empty string")


def _keys(value: Mapping[str, object], allowed: set[str], where: str) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _Bad(f"{where} has unknown fields {', '.join(unknown)}")


def _time(value: object, where: str, *, required: bool = False) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or not _RFC3339.match(value):
        raise _Bad(f"{where} is not an RFC 3339 time (e.g. 2026-11-25T10:00:00Z)")


def _digests(value: object, where: str) -> None:
    obj = _obj(value, where)
    for algo, hexpart in obj.items():
        if not isinstance(hexpart, str) or not hexpart:
            raise _Bad(f"{where}.{algo} is not a string")
        if algo in ("sha256", "sha512", "sha384", "sha1") and not _HEX.match(hexpart):
            raise _Bad(f"{where}.{algo} is not lower-case hex")
        if algo == "sha256" and len(hexpart) != 64:
            raise _Bad(f"{where}.sha256 is not 64 hex digits")


def descriptor(value: object, where: str, *, need_digest: bool = False) -> None:
    obj = _obj(value, where)
    _keys(obj, _DESCRIPTOR_KEYS, where)
    if not any(obj.get(k) for k in ("name", "uri", "digest")):
        raise _Bad(f"{where} needs at least one of name, uri and digest")
    for key in ("name", "uri", "downloadLocation", "mediaType", "content"):
        _str(obj.get(key), f"{where}.{key}", required=False)
    if "digest" in obj:
        _digests(obj["digest"], f"{where}.digest")
    elif need_digest:
        raise _Bad(f"{where} has no digest")
    if "annotations" in obj:
        _obj(obj["annotations"], f"{where}.annotations")


def _descriptors(value: object, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise _Bad(f"{where} is not a list")
    for i, item in enumerate(value):
        descriptor(item, f"{where}[{i}]")


def provenance(pred: Mapping[str, object]) -> None:
    _keys(pred, {"buildDefinition", "runDetails"}, "predicate")
    build = _obj(pred.get("buildDefinition"), "predicate.buildDefinition")
    _keys(build, {"buildType", "externalParameters", "internalParameters", "resolvedDependencies"},
          "buildDefinition")
    _str(build.get("buildType"), "buildDefinition.buildType")
    _obj(build.get("externalParameters"), "buildDefinition.externalParameters")
    if "internalParameters" in build:
        _obj(build["internalParameters"], "buildDefinition.internalParameters")
    _descriptors(build.get("resolvedDependencies"), "buildDefinition.resolvedDependencies")
    run = _obj(pred.get("runDetails"), "predicate.runDetails")
    _keys(run, {"builder", "metadata", "byproducts"}, "runDetails")
    builder = _obj(run.get("builder"), "runDetails.builder")
    _keys(builder, {"id", "version", "builderDependencies"}, "runDetails.builder")
    _str(builder.get("id"), "runDetails.builder.id")
    for key, value in _obj(builder.get("version", {}), "runDetails.builder.version").items():
        _str(value, f"runDetails.builder.version.{key}")
    _descriptors(builder.get("builderDependencies"), "runDetails.builder.builderDependencies")
    meta = _obj(run.get("metadata", {}), "runDetails.metadata")
    _keys(meta, {"invocationId", "startedOn", "finishedOn"}, "runDetails.metadata")
    _str(meta.get("invocationId"), "runDetails.metadata.invocationId", required=False)
    _time(meta.get("startedOn"), "runDetails.metadata.startedOn")
    _time(meta.get("finishedOn"), "runDetails.metadata.finishedOn")
    _descriptors(run.get("byproducts"), "runDetails.byproducts")


def verification_summary(pred: Mapping[str, object]) -> None:
    _keys(pred, {"verifier", "timeVerified", "resourceUri", "policy", "inputAttestations", "verificationResult",
                 "verifiedLevels", "dependencyLevels", "slsaVersion"}, "predicate")
    verifier = _obj(pred.get("verifier"), "predicate.verifier")
    _keys(verifier, {"id"}, "predicate.verifier")
    _str(verifier.get("id"), "predicate.verifier.id")
    _time(pred.get("timeVerified"), "predicate.timeVerified", required=True)
    _str(pred.get("resourceUri"), "predicate.resourceUri")
    policy = _obj(pred.get("policy"), "predicate.policy")
    _keys(policy, {"uri", "digest"}, "predicate.policy")
    _str(policy.get("uri"), "predicate.policy.uri")
    inputs = pred.get("inputAttestations", [])
    if not isinstance(inputs, list):
        raise _Bad("predicate.inputAttestations is not a list")
    for i, item in enumerate(inputs):
        obj = _obj(item, f"predicate.inputAttestations[{i}]")
        _keys(obj, {"uri", "digest"}, f"predicate.inputAttestations[{i}]")
        _str(obj.get("uri"), f"predicate.inputAttestations[{i}].uri")
        _digests(obj.get("digest"), f"predicate.inputAttestations[{i}].digest")
    if pred.get("verificationResult") not in VSA_RESULTS:
        raise _Bad(f"predicate.verificationResult is not one of {', '.join(VSA_RESULTS)}")
    levels = pred.get("verifiedLevels", [])
    if not isinstance(levels, list) or not all(isinstance(x, str) and x for x in levels):
        raise _Bad("predicate.verifiedLevels is not a list of strings")
    _str(pred.get("slsaVersion"), "predicate.slsaVersion", required=False)


PREDICATES: dict[str, Callable[[Mapping[str, object]], None]] = {
    PROVENANCE_TYPE: provenance,
    VSA_TYPE: verification_summary,
}


def problems(statement: object) -> str | None:
    """The first way statement breaks its schema, or None. A predicate type launcher does not know is
    checked only as far as the statement goes."""
    try:
        obj = _obj(statement, "the statement")
        _keys(obj, {"_type", "subject", "predicateType", "predicate"}, "the statement")
        if obj.get("_type") != STATEMENT_TYPE:
            raise _Bad(f"_type is not {STATEMENT_TYPE}")
        subjects = obj.get("subject")
        if not isinstance(subjects, list) or not subjects:
            raise _Bad("subject is not a non-empty list")
        for i, item in enumerate(subjects):
            descriptor(item, f"subject[{i}]", need_digest=True)
        _str(obj.get("predicateType"), "predicateType")
        pred = _obj(obj.get("predicate"), "predicate")
        check = PREDICATES.get(str(obj["predicateType"]))
        if check is not None:
            check(pred)
    except _Bad as exc:
        return str(exc)
    return None


def check(statement: object, source: str) -> None:
    """Raise Corrupt naming the first schema problem of the statement read from source."""
    found = problems(statement)
    if found is not None:
        raise Corrupt(f"{source}: not a valid in-toto statement: {found}",
                      "ask its author to write it again with `launcher attest`")
