"""`launcher run --probes SPEC` on the host: SPEC parsed and checked as recipe.toml's [probes] is, a bad
one refused in one line before anything is built, and the choice carried to the runtime's argv, the
launch record and the runtime (which overrides recipe.toml with it). The real runs are in
test_probes_in_image.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import UsageError
from launcher.runtime.probespec import ProbeError, ProbeSpec, from_json, parse_option
from launcher.runtime.recipespec import RecipeSpec, SpecError, parse_spec
from launcher.specs.container import ContainerJob, runtime_argv
from launcher.specs.recipes import Recipe
from launcher.specs.request import RunRequest, probe_option, probes_option
from launcher.specs.runspec import probes_record
from launcher.targets.slurm import pyxis_srun_argv

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("text", "want"), [
    ("off", None),
    (" OFF ", None),
    ("4", ProbeSpec(count=4)),
    ("count=8,gradcam=false", ProbeSpec(count=8, gradcam=False)),
    ("indices=0;3;7, layer=conv2d_4", ProbeSpec(count=3, indices=(0, 3, 7), layer="conv2d_4")),
    ("split=validation,gradcam=true", ProbeSpec()),
    ("fingerprint=sha256:" + "a" * 64, ProbeSpec(fingerprint="sha256:" + "a" * 64)),
])
def test_probe_specs_parse(text: str, want: ProbeSpec | None) -> None:
    assert parse_option(text) == want


@pytest.mark.parametrize(("text", "table", "key"), [
    ("0", {"count": 0}, "probes.count"),
    ("count=0", {"count": 0}, "probes.count"),
    ("count=many", {"count": "many"}, "probes.count"),
    ("indices=2;2", {"indices": [2, 2]}, "probes.indices"),
    ("indices=1;x", {"indices": [1, "x"]}, "probes.indices"),
    ("count=3,indices=1", {"count": 3, "indices": [1]}, "probes.indices"),
    ("gradcam=maybe", {"gradcam": "maybe"}, "probes.gradcam"),
    ("split=train", {"split": "train"}, "probes.split"),
    ("fingerprint=sha256:abc", {"fingerprint": "sha256:abc"}, "probes.fingerprint"),
    ("colour=red", {"colour": "red"}, "probes.colour"),
])
def test_a_bad_spec_fails_the_check_recipe_toml_gets(tmp_path: Path, text: str, table: dict[str, Any],
                                                      key: str) -> None:
    with pytest.raises(ProbeError) as opt:
        parse_option(text)
    (tmp_path / "train.py").write_text("")
    with pytest.raises(SpecError) as toml:
        parse_spec(tmp_path / "recipe.toml", {"entry": "train.py", "probes": table}, tmp_path)
    assert opt.value.key == toml.value.key == key
    assert opt.value.detail == toml.value.detail


@pytest.mark.parametrize("text", ["", "abc", "count", "=3", "count=2,count=3", "2.5"])
def test_malformed_specs_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError) as err:
        probe_option(text)
    assert err.value.one_line().startswith(f"--probes {text}: ") and "\n" not in err.value.one_line()


@pytest.mark.parametrize("command", [["run", "no_such_recipe"], ["experiment", "no_such_recipe"]])
def test_a_bad_spec_is_one_line_and_exit_2_before_anything_else(tmp_path: Path, command: list[str]) -> None:
    r = CliRunner().invoke(app, ["--workspace", str(tmp_path / "nowhere"), *command, "--probes", "count=0"])
    assert r.exit_code == 2, r.output
    assert "--probes count=0: probes.count: must be a whole number >= 1" in r.output
    assert "Traceback" not in r.output and "no_such_recipe" not in r.output  # refused before the recipe is read


def _recipe(tmp_path: Path, probes: ProbeSpec | None = None, adhoc: bool = False) -> Recipe:
    spec = RecipeSpec(tmp_path / "r", "r", "tensorflow", "train.py", adhoc=adhoc, probes=probes)
    return Recipe(spec, "sha256:" + "0" * 64)


def _job(tmp_path: Path, **kw: Any) -> ContainerJob:
    return ContainerJob(run_id="20260101T000000-r-abcdef", image_id="sha256:" + "1" * 64, env={},
                        host_out=str(tmp_path / "out"), recipe=_recipe(tmp_path), params={}, **kw)


def test_the_choice_reaches_the_runtime_argv(tmp_path: Path) -> None:
    plain = runtime_argv(_job(tmp_path))
    assert "--probes" not in plain and "--no-probes" not in plain
    off = runtime_argv(_job(tmp_path, no_probes=True))
    assert "--no-probes" in off and "--probes" not in off
    config = ProbeSpec(count=4, gradcam=False).as_dict()
    given = runtime_argv(_job(tmp_path, probes=config))
    assert json.loads(given[given.index("--probes") + 1]) == config
    assert given.index("--probes") < given.index("--params")  # before the script's own arguments
    assert "--no-probes" in pyxis_srun_argv(_job(tmp_path, no_probes=True), "127.0.0.1:5000/x@sha256:" + "2" * 64)


def test_the_launch_record_says_which_probes_and_where_from(tmp_path: Path) -> None:
    declared = ProbeSpec(count=16)
    recipe = _recipe(tmp_path, declared)
    assert probes_record(RunRequest("r"), recipe) == {"source": "recipe", "config": declared.as_dict()}
    assert probes_record(RunRequest("r", probes=probes_option("off")), recipe) == {
        "source": "option", "option": "off", "config": None}
    assert probes_record(RunRequest("r", probes=probes_option("4")), _recipe(tmp_path, adhoc=True)) == {
        "source": "option", "option": "4", "config": ProbeSpec(count=4).as_dict()}
    assert probes_record(RunRequest("r"), _recipe(tmp_path, adhoc=True)) == {"source": "none", "config": None}


def test_the_runtime_reads_back_what_the_host_sends() -> None:
    for spec in (ProbeSpec(), ProbeSpec(count=3, indices=(4, 1, 9), layer="c", gradcam=False)):
        assert from_json(json.loads(json.dumps(spec.as_dict()))) == spec
    with pytest.raises(ProbeError):
        from_json({"count": -1})


def _runtime(tmp_path: Path, target: list[str], *flags: str) -> subprocess.CompletedProcess[str]:
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
    return subprocess.run([sys.executable, "-m", "launcher.runtime", "run", *target, "--out", str(out), *flags],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "LAUNCHER_PROBES": '{"stale": true}'})


def _seen(res: subprocess.CompletedProcess[str]) -> Any:
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("probes="))
    text = line.removeprefix("probes=")
    return None if text == "-" else json.loads(text)


def test_the_runtime_flag_overrides_recipe_toml(tmp_path: Path) -> None:
    folder = tmp_path / "probing"
    folder.mkdir()
    (folder / "train.py").write_text("import os\nprint('probes=' + os.environ.get('LAUNCHER_PROBES', '-'))\n")
    (folder / "recipe.toml").write_text('framework = "none"\nentry = "train.py"\n\n[probes]\ncount = 5\n')
    recipe = ["--recipe", str(folder)]
    assert _seen(_runtime(tmp_path, recipe))["count"] == 5
    off = _runtime(tmp_path, recipe, "--no-probes")
    assert _seen(off) is None and "launcher: probes: off (--no-probes)" in off.stdout
    given = json.dumps(ProbeSpec(count=2, gradcam=False).as_dict())
    assert _seen(_runtime(tmp_path, recipe, "--probes", given)) == ProbeSpec(count=2, gradcam=False).as_dict()
    script = ["--script", str(folder / "train.py")]
    assert _seen(_runtime(tmp_path, script, "--probes", given)) == ProbeSpec(count=2, gradcam=False).as_dict()
    assert _seen(_runtime(tmp_path, script, "--no-probes")) is None  # not even the caller's environment
    bad = _runtime(tmp_path, recipe, "--probes", '{"count": 0}')
    assert bad.returncode == 2 and "--probes: probes.count: must be a whole number >= 1" in bad.stdout
    both = _runtime(tmp_path, recipe, "--probes", given, "--no-probes")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
