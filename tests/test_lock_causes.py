"""A project's lock error names its real cause (launcher.images.lockcauses): a requirement the image's pin
satisfies is never a conflict; when resolving needs a pin's metadata from an index this machine cannot
reach, the error names the index and the package and the fix is that wheel in a folder (--find-links); a
real conflict (torch<2.6 against the image's torch 2.13.0+cpu) gives the two ways out with their exact
commands, and no --find-links. The unreachable index is a closed port on loopback.

The fast tests answer for pip-compile with pip's own words (captured from pip 26 in the base image); the
slow ones run the real pip-compile in the bootstrapped base image against PyPI."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, LockFailed
from launcher.images import lock, projectlock
from launcher.images import pins as images
from launcher.images.wheelsources import reachable
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
PYTORCH_INDEX = "https://download.pytorch.org/whl/cpu"

# pip's words (pip install --dry-run in the base image) for the two requirement files of the issue, when
# the PyTorch index was left out: `torch` (which torch==2.13.0+cpu satisfies) and `torch<2.6` (which it does not)
SATISFIED = """ERROR: Cannot install torch because these package versions have conflicting dependencies.

The conflict is caused by:

Additionally, some packages in these conflicts have no matching distributions available for your environment:

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip to attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""
BOUND = """ERROR: Cannot install torch<2.6 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch<2.6
    The user requested (constraint) torch==2.13.0+cpu

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    torch

To fix this you could try to:
1. loosen the range of package versions you've specified
"""
TRACE = "pip._internal.exceptions.DistributionNotFound: ResolutionImpossible: for help visit ..."


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unreachable_torch_index(ws: Workspace) -> str:
    """Point the torch-cpu variant's index at a closed port on loopback: an index this machine cannot reach."""
    url = f"http://127.0.0.1:{closed_port()}/whl/cpu"
    for path in (ws.lock_in("torch-cpu"), ws.lock_txt("torch-cpu")):
        path.write_text(path.read_text().replace(PYTORCH_INDEX, url))
    reachable.cache_clear()
    assert not reachable(url)
    return url


class PipAnswer:
    """launcher.images.lock.compile_in_base answering as pip-compile failed in the base image."""

    def __init__(self, output: str, diagnosis: str) -> None:
        self.output, self.diagnosis = output, diagnosis
        self.files: dict[str, str] = {}

    def __call__(self, eng: Any, pin: Any, files: dict[str, str], argv: list[str], output: str,
                 **kw: Any) -> dict[str, Any]:
        self.files = dict(files)
        return {"ok": False, "stage": "compile", "output": self.output, "diagnosis": self.diagnosis,
                "python": "3.11.2", "implementation": "CPython", "machine": "x86_64", "system": "Linux"}


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    init_workspace(tmp_path / "ws", from_workspace=Workspace.at(REPO))
    monkeypatch.setattr(lock, "base_engine", lambda pin, rep: object())
    return Workspace.at(tmp_path / "ws")


def project(root: Path, requirements: str) -> Path:
    root.mkdir(parents=True)
    (root / "train.py").write_text("import torch\n")
    (root / "requirements.txt").write_text(requirements)
    return root


def test_a_requirement_the_pin_satisfies_behind_an_unreachable_index_names_the_index_and_the_wheel(
        ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = unreachable_torch_index(ws)
    pip = PipAnswer("ERROR: Cannot install torch because these package versions have conflicting dependencies.\n"
                    + TRACE, SATISFIED)
    monkeypatch.setattr(lock, "compile_in_base", pip)
    proj = project(tmp_path / "ts", "torch\nmatplotlib\n")
    with pytest.raises(LockFailed) as err:
        projectlock.lock_project(ws, proj, "torch-cpu")
    line = err.value.one_line()
    assert url not in pip.files["requirements.txt"]  # left out before pip saw it
    assert line.startswith(f"requirements.txt asks for torch, which the torch-cpu image's torch==2.13.0+cpu satisfies "
                           f"(no conflict); but resolving needs torch==2.13.0+cpu's metadata and {url}, the index "
                           "that serves it, cannot be reached from this machine; fix: put the torch 2.13.0+cpu wheel "
                           "for the image's Python 3.11 in a folder DIR"), line
    assert (f"--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --index-url {url} -d DIR "
            "torch==2.13.0+cpu`") in line
    assert f"pass --find-links DIR (`launcher lock {proj} --variant torch-cpu --find-links DIR`" in line
    assert "but the torch-cpu image pins" not in line and "conflict)" in line


def test_a_bound_the_pin_breaks_is_a_conflict_with_two_ways_out_and_no_find_links(
        ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unreachable_torch_index(ws)  # even with the index left out, a folder of wheels cannot help
    monkeypatch.setattr(lock, "compile_in_base", PipAnswer(
        "ERROR: Cannot install torch<2.6 because these package versions have conflicting dependencies.\n" + TRACE,
        BOUND))
    proj = project(tmp_path / "ts", "torch<2.6\nmatplotlib\n")
    with pytest.raises(LockFailed) as err:
        projectlock.lock_project(ws, proj, "torch-cpu")
    assert err.value.exit_code == ExitCode.LOCK_FAILED
    assert err.value.message == ("requirements.txt asks for torch<2.6, but the torch-cpu image pins "
                                 "torch==2.13.0+cpu (lockfiles/torch-cpu.txt)")
    hint = str(err.value.hint)
    assert "--find-links" not in hint and "cannot be reached" not in err.value.one_line()
    assert hint.startswith("either relax the bound in requirements.txt so that it allows torch==2.13.0+cpu (the "
                           "image's packages cannot move): e.g. `torch<2.6` -> `torch`; or build a variant of the "
                           "torch-cpu image with torch<2.6 and run on it: `"), hint
    assert hint.endswith("`, then run with --variant torch-cpu-torch-lt2_6")
    commands = hint.split("`")[5]
    assert commands.startswith(f"cd {ws.root} && grep -vxF torch==2.13.0+cpu lockfiles/torch-cpu.in > ")
    assert commands.endswith("launcher lock --variant torch-cpu-torch-lt2_6 && "
                             "launcher build --variant torch-cpu-torch-lt2_6")
    # the commands are exact: run from anywhere (up to the lock, which needs the index), they make the variant
    made = commands.split(" && launcher lock")[0]
    subprocess.run(["sh", "-c", made], cwd=tmp_path, check=True)
    assert "torch-cpu-torch-lt2_6" in ws.variants()
    lines = ws.lock_in("torch-cpu-torch-lt2_6").read_text().splitlines()
    assert "torch<2.6" in lines and "torch==2.13.0+cpu" not in lines and lines[:-1] == [
        ln for ln in ws.lock_in("torch-cpu").read_text().splitlines() if ln != "torch==2.13.0+cpu"]
    assert images.load(ws).get("torch-cpu-torch-lt2_6").ref == images.load(ws).get("torch-cpu").ref


def test_a_requirement_every_pin_satisfies_is_locked_without_resolving(ws: Workspace, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    unreachable_torch_index(ws)

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("nothing to resolve: pip-compile must not run")

    monkeypatch.setattr(lock, "compile_in_base", never)
    proj = project(tmp_path / "wlm", "torch>=2.6\n")
    done = projectlock.lock_project(ws, proj, "torch-cpu")
    assert done.extra == 0 and "torch==2.13.0+cpu" in (proj / "requirements.lock").read_text()


def test_a_dependency_that_breaks_a_pin_is_a_conflict_naming_it() -> None:
    held = lock.parse_lock((REPO / "lockfiles/cpu.txt").read_text())
    diagnosis = ("The conflict is caused by:\n    The user requested oldlib\n    oldlib 1.0 depends on numpy<2\n"
                 "    The user requested (constraint) numpy==2.4.6\n\nTo fix this...")
    found = projectlock.conflict("conflicting dependencies", diagnosis, "requirements.in", "cpu", held)
    assert found is not None
    assert found.message == ("requirements.in asks for oldlib; oldlib 1.0 depends on numpy<2, but the cpu image pins "
                             "numpy==2.4.6 (lockfiles/cpu.txt)")
    assert str(found.hint) == ("either relax the bound in requirements.in so that it allows numpy==2.4.6 (the "
                               "image's packages cannot move), or run the project with another --variant whose "
                               "lock fits")
    allowed = diagnosis.replace("numpy<2", "numpy>=2")  # the pin satisfies it: not a conflict
    assert projectlock.conflict("conflicting dependencies", allowed, "requirements.in", "cpu", held) is None


# ---------------------------------------------------------------- real pip-compile in the base image


def _lock(ws: Workspace, proj: Path, *extra: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "lock", str(proj), "--variant", "torch-cpu", *extra])
    return res.exit_code, " ".join(res.output.split())


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.network
@pytest.mark.slow
def test_the_three_requirement_files_lock_or_fail_for_their_real_cause(
        make_workspace: Callable[..., Workspace], tmp_path: Path) -> None:
    from test_project_deps import WHEEL, wheel_folder

    wheels = wheel_folder("LAUNCHER_TEST_WHEELS", "/opt/wheels", (WHEEL,), "download.pytorch.org/whl/cpu")
    ws = make_workspace(tmp_path / "ws", recipes=False)
    url = unreachable_torch_index(ws)

    code, line = _lock(ws, project(tmp_path / "a", "torch\nmatplotlib\n"))
    assert code == ExitCode.LOCK_FAILED, line
    assert ("requirements.txt asks for torch, which the torch-cpu image's torch==2.13.0+cpu satisfies (no conflict); "
            f"but resolving needs torch==2.13.0+cpu's metadata and {url}, the index that serves it, cannot be "
            "reached") in line and "--find-links DIR" in line
    code, line = _lock(ws, tmp_path / "a", "--find-links", str(wheels))  # the fix it gave: that wheel in a folder
    assert code == 0, line
    assert "matplotlib==" in (tmp_path / "a" / "requirements.lock").read_text()

    code, line = _lock(ws, project(tmp_path / "b", "torch<2.6\nmatplotlib\n"), "--find-links", str(wheels))
    assert code == ExitCode.LOCK_FAILED, line
    assert ("requirements.txt asks for torch<2.6, but the torch-cpu image pins torch==2.13.0+cpu "
            "(lockfiles/torch-cpu.txt); fix: either relax the bound") in line
    assert "then run with --variant torch-cpu-torch-lt2_6" in line and "--find-links" not in line.split("fix:")[1]

    code, line = _lock(ws, project(tmp_path / "c", "torch>=2.6\n"))  # PyTorch's word-language model
    assert code == 0, line
