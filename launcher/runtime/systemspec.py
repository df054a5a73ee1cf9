"""A project's OS packages: the ``[system]`` table of ``recipe.toml`` or of a project's ``launcher.toml``.

```toml
[system]
apt = ["tree", "libsndfile1=1.2.0-1"]   # Debian package names, optionally pinned NAME=VERSION
```

Standard library only (``launcher.runtime.recipespec`` reads recipes with it inside the image too). The
names are checked against Debian's syntax (policy 5.6.1 and 5.6.12) here; ``launcher lock`` resolves
them, with their dependencies, against the base image's own Debian release (launcher.images.aptlock).
"""

from __future__ import annotations

import re
from typing import Any

SYSTEM_KEYS = frozenset({"apt"})
# patterns compiled at first use (and cached by re)
# Debian policy 5.6.1: at least two characters, lower-case letters, digits, '+', '-', '.'; alphanumeric first.
APT_NAME = r"^[a-z0-9][a-z0-9+.-]+$"
# Policy 5.6.12: [epoch:]upstream[-revision], the upstream part starting with a digit.
APT_VERSION = r"^(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*$"


class SystemSpecError(ValueError):
    """A [system] table that cannot be used: ``key`` is the offending key (``system.apt``) or None."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key
        self.detail = message


def split_package(entry: str) -> tuple[str, str | None]:
    """``NAME`` or ``NAME=VERSION`` -> (name, version or None); SystemSpecError when either is malformed."""
    name, sep, version = entry.partition("=")
    if not re.match(APT_NAME, name):
        why = "an architecture qualifier (NAME:ARCH) is not supported" if ":" in name else \
            "a Debian package name is lower-case letters, digits, '+', '-' and '.' (at least 2, alphanumeric first)"
        raise SystemSpecError(f"{entry!r} is not a Debian package: {why}", "system.apt")
    if sep and not re.match(APT_VERSION, version):
        raise SystemSpecError(f"{entry!r}: {version!r} is not a Debian version ([epoch:]upstream[-revision], "
                              "starting with a digit)", "system.apt")
    return name, (version if sep else None)


def check_system(raw: Any) -> tuple[str, ...]:
    """The packages of a [system] table, each checked, duplicates merged, sorted by name."""
    if not isinstance(raw, dict):
        raise SystemSpecError("must be a table ([system] then apt = [...])", "system")
    unknown = sorted(set(raw) - SYSTEM_KEYS)
    if unknown:
        raise SystemSpecError(f"unknown key (known: {', '.join(sorted(SYSTEM_KEYS))})", f"system.{unknown[0]}")
    apt = raw.get("apt", [])
    if not isinstance(apt, list) or not all(isinstance(p, str) for p in apt):
        raise SystemSpecError('must be a list of Debian package names, e.g. apt = ["tree"]', "system.apt")
    return merge_packages(apt)


def merge_packages(entries: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Entries checked and merged: one per name (a bare name beside a pin of it gives the pin), sorted."""
    chosen: dict[str, str | None] = {}
    for entry in entries:
        name, version = split_package(entry.strip())
        before = chosen.get(name)
        if before is not None and version is not None and before != version:
            raise SystemSpecError(f"{name} is pinned twice ({name}={before} and {name}={version})", "system.apt")
        chosen[name] = version or before
    return tuple(n if v is None else f"{n}={v}" for n, v in sorted(chosen.items()))
