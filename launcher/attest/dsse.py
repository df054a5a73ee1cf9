"""DSSE envelopes (https://github.com/secure-systems-lab/dsse, protocol v1): a payload, its type, and
signatures over the Pre-Authentication Encoding of the two, so a signature never covers bytes whose
type could be read another way.

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body   (LEN: decimal byte count)

The envelope is JSON: ``{"payloadType", "payload" (base64), "signatures": [{"keyid", "sig" (base64)}]}``.
An SSH signature's ``sig`` is the SSHSIG blob ssh-keygen writes (without its armour); a PEM key's is
the raw Ed25519 signature or the DER ECDSA one.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from launcher.attest.signers import Checked, Signer, Trust
from launcher.errors import BadSignature, Corrupt, UnknownSigner
from launcher.hashing import atomic_write_bytes


def pae(payload_type: str, payload: bytes) -> bytes:
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


class SignatureJSON(TypedDict):
    keyid: str
    sig: str  # base64


class EnvelopeJSON(TypedDict):
    """A DSSE envelope as written (*.dsse.json)."""

    payloadType: str
    payload: str  # base64
    signatures: list[SignatureJSON]


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[tuple[str, bytes], ...]  # (keyid, sig)

    def to_json(self) -> EnvelopeJSON:
        return {"payloadType": self.payload_type, "payload": base64.b64encode(self.payload).decode(),
                "signatures": [{"keyid": k, "sig": base64.b64encode(s).decode()} for k, s in self.signatures]}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=2, sort_keys=True).encode() + b"\n"


def sign(payload: bytes, payload_type: str, signers: Sequence[Signer]) -> Envelope:
    data = pae(payload_type, payload)
    return Envelope(payload_type, payload, tuple(s.sign(data) for s in signers))


def write(path: Path, envelope: Envelope) -> None:
    atomic_write_bytes(path, envelope.to_bytes())


def parse(raw: bytes, source: str) -> Envelope:
    """An envelope from its JSON bytes; Corrupt when it is not one."""
    hint = "give the .dsse.json file `launcher attest` or `launcher reproduce` wrote"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise Corrupt(f"{source} is not JSON, so not a DSSE envelope", hint) from None
    if not isinstance(data, dict) or not isinstance(data.get("payload"), str) \
            or not isinstance(data.get("payloadType"), str) or not isinstance(data.get("signatures"), list):
        raise Corrupt(f"{source} is not a DSSE envelope (payloadType, payload, signatures)", hint)
    try:
        payload = base64.b64decode(data["payload"], validate=True)
        sigs = tuple((str(s.get("keyid") or ""), base64.b64decode(str(s["sig"]), validate=True))
                     for s in data["signatures"])
    except (binascii.Error, KeyError, TypeError, AttributeError):
        raise Corrupt(f"{source}: the envelope's payload or a signature is not base64", hint) from None
    return Envelope(data["payloadType"], payload, sigs)


def read(path: Path) -> Envelope:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise Corrupt(f"cannot read {path}: {exc.strerror or exc}", "give the path of a .dsse.json file") from None
    return parse(raw, str(path))


def verify(envelope: Envelope, trust: Trust, source: str) -> list[Checked]:
    """Check every signature against what the verifier trusts. Passes when one is good: a good signature
    by a trusted key authenticates the payload, whatever else the envelope carries (a co-signature that
    was corrupted is listed as bad, not fatal). Without a good one: BadSignature when a trusted key's
    signature does not verify (the payload was changed), else UnknownSigner (no signature is by a trusted
    key, or there is none)."""
    data = pae(envelope.payload_type, envelope.payload)
    checked = [trust.check(data, keyid, sig) for keyid, sig in envelope.signatures]
    if any(c.outcome == "good" for c in checked):
        return checked
    bad = [c for c in checked if c.outcome == "bad"]
    if bad:
        raise BadSignature(
            f"{source}: the signature by {bad[0].signer or bad[0].keyid or 'a trusted key'} does not verify: "
            "what it signed was changed after signing",
            "ask its author for the file again; do not trust this copy")
    who = ", ".join(sorted({c.keyid for c in checked if c.keyid})) or "nobody launcher can name"
    raise UnknownSigner(f"{source} is signed by {who}, whom {trust.describe()} does not name"
                        if checked else f"{source} carries no signature",
                        "add the author's key to your allowed-signers file (or pass it with --key PUB) "
                        "once you have checked it is theirs")
