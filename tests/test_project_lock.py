"""A project's own requirements locked against its variant's image, without a container: pip-compile's
side is a fake answer at launcher.images.lock.compile_in_base (the real resolution inside the base image
is in test_project_deps.py); and companion packages matched to their framework's build."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, ImageOutOfDate, LockFailed, NotFound, UsageError
from launcher.images import companions, lock, projectlock
from launcher.images.lock import parse_lock
from launcher.progress import RecordingReporter
from launcher.runs import project
from launcher.scaffold import init_workspace
from launcher.specs.recipes import load_recipe
from launcher.specs.request import RunRequest
from launcher.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
H = "0" * 63
# pip's own words when a project asks for what the image pins otherwise (pip install --dry-run, numpy<2)
DIAGNOSIS = """ERROR: Cannot install numpy<2 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested numpy<2
    The user requested (constraint) numpy==2.4.6

To fix this you could try to:
1. loosen the range of package versions you've specified
"""


def entry(name: str, version: str, digit: str = "1", via: str = "-r lockfiles/requirements.in") -> str:
    return f"{name}=={version} \\\n    --hash=sha256:{H}{digit}\n    # via {via}\n"


class FakeCompile:
    """launcher.images.lock.compile_in_base: records what it was given, answers as the driver would."""

    def __init__(self, body: str = "", ok: bool = True, **extra: Any) -> None:
        self.body, self.ok, self.extra = body, ok, extra
        self.calls: list[dict[str, Any]] = []

    def __call__(self, eng: Any, pin: Any, files: dict[str, str], argv: list[str], output: str,
                 **kw: Any) -> dict[str, Any]:
        self.calls.append({"files": dict(files), "argv": list(argv), "output": output, **kw})
        answer = {"python": "3.11.2", "implementation": "CPython", "machine": "x86_64", "system": "Linux",
                  "ok": self.ok, **self.extra}
        if self.ok:
            answer["lock"] = self.body
        return answer


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    init_workspace(tmp_path / "ws", from_workspace=Workspace.at(REPO))
    monkeypatch.setattr(lock, "base_engine", lambda pin, rep: object())
    return Workspace.at(tmp_path / "ws")


def fake(monkeypatch: pytest.MonkeyPatch, compile_: FakeCompile) -> FakeCompile:
    monkeypatch.setattr(lock, "compile_in_base", compile_)
    return compile_


def make_project(root: Path, requirements: str = "tabulate\nmsgpack\n", name: str = "requirements.in") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("import tabulate\n")
    (root / name).write_text(requirements)
    return root


# ------------------------------------------------------------------ what a project declares


def test_requirements_in_is_preferred_then_txt_then_pyproject(tmp_path: Path) -> None:
    assert projectlock.find(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\ndependencies = ["tabulate>=0.9", "msgpack"]\n')
    found = projectlock.find(tmp_path)
    assert found is not None and found.source.name == "pyproject.toml"
    assert found.text == "tabulate>=0.9\nmsgpack\n" and found.input_name == projectlock.PYPROJECT_INPUT
    (tmp_path / "requirements.txt").write_text("humanize\n")
    assert projectlock.find(tmp_path).source.name == "requirements.txt"  # type: ignore[union-attr]
    (tmp_path / "requirements.in").write_text("tabulate\n")
    found = projectlock.find(tmp_path)
    assert found is not None and found.source.name == "requirements.in" and found.lock_path.name == "requirements.lock"


def test_pyproject_without_dependencies_declares_nothing_and_dynamic_ones_are_refused(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\n')
    assert projectlock.find(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\ndynamic = ["dependencies"]\n')
    with pytest.raises(UsageError, match="dynamic"):
        projectlock.find(tmp_path)


# ------------------------------------------------------------------ locking, with a fake pip-compile


def test_a_project_lock_is_constrained_by_the_variant_and_byte_stable(ws: Workspace, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proj = make_project(tmp_path / "myproj")
    body = entry("msgpack", "1.2.4") + entry("numpy", "2.4.6", "2", "-c lockfiles/launcher-constraints.txt")
    compile_ = fake(monkeypatch, FakeCompile(body))
    res = projectlock.lock_project(ws, proj, "cpu")
    assert res.changed and res.packages == 2 and res.extra == 1  # numpy is the image's own
    text = (proj / "requirements.lock").read_text()
    head = text.splitlines()[:6]
    digest = projectlock.find(proj).sha256  # type: ignore[union-attr]
    assert head[1] == f"# input: requirements.in {digest}"
    assert head[2].startswith(f"# constraints: lockfiles/cpu.txt {lock.sha256_file(ws.lock_txt('cpu'))}")
    assert re.fullmatch(r"# resolved inside the base image by CPython 3\.11\.2 on linux/amd64 \(pip-tools .*\)",
                        head[3])
    assert "# via -r requirements.in" in text and "-c lockfiles/cpu.txt" in text and "lockfiles/launcher" not in text
    assert str(tmp_path) not in text  # no local path in a lock
    sent = compile_.calls[0]["files"]
    assert sent["requirements.in"].endswith("msgpack\n-c launcher-constraints.txt\n")
    pins = sent[projectlock.CONSTRAINTS].splitlines()
    assert "numpy==2.4.6" in pins and "tensorflow-cpu==2.21.0" in pins and "--hash" not in sent[projectlock.CONSTRAINTS]
    assert compile_.calls[0]["argv"][-1] == "lockfiles/requirements.in" and compile_.calls[0]["diagnose"]
    mtime = (proj / "requirements.lock").stat().st_mtime_ns
    again = projectlock.lock_project(ws, proj, "cpu")
    assert not again.changed and (proj / "requirements.lock").stat().st_mtime_ns == mtime
    # the existing pins are kept, except those the image fixes (they cannot move anyway)
    assert compile_.calls[1]["files"]["requirements.lock"] == "msgpack==1.2.4\n"
    assert projectlock.stale_reason(ws, projectlock.find(proj), "cpu") is None  # type: ignore[arg-type]


def test_requirements_the_image_already_meets_are_locked_without_resolving_and_need_no_layer(
        ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # PyTorch's examples list their framework (word_language_model: torch>=2.6), which the image pins
    proj = make_project(tmp_path / "example", "torch>=2.6  # the framework\nNumPy\n", name="requirements.txt")
    compile_ = fake(monkeypatch, FakeCompile(ok=False))
    res = projectlock.lock_project(ws, proj, "torch-cpu")
    assert compile_.calls == [] and res.extra == 0 and res.packages == 2
    text = (proj / "requirements.lock").read_text()
    assert "# nothing to resolve: every requirement is a package the image pins" in text
    held = {r.name: r for r in parse_lock(ws.lock_txt("torch-cpu").read_text())}
    locked = parse_lock(text)
    assert [(r.name, r.version, r.hashes) for r in locked] == [
        (n, held[n].version, held[n].hashes) for n in ("numpy", "torch")]
    assert locked[1].version == "2.13.0+cpu"
    assert projectlock.stale_reason(ws, projectlock.find(proj), "torch-cpu") is None  # type: ignore[arg-type]
    request = RunRequest(recipe=str(proj / "train.py"), variant="torch-cpu")
    assert project.image_for(ws, request, load_recipe(ws, str(proj / "train.py"))) is None  # no project layer
    # one requirement the image does not meet (another version, extras, an option): resolved as before
    for text in ("torch<2\n", "numpy\ntabulate\n", "torch[opt-einsum]>=2\n", "--pre\ntorch\n"):
        (proj / "requirements.txt").write_text(text)
        with pytest.raises(LockFailed):
            projectlock.lock_project(ws, proj, "torch-cpu")
    assert len(compile_.calls) == 4


def test_only_the_files_the_input_includes_go_to_the_resolver(ws: Workspace, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    proj = make_project(tmp_path / "p", "-r base.in\ntabulate\n")
    (proj / "base.in").write_text("-c pins.txt\nmsgpack\n")
    (proj / "pins.txt").write_text("msgpack<2\n")
    (proj / "labels.txt").write_text("cat\ndog\n")  # data beside the code, not a requirements file
    compile_ = fake(monkeypatch, FakeCompile(entry("msgpack", "1.2.4")))
    projectlock.lock_project(ws, proj, "cpu")
    assert set(compile_.calls[0]["files"]) == {"requirements.in", "base.in", "pins.txt", projectlock.CONSTRAINTS}


def test_stale_reasons_name_what_changed(ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = make_project(tmp_path / "p")
    req = projectlock.find(proj)
    assert req is not None
    assert projectlock.stale_reason(ws, req, "cpu") == "requirements.lock is missing"
    fake(monkeypatch, FakeCompile(entry("msgpack", "1.2.4")))
    projectlock.lock_project(ws, proj, "cpu")
    assert projectlock.stale_reason(ws, req, "torch-cpu") == \
        "requirements.lock was locked for the cpu image, not torch-cpu"
    (proj / "requirements.in").write_text("tabulate\nmsgpack\nhumanize\n")
    assert projectlock.stale_reason(ws, projectlock.find(proj), "cpu") == \
        "requirements.in changed since it was locked"  # type: ignore[arg-type]
    (proj / "requirements.in").write_text("tabulate\nmsgpack\n")
    ws.lock_txt("cpu").write_text(ws.lock_txt("cpu").read_text() + "\n")
    assert projectlock.stale_reason(ws, req, "cpu") == "lockfiles/cpu.txt changed since it was locked"


def test_a_missing_variant_lock_names_the_variant_lock(ws: Workspace, tmp_path: Path) -> None:
    ws.lock_txt("cpu").unlink()
    with pytest.raises(NotFound) as err:
        projectlock.lock_project(ws, make_project(tmp_path / "p"), "cpu")
    assert "lockfiles/cpu.txt is missing" in err.value.message and "launcher lock --variant cpu" in str(err.value.hint)


def test_a_conflict_with_a_pinned_package_names_both_pins_and_the_fix(ws: Workspace, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proj = make_project(tmp_path / "p", "numpy<2\n")
    output = "ERROR: Cannot install numpy<2 because these package versions have conflicting dependencies.\n" \
             "pip._internal.exceptions.DistributionNotFound: ResolutionImpossible: for help visit ..."
    fake(monkeypatch, FakeCompile(ok=False, stage="compile", output=output, diagnosis=DIAGNOSIS))
    with pytest.raises(LockFailed) as err:
        projectlock.lock_project(ws, proj, "cpu")
    line = err.value.one_line()
    assert line.startswith("requirements.in asks for numpy<2, but the cpu image pins numpy==2.4.6 (lockfiles/cpu.txt)")
    assert "fix: either relax the bound in requirements.in so that it allows numpy==2.4.6" in line
    assert "then run with --variant cpu-numpy-lt2" in line and "--find-links" not in line
    assert not (proj / "requirements.lock").exists()


def test_a_conflict_without_pips_diagnosis_still_names_the_pin() -> None:
    held = parse_lock((REPO / "lockfiles/cpu.txt").read_text())
    output = "  ERROR: Cannot install scikit-learn<1.5 because these package versions have conflicting dependencies."
    found = projectlock.conflict(output, "", "requirements.in", "cpu", held)
    assert found is not None
    assert found.message == ("requirements.in asks for scikit-learn<1.5, but the cpu image pins scikit-learn==1.9.1 "
                             "(lockfiles/cpu.txt)")
    assert projectlock.conflict("No matching distribution found for nothere", "", "requirements.in", "cpu",
                                held) is None


def test_a_long_list_of_releases_is_cut_to_the_newest() -> None:
    held = parse_lock((REPO / "lockfiles/torch-cpu.txt").read_text())
    lines = "\n".join(f"    torchvision 0.{28 - i}.0 depends on torch==2.{13 - i}.0" for i in range(8))
    diagnosis = f"The conflict is caused by:\n    The user requested torchvision\n{lines}\n" \
                "    The user requested (constraint) torch==2.13.0+cpu\n\nTo fix this..."
    found = projectlock.conflict("conflicting dependencies", diagnosis, "requirements.in", "torch-cpu", held)
    assert found is not None and "(6 older releases alike)" in found.message
    assert found.message.endswith("but the torch-cpu image pins torch==2.13.0+cpu (lockfiles/torch-cpu.txt)")


def test_an_unresolvable_name_points_at_find_links(ws: Workspace, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, FakeCompile(ok=False, stage="compile",
                                  output="ERROR: No matching distribution found for torchvision==0.28.0+cpu"))
    with pytest.raises(LockFailed) as err:
        projectlock.lock_project(ws, make_project(tmp_path / "p", "torchvision==0.28.0+cpu\n"), "cpu")
    assert "torchvision==0.28.0+cpu" in err.value.message and "--find-links DIR" in str(err.value.hint)
    source = tmp_path / "p" / "requirements.in"  # the file to fix, by its path: the user may be anywhere
    assert f"could not resolve {source}: No matching distribution" in err.value.message
    assert str(err.value.hint).startswith(f"check the names and versions in {source};")


# ------------------------------------------------------------------ companions


def test_companions_must_carry_their_frameworks_label() -> None:
    assert companions.mismatches({"torch": "2.13.0+cpu", "torchvision": "0.28.0+cpu"}) == []
    assert companions.mismatches({"torch": "2.13.0", "torchvision": "0.28.0", "torchaudio": "2.13.0"}) == []
    bad = companions.mismatches({"torch": "2.13.0+cpu", "torchvision": "0.28.0"})
    assert [(m.companion, m.wanted) for m in bad] == [("torchvision", "0.28.0+cpu")]
    assert companions.mismatches({"torch": "2.13.0+cu130", "torchaudio": "2.13.0+cpu"})[0].wanted == "2.13.0+cu130"
    assert companions.mismatches({"tensorflow-cpu": "2.21.0", "tf-keras": "2.21.1"}) == []
    assert companions.mismatches({"tensorflow-cpu": "2.21.0", "tensorflow-text": "2.20.0"})[0].rule == "minor"
    assert companions.mismatches({"tensorflow": "2.21.0", "tensorflow-cpu": "2.21.0"})[0].rule == "build"


# pip-compile's annotations in a project lock: tensorflow-probability[tf] pulls in tf-keras, which needs PyPI's
# `tensorflow` (the cpu image pins `tensorflow-cpu`)
TFP_LOCK = """tensorflow==2.21.0 \\
    --hash=sha256:{a}
    # via tf-keras
tensorflow-probability[tf]==0.25.0 \\
    --hash=sha256:{b}
    # via -r requirements.txt
tf-keras==2.21.0 \\
    --hash=sha256:{c}
    # via
    #   -r requirements.txt
    #   tensorflow-probability
""".format(a="a" * 64, b="b" * 64, c="c" * 64)


def test_a_second_tensorflow_build_a_project_pulls_in_is_named_with_what_pulls_it_not_the_images() -> None:
    assert companions.via(TFP_LOCK) == {"tensorflow": ["tf-keras"], "tensorflow-probability": ["-r requirements.txt"],
                                        "tf-keras": ["-r requirements.txt", "tensorflow-probability"]}
    with pytest.raises(LockFailed) as err:
        companions.check({"tensorflow-cpu": "2.21.0", "tensorflow": "2.21.0", "tf-keras": "2.21.0"},
                         {"tensorflow-cpu": "lockfiles/cpu.txt", "tensorflow": "requirements.lock",
                          "tf-keras": "requirements.lock"},
                         source="requirements.txt", relock="launcher lock ./mdn --variant cpu",
                         pulled_by=companions.via(TFP_LOCK))
    assert err.value.message == ("tensorflow==2.21.0 (requirements.lock) is a second build of tensorflow beside "
                                 "tensorflow-cpu==2.21.0 (lockfiles/cpu.txt): both install the same module")
    assert str(err.value.hint) == ("keep the image's tensorflow-cpu: remove what pulls in tensorflow (pulled in by "
                                   "tf-keras) from requirements.txt, then `launcher lock ./mdn --variant cpu`")
    with pytest.raises(LockFailed) as err:  # both in one lock (a variant's own): either may go
        companions.check({"tensorflow": "2.21.0", "tensorflow-cpu": "2.21.0"}, {}, source="lockfiles/cpu.in",
                         relock="launcher lock --variant cpu")
    assert str(err.value.hint).startswith("keep one: remove what pulls in tensorflow-cpu from lockfiles/cpu.in")
    with pytest.raises(LockFailed) as err:  # a variant's own lock names both
        companions.check({"tensorflow": "2.21.0", "tensorflow-cpu": "2.21.0"},
                         dict.fromkeys(("tensorflow", "tensorflow-cpu"), "lockfiles/cpu.txt"),
                         source="lockfiles/cpu.in", relock="launcher lock --variant cpu")
    assert str(err.value.hint).startswith("keep one: remove what pulls in tensorflow-cpu from lockfiles/cpu.in")


def test_a_cpu_torch_beside_a_cuda_companion_names_both_wheels_and_the_exact_fix() -> None:
    with pytest.raises(LockFailed) as err:
        companions.check({"torch": "2.13.0+cpu", "torchvision": "0.28.0"},
                         {"torch": "lockfiles/torch-cpu.txt", "torchvision": "requirements.lock"},
                         source="requirements.in", relock="launcher lock ./proj --variant torch-cpu")
    line = err.value.one_line()
    assert "torchvision==0.28.0 (requirements.lock) does not match torch==2.13.0+cpu (lockfiles/torch-cpu.txt)" in line
    assert "`--extra-index-url https://download.pytorch.org/whl/cpu`" in line
    assert "`launcher lock ./proj --variant torch-cpu --find-links DIR`" in line
    assert "pin torchvision==0.28.0+cpu in requirements.in" in line


def test_a_variant_lock_pairing_cpu_torch_with_pypis_torchvision_is_refused(ws: Workspace,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    before = ws.lock_txt("torch-cpu").read_text()
    ws.lock_in("torch-cpu").write_text(ws.lock_in("torch-cpu").read_text() + "torchvision\n")
    body = "".join(entry(n, v, str(i)) for i, (n, v) in enumerate(
        [("pip", "26.3"), ("setuptools", "84.2.1"), ("torch", "2.13.0+cpu"), ("torchvision", "0.28.0")]))
    fake(monkeypatch, FakeCompile(body))
    with pytest.raises(LockFailed) as err:
        lock.lock_variant(ws, "torch-cpu")
    assert "torchvision==0.28.0 (lockfiles/torch-cpu.txt) does not match torch==2.13.0+cpu" in err.value.message
    assert "launcher lock --variant torch-cpu --find-links DIR" in str(err.value.hint)
    assert ws.lock_txt("torch-cpu").read_text() == before  # nothing written


def test_a_project_companion_is_checked_against_the_variants_framework(ws: Workspace, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    proj = make_project(tmp_path / "vision", "torchvision\n")
    fake(monkeypatch, FakeCompile(entry("torch", "2.13.0+cpu") + entry("torchvision", "0.28.0", "2")))
    with pytest.raises(LockFailed, match=r"torchvision==0\.28\.0 \(requirements\.lock\) does not match "
                       r"torch==2\.13\.0\+cpu \(lockfiles/torch-cpu\.txt\)"):
        projectlock.lock_project(ws, proj, "torch-cpu")
    assert not (proj / "requirements.lock").exists()


# ------------------------------------------------------------------ runs lock what is stale, or refuse


def test_run_locks_a_stale_project_with_one_line_and_no_build_refuses(ws: Workspace, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    proj = make_project(tmp_path / "myproj")
    compile_ = fake(monkeypatch, FakeCompile(entry("msgpack", "1.2.4")))
    spec = RunRequest(recipe=str(proj / "train.py"), variant="cpu", build=False)
    recipe = load_recipe(ws, spec.recipe)
    assert project.folder(spec, recipe) == proj.resolve()
    with pytest.raises(ImageOutOfDate) as err:
        project.ensure_lock(ws, spec, recipe)
    assert "requirements.lock is missing" in err.value.message and f"launcher lock {proj}" in str(err.value.hint)
    rep = RecordingReporter()
    spec = replace(spec, build=True)
    project.ensure_lock(ws, spec, recipe, rep)
    assert rep.notes == ["project myproj: requirements.lock is missing; locking requirements.in for the cpu image"]
    project.ensure_lock(ws, spec, recipe, rep)  # current now: nothing more said, nothing locked
    assert len(rep.notes) == 1 and len(compile_.calls) == 1


def test_lock_cli_locks_a_project_folder_or_script(ws: Workspace, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    proj = make_project(tmp_path / "myproj")
    fake(monkeypatch, FakeCompile(entry("msgpack", "1.2.4")))
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", "lock", str(proj / "train.py")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)["data"]
    assert data["variant"] == "cpu" and data["python"]["path"] == str(proj / "requirements.lock")
    assert data["python"]["extra"] == 1 and data["python"]["changed"] is True
    bare = make_project(tmp_path / "bare", "x", name="notes.txt")
    res = CliRunner().invoke(app, ["-w", str(ws.root), "lock", str(bare)])
    assert res.exit_code == 0 and "no Python requirements declared" in res.output
    res = CliRunner().invoke(app, ["-w", str(ws.root), "lock", str(tmp_path / "nothere")])
    assert res.exit_code == ExitCode.USAGE


@pytest.mark.parametrize("command", ["run", "experiment", "lock", "build", "rebuild"])
def test_every_command_that_fetches_wheels_takes_find_links(command: str) -> None:
    """The hint of a missing wheel says --find-links DIR: each command that can hit it has that option."""
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert "--find-links" in res.output and "--ca-bundle" in res.output
