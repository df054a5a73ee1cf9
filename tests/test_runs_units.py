"""Params parsing, run ids and their resolution, code identity, user env (no engine needed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import ExitCode, UsageError
from launcher.runs.lifecycle import new_run_id, parse_params
from launcher.runtime.recipespec import RecipeSpec
from launcher.specs.recipes import Recipe


def test_params_are_typed() -> None:
    assert parse_params(["epochs=3", "lr=0.01", "aug=true", "name=mnist", "empty=", "tag=007x"]) == {
        "epochs": 3,
        "lr": 0.01,
        "aug": True,
        "name": "mnist",
        "empty": "",
        "tag": "007x",
    }


@pytest.mark.parametrize("bad", ["epochs", "=3", " =3", "1x=2", "a b=1"])
def test_malformed_params_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_params([bad])
    assert err.value.exit_code == ExitCode.USAGE
    assert "KEY=VALUE" in err.value.one_line()


def test_run_ids_follow_the_design() -> None:
    import re

    rid = new_run_id("mnist_convnet")
    assert re.fullmatch(r"\d{8}T\d{6}-mnist_convnet-[0-9a-f]{6}", rid)
    assert new_run_id("mnist_convnet") != rid


@pytest.mark.parametrize(
    ("security", "owner"),
    [
        ('["name=seccomp,profile=default"]', "1000:1000"),
        ('["name=seccomp,profile=default","name=rootless","name=cgroupns"]', None),
        ('["name=userns"]', None),
    ],
)
def test_outputs_go_to_the_host_user_unless_docker_maps_users(security: str, owner: str | None) -> None:
    from launcher.proc import Completed
    from launcher.targets.placement import output_owner

    class Answers:
        def run(self, argv: list[str], **kw: object) -> Completed:
            out = security if argv[:2] == ["docker", "info"] else "1000:1000\n"
            return Completed(argv=tuple(argv), returncode=0, stdout=out.encode(), stderr=b"")

        def owner(self) -> str:
            return "1000:1000"

    assert output_owner(Answers()) == owner  # type: ignore[arg-type]


# ---------------------------------------------------------------- code identity


def test_a_scripts_identity_is_its_project_and_path(tmp_path: Path) -> None:
    from launcher.specs.identity import from_plan, script_identity, slug

    assert script_identity(tmp_path / "myproj", tmp_path / "myproj" / "src" / "train.py") == "myproj/src/train.py"
    with pytest.raises(UsageError):
        script_identity(tmp_path / "a", tmp_path / "b" / "train.py")
    assert from_plan({"source": "mounted", "root": "/x/myproj", "entry": "train.py"}) == "myproj/train.py"
    assert from_plan({"source": "image"}) is None
    assert slug("mnist_convnet") == "mnist_convnet"
    assert slug("mnist_convnet", "examples/mnist_convnet.py") == "examples_mnist_convnet.py"
    assert slug("train", "my proj/train.py") == "my_proj_train.py"
    long = slug("train", "p" * 60 + "/train.py")
    assert len(long) == 40 and long.endswith("p_train.py")  # the project's name gives way first
    deep = slug("train", "proj/" + "sub/" * 20 + "train.py")
    assert len(deep) == 40 and deep.startswith("proj_") and deep.endswith("sub_train.py")


def test_no_scripts_run_name_can_be_a_recipes_name() -> None:
    from launcher.specs.identity import slug
    from launcher.specs.recipes import _NAME

    for identity in ("mnist_convnet/mnist_convnet.py", "a/b.py", "x" * 80 + "/train.py"):
        assert not _NAME.match(slug("x", identity))


# ---------------------------------------------------------------- run ids by any unique part


def _runs(ws_root: Path, ids: dict[str, str]) -> Any:
    from launcher.workspace import Workspace

    ws = Workspace.at(ws_root, cache_dir=ws_root / "cache")
    for rid, kind in ids.items():
        (ws.runs / rid).mkdir(parents=True)
        (ws.runs / rid / ("launch.json" if kind == "running" else "manifest.json")).write_text("{}")
    return ws


IDS = {"20261124T101500-mnist_convnet-1a2b3c": "done", "20261124T101500-mnist_convnet-1a9f00": "running",
       "20261124T120000-myproj_train.py-77aa01": "running", "20261125T080000-mnist_convnet-c0ffee": "done"}


def test_a_run_is_found_by_any_unique_start_or_its_tail(tmp_path: Path) -> None:
    from launcher.records.store import resolve_run, resolve_run_id

    ws = _runs(tmp_path, IDS)
    assert resolve_run_id(ws, "20261124T120000") == "20261124T120000-myproj_train.py-77aa01"  # still running
    assert resolve_run_id(ws, "20261125") == "20261125T080000-mnist_convnet-c0ffee"
    assert resolve_run_id(ws, "1a2b3c") == "20261124T101500-mnist_convnet-1a2b3c"  # what verify prints
    assert resolve_run_id(ws, "c0f") == "20261125T080000-mnist_convnet-c0ffee"
    assert resolve_run_id(ws, "20261124T101500-mnist_convnet-1a9f00") == "20261124T101500-mnist_convnet-1a9f00"
    assert resolve_run(ws, "77aa") == ws.runs / "20261124T120000-myproj_train.py-77aa01"
    assert resolve_run(ws, str(ws.runs / "20261125T080000-mnist_convnet-c0ffee")).name.endswith("c0ffee")


def test_an_ambiguous_run_is_a_usage_error_naming_the_candidates(tmp_path: Path) -> None:
    from launcher.errors import NotFound
    from launcher.records.store import resolve_run_id

    ws = _runs(tmp_path, IDS)
    with pytest.raises(UsageError) as err:
        resolve_run_id(ws, "20261124T1015")
    assert err.value.exit_code == ExitCode.USAGE
    assert "1a2b3c" in err.value.one_line() and "1a9f00" in err.value.one_line()
    with pytest.raises(UsageError):
        resolve_run_id(ws, "1a")
    with pytest.raises(NotFound):
        resolve_run_id(ws, "nothing")


def test_ps_short_ids_are_unique_readable_and_taken_back(tmp_path: Path) -> None:
    from launcher.records.store import resolve_run_id, short_ids

    ws = _runs(tmp_path, IDS)
    short = short_ids(IDS)
    assert short["20261125T080000-mnist_convnet-c0ffee"] == "20261125T080000-mnist_convnet"
    assert short["20261124T120000-myproj_train.py-77aa01"] == "20261124T120000-myproj_train.py"
    assert short["20261124T101500-mnist_convnet-1a2b3c"] == "20261124T101500-mnist_convnet-1a2"
    for rid, prefix in short.items():
        assert resolve_run_id(ws, prefix) == rid
    assert short_ids(["20261124T101500-a-111111", "20261124T101500-a_b-222222"])["20261124T101500-a-111111"] == \
        "20261124T101500-a-1"


# ---------------------------------------------------------------- --env and --secret-env


def test_env_items_take_values_from_here_or_as_given() -> None:
    from launcher.specs.userenv import parse, secret_hmac

    got = parse(["WANDB_MODE", "LR=0.1", "EMPTY="], ["HF_TOKEN"], {"WANDB_MODE": "offline", "HF_TOKEN": "t0k"})
    assert dict(got.plain) == {"WANDB_MODE": "offline", "LR": "0.1", "EMPTY": ""}
    assert dict(got.secret) == {"HF_TOKEN": "t0k"}
    assert got.record(b"salt")["HF_TOKEN"] == {"hmac": secret_hmac("t0k", b"salt")}
    assert "t0k" not in json.dumps(got.record(b"salt")) and "t0k" not in repr(got)
    assert got.names == ["EMPTY", "HF_TOKEN", "LR", "WANDB_MODE"]


@pytest.mark.parametrize(("env", "secret", "says"), [
    (["LAUNCHER_SEED=1"], [], "launcher sets LAUNCHER_SEED itself"),
    (["PYTHONHASHSEED=0"], [], "determinism profile"),
    ([], ["TF_DETERMINISTIC_OPS=0"], "determinism profile"),
    (["OMP_NUM_THREADS=8"], [], "--threads"),
    (["PYTHONPATH=/x"], [], "the image sets it"),
    (["NOT_SET_HERE"], [], "NOT_SET_HERE is not set here"),
    (["A=1"], ["A=2"], "given twice"),
    (["1BAD=x"], [], "not an environment variable name"),
    ([], ["KEY=two\nlines"], "line break"),
])
def test_bad_env_items_are_one_line_usage_errors_without_values(env: list[str], secret: list[str],
                                                                says: str) -> None:
    from launcher.specs.userenv import parse

    with pytest.raises(UsageError) as err:
        parse(env, secret, {"HOME": "/root"})
    line = err.value.one_line()
    assert err.value.exit_code == ExitCode.USAGE and says in line and "fix:" in line and "\n" not in line
    assert "two" not in line


def test_secrets_never_reach_the_docker_command_line() -> None:
    from launcher.hosts.engine import render
    from launcher.specs.container import ContainerJob, container_spec

    recipe = Recipe(RecipeSpec(Path("/r/tiny"), "tiny", "none", "train.py"), "sha256:" + "0" * 64)
    job = ContainerJob(run_id="20260101T000000-tiny-abcdef", image_id="sha256:" + "a" * 64, env={"LAUNCHER_SEED": "1"},
                       host_out="/h/runs/x/out", recipe=recipe, params={}, user_env={"MODE": "x y"},
                       secret_env={"TOKEN": "hunter2"})
    with pytest.raises(ValueError):
        container_spec(job)
    argv = render(container_spec(replace(job, env_file="/h/runs/x/secret.env")))
    assert "MODE=x y" in argv and "LAUNCHER_SEED=1" in argv
    assert argv[argv.index("--env-file") + 1] == "/h/runs/x/secret.env"
    assert not any("hunter2" in a for a in argv) and "hunter2" not in repr(job)
