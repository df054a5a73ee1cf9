"""Determinism profiles: the exact environment a run gets, and nothing else.

The runtime inside the container (``launcher.runtime``) reads these variables and applies
them before the recipe's code runs; the manifest records the same dict.

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
from launcher.runtime import frameworks

PROFILES: tuple[str, ...] = ("strict", "deterministic", "seeded", "off")
DEFAULT_PROFILE = "deterministic"
DEFAULT_SEED = 42
MAX_SEED = 2**32 - 1  # numpy's legacy seeding accepts no more
_DEFAULT_THREADS = 2

DESCRIPTIONS: dict[str, str] = {
    "strict": "seeds, op determinism, 1 thread (slow)",
    "deterministic": "seeds, op determinism, a fixed recorded thread count (default)",
    "seeded": "seeds only, no op determinism, threads left to the framework",
    "off": "nothing injected",
}


def default_threads() -> int:
    """The thread count of the `deterministic` profile: fixed, so results do not depend on core count."""
    return _DEFAULT_THREADS


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise UsageError(f"unknown determinism profile {profile!r}",
                         f"use one of: {', '.join(PROFILES)}")
    return profile


def _check_seed(seed: int | None) -> int:
    if seed is None:
        return DEFAULT_SEED
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UsageError(f"bad seed {seed!r}", f"give an integer from 0 to {MAX_SEED}")
    return seed


def _check_threads(profile: str, threads: int | None) -> int:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise UsageError(f"bad thread count {threads!r}", "give a whole number of at least 1")
    if profile == "strict":
        if threads not in (None, 1):
            raise UsageError(f"the strict profile runs on 1 thread, not {threads}",
                             "drop --threads, or use --determinism deterministic --threads N")
        return 1
    return threads if threads is not None else default_threads()


SEED_ENV = "LAUNCHER_SEED"  # the run's seed, as the runtime reads it
SOURCE_DATE_EPOCH = "SOURCE_DATE_EPOCH"
# the date writers stamp into what a run writes: 1980-01-01T00:00:00Z, as the images' build epoch (the
# earliest a zip entry can carry)
DEFAULT_SOURCE_DATE_EPOCH = 315532800
THREADS_ENV = "LAUNCHER_THREADS"  # the run's thread count (the deterministic and strict profiles)


def profile_env(profile: str, seed: int | None = None, threads: int | None = None) -> dict[str, str]:
    """The exact environment variables injected into a run for this profile."""
    check_profile(profile)
    if profile == "off":
        if threads is not None:
            _check_threads(profile, threads)
        return {"LAUNCHER_PROFILE": "off"}
    s = str(_check_seed(seed))
    env = {"LAUNCHER_PROFILE": profile, SEED_ENV: s, "PYTHONHASHSEED": s,
           SOURCE_DATE_EPOCH: str(DEFAULT_SOURCE_DATE_EPOCH)}
    if profile == "seeded":
        if threads is not None:
            _check_threads(profile, threads)
        return dict(sorted(env.items()))
    n = str(_check_threads(profile, threads))
    env.update({
        THREADS_ENV: n,
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        **frameworks.deterministic_env(n),  # TF_DETERMINISTIC_OPS, CUBLAS_WORKSPACE_CONFIG, XLA_FLAGS...
    })
    return dict(sorted(env.items()))


# Variables a profile sets that a user may set instead (--env NAME=VALUE): their value is the user's,
# recorded as such.
OVERRIDABLE_ENV: frozenset[str] = frozenset({SOURCE_DATE_EPOCH})
# Every other variable some profile sets: a user may not set them with --env (the run would record one
# profile and run another).
RESERVED_ENV: frozenset[str] = frozenset(
    key for profile in PROFILES for key in profile_env(profile, DEFAULT_SEED, None if profile == "strict" else 2)
    if key not in OVERRIDABLE_ENV)
