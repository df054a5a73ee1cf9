"""The target registry (targets/registry.py): a target added by one module (tests/toytarget.py) is chosen
by --scheduler's check, runs a group through launcher's run life (prepared once), and is reopened from
its runs' launch records; the CLI's --scheduler choices are the registry's; a target nobody registered
is refused by name."""

from __future__ import annotations

import importlib
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeplacement import make_project, make_workspace

from launcher.errors import ExitCode, UsageError, run_exit_code, verdict_exit_code
from launcher.hosts.hostspec import HostSpec
from launcher.hosts.local import LocalHost
from launcher.images import build
from launcher.runs import control
from launcher.runs.collect import read_launch
from launcher.runs.lifecycle import RunRequest, run_recipe
from launcher.targets import registry as targets
from launcher.targets.registry import TargetOptions
from launcher.targets.slurm import SlurmPlacement
from launcher.workspace import Workspace


@pytest.fixture
def toy() -> Iterator[typing.Any]:
    sys.modules.pop("toytarget", None)
    module = importlib.import_module("toytarget")  # registers the target, as any target module does
    yield module
    targets.unregister("toy")


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    monkeypatch.setattr(build, "ensure_current", lambda *a, **kw: None)  # no engine: the build record is the image
    return make_workspace(tmp_path)


def test_a_target_added_by_one_module_runs_a_group_and_reopens(toy: typing.Any, ws: Workspace,
                                                                 tmp_path: Path) -> None:
    assert "toy" in targets.scheduler_names()
    placement = targets.place(LocalHost(ws.root), HostSpec(), "toy", TargetOptions(partition="blue"))
    assert isinstance(placement, toy.ToyPlacement) and placement.label == "blue"
    out = run_recipe(ws, RunRequest(recipe=str(make_project(tmp_path))), placement, facts={}, poll_s=0, runs=3)
    assert [r["status"] for r in out.runs] == ["succeeded"] * 3 and out.exit_code == ExitCode.OK
    assert len(placement.jobs) == 3
    assert placement.prepared == 1  # once for the group (docs/design.md), not once per replicate
    launch = read_launch(ws, out.runs[0]["run_id"])
    assert launch["placement"] == {"kind": "toy", "label": "blue"}
    again = targets.open_placement(ws, launch)
    assert type(again) is toy.ToyPlacement and again.label == "blue"
    listed = {r["run_id"]: r["status"] for r in control.list_runs(ws)}
    assert listed == {r["run_id"]: "succeeded" for r in out.runs}


def test_a_failed_replicate_gives_the_run_exit_code(toy: typing.Any, ws: Workspace, tmp_path: Path) -> None:
    placement = targets.place(LocalHost(ws.root), HostSpec(), "toy", TargetOptions())
    placement.script.exit_codes = {0: 2}
    out = run_recipe(ws, RunRequest(recipe=str(make_project(tmp_path))), placement, facts={}, poll_s=0, runs=2)
    assert out.failure is not None and out.exit_code == ExitCode.RUN_FAILED


def test_the_target_checks_its_own_options(toy: typing.Any) -> None:
    with pytest.raises(UsageError, match="toy target takes only a label"):
        targets.select("toy", TargetOptions(settings=("time=1",)))
    assert targets.select("toy", TargetOptions(partition="x")) is toy.TARGET


def test_without_the_module_the_target_is_unknown(ws: Workspace) -> None:
    assert "toy" not in targets.scheduler_names()
    with pytest.raises(UsageError, match="unknown scheduler 'toy'") as err:
        targets.select("toy", TargetOptions())
    assert err.value.hint == "the schedulers launcher drives: slurm, ray"
    with pytest.raises(UsageError, match="placed by 'toy'"):
        targets.open_placement(ws, {"run_id": "r1", "placement": {"kind": "toy"}})


def test_the_builtin_targets() -> None:
    assert targets.scheduler_names() == ["slurm", "ray"]
    assert targets.targets()["direct"].scheduled is False
    assert targets.place(LocalHost(), HostSpec(), None, TargetOptions()).kind == "local"  # the host itself
    slurm = targets.place(LocalHost(), HostSpec(), "slurm", TargetOptions(partition="gpu", settings=("time=1:00",),
                                                                          max_parallel=2))
    assert isinstance(slurm, SlurmPlacement)
    assert (slurm.partition, slurm.options, slurm.max_parallel) == ("gpu", {"time": "1:00"}, 2)
    with pytest.raises(UsageError, match="need --scheduler slurm"):
        targets.select(None, TargetOptions(partition="gpu"))
    with pytest.raises(UsageError, match="--max-parallel must be at least 1"):
        targets.select("slurm", TargetOptions(max_parallel=0))
    with pytest.raises(UsageError, match="cluster settings"):
        targets.check_host_provision(targets.ProvisionRequest(registry="reg:5000"))


def test_the_cli_offers_the_registered_schedulers() -> None:
    from launcher.cli import hostopts

    assert typing.get_args(hostopts.SchedulerName) == tuple(targets.scheduler_names())


def test_exit_codes_of_results() -> None:
    assert run_exit_code("succeeded") == ExitCode.OK
    assert run_exit_code("failed") == run_exit_code("cancelled") == ExitCode.RUN_FAILED
    assert run_exit_code(None, ended=False) == run_exit_code("running", ended=False) == ExitCode.OK
    assert verdict_exit_code(True) == ExitCode.OK and verdict_exit_code(False) == ExitCode.NOT_REPRODUCIBLE


def test_a_later_part_of_a_group_is_not_prepared_again(toy: typing.Any, ws: Workspace, tmp_path: Path) -> None:
    placement = targets.place(LocalHost(ws.root), HostSpec(), "toy", TargetOptions())
    script = make_project(tmp_path)
    first = run_recipe(ws, RunRequest(recipe=str(script)), placement, facts={}, poll_s=0)
    run_recipe(ws, RunRequest(recipe=str(script), group=first.group, replicate=1), placement, facts={}, poll_s=0,
               prepared=True)  # as an experiment runs a group's replicates one by one on the same host
    assert placement.prepared == 1 and len(placement.jobs) == 2
