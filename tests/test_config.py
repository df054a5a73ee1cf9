"""Defaults from launcher.toml and LAUNCHER_* variables: the command line wins, then the environment,
then the file, then launcher's own; `launcher config` shows which is in force and why; a value launcher
refuses is a one-line error naming the file (or variable), the key and the fix, exit 40."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from launcher import config
from launcher.cli import app, common
from launcher.errors import ExitCode
from launcher.workspace import Workspace

runner = CliRunner()
VARS = ("LAUNCHER_HOST", "LAUNCHER_VARIANT", "LAUNCHER_DETERMINISM", "LAUNCHER_THREADS")


@pytest.fixture()
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in (*VARS, "LAUNCHER_SIGNING_KEY", "LAUNCHER_ALLOWED_SIGNERS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user-config"))  # the user's own, empty
    root = tmp_path / "ws"
    assert runner.invoke(app, ["init", str(root)]).exit_code == 0
    assert runner.invoke(app, ["-w", str(root), "recipes", "new", "tiny_model"]).exit_code == 0
    monkeypatch.chdir(root)
    return root


@pytest.fixture()
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What `launcher run` would start (the spec, the host), without opening a host or starting anything."""
    from launcher.cli import run_cmds
    from launcher.runs import lifecycle

    seen: list[dict[str, Any]] = []

    def fake_run(ws_: Any, spec: Any, target: Any, reporter: Any, **kw: Any) -> Any:
        seen.append({"variant": spec.variant, "profile": spec.profile, "threads": spec.threads,
                     "host": kw["host_spec"].destination})
        raise typer.Exit(0)

    monkeypatch.setattr(lifecycle, "run_recipe", fake_run)
    monkeypatch.setattr(run_cmds, "_open", lambda ctx, host: nullcontext(host))
    return seen


def test_precedence_command_line_then_environment_then_file(ws: Path, started: list[dict[str, Any]]) -> None:
    def run(*args: str, **env: str) -> dict[str, Any]:
        res = runner.invoke(app, ["run", "tiny_model", *args], env=env)
        assert res.exit_code == 0, res.output
        return started.pop()

    assert run() == {"variant": "cpu", "profile": "deterministic", "threads": None, "host": None}  # built-in
    (ws / "launcher.toml").write_text('[defaults]\nhost = "gpu-box"\nvariant = "gpu"\nthreads = 4\n'
                                      'determinism = "deterministic"\n')
    assert run() == {"variant": "gpu", "profile": "deterministic", "threads": 4, "host": "gpu-box"}
    assert run(LAUNCHER_VARIANT="cpu", LAUNCHER_HOST="user@10.0.0.9", LAUNCHER_THREADS="3") == \
        {"variant": "cpu", "profile": "deterministic", "threads": 3, "host": "user@10.0.0.9"}
    assert run("--variant", "gpu", "--host", "local", "--threads", "8", LAUNCHER_VARIANT="cpu",
               LAUNCHER_HOST="elsewhere") == {"variant": "gpu", "profile": "deterministic", "threads": 8,
                                               "host": "local"}
    # a default thread count is the deterministic profile's: strict still runs on 1, seeded on none
    assert run("--determinism", "strict")["threads"] is None
    assert run(LAUNCHER_DETERMINISM="seeded")["profile"] == "seeded"
    # typed, it is passed on (and determinism.py refuses it: strict runs on 1 thread)
    assert run("--determinism", "strict", "--threads", "4")["threads"] == 4
    # --workspace after the command finds that workspace's file
    other = ws.parent / "other"
    assert runner.invoke(app, ["init", str(other)]).exit_code == 0
    assert runner.invoke(app, ["-w", str(other), "recipes", "new", "tiny_model"]).exit_code == 0
    (other / "launcher.toml").write_text('[defaults]\nvariant = "cpu"\nhost = "other-box"\n')
    res = runner.invoke(app, ["run", "tiny_model", "--workspace", str(other)])
    assert res.exit_code == 0, res.output
    assert started.pop()["host"] == "other-box"


def test_defaults_reach_every_command_that_has_the_option(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.images import build as build_mod

    built: list[str] = []
    monkeypatch.setattr(build_mod, "build", lambda ws_, variant, **kw: built.append(variant) or (_ for _ in ()).throw(
        typer.Exit(0)))
    (ws / "launcher.toml").write_text('[defaults]\nvariant = "gpu"\n')
    assert runner.invoke(app, ["build"]).exit_code == 0
    assert runner.invoke(app, ["build", "cpu"]).exit_code == 0  # typed, in the older spelling: it wins
    assert built == ["gpu", "cpu"]
    help_text = runner.invoke(app, ["build", "--help"], env={"COLUMNS": "200"}).output
    assert "[default: gpu]" in help_text
    # lock's --variant means "which to lock" (default all): a default variant does not narrow it
    assert "[default: all]" in runner.invoke(app, ["lock", "--help"], env={"COLUMNS": "200"}).output


def test_config_shows_each_value_and_where_it_comes_from(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = runner.invoke(app, ["config", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)["data"]
    assert data["file"] == str(ws / "launcher.toml") and data["file_exists"] is False
    assert {s["key"]: (s["value"], s["source"]) for s in data["settings"]} == {
        "host": ("local", "built-in"), "variant": ("cpu", "built-in"),
        "determinism": ("deterministic", "built-in"), "threads": (2, "built-in"),
        "signing_key": (None, "built-in"), "allowed_signers": (None, "built-in")}
    (ws / "launcher.toml").write_text('[defaults]\nvariant = "gpu"\nthreads = 4\nsigning_key = "keys/me"\n')
    res = runner.invoke(app, ["config", "--json"], env={"LAUNCHER_THREADS": "6"})
    settings = {s["key"]: s for s in json.loads(res.stdout)["data"]["settings"]}
    assert (settings["variant"]["value"], settings["variant"]["source"]) == ("gpu", "file")
    assert settings["variant"]["origin"] == str(ws / "launcher.toml")
    assert (settings["threads"]["value"], settings["threads"]["origin"]) == (6, "LAUNCHER_THREADS")
    assert settings["host"]["option"] == "--host" and settings["host"]["env"] == "LAUNCHER_HOST"
    # a key's path is the workspace's when relative (launcher.toml sits at its root)
    assert (settings["signing_key"]["value"], settings["signing_key"]["option"]) == (str(ws / "keys/me"), "--key")
    # a console keeps the width it was made with, by whichever test printed first: a fresh one, made at 200
    monkeypatch.setattr(common.stdout, "_console", None)
    text = runner.invoke(app, ["config"], env={"LAUNCHER_THREADS": "6", "COLUMNS": "200"}).output
    assert "launcher.toml" in text and "LAUNCHER_THREADS" in text and "command line > environment" in text
    # outside a workspace: the environment and the built-in values
    res = runner.invoke(app, ["config", "--json", "-w", str(ws.parent)], env={"LAUNCHER_HOST": "h"})
    data = json.loads(res.stdout)["data"]
    assert data["file"] is None and data["settings"][0]["value"] == "h"


@pytest.mark.parametrize("text, names", [
    ('[defaults]\nvariant = "tpu"\n', ["defaults.variant", "cpu, gpu"]),
    ('[defaults]\nthreads = 0\n', ["defaults.threads", "at least 1"]),
    ('[defaults]\nthreads = "four"\n', ["defaults.threads", "whole number"]),
    ('[defaults]\ndeterminism = "exact"\n', ["defaults.determinism", "strict, deterministic, seeded, off"]),
    ('[defaults]\nhost = "two words"\n', ["defaults.host", "SSH destination"]),
    ('[defaults]\nsigning_key = 3\n', ["defaults.signing_key", "the path of a file"]),
    ('[defaults]\nthreds = 4\n', ["defaults.threds", "host, variant, determinism, threads"]),
    ('variant = "gpu"\n', ["'variant'", "[defaults]"]),
    ("[defaults\n", ["not valid TOML", "[defaults]"]),
])
def test_a_bad_file_is_one_line_naming_the_file_the_key_and_the_fix(ws: Path, text: str, names: list[str]) -> None:
    (ws / "launcher.toml").write_text(text)
    for args in (["ps"], ["config"], ["run", "tiny_model", "--json"]):
        res = runner.invoke(app, args)
        assert res.exit_code == ExitCode.BAD_CONFIG == 40, res.output
        line = res.stderr.strip()
        assert "\n" not in line and str(ws / "launcher.toml") in line and "fix:" in line, line
        assert all(n in line for n in names), line
        assert "Traceback" not in res.output
    assert json.loads(runner.invoke(app, ["ps", "--json"]).stdout)["exit_code"] == 40


def test_a_bad_variable_names_the_variable(ws: Path) -> None:
    res = runner.invoke(app, ["ps"], env={"LAUNCHER_THREADS": "many"})
    assert res.exit_code == ExitCode.BAD_CONFIG
    assert "LAUNCHER_THREADS='many'" in res.stderr and "unset it" in res.stderr


def test_resolve_is_the_library_view(ws: Path) -> None:
    workspace = Workspace.at(ws)
    (ws / "launcher.toml").write_text('[defaults]\nhost = "a"\n')
    cfg = config.resolve(workspace, {"LAUNCHER_VARIANT": "gpu"})
    assert cfg.defaults() == {"host": "a", "variant": "gpu"}
    assert [v.source for v in cfg.values] == ["file", "environment", "built-in", "built-in", "built-in", "built-in"]


def test_whom_a_reviewer_trusts_is_never_a_workspace_s_setting(ws: Path, tmp_path: Path) -> None:
    # a cloned project's launcher.toml naming its own allowed signers: shown as ignored, never a default
    (ws / "launcher.toml").write_text('[defaults]\nallowed_signers = "allowed_signers"\n')
    data = json.loads(runner.invoke(app, ["config", "--json"]).stdout)["data"]
    settings = {s["key"]: s for s in data["settings"]}
    assert (settings["allowed_signers"]["value"], settings["allowed_signers"]["source"]) == (None, "built-in")
    assert "a workspace cannot choose whom its reviewer trusts" in data["ignored"]["allowed_signers"]
    assert "ignored:" in runner.invoke(app, ["config"], env={"COLUMNS": "200"}).output
    # the user's own configuration is read (and the environment before it)
    mine = tmp_path / "user-config" / "launcher" / "allowed_signers"
    mine.parent.mkdir(parents=True)
    mine.write_text("")
    settings = {s["key"]: s for s in json.loads(runner.invoke(app, ["config", "--json"]).stdout)["data"]["settings"]}
    assert (settings["allowed_signers"]["value"], settings["allowed_signers"]["source"]) == (
        str(mine), "user configuration")
    res = runner.invoke(app, ["config", "--json"], env={"LAUNCHER_ALLOWED_SIGNERS": str(tmp_path / "team")})
    settings = {s["key"]: s for s in json.loads(res.stdout)["data"]["settings"]}
    assert settings["allowed_signers"]["origin"] == "LAUNCHER_ALLOWED_SIGNERS"
