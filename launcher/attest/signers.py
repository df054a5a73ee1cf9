"""Keys people already have: an SSH key, used as git signs commits (``ssh-keygen -Y sign`` with the
namespace ``launcher``, verified with ``ssh-keygen -Y verify`` against an allowed-signers file), and an
Ed25519 or ECDSA key in PEM form (through ``cryptography``). What a verifier trusts is a
:class:`Trust`: an allowed-signers file and/or public keys (PEM, or an OpenSSH ``.pub`` line).

Keyless signing (Sigstore: a short-lived certificate from Fulcio, the signature logged in Rekor)
needs Sigstore's public services; it is a third :class:`Signer` behind the name ``sigstore`` once
launcher can reach them (``load_signer`` is the seam).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from launcher import proc
from launcher.errors import MissingExtra, NotFound, UsageError
from launcher.workspace import user_allowed_signers

NAMESPACE = "launcher"  # ssh-keygen -Y's namespace: an allowed signer can be limited to it
SSHSIG_MAGIC = b"SSHSIG"
KEYLESS = "sigstore"
ALLOWED_SIGNERS_ENV = "LAUNCHER_ALLOWED_SIGNERS"
PASSWORD_ENV = "LAUNCHER_KEY_PASSWORD"  # noqa: S105  (the variable that holds an encrypted PEM key's passphrase)


class Signer(Protocol):
    @property
    def kind(self) -> str: ...

    def sign(self, data: bytes) -> tuple[str, bytes]:
        """(keyid, signature) over data."""

    def keyid(self) -> str:
        """The key id its signatures carry (what a verification summary names as its verifier)."""

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Checked:
    """One signature checked against what the verifier trusts."""

    keyid: str
    outcome: str  # "good" | "bad" (a trusted key, but it does not verify) | "unknown" (no trusted key)
    signer: str = ""  # who: the allowed signer's principal, or the trusted key's file

    def to_dict(self) -> dict[str, str]:
        return {"keyid": self.keyid, "outcome": self.outcome, "signer": self.signer}


# ---------------------------------------------------------------- SSH keys, through ssh-keygen -Y


def _ssh_string(data: bytes, at: int) -> tuple[bytes, int]:
    if at + 4 > len(data):
        raise ValueError("truncated")
    (n,) = struct.unpack(">I", data[at:at + 4])
    if at + 4 + n > len(data):
        raise ValueError("truncated")
    return data[at + 4:at + 4 + n], at + 4 + n


def sshsig_public(blob: bytes) -> bytes:
    """The public key blob inside an SSHSIG signature (ValueError when it is not one)."""
    if not blob.startswith(SSHSIG_MAGIC):
        raise ValueError("not an SSH signature")
    public, _ = _ssh_string(blob, len(SSHSIG_MAGIC) + 4)
    if not public:
        raise ValueError("no public key")
    return public


def ssh_fingerprint(public: bytes) -> str:
    """``SHA256:...`` as ssh-keygen -l prints it, of an SSH public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(public).digest()).decode().rstrip("=")


def sshsig_keyid(blob: bytes) -> str:
    """The fingerprint of the key inside an SSHSIG blob."""
    return ssh_fingerprint(sshsig_public(blob))


def armor(blob: bytes) -> str:
    text = base64.b64encode(blob).decode()
    lines = [text[i:i + 70] for i in range(0, len(text), 70)]
    return "-----BEGIN SSH SIGNATURE-----\n" + "\n".join(lines) + "\n-----END SSH SIGNATURE-----\n"


def unarmor(text: str) -> bytes:
    body = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("-----")]
    return base64.b64decode("".join(body))


@dataclass(frozen=True)
class SSHSigner:
    key: Path  # a private key file, or a .pub whose key the agent holds
    kind: str = "ssh"

    def sign(self, data: bytes) -> tuple[str, bytes]:
        done = proc.run(["ssh-keygen", "-q", "-Y", "sign", "-f", self.key, "-n", NAMESPACE], input=data, check=False)
        if done.returncode != 0 or "BEGIN SSH SIGNATURE" not in done.out:
            raise UsageError(f"ssh-keygen could not sign with {self.key}: {done.last_error_line()}",
                             "give a private key without a passphrase, or load it into ssh-agent and pass its .pub")
        blob = unarmor(done.out)
        return sshsig_keyid(blob), blob

    def keyid(self) -> str:
        if self.key.suffix == ".pub":
            text = self.key.read_text(errors="replace")
        else:  # the public half, derived from the private key (a stale .pub beside it could name another)
            done = proc.run(["ssh-keygen", "-y", "-f", self.key], check=False)
            if done.returncode != 0:
                raise UsageError(f"ssh-keygen cannot read the public half of {self.key}: {done.last_error_line()}",
                                 "give a private key without a passphrase, or load it into ssh-agent and pass its .pub")
            text = done.out
        found = _KEY_IN_LINE.match(" " + (text.strip().splitlines() or [""])[0])
        if found is None:
            raise UsageError(f"{self.key} holds no OpenSSH public key", "give an SSH private key or its .pub")
        return ssh_fingerprint(base64.b64decode(found.group(2)))

    def describe(self) -> str:
        return f"SSH key {self.key}"


# ---------------------------------------------------------------- PEM keys, through cryptography


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError as exc:  # a dependency of launcher (and of paramiko): only a broken install lacks it
        raise MissingExtra(f"PEM keys need the Python package cryptography, which is not installed ({exc})",
                           "pip install cryptography (a dependency of launcher: reinstall launcher)") from None
    return serialization


def pem_keyid(public_key: Any) -> str:
    """``sha256:<hex>`` of the key's SubjectPublicKeyInfo (DER): the same for its private and public halves."""
    serialization = _crypto()
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _hash_for(curve: Any) -> Any:
    from cryptography.hazmat.primitives import hashes

    return {256: hashes.SHA256(), 384: hashes.SHA384(), 521: hashes.SHA512()}.get(curve.key_size, hashes.SHA256())


@dataclass
class PemSigner:
    path: Path
    kind: str = "pem"
    _key: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        serialization = _crypto()
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519

        password = os.environ.get(PASSWORD_ENV)
        try:
            key = serialization.load_pem_private_key(self.path.read_bytes(),
                                                     password.encode() if password else None)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"cannot read the PEM key {self.path}: {exc}",
                             f"give an unencrypted Ed25519 or ECDSA private key, or set {PASSWORD_ENV}") from None
        if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
            raise UsageError(f"{self.path} is a {type(key).__name__}: launcher signs with Ed25519 or ECDSA keys",
                             "make one with `openssl genpkey -algorithm ed25519 -out key.pem`")
        self._key = key

    def sign(self, data: bytes) -> tuple[str, bytes]:
        from cryptography.hazmat.primitives.asymmetric import ec

        if isinstance(self._key, ec.EllipticCurvePrivateKey):
            sig = self._key.sign(data, ec.ECDSA(_hash_for(self._key.curve)))
        else:
            sig = self._key.sign(data)
        return pem_keyid(self._key.public_key()), sig

    def keyid(self) -> str:
        return pem_keyid(self._key.public_key())

    def describe(self) -> str:
        return f"PEM key {self.path}"


def _verify_pem(public_key: Any, data: bytes, sig: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(sig, data, ec.ECDSA(_hash_for(public_key.curve)))
        else:
            public_key.verify(sig, data)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


# ---------------------------------------------------------------- choosing a key


def load_signer(spec: str | Path) -> Signer:
    """The signer a --key (or launcher.toml's signing_key) names: an SSH private key (or the .pub of
    one in ssh-agent), or a PEM Ed25519/ECDSA private key."""
    if str(spec) == KEYLESS:
        raise UsageError("keyless Sigstore signing needs Sigstore's public services (Fulcio, Rekor), which "
                         "launcher does not use yet", "sign with an SSH key or a PEM key (--key FILE)")
    path = Path(spec).expanduser()
    try:
        head = path.read_bytes()[:200]
    except OSError as exc:
        raise NotFound(f"no signing key at {path} ({exc.strerror or exc})",
                       "give an SSH or PEM private key with --key FILE, or signing_key in launcher.toml") from None
    if b"BEGIN OPENSSH PRIVATE KEY" in head or head.startswith((b"ssh-", b"ecdsa-sha2-", b"sk-")):
        return SSHSigner(path)
    if b"-----BEGIN" in head and b"PRIVATE KEY" in head:
        return PemSigner(path)
    if b"PUBLIC KEY" in head:
        raise UsageError(f"{path} is a public key: signing needs the private one",
                         "give the private key (a verifier takes the public one: attest verify --key)")
    raise UsageError(f"{path} is neither an OpenSSH nor a PEM private key",
                     "make one with `ssh-keygen -t ed25519` or `openssl genpkey -algorithm ed25519`")


# ---------------------------------------------------------------- what a verifier trusts

_KEY_IN_LINE = re.compile(r"(?:^|\s)((?:ssh|ecdsa|sk)-[A-Za-z0-9@.-]+)\s+([A-Za-z0-9+/]+={0,2})(?:\s|$)")


def _principals(line: str) -> tuple[list[str], str] | None:
    """An allowed-signers line's principals (its patterns, negated ones left out) and its key's base64."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    if text.startswith('"'):
        end = text.find('"', 1)
        if end < 0:
            return None
        names, rest = text[1:end], text[end + 1:]
    else:
        names, _, rest = text.partition(" ")
    found = _KEY_IN_LINE.search(rest)
    if found is None:
        return None
    return [p for p in names.split(",") if p and not p.startswith("!")], found.group(2)


def _ssh_public_line(path: Path) -> tuple[str, str] | None:
    """(key type, base64) of an OpenSSH public key file, None for another kind of file (a PEM key)."""
    first = (path.read_text(errors="replace").strip().splitlines() or [""])[0]
    found = _KEY_IN_LINE.match(" " + first)
    return (found.group(1), found.group(2)) if found else None


@dataclass(frozen=True)
class Trust:
    """What a verifier trusts: an allowed-signers file (and where it came from: the command line, the
    environment or the user's own configuration, never a workspace) and public keys given by path."""

    allowed_signers: Path | None = None  # an OpenSSH allowed-signers file (as git's gpg.ssh.allowedSignersFile)
    keys: tuple[Path, ...] = ()  # public keys: PEM, or an OpenSSH public key line
    origin: str = "--allowed-signers"  # where allowed_signers came from, in words the verdict prints
    key_option: str = "--key"

    @classmethod
    def of(cls, allowed_signers: Path | None, keys: Sequence[Path] = (), *, origin: str = "--allowed-signers",
           key_option: str = "--key", ignored: str | None = None) -> Trust:
        """ignored: a trust root that was found but is not taken (a workspace's), named when nothing else is."""
        for p in [*([allowed_signers] if allowed_signers else []), *keys]:
            if not p.is_file():
                raise NotFound(f"no such file {p}", "give an allowed-signers file or a public key that exists")
        if allowed_signers is None and not keys:
            why = f" ({ignored})" if ignored else ""
            raise UsageError(f"nothing to check the signatures against{why}",
                             f"give --allowed-signers FILE (SSH keys, as git uses) or {key_option} PUB (a public "
                             f"key), set {ALLOWED_SIGNERS_ENV}, or keep your own in {user_allowed_signers()}")
        return cls(allowed_signers, tuple(keys), origin, key_option)

    def describe(self) -> str:
        parts = [f"{self.allowed_signers} (from {self.origin})"] if self.allowed_signers else []
        return ", ".join(parts + [f"{k} ({self.key_option})" for k in self.keys])

    def roots(self) -> list[dict[str, str]]:
        """What was trusted, for a verdict's data: each file and where it came from."""
        out = [{"allowed_signers": str(self.allowed_signers), "from": self.origin}] if self.allowed_signers else []
        return out + [{"key": str(k), "from": self.key_option} for k in self.keys]

    def _ssh_lines(self) -> tuple[list[str], dict[str, str]]:
        """The allowed-signers lines to verify with, and who each generated principal stands for: a --key
        file gets a principal of launcher's making (its file name is never written into the file)."""
        lines = self.allowed_signers.read_text(errors="replace").splitlines() if self.allowed_signers else []
        named: dict[str, str] = {}
        for i, key in enumerate(self.keys):
            found = _ssh_public_line(key)
            if found is not None:
                principal = f"launcher-trusted-key-{i}"
                named[principal] = str(key)
                lines.append(f'{principal} namespaces="{NAMESPACE}" {found[0]} {found[1]}')
        return lines, named

    def check(self, data: bytes, keyid: str, sig: bytes) -> Checked:
        """Whether sig over data is by a trusted key: good, bad (a trusted key that does not verify) or
        unknown (no trusted key made it, or it cannot be read)."""
        if sig.startswith(SSHSIG_MAGIC):
            return self._check_ssh(data, sig)
        return self._check_pem(data, keyid, sig)

    def _check_ssh(self, data: bytes, blob: bytes) -> Checked:
        try:
            public = sshsig_public(blob)
            keyid = ssh_fingerprint(public)
            key_type = _ssh_string(public, 0)[0].decode("ascii")
        except (ValueError, struct.error, UnicodeDecodeError):
            return Checked("", "unknown")  # not a signature anyone can be named for
        lines, named = self._ssh_lines()
        b64 = base64.b64encode(public).decode()
        candidates = [p for parsed in map(_principals, lines) if parsed and parsed[1] == b64 for p in parsed[0]]
        with tempfile.TemporaryDirectory(prefix="launcher-verify-") as tmp:
            sigfile, allowed = Path(tmp) / "sig", Path(tmp) / "allowed_signers"
            sigfile.write_text(armor(blob))
            allowed.write_text("\n".join(lines) + "\n")
            if lines:  # a certificate authority's line names no key of its own: ssh-keygen finds those
                found = proc.run(["ssh-keygen", "-Y", "find-principals", "-s", sigfile, "-f", allowed], check=False)
                candidates += [p.strip() for p in found.out.splitlines() if p.strip() and found.returncode == 0]
            for principal in dict.fromkeys(candidates):
                if _ssh_verifies(allowed, principal, sigfile, data):
                    return Checked(keyid, "good", named.get(principal, principal))
            if not candidates:
                return Checked(keyid, "unknown")
            # a trusted key: is the signature wrong, or is the key not trusted for launcher's namespace?
            alone = Path(tmp) / "alone"
            alone.write_text(f'signer namespaces="{NAMESPACE}" {key_type} {b64}\n')
            if _ssh_verifies(alone, "signer", sigfile, data):
                return Checked(keyid, "unknown")
            return Checked(keyid, "bad", named.get(candidates[0], candidates[0]))

    def _check_pem(self, data: bytes, keyid: str, sig: bytes) -> Checked:
        serialization = _crypto()
        matched = False
        for path in self.keys:
            raw = path.read_bytes()
            if b"PUBLIC KEY" not in raw:
                continue
            try:
                public = serialization.load_pem_public_key(raw)
            except ValueError:
                raise UsageError(f"{path} is not a PEM public key launcher reads",
                                 "give the public half of an Ed25519 or ECDSA key (openssl pkey -pubout)") from None
            if keyid and pem_keyid(public) != keyid:
                continue
            if _verify_pem(public, data, sig):
                return Checked(pem_keyid(public), "good", str(path))
            matched = matched or bool(keyid)  # a signature without a key id is nobody's in particular
        return Checked(keyid, "bad" if matched else "unknown")


def _ssh_verifies(allowed: Path, principal: str, sigfile: Path, data: bytes) -> bool:
    done = proc.run(["ssh-keygen", "-Y", "verify", "-f", allowed, "-I", principal, "-n", NAMESPACE, "-s", sigfile],
                    input=data, check=False)
    return done.returncode == 0
