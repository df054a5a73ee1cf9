"""`launcher attest verify FILE`: a signed statement checked as a reviewer would.

In order, each failure its own exit code: the envelope's form (13, CORRUPT), its signatures against
what the reviewer trusts (43 UNKNOWN_SIGNER: no trusted key signed it; 41 BAD_SIGNATURE: a trusted
key's signature does not verify, so the statement was changed), the statement's schema (13), and,
given the run's folder, every subject's (and byproduct's) sha256 (42 DIGEST_MISMATCH).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict, TypeVar, cast

from launcher.attest import dsse, schema
from launcher.attest import statement as st
from launcher.attest.signers import Checked, Trust
from launcher.errors import Corrupt, DigestMismatch, NotFound, UnknownSigner
from launcher.hashing import sha256_bytes, sha256_file

P = TypeVar("P")


def _at(value: object, *keys: str) -> object:
    """value[k1][k2]... through JSON objects; None where one is missing or not an object."""
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


class VerifiedRecord(TypedDict):
    """`launcher attest verify`'s JSON result for a statement."""

    file: str
    valid: bool
    predicate_type: str
    subjects: int
    envelope_sha256: str
    statement_sha256: str
    signatures: list[dict[str, str]]
    run_dir: str | None
    files_checked: int
    run_id: NotRequired[object]  # provenance: runDetails.metadata.invocationId
    builder: NotRequired[object]  # provenance: runDetails.builder.id
    verification_result: NotRequired[object]  # a verification summary's fields from here on
    verified_levels: NotRequired[object]
    verifier: NotRequired[object]
    resource: NotRequired[object]


@dataclass
class Verified:
    path: Path
    # a statement of any predicate type: its predicate is read through isinstance checks (schema.py checks
    # the types launcher knows: provenance, verification summary)
    statement: st.Statement[object]
    signatures: list[Checked]
    envelope_sha256: str
    statement_sha256: str
    files_checked: int = 0
    run_dir: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def predicate_type(self) -> str:
        return self.statement["predicateType"]

    @property
    def signers(self) -> list[str]:
        return [c.signer or c.keyid for c in self.signatures if c.outcome == "good"]

    def to_dict(self) -> VerifiedRecord:  # `attest verify`'s Result data
        pred = self.statement["predicate"]
        out: VerifiedRecord = {
            "file": str(self.path), "valid": True, "predicate_type": self.predicate_type,
            "subjects": len(self.statement["subject"]), "envelope_sha256": self.envelope_sha256,
            "statement_sha256": self.statement_sha256, "signatures": [c.to_dict() for c in self.signatures],
            "run_dir": str(self.run_dir) if self.run_dir else None, "files_checked": self.files_checked,
        }
        if self.predicate_type == st.PROVENANCE_TYPE:
            out["run_id"] = _at(pred, "runDetails", "metadata", "invocationId")
            out["builder"] = _at(pred, "runDetails", "builder", "id")
        elif self.predicate_type == st.VSA_TYPE:
            out["verification_result"] = _at(pred, "verificationResult")
            out["verified_levels"] = _at(pred, "verifiedLevels")
            out["verifier"] = _at(pred, "verifier", "id")
            out["resource"] = _at(pred, "resourceUri")
        return out

    def summary_line(self) -> str:
        kind = {st.PROVENANCE_TYPE: "provenance", st.VSA_TYPE: "verification summary"}.get(self.predicate_type,
                                                                                          self.predicate_type)
        line = f"valid: {self.path.name} is a {kind} statement signed by {', '.join(self.signers)}"
        if self.predicate_type == st.VSA_TYPE:
            pred = self.statement["predicate"]
            levels = _at(pred, "verifiedLevels")
            named = ", ".join(str(x) for x in levels) if isinstance(levels, list) else ""
            line += f" ({_at(pred, 'verificationResult')}: {named or 'no level'})"
        if self.run_dir is not None:
            line += f"; all {self.files_checked} files it names match {self.run_dir}"
        return line


def check_files(statement: st.Statement[P], run_dir: Path, source: str) -> int:
    """Every subject (and a provenance's byproducts) against the file of that name under run_dir."""
    wanted = st.subject_digests(statement)
    wrong: list[str] = []
    for name, digest in sorted(wanted.items()):
        path = run_dir / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise Corrupt(f"{source}: the subject {name!r} is not a path inside a run folder",
                          "ask its author for the statement again")
        got = sha256_file(path) if path.is_file() else None
        if got is None:
            wrong.append(f"{name} (missing)")
        elif got != digest:
            wrong.append(f"{name} (sha256 {got[7:19]}…, signed {digest[7:19]}…)")
    if wrong:
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise DigestMismatch(f"{len(wrong)} of {len(wanted)} files differ from what {source} names: "
                             + "; ".join(wrong[:3]) + more,
                             f"these are not the files that were signed: get them again from their author, or "
                             f"check {run_dir} is the run the statement is about")
    return len(wanted)


def open_signed(path: Path, trust: Trust) -> Verified:
    """The statement inside the envelope at path, its signatures checked and its schema too."""
    raw = path.read_bytes() if path.is_file() else b""
    if not raw:
        raise NotFound(f"no file {path}", "give the path of a .dsse.json envelope")
    if b'"_type"' in raw[:4096] and b'"payload"' not in raw[:4096]:
        raise UnknownSigner(f"{path} is an unsigned statement, not a signed envelope",
                            "sign it: `launcher attest RUN --key FILE` writes attestation/provenance.dsse.json")
    envelope = dsse.parse(raw, str(path))
    if envelope.payload_type != st.PAYLOAD_TYPE:
        raise Corrupt(f"{path} carries a {envelope.payload_type!r} payload, not an in-toto statement",
                      "give an envelope `launcher attest` or `launcher reproduce` wrote")
    checked = dsse.verify(envelope, trust, str(path))
    decoded = st.decode(envelope.payload, str(path))
    schema.check(decoded, str(path))
    statement = cast("st.Statement[object]", decoded)  # its form checked just above
    return Verified(path, statement, checked, sha256_bytes(raw), sha256_bytes(envelope.payload))


def verify_file(path: Path, trust: Trust, run_dir: Path | None = None) -> Verified:
    verified = open_signed(path, trust)
    if run_dir is not None:
        if not run_dir.is_dir():
            raise NotFound(f"no run folder {run_dir}", "give the folder of the run (runs/<id>) the statement is about")
        verified.files_checked = check_files(verified.statement, run_dir, str(path))
        verified.run_dir = run_dir
    return verified
