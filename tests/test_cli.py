"""The CLI layer: one-line errors with named exit codes, --json envelopes, --debug, init,
and a subprocess smoke test. (Every module importable on its own: test_imports.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import launcher
from launcher.cli import app
from launcher.errors import ExitCode, LauncherError

runner = CliRunner()


def test_exit_codes_are_distinct() -> None:
    values = [c.value for c in ExitCode]
    assert len(values) == len(set(values))


def test_error_is_one_line_with_problem_and_fix() -> None:
    err = LauncherError("the thing is missing.", "create the thing\nwith care")
    assert err.one_line() == "the thing is missing; fix: create the thing with care"


def test_outside_a_workspace_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["build", "cpu"])
    assert res.exit_code == ExitCode.NOT_FOUND
    assert "no launcher workspace" in res.output and "launcher init" in res.output
    assert "Traceback" not in res.output


def test_json_error_envelope(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["--json", "lock"])
    assert res.exit_code == ExitCode.NOT_FOUND
    env = json.loads(res.stdout)
    assert env["schema"] == "launcher.result/v1" and env["ok"] is False
    assert env["exit_code"] == ExitCode.NOT_FOUND and "no launcher workspace" in env["summary"]


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["--debug", "lock"])
    assert isinstance(res.exception, LauncherError)


def test_init_scaffolds_and_never_overwrites(tmp_path: Path) -> None:
    res = runner.invoke(app, ["--json", "init", str(tmp_path / "proj")])
    assert res.exit_code == 0, res.output
    created = json.loads(res.stdout)["data"]["created"]
    assert "lockfiles/cpu.in" in created and "dockerfiles/gpu.Dockerfile" in created
    (tmp_path / "proj" / "lockfiles" / "cpu.in").write_text("mine\n")
    res = runner.invoke(app, ["--json", "init", str(tmp_path / "proj")])
    assert "lockfiles/cpu.in" in json.loads(res.stdout)["data"]["skipped"]
    assert (tmp_path / "proj" / "lockfiles" / "cpu.in").read_text() == "mine\n"


def test_init_says_what_takes_the_workspace_to_its_first_run(tmp_path: Path) -> None:
    """From the templates the cpu lock is still to be resolved; a copy of a workspace with its locks goes to the
    build at once."""
    res = runner.invoke(app, ["init", str(tmp_path / "fresh")])
    assert res.exit_code == 0, res.output
    assert "next, in it: `launcher lock --variant cpu`; `launcher build --variant cpu`; `launcher run " in res.stdout
    src = tmp_path / "src"
    runner.invoke(app, ["init", str(src)])
    (src / "lockfiles" / "cpu.txt").write_text("six==1.16.0 --hash=sha256:" + "0" * 64 + "\n")
    res = runner.invoke(app, ["--json", "init", str(tmp_path / "copy"), "--from", str(src)])
    assert json.loads(res.stdout)["data"]["next"] == ["launcher build --variant cpu", "launcher run path/to/train.py"]


def test_bad_option_is_a_usage_error() -> None:
    res = runner.invoke(app, ["build", "--no-such-option"])
    assert res.exit_code == ExitCode.USAGE


def test_real_subprocess_smoke(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("launcher")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"launcher {launcher.__version__}"
    helped = subprocess.run([exe, "run", "--help"], capture_output=True, text=True, check=True)
    assert "--determinism" in helped.stdout
    failed = subprocess.run([exe, "-w", str(tmp_path), "lock"], capture_output=True, text=True)
    assert failed.returncode == ExitCode.NOT_FOUND
    assert failed.stderr.strip().count("\n") == 0 and failed.stderr.startswith("error:")


def test_recipes_new_scaffolds_a_recipe_in_the_workspace(tmp_path: Path) -> None:
    assert runner.invoke(app, ["init", str(tmp_path)]).exit_code == 0
    res = runner.invoke(app, ["-w", str(tmp_path), "--json", "recipes", "new", "my_model"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "recipes" / "my_model" / "recipe.toml").is_file()
    listed = runner.invoke(app, ["-w", str(tmp_path), "--json", "recipes", "list"])
    assert "my_model" in listed.stdout
    bad = runner.invoke(app, ["-w", str(tmp_path), "init", "elsewhere", "my_model"])
    assert bad.exit_code == ExitCode.USAGE


def test_global_options_are_accepted_after_every_command(tmp_path: Path) -> None:
    """`launcher verify checksums --json` as the README writes it, not only `launcher --json verify ...`."""
    import typer

    def commands(group: object, prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for name, cmd in getattr(group, "commands", {}).items():
            if hasattr(cmd, "commands"):
                out.update(commands(cmd, f"{prefix}{name} "))
            else:
                out[f"{prefix}{name}"] = cmd
        return out

    every = commands(typer.main.get_command(app))
    assert len(every) > 20
    for name, cmd in every.items():
        opts = {o for p in getattr(cmd, "params", []) for o in p.opts}
        assert {"--json", "--quiet", "--debug", "--workspace"} <= opts, name
    ws = tmp_path / "ws"
    assert runner.invoke(app, ["init", str(ws)]).exit_code == 0
    res = runner.invoke(app, ["recipes", "list", "--json", "-w", str(ws)])
    assert res.exit_code == 0 and json.loads(res.stdout)["command"] == "recipes ls"
    res = runner.invoke(app, ["verify", "checksums", "--workspace", str(ws), "--json"])
    assert res.exit_code == ExitCode.NOT_FOUND
    assert json.loads(res.stdout)["exit_code"] == ExitCode.NOT_FOUND and "Traceback" not in res.output
    res = runner.invoke(app, ["ps", "-w", str(ws), "--quiet", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["data"]["runs"] == []
    res = runner.invoke(app, ["ps", "-w", str(ws)])
    assert res.exit_code == 0 and "no runs in" in res.stdout and "launcher run RECIPE" in res.stdout
    res = runner.invoke(app, ["build", "nope", "-w", str(ws), "--debug"])
    assert res.exception is not None and not isinstance(res.exception, SystemExit)  # --debug: the traceback


def test_the_root_lists_every_command_its_modules_declare() -> None:
    """cli/lazy.py's table names each command of each module, in --help's order, and nothing else."""
    import typer

    from launcher.cli.lazy import COMMANDS, declared

    modules = list(dict.fromkeys(COMMANDS.values()))
    assert {p.stem for p in Path(launcher.__file__).parent.joinpath("cli").glob("*_cmds.py")} == set(modules)
    by_module = [(name, module) for module in modules for name in declared(module)]
    assert by_module == list(COMMANDS.items())
    root = typer.main.get_command(app)
    assert list(root.commands) == list(COMMANDS)  # type: ignore[attr-defined]
    listed = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        assert f"│ {name} " in listed and (cmd.short_help or cmd.help or "").split("\n")[0][:40] in listed, name
    assert "No such command 'rn'" in runner.invoke(app, ["rn"]).output  # still a usage error, all loaded


def test_a_command_imports_its_own_module_only(tmp_path: Path) -> None:
    """`launcher run` starts without importing the other command modules and the core under them."""
    code = ("import sys\nfrom launcher.cli import app\ntry:\n    app(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('launcher.'))))\n")
    res = subprocess.run([sys.executable, "-c", code, "-w", str(tmp_path), "run", "--help"],
                         capture_output=True, text=True, check=True)
    loaded = set(res.stdout.splitlines()[-1].split())
    assert "launcher.cli.run_cmds" in loaded and "--determinism" in res.stdout
    others = {f"launcher.cli.{m}" for m in ("images_cmds", "verify_cmds", "attest_cmds", "vm_cmds", "cache_cmds",
                                             "recipe_cmds", "export_cmds", "explain_cmds", "diverge_cmds")}
    assert not loaded & others, sorted(loaded & others)
    assert "launcher.images.build" not in loaded and "launcher.images.aptlock" not in loaded
    env = {**os.environ, "_LAUNCHER_COMPLETE": "complete_bash", "COMP_WORDS": "launcher re", "COMP_CWORD": "1"}
    completed = subprocess.run([Path(sys.executable).with_name("launcher")], env=env, capture_output=True, text=True)
    assert completed.stdout.split() == ["rebuild", "recipes", "resume", "report", "reproduce"]


def test_a_command_looked_up_alone_is_the_one_its_module_declares() -> None:
    """The root builds only the command it runs (cli/lazy.py); listing builds the rest, the same."""
    from launcher.cli.lazy import declared

    alone, full = declared("run_cmds", only="run"), declared("run_cmds")
    assert list(alone) == ["run"] and len(full) > 1
    assert [p.name for p in alone["run"].params] == [p.name for p in full["run"].params]
    assert alone["run"].help == full["run"].help
    assert list(declared("images_cmds", only="base")) == ["base"]  # a group among commands
