"""Determinism profiles -> the exact environment injected into a run."""

from __future__ import annotations

import pytest

from launcher import determinism
from launcher.errors import ExitCode, UsageError

OP_DETERMINISM = {"TF_DETERMINISTIC_OPS": "1", "TF_CUDNN_DETERMINISTIC": "1",
                  "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}
THREAD_VARS = ("LAUNCHER_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS",
               "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def test_default_threads_is_a_fixed_number_not_the_core_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 96)
    assert determinism.default_threads() == 2
    env = determinism.profile_env("deterministic", 7)
    assert all(env[k] == "2" for k in THREAD_VARS)


def test_deterministic_profile_is_exactly_this_dict() -> None:
    assert determinism.profile_env("deterministic", 1001, 4) == {
        "LAUNCHER_PROFILE": "deterministic", "LAUNCHER_SEED": "1001", "PYTHONHASHSEED": "1001",
        "SOURCE_DATE_EPOCH": "315532800", **OP_DETERMINISM, **dict.fromkeys(THREAD_VARS, "4"),
    }


def test_strict_is_deterministic_on_one_thread() -> None:
    env = determinism.profile_env("strict", 5)
    assert env["LAUNCHER_PROFILE"] == "strict"
    assert all(env[k] == "1" for k in THREAD_VARS)
    assert {k: env[k] for k in OP_DETERMINISM} == OP_DETERMINISM
    assert determinism.profile_env("strict", 5, 1) == env


def test_seeded_sets_seeds_only_like_fast_n_close() -> None:
    assert determinism.profile_env("seeded", 9) == {"LAUNCHER_PROFILE": "seeded", "LAUNCHER_SEED": "9",
                                                    "PYTHONHASHSEED": "9", "SOURCE_DATE_EPOCH": "315532800"}


def test_source_date_epoch_is_the_profiles_and_the_user_may_set_another() -> None:
    # writers that honour it (matplotlib's PDF and SVG, zip, tar) stamp 1980-01-01, not the wall clock
    from launcher.runs import lifecycle
    from launcher.specs import userenv
    from launcher.specs.request import RunRequest

    for profile in ("strict", "deterministic", "seeded"):
        assert determinism.profile_env(profile, 1)["SOURCE_DATE_EPOCH"] == "315532800"
    assert "SOURCE_DATE_EPOCH" not in determinism.RESERVED_ENV and "PYTHONHASHSEED" in determinism.RESERVED_ENV
    assert userenv.parse(["SOURCE_DATE_EPOCH=1764320000"]).plain == {"SOURCE_DATE_EPOCH": "1764320000"}
    request = RunRequest(recipe="r", env={"SOURCE_DATE_EPOCH": "1764320000"})
    env = lifecycle._job_env(request, None)
    assert "SOURCE_DATE_EPOCH" not in env and env["PYTHONHASHSEED"] == "42"  # the user's value goes on its own
    assert lifecycle._job_env(RunRequest(recipe="r"), None)["SOURCE_DATE_EPOCH"] == "315532800"


def test_off_sets_nothing_but_its_name() -> None:
    assert determinism.profile_env("off", 9, 3) == {"LAUNCHER_PROFILE": "off"}


def test_no_seed_means_the_documented_default_seed() -> None:
    assert determinism.profile_env("seeded", None)["LAUNCHER_SEED"] == str(determinism.DEFAULT_SEED)


def test_every_value_is_a_string_and_the_dict_is_sorted() -> None:
    for profile in determinism.PROFILES:
        env = determinism.profile_env(profile, 3)
        assert all(isinstance(v, str) for v in env.values())
        assert list(env) == sorted(env)


@pytest.mark.parametrize(("profile", "seed", "threads", "words"), [
    ("fast", 1, None, "unknown determinism profile 'fast'"),
    ("deterministic", 1, 0, "bad thread count 0"),
    ("deterministic", 1, -2, "bad thread count -2"),
    ("strict", 1, 4, "the strict profile runs on 1 thread"),
    ("deterministic", -1, None, "bad seed -1"),
    ("deterministic", 2**32, None, "bad seed"),
    ("seeded", True, None, "bad seed True"),
    ("off", 1, 0, "bad thread count 0"),
])
def test_bad_input_is_a_usage_error(profile: str, seed: int, threads: int | None, words: str) -> None:
    with pytest.raises(UsageError) as info:
        determinism.profile_env(profile, seed, threads)
    assert words in info.value.message
    assert info.value.exit_code == ExitCode.USAGE
    assert info.value.hint


def test_every_profile_has_a_description() -> None:
    assert set(determinism.DESCRIPTIONS) == set(determinism.PROFILES)
    assert determinism.DEFAULT_PROFILE == "deterministic"
