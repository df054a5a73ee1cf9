"""Environment variables a user passes to a run (``--env``, ``--secret-env``), checked and recorded.

``--env NAME`` passes this machine's value of NAME, ``--env NAME=VALUE`` that value; either is
recorded with its value. ``--secret-env`` takes the same forms, but only the value's sha256 is
recorded: the value reaches the container through an env file readable by the user alone (see
:mod:`launcher.runs.container`), never the launch record, a log or a command line. Names launcher
sets itself (``LAUNCHER_*``, every variable of a determinism profile, the image's ``PATH`` and
``PYTHONPATH``) are refused: a run would silently lose the seed or the determinism it records.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.errors import UsageError
from launcher.runs.determinism import RESERVED_ENV
from launcher.runs.records import EnvValue

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE_ENV = ("PATH", "PYTHONPATH")  # the image's own: the runtime and the locked packages are found through them


@dataclass(frozen=True)
class UserEnv:
    plain: Mapping[str, str] = field(default_factory=dict)
    secret: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def names(self) -> list[str]:
        return sorted({*self.plain, *self.secret})

    def record(self) -> dict[str, EnvValue]:
        """What the launch record and the manifest keep: {"NAME": {"value": ...} | {"sha256": ...}}."""
        out: dict[str, EnvValue] = {k: {"value": v} for k, v in self.plain.items()}
        out.update({k: {"sha256": secret_digest(v)} for k, v in self.secret.items()})
        return dict(sorted(out.items()))


def secret_digest(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()


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

