"""Determinism profiles: the exact environment a run gets, and nothing else.

The runtime inside the container (``launcher.runtime``) reads these variables and applies
them before the recipe's code runs; the manifest records the same dict. The table itself is
``launcher.runtime.profiles`` (the runtime applies a profile on a host run too); this module is the host's
view of it: bad values as :class:`~launcher.errors.UsageError`, the profiles' descriptions, and the names a
user may not set.

- ``deterministic`` (the default): seeds, op determinism (TF, cuDNN, cuBLAS, XLA) and a fixed,
  recorded thread count. The thread count changes the bits, so it belongs to the environment:
  two hosts with different core counts then still agree.
- ``strict``: the same with one thread (the seeds' advice; slower).
- ``seeded``: seeds only (the seeds' ``fast_n_close``): repeatable on some hardware, not promised.
- ``off``: nothing is set; the recipe runs as it would without launcher.

Every profile but ``off`` also sets ``SOURCE_DATE_EPOCH`` (1980-01-01, the images' build epoch), which
matplotlib's PDF, PS and SVG writers, zip and tar tools and many others honour: the files a script writes
then carry that date, not the wall clock. It is recorded with the profile, and a user may set another
(``--env SOURCE_DATE_EPOCH=N``; an empty value lets writers use the clock again).
"""

from __future__ import annotations

from launcher.errors import UsageError
from launcher.runtime import profiles
from launcher.runtime.profiles import (
    DEFAULT_SEED,
    DEFAULT_SOURCE_DATE_EPOCH,
    MAX_SEED,
    PROFILES,
    SEED_ENV,
    SOURCE_DATE_EPOCH,
    THREADS_ENV,
)

__all__ = ["DEFAULT_PROFILE", "DEFAULT_SEED", "DEFAULT_SOURCE_DATE_EPOCH", "DESCRIPTIONS", "MAX_SEED",
           "OVERRIDABLE_ENV", "PROFILES", "RESERVED_ENV", "SEED_ENV", "SOURCE_DATE_EPOCH", "THREADS_ENV",
           "check_profile", "default_threads", "profile_env"]

DEFAULT_PROFILE = "deterministic"

DESCRIPTIONS: dict[str, str] = {
    "strict": "seeds, op determinism, 1 thread (slow)",
    "deterministic": "seeds, op determinism, a fixed recorded thread count (default)",
    "seeded": "seeds only, no op determinism, threads left to the framework",
    "off": "nothing injected",
}


def default_threads() -> int:
    """The thread count of the `deterministic` profile: fixed, so results do not depend on core count."""
    return profiles.DEFAULT_THREADS


def check_profile(profile: str) -> str:
    try:
        return profiles.check_profile(profile)
    except profiles.ProfileError as exc:
        raise UsageError(exc.problem, exc.fix) from None


def profile_env(profile: str, seed: int | None = None, threads: int | None = None) -> dict[str, str]:
    """The exact environment variables injected into a run for this profile."""
    try:
        return profiles.profile_env(profile, seed, threads)
    except profiles.ProfileError as exc:
        raise UsageError(exc.problem, exc.fix) from None


# Variables a profile sets that a user may set instead (--env NAME=VALUE): their value is the user's,
# recorded as such.
OVERRIDABLE_ENV: frozenset[str] = frozenset({SOURCE_DATE_EPOCH})
# Every other variable some profile sets: a user may not set them with --env (the run would record one
# profile and run another).
RESERVED_ENV: frozenset[str] = frozenset(
    key for profile in PROFILES for key in profile_env(profile, DEFAULT_SEED, None if profile == "strict" else 2)
    if key not in OVERRIDABLE_ENV)
