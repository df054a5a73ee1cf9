"""Scripts shaped like PyTorch's public examples, run as their authors run them, in the real torch-cpu image:
figures saved each epoch verify identical with their volatile parts named, and noise drawn into a figure
alone is "an output differs", never nondeterminism in training; a by-hand loop that saves nothing is
identical (or differs) by launcher's weight digests; a script reads traindata.pt from its working
directory, sent with --data-from or lying beside it. The scripts are in tests/fixtures/."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.workspace import Workspace

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.image, pytest.mark.slow]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def cli(ws: Workspace, *args: str, code: int = 0) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == code, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def verify(ws: Workspace, runs: list[dict[str, Any]], code: int) -> dict[str, Any]:
    return cli(ws, "verify", "checksums", *(r["run_id"] for r in runs), code=code)


@pytest.fixture(scope="module")
def torch_ws(make_workspace: Callable[[Path], Workspace], tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A workspace with the torch-cpu image built from the committed lock (the wheel from a folder)."""
    wheels = Path(os.environ.get("LAUNCHER_TEST_WHEELS", "/opt/wheels"))
    need((wheels / WHEEL).is_file(), f"no {WHEEL} in {wheels} (set LAUNCHER_TEST_WHEELS to a folder holding it; "
         "download.pytorch.org serves it)")
    ws = make_workspace(tmp_path_factory.mktemp("examples") / "ws")
    cli(ws, "build", "--variant", "torch-cpu", "--find-links", str(wheels))
    return ws


def project(tmp_path: Path, fixture: str) -> Path:
    """The fixture's folder copied outside this repository (its own project, not the repository's)."""
    return Path(shutil.copytree(FIXTURES / fixture, tmp_path / fixture))


@pytest.mark.network  # matplotlib, the project's requirement, from PyPI
def test_figures_saved_each_epoch_verify_identical_and_noise_in_a_figure_is_an_output_that_differs(
        torch_ws: Workspace, tmp_path: Path) -> None:
    script = project(tmp_path, "figures") / "train.py"
    runs = cli(torch_ws, "run", str(script), "--runs", "2", "--seed", "5")["data"]["runs"]
    assert all(r["determinism"]["env"]["SOURCE_DATE_EPOCH"] == "315532800" for r in runs)
    doc = verify(torch_ws, runs, ExitCode.OK)
    data = doc["data"]
    assert data["verdict"] == "identical", doc["summary"]
    kinds = data["evidence"]["kinds"]
    assert kinds["figure"]["files"] == 9 and kinds["figure"]["identical"] == 9
    assert kinds["model"]["identical"] >= 1 and kinds["weight digests"]["identical"] == 1
    # PDF and PNG carry SOURCE_DATE_EPOCH's date and are the same bytes; matplotlib draws SVG ids at random
    svg = next(g for g in data["bytes_only"] if g["format"] == "svg")
    assert svg["volatile"] == ["element ids (drawn at random: matplotlib's svg.hashsalt unset)"]
    assert "predict0.svg, predict1.svg, predict2.svg (element ids" in doc["summary"]
    assert not any(g["format"] in ("pdf", "png") for g in data["bytes_only"])

    noisy = cli(torch_ws, "run", str(script), "--runs", "2", "--seed", "5", "--", "--noise")["data"]["runs"]
    doc = verify(torch_ws, noisy, ExitCode.OUTPUT_DIFFERS)
    summary = doc["summary"]
    assert summary.startswith("an output differs: predict0.pdf (figure; pdf: object "), summary
    assert "predict0.png (figure; png: pixels differ in" in summary and "nondeterminism" not in summary
    (exp,) = doc["data"]["explanations"].values()
    assert exp["classification"]["kind"] == "outputs" and exp["steps"]["same"] is True


def test_a_by_hand_loop_that_saves_nothing_is_identical_by_its_weight_digests_and_differs_by_them(
        torch_ws: Workspace, tmp_path: Path) -> None:
    script = project(tmp_path, "weight_digests") / "by_hand.py"
    runs = cli(torch_ws, "run", str(script), "--runs", "2", "--variant", "torch-cpu")["data"]["runs"]
    doc = verify(torch_ws, runs, ExitCode.OK)
    assert doc["summary"].startswith("identical by launcher's weight digests at step 40 (module Linear, updated by "
                                     "hand): all 2 runs are bit-identical"), doc["summary"]
    assert doc["data"]["evidence"]["kinds"]["weight digests"]["training"] is True

    seeds = cli(torch_ws, "run", str(script), "--seed", "1", "--seed", "2", "--variant", "torch-cpu")["data"]["runs"]
    doc = verify(torch_ws, seeds, ExitCode.NOT_REPRODUCIBLE)
    assert "by launcher's weight digests (input-change): weights already differ at step 0" in doc["summary"]
    assert "module Linear, updated by hand" in doc["summary"]

    sgd = cli(torch_ws, "run", str(script), "--runs", "2", "--variant", "torch-cpu", "--",
              "--optimizer", "sgd")["data"]["runs"]
    assert "(module Linear, optimizer SGD)" in verify(torch_ws, sgd, ExitCode.OK)["summary"]


def test_a_script_reads_traindata_from_its_working_directory_sent_or_beside_it(torch_ws: Workspace,
                                                                              tmp_path: Path) -> None:
    folder = project(tmp_path, "workdir")
    (made,) = cli(torch_ws, "run", str(folder / "generate.py"), "--variant", "torch-cpu")["data"]["runs"]
    outputs = torch_ws.runs / made["run_id"] / "outputs"
    assert (outputs / "traindata.pt").is_file()

    # the file another run wrote, sent as data
    (sent,) = cli(torch_ws, "run", str(folder / "train.py"), "--variant", "torch-cpu",
                  "--data-from", str(outputs))["data"]["runs"]
    log = (torch_ws.runs / sent["run_id"] / "outputs/logs/train.log").read_text()
    assert "loss " in log and "on (4, 100)" in log
    assert "and the data (1: traindata.pt) shown read-only beside what the script writes" in log
    got = sorted(p.relative_to(torch_ws.runs / sent["run_id"] / "outputs").as_posix()
                 for p in (torch_ws.runs / sent["run_id"] / "outputs").iterdir())
    assert "model.pt" in got and "traindata.pt" not in got and "generate.py" not in got  # only what it wrote

    # the file beside the script
    shutil.copy(outputs / "traindata.pt", folder / "traindata.pt")
    (beside,) = cli(torch_ws, "run", str(folder / "train.py"), "--variant", "torch-cpu")["data"]["runs"]
    out = torch_ws.runs / beside["run_id"] / "outputs"
    trained = [ln for ln in (out / "logs/train.log").read_text().splitlines() if ln.startswith("loss ")]
    assert trained and trained == [ln for ln in log.splitlines() if ln.startswith("loss ")]  # the same data
    assert "the script's folder (3: generate.py, train.py, traindata.pt)" in (out / "logs/train.log").read_text()
    assert (out / "model.pt").is_file() and not (out / "traindata.pt").exists()
    assert not any(p.is_symlink() for p in out.rglob("*"))
