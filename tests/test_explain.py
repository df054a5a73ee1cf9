"""`launcher explain RUN --image FILE` on the host, without Docker: the arguments, every refusal (one line,
its exit code, nothing written), and what the tool container is asked to do, with a fake engine in place
of Docker that writes what the runtime would. The real computation in the TensorFlow image is in
tests/test_explain_in_image.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from runfactory import FakeRun, make_workspace, write_run
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, NotFound
from launcher.hosts import engine as enginemod
from launcher.hosts.containerspec import ContainerSpec
from launcher.proc import Completed
from launcher.runs import explain as explainmod
from launcher.runtime import fingerprints as fp
from launcher.runtime.pictures import encode_png

runner = CliRunner()
RUN = "20261122T100000-catsdogs_convnet-aaaaaa"
IMAGE_ID = "sha256:" + "1" * 64


class FakeEngine:
    """Stands in for the local Docker engine: holds the images given, and answers `docker run` by
    writing into the mounted output folder what the runtime would (or by failing as told)."""

    where = "the local Docker engine"

    def __init__(self, images: Sequence[str] = (IMAGE_ID,), rc: int = 0, said: str = "") -> None:
        self.images, self.rc, self.said = set(images), rc, said
        self.calls: list[list[str]] = []

    def inspect_image(self, ref: str) -> dict[str, Any]:
        if ref not in self.images:
            raise NotFound(f"image {ref} is not in {self.where}", "build it first with `launcher build`")
        return {"Id": ref}

    def run_to_end(self, spec: ContainerSpec, *, input: bytes | None = None,
                   timeout: float | None = None) -> Completed:
        argv = enginemod.render(spec)
        self.calls.append(argv)
        mounts = dict(reversed(argv[i + 1].split(":")[:2]) for i, a in enumerate(argv) if a == "-v")
        out = Path(mounts[explainmod.OUT_DIR])
        if self.rc != 0:
            (out / "heatmap.png").write_bytes(b"half")  # a failure half-way: nothing of it may remain
            return Completed(tuple(argv), self.rc, b"", f"noise\nlauncher: error: {self.said}\n".encode())
        heat = np.linspace(0, 1, 49, dtype=np.float32).reshape(7, 7)
        (out / "heatmap.png").write_bytes(encode_png(np.zeros((7, 7, 3), np.uint8)))
        (out / "overlay.png").write_bytes(encode_png(np.zeros((180, 180, 3), np.uint8)))
        lo, hi = (float(v) for v in next(a for a in argv if a.startswith("--input-range=")).split("=")[1].split(","))
        layer = argv[argv.index("--layer") + 1] if "--layer" in argv else None
        fp.write_json(out / "explain.json", {
            "model": {"path": "/launcher/model/model.keras", "sha256": "sha256:" + "a" * 64},
            "image": {"path": "/launcher/input/image.png", "sha256": "sha256:" + "b" * 64},
            "input_shape": [180, 180, 3], "input_range": [lo, hi], "layer": layer or "conv2d_4",
            "layer_chosen": "declared" if layer else "automatic", "outputs": [0.25], "probabilities": [0.75, 0.25],
            "probabilities_read_as": "sigmoid output", "predicted": 0, "probability": 0.75,
            "heatmap_shape": [7, 7], "heatmap": heat.tolist()})
        return Completed(tuple(argv), 0, b"launcher: class 0\n", b"")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws")


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "stripes.png"
    path.write_bytes(encode_png(np.zeros((20, 30, 3), np.uint8)))
    return path


def keras_run(root: Path, *, probes: dict[str, Any] | None = None, model: bool = True) -> Path:
    files = {"model/model.keras": b"PK\x03\x04 not really a keras zip"} if model else {}
    if probes is not None:
        files["probes/probes.json"] = fp.canonical_json(probes).encode()
    return write_run(root / "runs", FakeRun(run_id=RUN, recipe="catsdogs_convnet", image_id=IMAGE_ID,
                                            extra_files=files))


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    eng = FakeEngine()
    monkeypatch.setattr(explainmod.enginemod, "local", lambda: eng)
    return eng


def _invoke(root: Path, *args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, ["--workspace", str(root), "--quiet", "explain", *args])
    return r.exit_code, r.stdout, r.stderr


def _leftovers(root: Path) -> list[str]:
    where = root / "explanations"
    return sorted(p.name for p in where.rglob("*")) if where.exists() else []


def test_a_missing_image_file_is_one_line_and_not_found(root: Path, engine: FakeEngine, tmp_path: Path) -> None:
    keras_run(root)
    code, _, err = _invoke(root, RUN, "--image", str(tmp_path / "nope.png"))
    assert code == ExitCode.NOT_FOUND
    assert err.count("\n") == 1 and "no image file" in err and "nope.png" in err and "Traceback" not in err
    code, _, err = _invoke(root, RUN, "--image", str(tmp_path))
    assert code == ExitCode.USAGE and "is not a file" in err
    assert not engine.calls


def test_a_missing_run_is_not_found(root: Path, engine: FakeEngine, image: Path) -> None:
    code, _, err = _invoke(root, "20990101", "--image", str(image))
    assert code == ExitCode.NOT_FOUND and "no run '20990101'" in err and "launcher ps" in err
    assert not engine.calls


def test_a_model_not_pulled_names_the_pull(root: Path, engine: FakeEngine, image: Path) -> None:
    d = keras_run(root)
    (d / explainmod.MODEL).unlink()  # listed in the manifest, not here: the pull did not bring it
    code, _, err = _invoke(root, RUN[:20], "--image", str(image))  # a prefix of the run id is enough
    assert code == ExitCode.NOT_FOUND
    assert "model outputs/model/model.keras is not here" in err and f"`launcher pull {RUN}`" in err
    assert not engine.calls


def test_a_run_without_a_keras_model_says_so(root: Path, engine: FakeEngine, image: Path) -> None:
    keras_run(root, model=False)
    code, _, err = _invoke(root, RUN, "--image", str(image))
    assert code == ExitCode.NOT_FOUND and "has no Keras model" in err and "launcher pull" not in err


def test_a_model_that_is_not_the_recorded_one_is_corrupt(root: Path, engine: FakeEngine, image: Path) -> None:
    d = keras_run(root)
    (d / explainmod.MODEL).write_bytes(b"something else")
    code, _, err = _invoke(root, RUN, "--image", str(image))
    assert code == ExitCode.CORRUPT and "does not match the digest its manifest records" in err
    assert not engine.calls


def test_the_runs_image_not_on_the_engine_names_the_image_and_the_rebuild(
        root: Path, monkeypatch: pytest.MonkeyPatch, image: Path) -> None:
    keras_run(root)
    eng = FakeEngine(images=())
    monkeypatch.setattr(explainmod.enginemod, "local", lambda: eng)
    code, _, err = _invoke(root, RUN, "--image", str(image))
    assert code == ExitCode.NOT_FOUND
    assert IMAGE_ID[:19] in err and "launcher/ws-cpu:0123456789ab" in err and "the local Docker engine" in err
    assert "`launcher build --variant cpu`" in err and err.count("\n") == 1
    assert not eng.calls and _leftovers(root) == []


@pytest.mark.parametrize("given", ["0", "1,0", "a,b", "0,1,2"])
def test_a_bad_input_range_is_a_usage_error(root: Path, engine: FakeEngine, image: Path, given: str) -> None:
    keras_run(root)
    code, _, err = _invoke(root, RUN, "--image", str(image), "--input-range", given)
    assert code == ExitCode.USAGE and "--input-range" in err
    assert not engine.calls


def test_an_out_folder_holding_other_files_is_refused(root: Path, engine: FakeEngine, image: Path,
                                                      tmp_path: Path) -> None:
    keras_run(root)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    code, _, err = _invoke(root, RUN, "--image", str(image), "--out", str(other))
    assert code == ExitCode.USAGE and "holds other files" in err
    assert [p.name for p in other.iterdir()] == ["notes.txt"] and not engine.calls


def test_explain_runs_the_tool_container_and_moves_the_folder_into_place(
        root: Path, engine: FakeEngine, image: Path) -> None:
    keras_run(root, probes={"recorded": True, "input_range": [0.0, 255.0],
                            "gradcam": {"layer": "conv2d_4", "chosen": "automatic", "shape": [7, 7]}})
    r = runner.invoke(app, ["--workspace", str(root), "--quiet", "--json", "explain", RUN, "--image", str(image)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)["data"]
    out = root / "explanations" / RUN / "stripes"
    assert data["paths"] == {"folder": str(out), "explain": str(out / "explain.json"),
                             "heatmap": str(out / "heatmap.png"), "overlay": str(out / "overlay.png")}
    assert data["input_range"] == [0.0, 255.0] and data["input_range_source"] == "recorded by the run's probes"
    assert data["layer"] == "conv2d_4" and data["layer_source"] == "recorded by the run's probes"
    assert data["notes"] == [] and data["run_id"] == RUN and data["docker_image"] == IMAGE_ID
    assert data["model"]["path"] == str(root / "runs" / RUN / explainmod.MODEL)  # host paths, not the container's
    assert data["image"]["path"] == str(image.resolve())
    assert data["runtime"]["digest"].startswith("sha256:")
    written = json.loads((out / "explain.json").read_text())
    assert written == {k: v for k, v in data.items() if k not in ("paths", "notes")}
    assert sorted(p.name for p in out.iterdir()) == ["explain.json", "heatmap.png", "overlay.png"]
    assert _leftovers(root) == [RUN, "explain.json", "heatmap.png", "overlay.png", "stripes"]  # no partial folder

    (argv,) = engine.calls
    assert argv[:2] == ["docker", "run"] and argv[argv.index("--network") + 1] == "none"
    assert "--user" in argv and "HOME=/tmp" in argv
    image_at = argv.index(IMAGE_ID)
    assert argv[image_at + 1:image_at + 4] == ["python", "-m", "launcher.runtime"] and argv[image_at + 4] == "explain"
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    assert f"{root / 'runs' / RUN / 'outputs' / 'model'}:{explainmod.MODEL_DIR}:ro" in mounts
    assert f"{image.resolve()}:{explainmod.INPUT_DIR}/image.png:ro" in mounts
    assert [m for m in mounts if m.endswith(explainmod.OUT_DIR)]  # the only one written to
    assert sum(not m.endswith(":ro") for m in mounts) == 1
    assert "--input-range=0.0,255.0" in argv and argv[argv.index("--layer") + 1] == "conv2d_4"

    # Again, with the options: the earlier explanation is replaced.
    code, text, _ = _invoke(root, RUN, "--image", str(image), "--layer", "conv2d_3", "--input-range", "-1,1")
    assert code == 0, text
    assert "predicted class 0 with probability 0.7500" in text and "layer conv2d_3 (given)" in text
    assert "mapped onto [-1, 1] (given)" in text and f"wrote {out / 'overlay.png'}" in text
    assert json.loads((out / "explain.json").read_text())["layer"] == "conv2d_3"
    assert "--input-range=-1.0,1.0" in engine.calls[-1]
    assert _leftovers(root) == [RUN, "explain.json", "heatmap.png", "overlay.png", "stripes"]


def test_without_recorded_probes_the_range_is_assumed_and_said(root: Path, engine: FakeEngine, image: Path,
                                                               tmp_path: Path) -> None:
    keras_run(root)
    out = tmp_path / "here"
    code, text, _ = _invoke(root, RUN, "--image", str(image), "--out", str(out))
    assert code == 0, text
    assert "(assumed)" in text and "note: the run recorded no input range" in text and "--input-range" in text
    doc = json.loads((out / "explain.json").read_text())
    assert doc["input_range"] == [0.0, 1.0] and doc["layer_source"] == "automatic"
    assert "--layer" not in engine.calls[0]


@pytest.mark.parametrize(("rc", "said", "exit_code", "fix"), [
    (17, "/launcher/input/image.png is not an image TensorFlow decodes (PNG, JPEG, BMP or GIF)", ExitCode.BAD_DATA,
     "give a PNG, JPEG, BMP or GIF file"),
    (13, "/launcher/model/model.keras does not load as a Keras model (ValueError: bad zip)", ExitCode.CORRUPT,
     f"launcher pull {RUN}"),
    (2, "--layer 'dense' does not output a (batch, height, width, channels) feature map", ExitCode.USAGE, ""),
    (16, "the model has no convolutional feature map", ExitCode.INCOMPATIBLE, "Keras image classifiers"),
    (1, "Segmentation fault", ExitCode.COMMAND_FAILED, "rerun with --debug"),
])
def test_a_failure_in_the_image_is_one_line_and_leaves_no_folder(
        root: Path, monkeypatch: pytest.MonkeyPatch, image: Path, rc: int, said: str, exit_code: ExitCode,
        fix: str) -> None:
    keras_run(root)
    eng = FakeEngine(rc=rc, said=said)
    monkeypatch.setattr(explainmod.enginemod, "local", lambda: eng)
    code, _, err = _invoke(root, RUN, "--image", str(image))
    assert code == exit_code, err
    mounted = {"/launcher/input/image.png": str(image), "/launcher/model/model.keras": str(
        root / "runs" / RUN / "outputs" / "model" / "model.keras")}
    for inside, here in mounted.items():  # the user's own paths, not the container's
        said = said.replace(inside, here)
    assert err.count("\n") == 1 and said in err and fix in err and "noise" not in err
    assert "/launcher/" not in err
    assert ("exit 1" in err) == (rc == 1)  # an exit the runtime does not use is reported with its number
    assert _leftovers(root) == [RUN]  # the run's folder of explanations, empty: no partial, no half-written one


def test_explain_is_listed_and_its_help_teaches() -> None:
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "explain" in top
    text = runner.invoke(app, ["explain", "--help"], env={"COLUMNS": "200"}).output
    assert "Usage: launcher explain [OPTIONS] RUN" in text
    assert "pinned Docker image" in text and "not TensorFlow" in text and "Example: launcher explain" in text
    for option in ("--image", "--layer", "--out", "--input-range"):
        assert option in text


def test_the_runtime_parser_has_explain() -> None:
    from launcher.runtime.runner import build_parser

    args = build_parser().parse_args(["explain", "--model", "m.keras", "--image", "a.png", "--out", "o",
                                      "--input-range=-1,1"])
    assert args.command == "explain" and args.input_range == "-1,1" and args.layer is None


def test_the_runtime_exit_codes_mirror_launchers() -> None:
    from launcher.runtime import explain as runtime_explain
    from launcher.runtime import record

    assert (record.EXIT_USAGE, record.EXIT_BAD_DATA, record.EXIT_BAD_RECIPE) == (
        ExitCode.USAGE, ExitCode.BAD_DATA, ExitCode.BAD_RECIPE)
    assert (runtime_explain.EXIT_NOT_FOUND, runtime_explain.EXIT_CORRUPT, runtime_explain.EXIT_INCOMPATIBLE) == (
        ExitCode.NOT_FOUND, ExitCode.CORRUPT, ExitCode.INCOMPATIBLE)
