"""Params parsing and run ids (no engine needed)."""

from __future__ import annotations

import pytest

from launcher.errors import ExitCode, UsageError
from launcher.runs.lifecycle import new_run_id, parse_params


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
    from launcher.runs.placement import output_owner

    class Answers:
        def run(self, argv: list[str], **kw: object) -> Completed:
            out = security if argv[:2] == ["docker", "info"] else "1000:1000\n"
            return Completed(argv=tuple(argv), returncode=0, stdout=out.encode(), stderr=b"")

        def owner(self) -> str:
            return "1000:1000"

    assert output_owner(Answers()) == owner  # type: ignore[arg-type]
