"""A reproduction's verdict as an SLSA Verification Summary (VSA v1, https://slsa.dev/verification_summary/v1).

- subject: the original run's outputs (name and the sha256 its author signed), each annotated with
  ``result`` (verify's status for it: identical, identical-content, differs, missing, ignored, unreadable)
  and ``reproducedSha256`` (what the reproduction wrote there);
- verifier.id: ``urn:launcher:verifier:<key id>``: the key that signs the summary (``attest verify`` refuses a
  summary signed by another key);
- resourceUri: ``urn:launcher:run:<original run id>``; policy.uri: ``urn:launcher:policy:reproduce:v1``
  (the bundle's signatures, the image rebuilt to the recorded ID, the run repeated with the same code,
  parameters, seed and profile, its outputs compared by `launcher verify checksums`);
- inputAttestations: the original's signed provenance (the envelope's sha256, and the statement's) and
  the reproduction's own signed provenance (whose builder id names the host it ran on);
- verificationResult: PASSED for *identical* in the recorded image, FAILED otherwise (the policy includes
  the image: --allow-other-image runs it, but cannot pass); verifiedLevels: ``LAUNCHER_REPRODUCED_<VERDICT>``
  (IDENTICAL, INCONCLUSIVE, DIFFERS), and ``LAUNCHER_OTHER_IMAGE`` when --allow-other-image ran it in an image
  other than the recorded one.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import NotRequired, TypedDict

from launcher.attest import provenance as prov
from launcher.attest import schema
from launcher.attest import statement as st
from launcher.attest.bundle import RUNS_DIR
from launcher.attest.check import Verified
from launcher.attest.provenance import ATTESTATION_DIR

POLICY = f"{st.URI}:policy:reproduce:v1"
OTHER_IMAGE = st.OTHER_IMAGE
STATEMENT_FILE = "verification.json"
ENVELOPE_FILE = "verification.dsse.json"


class VerifierId(TypedDict):
    id: str


class Policy(TypedDict):
    uri: str


class InputAttestation(TypedDict):
    uri: str
    digest: st.DigestSet


class VerificationSummary(TypedDict):
    """The SLSA VSA v1 predicate of runs/<id>/attestation/verification.json (a reproduction's verdict)."""

    verifier: VerifierId
    timeVerified: str
    resourceUri: str
    policy: Policy
    inputAttestations: list[InputAttestation]
    verificationResult: str
    verifiedLevels: list[str]
    slsaVersion: str


class OutputResult(TypedDict):
    """What the reproduction wrote for one of the original's outputs: verify's status and its sha256."""

    status: str
    sha256: str | None


class SignedProvenance(TypedDict):
    """Where the reproduction's own signed provenance is, and its envelope's sha256."""

    uri: str
    envelope_sha256: str


class OutputNotes(TypedDict):
    """A subject's annotations in a verification summary."""

    result: str
    reproducedSha256: NotRequired[str]


def verifier_id(keyid: str) -> str:
    """The verifier a summary names: the key that signs it (so no one can claim another's verdict)."""
    return st.VERIFIER + keyid


def level(verdict: str) -> str:
    return st.REPRODUCED + verdict.upper().replace("-", "_")


def summary(original: Verified, original_run: str, reproduction: SignedProvenance, verdict: str,
            results: Mapping[str, OutputResult], *, other_image: bool,
            verifier_key: str) -> st.Statement[VerificationSummary]:
    """The VSA statement. original: the run's provenance as verified from the bundle; reproduction:
    {"uri", "envelope_sha256"} of the reproduction's own signed provenance; results: output name ->
    {"status", "sha256"} (the reproduction's digest, where it wrote that file); verifier_key: the id of
    the key that will sign it."""
    subjects = []
    for name, digest in sorted(st.subject_digests(original.statement, byproducts=False).items()):
        got = results.get(name)
        notes: OutputNotes = {"result": str(got["status"] if got else "missing")}
        if got and got["sha256"]:
            notes["reproducedSha256"] = got["sha256"].removeprefix("sha256:")
        subjects.append(st.descriptor(name, digest, annotations=notes))
    base = f"{RUNS_DIR}/{original_run}/{ATTESTATION_DIR}"
    predicate: VerificationSummary = {
        "verifier": {"id": verifier_id(verifier_key)},
        "timeVerified": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "resourceUri": f"{st.URI}:run:{original_run}",
        "policy": {"uri": POLICY},
        "inputAttestations": [
            {"uri": f"{base}/{prov.ENVELOPE_FILE}", "digest": st.digest_set(original.envelope_sha256)},
            {"uri": f"{base}/{prov.STATEMENT_FILE}", "digest": st.digest_set(original.statement_sha256)},
            {"uri": reproduction["uri"], "digest": st.digest_set(reproduction["envelope_sha256"])},
        ],
        "verificationResult": "PASSED" if verdict == "identical" and not other_image else "FAILED",
        "verifiedLevels": [level(verdict), *([OTHER_IMAGE] if other_image else [])],
        "slsaVersion": "1.0",
    }
    statement = st.make(subjects, st.VSA_TYPE, predicate)
    schema.check(statement, f"the verification summary of {original_run}")
    return statement
