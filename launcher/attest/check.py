"""`launcher attest verify FILE`: a signed statement checked as a reviewer would.

In order, each failure its own exit code: the envelope's form (13, CORRUPT), its signatures against
what the reviewer trusts (43 UNKNOWN_SIGNER: no trusted key signed it; 41 BAD_SIGNATURE: a trusted
key's signature does not verify and none does, so the statement was changed), the statement's schema
(13), a verification summary's verifier (43: it must be the key that signed it), what the reviewer
asked for (--predicate-type: 16 INCOMPATIBLE; --verifier: 43), and, given the run's folder, every file
(42 DIGEST_MISMATCH: a file differs, is missing, is a link, or is in outputs/ without being named).
A valid summary of a reproduction that did not pass exits with its verdict's code (3, 37, 44).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NotRequired, TypedDict, TypeVar, cast

from launcher.attest import dsse, schema
from launcher.attest import statement as st
from launcher.attest.signers import Checked, Trust
from launcher.errors import Corrupt, DigestMismatch, ExitCode, Incompatible, NotFound, UnknownSigner
from launcher.hashing import sha256_bytes

P = TypeVar("P")
OUTPUTS = "outputs"  # a run folder's outputs: every file in it is one its statement names
KINDS = {"provenance": st.PROVENANCE_TYPE, "summary": st.VSA_TYPE, "verification-summary": st.VSA_TYPE,
         "vsa": st.VSA_TYPE, "bundle": st.BUNDLE_TYPE}
ENVELOPE_OF_RUN = "attestation/provenance.dsse.json"  # a run folder's signed provenance (provenance.py)


def _at(value: object, *keys: str) -> object:
    """value[k1][k2]... through JSON objects; None where one is missing or not an object."""
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def kind_of(predicate_type: str) -> str:
    """A predicate type in words: provenance, verification summary, bundle, or the type itself."""
    return {st.PROVENANCE_TYPE: "provenance", st.VSA_TYPE: "verification summary",
            st.BUNDLE_TYPE: "bundle"}.get(predicate_type, predicate_type)


def predicate_type_of(name: str) -> str:
    """--predicate-type's value: a kind's short name (provenance, summary, bundle) or a type URI."""
    return KINDS.get(name.strip().lower(), name.strip())


class VerifiedRecord(TypedDict):
    """`launcher attest verify`'s JSON result for a statement."""

    file: str
    valid: bool
    passed: bool  # False: a valid summary of a reproduction that did not pass (its exit code says how)
    predicate_type: str
    subjects: int
    envelope_sha256: str
    statement_sha256: str
    signatures: list[dict[str, str]]
    trusted: list[dict[str, str]]
    run_dir: str | None
    files_checked: int
    run_id: NotRequired[object]  # provenance: runDetails.metadata.invocationId
    builder: NotRequired[object]  # provenance: runDetails.builder.id
    verification_result: NotRequired[object]  # a verification summary's fields from here on
    verified_levels: NotRequired[object]
    verifier: NotRequired[object]
    resource: NotRequired[object]


def summary_exit_code(predicate: object) -> ExitCode:
    """A verification summary's verdict as an exit code: 0 PASSED; else 3 (the outputs differ), 44
    (another image ran it), 37 (inconclusive), 3 for any other failure."""
    if _at(predicate, "verificationResult") == "PASSED":
        return ExitCode.OK
    found = _at(predicate, "verifiedLevels")
    levels = {str(x) for x in found} if isinstance(found, list) else set()
    if st.REPRODUCED + "DIFFERS" in levels:
        return ExitCode.NOT_REPRODUCIBLE
    if st.OTHER_IMAGE in levels:
        return ExitCode.OTHER_IMAGE
    if st.REPRODUCED + "INCONCLUSIVE" in levels:
        return ExitCode.INCONCLUSIVE
    return ExitCode.NOT_REPRODUCIBLE


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
    trusted: list[dict[str, str]] = field(default_factory=list)  # Trust.roots(): what the verdict relied on
    trust_text: str = ""

    @property
    def predicate_type(self) -> str:
        return self.statement["predicateType"]

    @property
    def signers(self) -> list[str]:
        return [c.signer or c.keyid for c in self.signatures if c.outcome == "good"]

    @property
    def exit_code(self) -> ExitCode:
        return summary_exit_code(self.statement["predicate"]) if self.predicate_type == st.VSA_TYPE else ExitCode.OK

    def to_dict(self) -> VerifiedRecord:  # `attest verify`'s Result data
        pred = self.statement["predicate"]
        out: VerifiedRecord = {
            "file": str(self.path), "valid": True, "passed": self.exit_code == ExitCode.OK,
            "predicate_type": self.predicate_type, "subjects": len(self.statement["subject"]),
            "envelope_sha256": self.envelope_sha256, "statement_sha256": self.statement_sha256,
            "signatures": [c.to_dict() for c in self.signatures], "trusted": self.trusted,
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
        bad = sum(c.outcome == "bad" for c in self.signatures)
        other = f" (and {bad} signatures by a trusted key that do not verify)" if bad > 1 else \
            " (and 1 signature by a trusted key that does not verify)" if bad else ""
        who, trust = f"signed by {', '.join(self.signers)}{other}", f"; trusting {self.trust_text}"
        if self.predicate_type != st.VSA_TYPE:
            files = f"; all {self.files_checked} files it names match {self.run_dir}" if self.run_dir else ""
            return f"valid: {self.path.name} is a {kind_of(self.predicate_type)} statement {who}{files}{trust}"
        files = (f"; {self.run_dir} is the run it is about: all {self.files_checked} files of its signed provenance "
                 "match") if self.run_dir else ""
        pred = self.statement["predicate"]
        levels = _at(pred, "verifiedLevels")
        named = ", ".join(str(x) for x in levels) if isinstance(levels, list) else "no level"
        result = _at(pred, "verificationResult")
        if self.exit_code == ExitCode.OK:
            return f"valid: {self.path.name} is a verification summary {who}: {result} ({named}){files}{trust}"
        return (f"{result}: {self.path.name} is a valid verification summary {who}, of a reproduction that did not "
                f"pass ({named}){files}{trust}")


def file_problem(run_dir: Path, name: str) -> str | None:
    """What is wrong with run_dir/name as a file of the run (missing, a link, not a regular file), or None:
    no link is followed, at any level below run_dir."""
    path, mode = run_dir, 0
    parts = PurePosixPath(name).parts
    for i, part in enumerate(parts):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return "missing"
        if stat.S_ISLNK(mode):
            return "a link, not the run's file" if i == len(parts) - 1 else f"inside {'/'.join(parts[:i + 1])}, a link"
    return None if stat.S_ISREG(mode) else "not a regular file"


def _hashes(path: Path, algorithms: list[str]) -> dict[str, str]:
    hashers = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            for h in hashers.values():
                h.update(block)
    return {a: h.hexdigest() for a, h in hashers.items()}


def _unnamed_outputs(run_dir: Path, named: Mapping[str, object]) -> list[str]:
    """What outputs/ holds that the statement does not name: added files, and links (never followed)."""
    found: list[str] = []
    top = run_dir / OUTPUTS
    if not top.is_dir() or top.is_symlink():
        return found
    for folder, dirs, files in os.walk(top):
        for entry in sorted(dirs + files):
            full = Path(folder) / entry
            rel = full.relative_to(run_dir).as_posix()
            if full.is_symlink():
                found.append(f"{rel} (a link, not named)" if rel not in named else f"{rel} (a link)")
            elif entry in files and rel not in named:
                found.append(f"{rel} (not named: added after signing?)")
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]
    return found


def check_files(statement: st.Statement[P], run_dir: Path, source: str, *, every_output: bool = True) -> int:
    """Every subject (and a provenance's byproducts) against the file of that name under run_dir, by each
    digest launcher checks; links are not followed. every_output: outputs/ may hold nothing else."""
    wanted = st.checkable(statement)
    wrong: list[str] = []
    for name, digests in sorted(wanted.items()):
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or "\\" in name:
            raise Corrupt(f"{source}: the subject {name!r} is not a path inside a run folder",
                          "ask its author for the statement again")
        problem = file_problem(run_dir, name)
        if problem is not None:
            wrong.append(f"{name} ({problem})")
            continue
        got = _hashes(run_dir / name, sorted(digests))
        for algo in sorted(digests):
            if got[algo] != digests[algo].lower():
                wrong.append(f"{name} ({algo} {got[algo][:12]}…, signed {digests[algo][:12]}…)")
                break
    if every_output:
        wrong += [w for w in _unnamed_outputs(run_dir, wanted) if w not in wrong]
    if wrong:
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise DigestMismatch(f"{len(wrong)} files differ from what {source} names: " + "; ".join(wrong[:3]) + more,
                             f"these are not the files that were signed: get them again from their author, or "
                             f"check {run_dir} is the run the statement is about")
    return len(wanted)


def _bind_verifier(statement: st.Statement[object], checked: list[Checked], source: str) -> None:
    """A verification summary speaks for the key that signed it: its verifier.id must name that key."""
    named = _at(statement["predicate"], "verifier", "id")
    key = named.removeprefix(st.VERIFIER) if isinstance(named, str) and named.startswith(st.VERIFIER) else None
    good = [c.keyid for c in checked if c.outcome == "good"]
    if key is None or key not in good:
        why = "names no key" if key is None or "@" in key else \
            f"is not the key of its trusted signature ({', '.join(good)})"
        raise UnknownSigner(f"{source}: its verifier {named!r} {why}: a verification summary is the word of the "
                            "key that signed it", "ask the verifier to reproduce again with this launcher "
                            "(its summary names the verifier's key id)")


def open_signed_bytes(raw: bytes, source: str, path: Path, trust: Trust) -> Verified:
    """The statement inside the envelope raw (read from path), its signatures and schema checked."""
    if b'"_type"' in raw[:4096] and b'"payload"' not in raw[:4096]:
        raise UnknownSigner(f"{source} is an unsigned statement, not a signed envelope",
                            "sign it: `launcher attest RUN --key FILE` writes attestation/provenance.dsse.json")
    envelope = dsse.parse(raw, source)
    if envelope.payload_type != st.PAYLOAD_TYPE:
        raise Corrupt(f"{source} carries a {envelope.payload_type!r} payload, not an in-toto statement",
                      "give an envelope `launcher attest` or `launcher reproduce` wrote")
    checked = dsse.verify(envelope, trust, source)
    decoded = st.decode(envelope.payload, source)
    schema.check(decoded, source)
    statement = cast("st.Statement[object]", decoded)  # its form checked just above
    if statement["predicateType"] == st.VSA_TYPE:
        _bind_verifier(statement, checked, source)
    return Verified(path, statement, checked, sha256_bytes(raw), sha256_bytes(envelope.payload),
                    trusted=trust.roots(), trust_text=trust.describe())


def open_signed(path: Path, trust: Trust) -> Verified:
    """The statement inside the envelope at path, its signatures checked and its schema too."""
    try:
        raw = path.read_bytes() if path.is_file() else b""
    except OSError:
        raw = b""
    if not raw:
        raise NotFound(f"no file {path}", "give the path of a .dsse.json envelope")
    return open_signed_bytes(raw, str(path), path, trust)


def require(verified: Verified, predicate_type: str | None, verifier: str | None) -> None:
    """What the reviewer expects: a statement of this type (16 INCOMPATIBLE), signed by (for a summary:
    verified by) this principal or key id (43 UNKNOWN_SIGNER)."""
    if predicate_type:
        want = predicate_type_of(predicate_type)
        if verified.predicate_type != want:
            raise Incompatible(f"{verified.path.name} is a {kind_of(verified.predicate_type)} statement, not a "
                               f"{kind_of(want)} (--predicate-type {predicate_type})",
                               "give the file you meant to check, or drop --predicate-type")
    if verifier:
        good = [c for c in verified.signatures if c.outcome == "good"]
        if verified.predicate_type == st.VSA_TYPE:
            named = str(_at(verified.statement["predicate"], "verifier", "id")).removeprefix(st.VERIFIER)
            good = [c for c in good if c.keyid == named]
        if not any(verifier in (c.signer, c.keyid) for c in good):
            who = ", ".join(c.signer or c.keyid for c in good) or "nobody"
            raise UnknownSigner(f"{verified.path.name} is not signed by {verifier} (--verifier): "
                                f"{'verified' if verified.predicate_type == st.VSA_TYPE else 'signed'} by {who}",
                                "ask the verifier for their own signed file, or check whom you expect")


def _summary_run(verified: Verified, run_dir: Path, source: str) -> int:
    """A summary checked against a run folder: the folder must hold the provenance the summary names
    (by its envelope's sha256), and its files be that provenance's; the summary's outputs too."""
    pred = verified.statement["predicate"]
    rid = str(_at(pred, "resourceUri") or "").removeprefix(f"{st.URI}:run:")
    inputs = _at(pred, "inputAttestations")
    named = {str(_at(i, "uri")): st.from_digest_set(_at(i, "digest")) for i in inputs if isinstance(i, Mapping)} \
        if isinstance(inputs, list) else {}
    envelope = run_dir / ENVELOPE_OF_RUN
    recorded = named.get(f"runs/{rid}/{ENVELOPE_OF_RUN}")
    if recorded is None or file_problem(run_dir, ENVELOPE_OF_RUN) is not None or \
            sha256_bytes(envelope.read_bytes()) != recorded:
        raise DigestMismatch(f"{run_dir} is not the run {rid} the summary is about: it does not hold the signed "
                             "provenance the summary names", f"give the folder of run {rid} (runs/{rid}, or one "
                             "unpacked from its bundle)")
    provenance = st.decode(dsse.read(envelope).payload, str(envelope))
    schema.check(provenance, str(envelope))
    if _at(provenance, "runDetails", "metadata", "invocationId") not in (rid, None):
        raise DigestMismatch(f"{envelope} is the provenance of another run than {rid}", f"give the folder of run {rid}")
    count = check_files(cast("st.Statement[object]", provenance), run_dir, f"{source}'s run's provenance")
    check_files(verified.statement, run_dir, source, every_output=False)
    return count


def verify_file(path: Path, trust: Trust, run_dir: Path | None = None, *, predicate_type: str | None = None,
                verifier: str | None = None) -> Verified:
    verified = open_signed(path, trust)
    require(verified, predicate_type, verifier)
    if run_dir is not None:
        if not run_dir.is_dir():
            raise NotFound(f"no run folder {run_dir}", "give the folder of the run (runs/<id>) the statement is about")
        if verified.predicate_type == st.VSA_TYPE:
            verified.files_checked = _summary_run(verified, run_dir, str(path))
        else:
            verified.files_checked = check_files(verified.statement, run_dir, str(path))
        verified.run_dir = run_dir
    return verified
