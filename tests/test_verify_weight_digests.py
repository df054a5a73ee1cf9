"""Verdicts that agree with their own evidence (launcher.verify.stepevidence, verdicts): launcher's weight
digests of a script that saves nothing prove identical (or differs) at the last step, naming the module and
optimizer; digests that never moved prove nothing; when every digest agrees to the last step, a differing
figure is "an output differs" (exit 38), never nondeterminism in training. On hand-made records."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from runfactory import keep_only, make_workspace, pair, refresh_manifest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.runtime import steps
from launcher.verify.differences import CLASS_INPUT, CLASS_NONDETERMINISM, CLASS_OUTPUTS, IDENTICAL
from launcher.verify.evidence import KIND_FIGURE, KIND_STEPS
from launcher.verify.verdicts import INCONCLUSIVE, verify_checksums
from launcher.workspace import Workspace

runner = CliRunner()
COVERS = {"module": "Linear", "optimizer": "by hand"}


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")


def _digests(seed: str, points: list[int], moved: bool = True) -> list[dict[str, object]]:
    return [{"step": s, "digest": f"sha256:{seed}-{s if moved else 0}", "layers": {"fc": f"{seed}-{s if moved else 0}"},
             **COVERS} for s in points]


def _saves_nothing(d: Path, rows: list[dict[str, object]], *kept: str) -> None:
    """The run as a script that saves nothing leaves it: launcher's records, its log, its weight digests."""
    (d / "outputs" / steps.STEPS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    keep_only(d, steps.STEPS, *kept)


def _cli(ws: Workspace, *args: str) -> tuple[int, str]:
    r = runner.invoke(app, ["--workspace", str(ws.root), "verify", "checksums", *args])
    return r.exit_code, r.stdout


def test_a_script_that_saves_nothing_is_identical_by_its_weight_digests(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d in (a, b):
        _saves_nothing(d, _digests("s1", [0, 315]))
    report = verify_checksums(ws)
    line = report.summary_line()
    assert report.exit_code == ExitCode.OK and report.verdict == IDENTICAL, line
    assert line.startswith("identical by launcher's weight digests at step 315 (module Linear, updated by hand): "
                           "all 2 runs are bit-identical"), line
    kinds = report.evidence()["kinds"]
    assert kinds[KIND_STEPS]["identical"] == 1 and kinds[KIND_STEPS]["training"] is True
    assert report.to_dict()["evidence"]["training"] is True
    assert report.checks()["models"] == {"all_same": True, "checked": 2, "of": 2, "differing": []}  # by them
    code, out = _cli(ws)
    assert code == ExitCode.OK and "weight digests: 1 file, 1 compared: identical (1 identical)" in out


def test_weight_digests_that_part_are_a_difference_by_them(ws: Workspace) -> None:
    a, b = pair(ws.runs, seed=7)
    _saves_nothing(a, _digests("s1", [0, 315]))
    _saves_nothing(b, _digests("s7", [0, 315]))
    report = verify_checksums(ws)
    line = report.summary_line()
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE and report.verdict == "differs"
    (run,) = report.differing
    assert run.explanation is not None and run.explanation["classification"]["kind"] == CLASS_INPUT
    assert report.checks()["models"]["all_same"] is False
    assert "by launcher's weight digests (input-change): weights already differ at step 0, the first recorded " \
           "in both (first layer fc); module Linear, updated by hand" in line, line


def test_nondeterministic_digests_are_nondeterminism_in_training(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    _saves_nothing(a, _digests("s1", [0, 10, 20]))
    rows = _digests("s1", [0, 10, 20])
    rows[2] = {**rows[2], "digest": "sha256:other", "layers": {"fc": "other"}}
    _saves_nothing(b, rows)
    report = verify_checksums(ws)
    (run,) = report.differing
    assert run.explanation is not None
    cls = run.explanation["classification"]
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE and cls["kind"] == CLASS_NONDETERMINISM
    assert "weights agree up to step 10 and part by step 20" in report.summary_line()


def test_runs_that_end_at_other_steps_differ(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    _saves_nothing(a, _digests("s1", [0, 315]))
    _saves_nothing(b, _digests("s1", [0, 315, 316]))
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE
    assert "training ends at step 315 in one run and 316 in the other" in report.summary_line()


def test_rows_one_run_recorded_alone_are_set_aside(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    _saves_nothing(a, _digests("s1", [0, 315]))
    _saves_nothing(b, _digests("s1", [0, 100, 200, 300, 315]))  # another --trace-every
    report = verify_checksums(ws)
    line = report.summary_line()
    assert report.exit_code == ExitCode.OK, line
    assert line.startswith("identical in content by launcher's weight digests at step 315")
    assert "fingerprints/steps.jsonl (rows at steps one run recorded alone (another --trace-every))" in line


def test_weight_digests_that_never_moved_prove_nothing(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d in (a, b):
        _saves_nothing(d, _digests("s1", [0, 1], moved=False))  # backward() once, no update
    report = verify_checksums(ws)
    line = report.summary_line()
    assert report.exit_code == ExitCode.INCONCLUSIVE and report.verdict == INCONCLUSIVE, line
    assert "launcher's weight digests saw no update" in line and "by launcher's weight digests" not in line


def test_no_training_observed_at_all_stays_inconclusive(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d in (a, b):
        keep_only(d)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.INCONCLUSIVE
    assert "nothing that training produced was compared" in report.summary_line()


def _png(shade: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\0" + bytes([shade if r == 1 else 0] * 4) for r in range(3))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 3, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_a_figure_that_differs_while_every_digest_agrees_is_an_output_that_differs(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d, shade in ((a, 10), (b, 11)):  # noise drawn into the figure only
        (d / "outputs/figure.png").write_bytes(_png(shade))
        _saves_nothing(d, _digests("s1", [0, 20, 40]), "figure.png")
    report = verify_checksums(ws)
    (run,) = report.differing
    assert run.explanation is not None
    cls = run.explanation["classification"]
    assert report.exit_code == ExitCode.OUTPUT_DIFFERS and report.verdict == "differs"
    assert cls["kind"] == CLASS_OUTPUTS and "nondeterminism" not in cls["line"]
    assert cls["line"] == ("an output differs: figure.png (figure; png: pixels differ in 1 of 3 rows (first row 1)); "
                           "training identical (launcher's weight digests agree at all 3 steps recorded in both, "
                           "to step 40)")
    line = report.summary_line()
    assert line.startswith("an output differs: figure.png (figure; png:") and f"(1 of 1 runs against {a.name})" in line
    assert report.evidence()["kinds"][KIND_FIGURE]["differs"] == 1
    code, out = _cli(ws)
    assert code == ExitCode.OUTPUT_DIFFERS and "an output differs: figure.png" in out and "nondeterminism" not in out


def test_a_figure_that_differs_while_a_digest_parts_is_not_only_an_output(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    rows = _digests("s1", [0, 20, 40])
    for d, shade, last in ((a, 10, "x"), (b, 11, "y")):
        (d / "outputs/figure.png").write_bytes(_png(shade))
        _saves_nothing(d, [*rows[:2], {**rows[2], "digest": last, "layers": {"fc": last}}], "figure.png")
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.NOT_REPRODUCIBLE
    (run,) = report.differing
    assert run.explanation is not None and run.explanation["classification"]["kind"] == CLASS_NONDETERMINISM


def test_a_byte_compared_file_whose_difference_is_a_date_says_so(ws: Workspace) -> None:
    a, b = pair(ws.runs)
    for d, when in ((a, "2026-11-28 10:55:01"), (b, "2026-11-28 10:57:13")):
        (d / "outputs/summary.html").write_text(f"<p>run finished {when}</p>")
        refresh_manifest(d)
    report = verify_checksums(ws)
    assert report.exit_code == ExitCode.OUTPUT_DIFFERS  # the model, metrics and fingerprints all agree
    (run,) = report.differing
    assert run.explanation is not None
    assert "summary.html (other; bytes; format not compared by content; the differing bytes look like a date " \
           "(2026-11-28 10:55:01 -> 2026-11-28 10:57:13)" in run.explanation["classification"]["line"]


# ---------------------------------------------------------------- what the runtime records (torch on this machine)

IN_A_FUNCTION = """\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.fc(x)


def main():  # the model is gone when the script ends: the last row is read through the optimizer
    model = Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(8, 3)).pow(2).mean().backward()
        opt.step()


main()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args", "covers"), [
    ("by_hand", ["--steps", "6"], [("Linear", "by hand")] * 2),
    # an optimizer made before the first backward(): its first step takes step 0 (the same weights), and backward()
    # calls are its steps' gradients, not updates (micro-batches accumulate several)
    ("by_hand", ["--steps", "6", "--optimizer", "sgd"], [("Linear", "SGD"), ("Linear", "SGD")]),
    ("in_a_function", [], [("Net", "Adadelta"), ("Net", "Adadelta")]),
])
def test_each_step_row_names_the_module_and_optimizer_its_digests_cover(tmp_path: Path, script: str,
                                                                       args: list[str],
                                                                       covers: list[tuple[str, str]]) -> None:
    import shutil

    from test_step_trace import _rows, _run_torch

    path = tmp_path / "code" / f"{script}.py"
    path.parent.mkdir()
    if script == "by_hand":
        shutil.copy(Path(__file__).parent / "fixtures/weight_digests/by_hand.py", path)
    else:
        path.write_text(IN_A_FUNCTION)
    _run_torch(tmp_path / "out", path, *args)
    rows = _rows(tmp_path / "out")
    assert [(r["module"], r["optimizer"]) for r in rows] == covers
    assert rows[-1]["step"] == (6 if script == "by_hand" else 5)
