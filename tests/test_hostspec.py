"""One host specification: every host command takes the same options (declared once), a run's launch
record keeps what reopens its host, and a run is reopened through the placement it was started with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import UsageError
from launcher.hosts.hostspec import HostSpec
from launcher.hosts.local import LocalHost
from launcher.targets.placement import DirectPlacement
from launcher.targets.registry import open_placement
from launcher.workspace import Workspace

HOST_OPTIONS = {"--host", "--trust-new-host", "--identity", "--port", "--ssh-config", "--known-hosts"}


def _commands(group: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group
            out.update(_commands(cmd, f"{prefix}{name} "))
        else:
            out[f"{prefix}{name}"] = cmd
    return out


def test_every_host_command_takes_every_host_option() -> None:
    root = typer.main.get_command(app)
    with_host = {}
    for name, cmd in _commands(root).items():
        opts = {o for p in cmd.params for o in p.opts}
        if "--host" in opts:
            with_host[name] = opts
    assert {"run", "ps", "provision", "clean", "experiment"} <= set(with_host)
    for name, opts in with_host.items():
        assert HOST_OPTIONS <= opts, f"`launcher {name}` lacks {sorted(HOST_OPTIONS - opts)}"


def test_record_round_trip_keeps_what_reopens_the_host_and_never_the_trust() -> None:
    spec = HostSpec("me@gpu1", trust_new_host=True, identity=Path("/k/id"), port=2222,
                    ssh_config=Path("/dev/null"), known_hosts=Path("/k/known"))
    record = spec.to_record()
    assert record == {"spec": "me@gpu1", "identity": "/k/id", "port": 2222, "ssh_config": "/dev/null",
                      "known_hosts": "/k/known"}
    back = HostSpec.from_record(record)
    assert back == HostSpec("me@gpu1", identity=Path("/k/id"), port=2222, ssh_config=Path("/dev/null"),
                            known_hosts=Path("/k/known"))
    assert HostSpec.from_record(None).local and HostSpec("local").local and HostSpec().name == "local"
    assert HostSpec().to_record() == {"spec": None}
    assert spec.to("gpu2").destination == "gpu2" and spec.to("gpu2").port == 2222


def test_experiment_gives_each_host_the_same_ssh_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import launcher.workflows.experiment as experiment_mod

    seen: dict[str, Any] = {}

    def fake(ws: Workspace, recipe: str, runs: int, seeds: str, hosts: list[HostSpec], **kw: Any) -> Any:
        seen["hosts"] = hosts
        raise UsageError("stop here", "this is a test")

    monkeypatch.setattr(experiment_mod, "experiment", fake)
    runner = CliRunner()
    res = runner.invoke(app, ["init", str(tmp_path / "ws")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["--workspace", str(tmp_path / "ws"), "experiment", "mnist_convnet", "-H", "a",
                              "-H", "b@c", "--port", "2222", "--ssh-config", "/dev/null", "--known-hosts", "/k"])
    assert "stop here" in res.output
    assert [h.destination for h in seen["hosts"]] == ["a", "b@c"]
    assert all(h.port == 2222 and h.ssh_config == Path("/dev/null") and h.known_hosts == Path("/k")
               for h in seen["hosts"])
    runner.invoke(app, ["--workspace", str(tmp_path / "ws"), "experiment", "mnist_convnet"])
    assert seen["hosts"] == [HostSpec()]


def test_a_run_is_reopened_through_the_placement_it_was_started_with(tmp_path: Path) -> None:
    ws = Workspace.at(tmp_path)
    launch = {"run_id": "r", "host_options": {"spec": None}, "placement": {"kind": "direct"}}
    with open_placement(ws, launch) as placement:
        assert isinstance(placement, DirectPlacement) and isinstance(placement.host, LocalHost)
    # launch records from before placements were recorded are direct placements
    with open_placement(ws, {"run_id": "r", "host_options": {"spec": None}}) as placement:
        assert isinstance(placement, DirectPlacement)
    with pytest.raises(UsageError, match="placed by 'kubernetes'"):
        open_placement(ws, {**launch, "placement": {"kind": "kubernetes"}})
