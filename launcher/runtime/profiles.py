"""The determinism profiles' table: the exact environment each profile injects into a run, built from what
each framework declares (:mod:`launcher.runtime.frameworks`). Standard library only, so the runtime applies a
profile itself on a host run (``python -m launcher.runtime run --profile``); the host's checks, descriptions
and reserved names are :mod:`launcher.determinism`'s, over this table."""

from __future__ import annotations

from launcher.runtime import frameworks

PROFILES: tuple[str, ...] = ("strict", "deterministic", "seeded", "off")
DEFAULT_SEED = 42
MAX_SEED = 2**32 - 1  # numpy's legacy seeding accepts no more
DEFAULT_THREADS = 2

SEED_ENV = "LAUNCHER_SEED"  # the run's seed, as the runtime reads it
SOURCE_DATE_EPOCH = "SOURCE_DATE_EPOCH"
# the date writers stamp into what a run writes: 1980-01-01T00:00:00Z, as the images' build epoch (the
# earliest a zip entry can carry)
DEFAULT_SOURCE_DATE_EPOCH = 315532800
THREADS_ENV = "LAUNCHER_THREADS"  # the run's thread count (the deterministic and strict profiles)


class ProfileError(ValueError):
    """A profile, seed or thread count no profile takes: the problem and its fix."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise ProfileError(f"unknown determinism profile {profile!r}", f"use one of: {', '.join(PROFILES)}")
    return profile


def _check_seed(seed: int | None) -> int:
    if seed is None:
        return DEFAULT_SEED
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ProfileError(f"bad seed {seed!r}", f"give an integer from 0 to {MAX_SEED}")
    return seed


def _check_threads(profile: str, threads: int | None) -> int:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ProfileError(f"bad thread count {threads!r}", "give a whole number of at least 1")
    if profile == "strict":
        if threads not in (None, 1):
            raise ProfileError(f"the strict profile runs on 1 thread, not {threads}",
                               "drop --threads, or use --determinism deterministic --threads N")
        return 1
    return threads if threads is not None else DEFAULT_THREADS


def profile_env(profile: str, seed: int | None = None, threads: int | None = None) -> dict[str, str]:
    """The exact environment variables injected into a run for this profile (ProfileError for bad values)."""
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
