"""The command line as a stranger meets it: conventional metavars (never a Python type, and none on a
flag), the allowed values of a choice listed in help, shell completion of recipes, run IDs, variants and
SSH hosts (in a real bash too), and one spelling per idea with the older spellings still working."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
import typer
from typer.testing import CliRunner

from launcher.cli import app
from launcher.cli import params as cliparams
from launcher.determinism import PROFILES
from launcher.errors import ExitCode
from launcher.workflows.experiment import plan

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
PYTHON_TYPE = re.compile(r"<(bool|str|int|float|path|text|list\[[^>]*\]|tuple\[[^>]*\]|[a-z_-]+(\|[a-z_-]+)+)>")


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], bool]]:
    """(the command's words, whether it is a command rather than a group), hidden ones left out."""
    for name, cmd in group.commands.items():
        if getattr(cmd, "hidden", False):
            continue
        yield (*path, name), not hasattr(cmd, "commands")
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))


@pytest.fixture()
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("LAUNCHER_HOST", "LAUNCHER_VARIANT", "LAUNCHER_DETERMINISM", "LAUNCHER_THREADS"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "ws"
    assert runner.invoke(app, ["init", str(root)]).exit_code == 0
    assert runner.invoke(app, ["-w", str(root), "recipes", "new", "tiny_model"]).exit_code == 0
    monkeypatch.chdir(root)
    return root


def test_no_help_shows_a_python_type_and_flags_show_no_value(ws: Path) -> None:
    every = [((), False), *_commands(typer.main.get_command(app))]
    assert len(every) > 25
    for path, leaf in every:
        res = runner.invoke(app, [*path, "--help"], env=WIDE)
        assert res.exit_code == 0, (path, res.output)
        assert not PYTHON_TYPE.search(res.output), (path, PYTHON_TYPE.findall(res.output))
        usage = next(line for line in res.output.splitlines() if "Usage:" in line)
        assert not re.search(r"\[[a-z_]+\]|\{", usage), (path, usage)  # RUN, [RUN...]; not [runs]..., {RECIPE}
        assert re.search(r"--help\s+-h\s+Show this message", res.output), path  # a flag: no value shown
        if leaf:  # every command takes the global flags, shown without a value
            assert re.search(r"--json\s+Print a versioned JSON", res.output), path
    run = runner.invoke(app, ["run", "--help"], env=WIDE).output
    for flag, text in (("--detach", "Start and return"), ("--no-build", "Refuse"), ("--mount", "Development mode")):
        assert re.search(rf"{flag}(\s+-d)?\s+{text}", run), flag
    for option, metavar in (("--seed", "N"), ("--threads", "N"), ("--param", "KEY=VALUE"), ("--data", "PATH"),
                            ("--runs", "N"), ("--group", "NAME")):
        assert re.search(rf"{option}(\s+-[a-z])?\s+{re.escape(metavar)}\s", run), option
    assert "Usage: launcher run [OPTIONS] RECIPE [-- SCRIPT_ARGS...]" in run
    root = runner.invoke(app, ["--help"], env=WIDE).output
    assert "--install-completion" in root and "--show-completion" in root


def test_choices_are_listed_in_help(ws: Path) -> None:
    run = runner.invoke(app, ["run", "--help"], env=WIDE).output
    assert "[cpu|gpu]" in run and "[strict|deterministic|seeded|off]" in run and "[slurm|ray]" in run
    assert "[cpu|gpu|all]" in runner.invoke(app, ["lock", "--help"], env=WIDE).output
    assert "[same|different|both]" in runner.invoke(app, ["experiment", "--help"], env=WIDE).output
    assert "[mlflow|tensorboard]" in runner.invoke(app, ["export", "--help"], env=WIDE).output
    assert "[tensorflow|torch|jax]" in runner.invoke(app, ["recipes", "new", "--help"], env=WIDE).output
    # the variants are the workspace's own: a NAME.in with a NAME.Dockerfile
    (ws / "lockfiles" / "torch-cpu.in").write_text("torch\n")
    (ws / "dockerfiles" / "torch-cpu.Dockerfile").write_text("FROM scratch\n")
    (ws / "lockfiles" / "orphan.in").write_text("six\n")  # no Dockerfile: not a variant
    assert "[cpu|gpu|torch-cpu]" in runner.invoke(app, ["build", "--help"], env=WIDE).output
    assert "[cpu|gpu|torch-cpu]" in runner.invoke(app, ["-w", str(ws), "build", "--help"], env=WIDE).output
    assert set(get_args(cliparams.Profile)) == set(PROFILES)


def test_bad_choices_are_usage_errors_naming_the_allowed_values(ws: Path) -> None:
    res = runner.invoke(app, ["run", "tiny_model", "--determinism", "strikt"])
    assert res.exit_code == ExitCode.USAGE and "strict" in res.output
    res = runner.invoke(app, ["run", "tiny_model", "--variant", "tpu"])
    assert res.exit_code == ExitCode.USAGE and "cpu, gpu" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["experiment", "tiny_model", "--scheduler", "pbs"])
    assert res.exit_code == ExitCode.USAGE and "slurm" in res.output
    # with --json, an error found while parsing is the versioned envelope too (the message stays on stderr)
    for args in (["run", "tiny_model", "--variant", "gpu", "--determinism", "strikt", "--json"],
                 ["--json", "verify", "checksums", "--no-such-option"], ["--json", "--no-such-option"]):
        res = runner.invoke(app, args)
        envelope = json.loads(res.stdout)
        assert res.exit_code == envelope["exit_code"] == ExitCode.USAGE and envelope["ok"] is False, args
        assert envelope["summary"] in " ".join(res.stderr.replace("│", " ").split()) or "Invalid value" in res.stderr
    assert json.loads(runner.invoke(app, ["run", "x", "--determinism", "strikt", "--json"]).stdout)["command"] == "run"


def test_completion_of_recipes_runs_variants_and_hosts(ws: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def complete(*words: str) -> list[str]:
        env = {"_LAUNCHER_COMPLETE": "complete_bash", "COMP_WORDS": " ".join(["launcher", *words]),
               "COMP_CWORD": str(len(words))}
        res = runner.invoke(app, [], env=env, prog_name="launcher")
        return res.output.split()

    assert complete("run", "tin") == ["tiny_model"]
    assert complete("verify", "checksums", "--against", "") == []
    run_id = "20261123T101010-tiny_model-abc123"
    (ws / "runs" / run_id).mkdir(parents=True)
    (ws / "runs" / run_id / "launch.json").write_text("{}")
    (ws / "runs" / "not-a-run").mkdir()
    assert complete("logs", "2026") == [run_id]
    assert complete("verify", "checksums", "") == [run_id]
    (ws / "runs" / run_id / "launch.json").write_text(json.dumps({"run_id": run_id, "group": "tiny_model-same-seed"}))
    assert complete("report", "tiny") == complete("verify", "checksums", "-g", "") == ["tiny_model-same-seed"]
    assert complete("build", "--variant", "") == ["cpu", "gpu"]
    assert complete("lock", "--variant", "") == ["cpu", "gpu", "all"]
    assert complete("run", "x", "--determinism", "s") == ["strict", "seeded"]
    assert "--determinism" in complete("run", "x", "--") and "--profile" not in complete("run", "x", "--")
    assert "ls" in complete("recipes", "") and "list" not in complete("recipes", "")  # hidden alias
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host gpu-box gpu-*.lab !gpu-old\n  HostName 10.0.0.5\n"
                                          "Host *\n  ServerAliveInterval 30\nInclude conf.d/*\n")
    (home / ".ssh" / "conf.d" / "work").write_text("Host=bastion\n  User me\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LAUNCHER_HOME", str(home / ".launcher"))
    assert cliparams.ssh_hosts() == ["gpu-box", "bastion"]
    (home / ".launcher" / "ssh").mkdir(parents=True)  # the VMs `launcher vm up` made come first
    (home / ".launcher" / "ssh" / "config").write_text("Host my-vm\n  HostName 20.1.2.3\n")
    assert complete("run", "x", "--host", "") == ["my-vm", "gpu-box", "bastion"]
    assert complete("ps", "-H", "b") == ["bastion"]
    other = tmp_path / "other_config"
    other.write_text("Host elsewhere\n")
    assert complete("ps", "--ssh-config", str(other), "--host", "") == ["elsewhere"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_install_completion_in_a_real_bash_completes_a_recipe_and_a_run(ws: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    run_id = "20261123T111111-tiny_model-def456"
    (ws / "runs" / run_id).mkdir(parents=True)
    (ws / "runs" / run_id / "launch.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("_TYPER")}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    installed = subprocess.run(["bash", "-c", "launcher --install-completion"], cwd=ws, env=env,
                               capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "bash completion installed" in installed.stdout
    script = ("source ~/.bashrc\n"
              'complete_words() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=();\n'
              '  $(complete -p launcher | sed "s/.*-F \\([^ ]*\\) .*/\\1/") launcher; echo "${COMPREPLY[*]}"; }\n'
              "complete_words launcher run tiny\n"
              "complete_words launcher logs 20261123T11\n")
    done = subprocess.run(["bash", "-c", script], cwd=ws, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["tiny_model", run_id], done.stdout + done.stderr


def test_one_spelling_per_idea_with_the_old_ones_hidden(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.images import build as build_mod

    built: list[str] = []

    def fake_build(ws_: Any, variant: str, **kw: Any) -> Any:
        built.append(variant)
        raise typer.Exit(0)

    monkeypatch.setattr(build_mod, "build", fake_build)
    assert runner.invoke(app, ["build", "--variant", "gpu"]).exit_code == 0
    assert runner.invoke(app, ["build", "gpu"]).exit_code == 0  # the README's old spelling
    assert runner.invoke(app, ["build"]).exit_code == 0
    assert built == ["gpu", "gpu", "cpu"]
    res = runner.invoke(app, ["build", "gpu", "--variant", "cpu"])
    assert res.exit_code == ExitCode.USAGE and "two variants" in res.output
    help_text = runner.invoke(app, ["build", "--help"], env=WIDE).output
    assert "POSITIONAL" not in help_text and re.search(r"Usage: launcher build \[OPTIONS\] *\n", help_text)
    for old, new in ((["recipes", "list"], ["recipes", "ls"]), (["cache", "list"], ["cache", "ls"])):
        a, b = runner.invoke(app, [*old, "--json"]), runner.invoke(app, [*new, "--json"])
        assert a.exit_code == b.exit_code == 0, a.output + b.output
        same = [{k: v for k, v in json.loads(r.stdout)["data"].items() if k != "engine"} for r in (a, b)]
        assert same[0] == same[1]  # (the engine's images may change meanwhile: others build too)
    assert "list" not in runner.invoke(app, ["recipes", "--help"], env=WIDE).output.split()
    assert "--profile" not in runner.invoke(app, ["run", "--help"], env=WIDE).output  # --determinism, one spelling
    res = runner.invoke(app, ["run", "tiny_model", "--profile", "strikt"])  # the older one still parses
    assert res.exit_code == ExitCode.USAGE and "strikt" in res.output and "No such option" not in res.output
    # --seed repeats in experiment as in run: the different-seeds group takes the seeds given, then counts on
    jobs = plan("tiny", 3, "both", base_seed=[7, 100], stamp="20261123T000000")
    assert [j.seed for j in jobs if j.kind == "same-seed"] == [7, 7, 7]
    assert [j.seed for j in jobs if j.kind == "different-seeds"] == [7, 100, 101]
    assert [j.seed for j in plan("tiny", 2, "different", base_seed=5)] == [5, 6]


def test_help_paragraphs_are_reflowed_but_lists_keep_their_lines() -> None:
    from launcher.cli.common import reflow

    doc = """Summary line.

    A paragraph written over
    two lines.

    - a list item
    - another
    """
    assert reflow(doc) == "Summary line.\n\nA paragraph written over two lines.\n\n- a list item\n- another"
    assert reflow(None) is None
    import typer

    from launcher.cli import app

    explain = typer.main.get_command(app).commands["explain"]  # type: ignore[attr-defined]
    assert "(pull the run first). The computation runs in the run's own pinned Docker image" in explain.help
