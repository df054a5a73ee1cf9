"""Environment variables a user passes to a run (``--env``, ``--secret-env``), checked and recorded.

``--env NAME`` passes this machine's value of NAME, ``--env NAME=VALUE`` that value; either is
recorded with its value. ``--secret-env`` takes the same forms, but only an HMAC-SHA256 of the value is
recorded, keyed with a random salt drawn for the run and kept on this machine alone (the user's cache,
``secret-salts/<run id>``, readable by the user only): a manifest that travels (a bundle) does not let
anyone try a dictionary against it, while this machine can still check a value it is given again. (A
manifest of an older launcher records a plain sha256, still read.) The value reaches the container
through an env file readable by the user alone (see :mod:`launcher.specs.container`), never the launch
record, a log or a command line. Names launcher
sets itself (``LAUNCHER_*``, every variable of a determinism profile, the image's ``PATH`` and
``PYTHONPATH``) are refused: a run would silently lose the seed or the determinism it records.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.determinism import RESERVED_ENV
from launcher.errors import UsageError
from launcher.records.records import EnvValue

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE_ENV = ("PATH", "PYTHONPATH")  # the image's own: the runtime and the locked packages are found through them
SALTS = "secret-salts"  # under the cache: one file per run, its secrets' HMAC key


@dataclass(frozen=True)
class UserEnv:
    plain: Mapping[str, str] = field(default_factory=dict)
    secret: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def names(self) -> list[str]:
        return sorted({*self.plain, *self.secret})

    def record(self, salt: bytes | None = None) -> dict[str, EnvValue]:
        """What the launch record and the manifest keep: {"NAME": {"value": ...} | {"hmac": ...}}; salt: the
        run's (new_salt), without which a secret's record can never be checked (a throwaway one is drawn)."""
        out: dict[str, EnvValue] = {k: {"value": v} for k, v in self.plain.items()}
        key = salt if salt is not None else secrets.token_bytes(32)
        out.update({k: {"hmac": secret_hmac(v, key)} for k, v in self.secret.items()})
        return dict(sorted(out.items()))


def secret_digest(value: str) -> str:
    """The plain sha256 an older launcher recorded for a secret (still checked: secret_matches)."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()


def secret_hmac(value: str, salt: bytes) -> str:
    return "hmac-sha256:" + hmac.new(salt, value.encode("utf-8"), hashlib.sha256).hexdigest()


def is_name(name: str) -> bool:
    return bool(_NAME.match(name))


def is_secret(record: object) -> bool:
    """Whether an env record is a --secret-env one (its value not kept): {"hmac"} or an older {"sha256"}."""
    return isinstance(record, dict) and ("hmac" in record or "sha256" in record)


def salt_file(cache_dir: Path, run_id: str) -> Path:
    return cache_dir / SALTS / run_id


def new_salt(cache_dir: Path, run_id: str) -> bytes:
    """A random salt for run_id's secrets, written readable by this user alone (before the run records them)."""
    salt = secrets.token_bytes(32)
    path = salt_file(cache_dir, run_id)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{run_id}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(salt.hex().encode() + b"\n")
    os.replace(tmp, path)
    return salt


def find_salt(cache_dir: Path, run_id: str) -> bytes | None:
    """run_id's salt where this machine ran it, else None."""
    try:
        return bytes.fromhex(salt_file(cache_dir, run_id).read_text().strip())
    except (OSError, ValueError):
        return None


def secret_matches(value: str, record: Mapping[str, object], salt: bytes | None) -> bool | None:
    """Whether value is the one the record was made of; None when this machine cannot tell (no salt)."""
    if "hmac" in record:
        if salt is None:
            return None
        return hmac.compare_digest(str(record["hmac"]), secret_hmac(value, salt))
    if "sha256" in record:
        return hmac.compare_digest(str(record["sha256"]), secret_digest(value))
    return None


def reserved_reason(name: str) -> str | None:
    """Why launcher keeps NAME for itself, or None when a user may set it."""
    if name.startswith("LAUNCHER_"):
        return "LAUNCHER_* variables are launcher's own"
    if name in RESERVED_ENV:
        return "it belongs to the determinism profile"
    if name in IMAGE_ENV:
        return "the image sets it to find launcher's runtime and the locked packages"
    return None


def _one(item: str, option: str, environ: Mapping[str, str]) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not _NAME.match(name):
        raise UsageError(f"{option} {name or item!r}: not an environment variable name",
                         f"write {option} NAME or {option} NAME=VALUE (letters, digits and _, not starting "
                         "with a digit)")
    why = reserved_reason(name)
    if why is not None:
        hint = ("set the seed, profile and threads with --seed, --determinism and --threads"
                if name in RESERVED_ENV or name.startswith("LAUNCHER_") else "drop it")
        raise UsageError(f"{option} {name}: launcher sets {name} itself ({why})", hint)
    if not sep:
        if name not in environ:
            raise UsageError(f"{option} {name}: {name} is not set here, so there is no value to pass",
                             f"export {name} first, or give the value: {option} {name}=VALUE")
        value = environ[name]
    return name, value


def parse(env: Sequence[str] = (), secret: Sequence[str] = (),
          environ: Mapping[str, str] | None = None) -> UserEnv:
    """--env and --secret-env items (NAME or NAME=VALUE) as a UserEnv; a bad, reserved, repeated or
    (NAME alone) unset name is a UsageError that never shows a value."""
    import os

    source = os.environ if environ is None else environ
    plain: dict[str, str] = {}
    hidden: dict[str, str] = {}
    for option, items, into in (("--env", env, plain), ("--secret-env", secret, hidden)):
        for item in items:
            name, value = _one(item, option, source)
            if name in plain or name in hidden:
                raise UsageError(f"{option} {name}: {name} is given twice", "pass each variable once")
            if option == "--secret-env" and ("\n" in value or "\0" in value):
                raise UsageError(f"--secret-env {name}: the value holds a line break, which an env file cannot carry",
                                 "pass it in a file with --data-from DIR and read it there")
            into[name] = value
    return UserEnv(plain, hidden)

