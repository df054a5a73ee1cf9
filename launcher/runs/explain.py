"""`launcher explain RUN --image FILE`: the Grad-CAM of a pulled run's model for an image of the user's.

The computation runs inside the run's own pinned image (its TensorFlow, Keras and numpy; the host
needs none of them), as a short-lived tool container: no network, the caller's UID:GID, the run's
model folder and the image file mounted read-only, a fresh temporary folder beside the final one
mounted for the results. The code it runs is launcher's runtime (``python -m launcher.runtime
explain``, launcher.runtime.explain) from this host, mounted read-only over the image's copy, so runs
made with images older than `explain` can be explained too; its digest is recorded.

The folder is moved into place only when the container succeeded and wrote every file, so a failure
leaves no folder that looks complete; an earlier explanation in the same place is replaced.

The pixel values 0..255 of the image are mapped onto the value range the model was trained on:
``--input-range``, else the range the run recorded with its probe set (``outputs/probes/probes.json``
``input_range``), else [0, 1] (said in the result). The layer is ``--layer``, else the run's
recorded Grad-CAM layer, else the last convolutional feature map.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

import launcher
from launcher.errors import (
    BadData,
    CommandFailed,
    Corrupt,
    ExitCode,
    Incompatible,
    LauncherError,
    NotFound,
    UsageError,
)
from launcher.hashing import sha256_file
from launcher.hosts import engine as enginemod
from launcher.hosts.containerspec import ContainerSpec, Mount
from launcher.progress import NullReporter, Reporter
from launcher.records.manifest import Manifest, load_manifest
from launcher.records.rundir import OUTPUTS
from launcher.records.store import resolve_run
from launcher.runtime import explain as runtime_explain
from launcher.runtime import fingerprints as fp
from launcher.runtime.code import runtime_digest
from launcher.workspace import Workspace

MODEL = f"{OUTPUTS}/model/model.keras"
PROBES = f"{OUTPUTS}/probes/probes.json"
DEFAULT_RANGE = (0.0, 1.0)
TIMEOUT_S = 900.0
LABEL = "org.launcher.explain"
# Inside the tool container.
MODEL_DIR = "/launcher/model"
INPUT_DIR = "/launcher/input"
OUT_DIR = "/launcher/out"
RUNTIME_DIR = "/launcher/explain-runtime"

# The runtime's exit codes (it mirrors ExitCode's values) -> the error raised here and its fix.
_FAILURES: dict[int, tuple[type[LauncherError], str | None]] = {
    ExitCode.USAGE: (UsageError, None),  # the runtime's message names the fix (a layer of the model)
    ExitCode.NOT_FOUND: (NotFound, None),
    ExitCode.CORRUPT: (Corrupt, "pull the run again (`launcher pull {run}`)"),
    ExitCode.INCOMPATIBLE: (Incompatible, "explain works on Keras image classifiers with a convolutional feature map"),
    ExitCode.BAD_DATA: (BadData, "give a PNG, JPEG, BMP or GIF file"),
}


class RuntimeRef(TypedDict):
    digest: str
    source: str
    version: str


class ExplainDocument(runtime_explain.ExplainDocument):
    """The explanation's ``explanation.json`` (launcher.runtime.explain.DOCUMENT): what the runtime
    computed in the run's image, completed here with the run, the image, where the paths are and why
    the range and layer were chosen."""

    run_id: str
    docker_image: str
    input_range_source: str
    layer_source: str
    runtime: RuntimeRef


class ExplanationRecord(ExplainDocument):
    """The `explain` command's Result data: explain.json's document, the files written and notes."""

    paths: dict[str, str]
    notes: list[str]


@dataclass
class Explanation:
    run_id: str
    out: Path
    document: ExplainDocument
    notes: list[str] = field(default_factory=list)

    @property
    def paths(self) -> dict[str, str]:
        return {"folder": str(self.out), **{name.split(".")[0]: str(self.out / name)
                                            for name in runtime_explain.FILES}}

    def to_dict(self) -> ExplanationRecord:
        return {**self.document, "paths": self.paths, "notes": list(self.notes)}

    def summary_line(self) -> str:
        d = self.document
        return (f"{self.run_id}: class {d['predicted']} (p {d['probability']:.4f}), Grad-CAM at layer "
                f"{d['layer']} ({d['layer_source']}); wrote {self.out}")


def parse_range(text: str) -> tuple[float, float]:
    """LO,HI as two floats with HI above LO; UsageError otherwise."""
    parts = text.split(",")
    try:
        lo, hi = (float(p) for p in parts)
    except ValueError:
        raise UsageError(f"--input-range {text!r} is not two numbers LO,HI",
                         "give the value range the model was trained on, e.g. --input-range 0,1 or 0,255") from None
    if not hi > lo:
        raise UsageError(f"--input-range {text!r}: HI is not above LO", "give LO,HI with LO < HI, e.g. 0,255")
    return lo, hi


def _recorded(path: Path) -> tuple[tuple[float, float] | None, str | None]:
    """What the run's probes recorded (probes.json): the model's input range (LO < HI) and its Grad-CAM
    layer; None for either where it is missing or not of that form."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        return None, None
    value = doc.get("input_range")
    recorded_range = None
    if (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value)
            and value[1] > value[0]):
        recorded_range = float(value[0]), float(value[1])
    gradcam = doc.get("gradcam")
    layer = gradcam.get("layer") if isinstance(gradcam, dict) else None
    return recorded_range, layer if isinstance(layer, str) and layer else None


def _mountable(path: Path, what: str) -> str:
    """The path as `docker run -v` takes it: a ':' or ',' in it would split the mount."""
    text = str(path)
    if ":" in text or "," in text:
        raise UsageError(f"{what} {text} has a ':' or ',' in its path, which a Docker mount cannot take",
                         "copy or move it to a path without them")
    return text


def _model(m: Manifest, run_id: str) -> Path:
    model = m.file(MODEL)
    recorded = m.artifact(MODEL)
    if not model.is_file():
        if recorded is None:
            raise NotFound(f"run {run_id} has no Keras model ({MODEL} is not among its artifacts)",
                           "explain needs a run whose recipe saves model/model.keras (a Keras image classifier)")
        raise NotFound(f"run {run_id}'s model {MODEL} is not here", f"pull the run first: `launcher pull {run_id}`")
    if recorded is not None and sha256_file(model) != recorded.sha256:
        raise Corrupt(f"{model} does not match the digest its manifest records",
                      f"pull the run again (`launcher pull {run_id}`)")
    return Path(model)


def _image_id(m: Manifest, run_id: str, eng: enginemod.Engine) -> str:
    image = m.image
    image_id = str(image.get("id") or "")
    if not image_id.startswith("sha256:"):
        raise NotFound(f"run {run_id} records no image ID", "explain runs in the run's own image; it needs one")
    try:
        eng.inspect_image(image_id)
    except NotFound:
        variant, commit = image.get("variant") or "cpu", str(image.get("git_commit") or "")
        tag = f" ({image['tag']})" if image.get("tag") else ""
        at = f" at git {commit[:12]}" if commit else ""
        raise NotFound(f"run {run_id}'s image {image_id[:19]}{tag} is not in {eng.where}",
                       f"build it again with `launcher build --variant {variant}` from the workspace{at} (the "
                       "image ID is a function of content), or `docker load` a saved copy") from None
    return image_id


def _check_out(out: Path) -> None:
    if out.is_file():
        raise UsageError(f"--out {out} is a file", "give a folder (new, or an earlier explanation's)")
    if out.is_dir() and any(out.iterdir()) and not (out / runtime_explain.DOCUMENT).is_file():
        raise UsageError(f"--out {out} holds other files, not an explanation",
                         "give a new or empty folder; an earlier explanation's folder is replaced")


def _failure(done: Any, run_id: str, image_id: str, paths: dict[str, str] | None = None) -> LauncherError:
    text = done.err + "\n" + done.out
    for inside, here in (paths or {}).items():  # the user's paths, not the container's
        text = text.replace(inside, here)
    said = [ln.split("launcher: error:", 1)[1].strip() for ln in text.splitlines() if "launcher: error:" in ln]
    if said and done.returncode in _FAILURES:
        cls, hint = _FAILURES[done.returncode]
        return cls(said[-1], hint.format(run=run_id) if hint else None)
    last = done.last_error_line()
    if re.search(r"No module named '?(tensorflow|keras|numpy)", text):
        return Incompatible(f"the run's image {image_id[:19]} has no TensorFlow ({last})",
                            "explain computes Grad-CAM with the TensorFlow of a TensorFlow run's image")
    return CommandFailed(f"explain failed in the run's image {image_id[:19]} (exit {done.returncode}): {last}",
                         "rerun with --debug, or run `python -m launcher.runtime explain` in the image by hand")


def _inside(image: Path) -> str:
    """Where the user's image is mounted in the container (its suffix kept: decoders may look at it)."""
    return f"{INPUT_DIR}/image" + (image.suffix.lower() if re.fullmatch(r"\.[A-Za-z0-9]{1,8}", image.suffix) else "")


def _spec(image_id: str, model: Path, image: Path, tmp: Path, run_id: str, layer: str | None,
          input_range: tuple[float, float]) -> ContainerSpec:
    pkg = Path(launcher.__file__).resolve().parent
    inside = _inside(image)
    command = ["python", "-m", "launcher.runtime", "explain", "--model", f"{MODEL_DIR}/{model.name}",
               "--image", inside, "--out", OUT_DIR, f"--input-range={input_range[0]!r},{input_range[1]!r}"]
    if layer:
        command += ["--layer", layer]
    mounts = (Mount(_mountable(model.parent, "the model folder"), MODEL_DIR, read_only=True),
              Mount(_mountable(image, "the image"), inside, read_only=True),
              Mount(_mountable(tmp, "the output folder"), OUT_DIR),
              Mount(_mountable(pkg / "__init__.py", "launcher"), f"{RUNTIME_DIR}/launcher/__init__.py", read_only=True),
              Mount(_mountable(pkg / "runtime", "launcher"), f"{RUNTIME_DIR}/launcher/runtime", read_only=True))
    return ContainerSpec(
        image_id, tuple(command), network="none", labels={LABEL: run_id},
        user=f"{os.getuid()}:{os.getgid()}" if hasattr(os, "getuid") else None,
        env={"HOME": "/tmp", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": RUNTIME_DIR},
        mounts=mounts)


def _move_into_place(tmp: Path, out: Path) -> None:
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}") if out.exists() else None
    if old is not None:
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _chosen(m: Manifest, input_range: tuple[float, float] | None, layer: str | None
            ) -> tuple[tuple[float, float], str, str | None, str, list[str]]:
    """The input range and layer: given, else recorded by the run's probes, else assumed (the range)
    or automatic (the layer); with where each came from and the notes for the user."""
    recorded_range, recorded_layer = _recorded(m.file(PROBES))
    notes: list[str] = []
    if input_range is not None:
        range_source = "given"
    elif recorded_range is not None:
        input_range, range_source = recorded_range, "recorded by the run's probes"
    else:
        input_range, range_source = DEFAULT_RANGE, "assumed"
        notes.append(f"the run recorded no input range ({PROBES}); assumed the model was trained on pixel "
                     "values in [0, 1]; give --input-range LO,HI if it was not")
    if layer:
        layer_source = "given"
    elif recorded_layer is not None:
        layer, layer_source = recorded_layer, "recorded by the run's probes"
    else:
        layer, layer_source = None, "automatic"
    return input_range, range_source, layer, layer_source, notes


def _completed(tmp: Path, run_id: str, image_id: str, model: Path, image: Path, range_source: str,
               layer_source: str) -> ExplainDocument:
    """The document the runtime wrote in tmp, completed with what only the host knows, and written back."""
    doc = json.loads((tmp / runtime_explain.DOCUMENT).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not all(k in doc for k in ("predicted", "probability", "layer")):
        raise CommandFailed(f"explain in the run's image wrote an unreadable {runtime_explain.DOCUMENT}",
                            "rerun with --debug and report it")
    doc.update({
        "run_id": run_id, "docker_image": image_id,
        "model": {**doc.get("model", {}), "path": str(model)},
        "image": {**doc.get("image", {}), "path": str(image)},
        "input_range_source": range_source, "layer_source": layer_source,
        "runtime": {"digest": runtime_digest(Path(launcher.__file__).resolve().parent),
                    "source": "launcher on the host, mounted read-only", "version": launcher.__version__},
    })
    fp.write_json(tmp / runtime_explain.DOCUMENT, doc)
    return cast(ExplainDocument, doc)


def explain_run(ws: Workspace, ref: str, image: Path, *, layer: str | None = None, out: Path | None = None,
                input_range: tuple[float, float] | None = None, reporter: Reporter | None = None,
                eng: enginemod.Engine | None = None, timeout: float = TIMEOUT_S) -> Explanation:
    """Explain the model of run ``ref`` for the image file; the document written and where."""
    rep = reporter or NullReporter()
    if not image.exists():
        raise NotFound(f"no image file {image}", "give the path of a PNG, JPEG, BMP or GIF file with --image")
    if not image.is_file():
        raise UsageError(f"--image {image} is not a file", "give the path of a PNG, JPEG, BMP or GIF file")
    image = image.resolve()
    m = load_manifest(resolve_run(ws, ref))
    run_id = m.run_id
    model = _model(m, run_id)
    eng = eng or enginemod.local()
    image_id = _image_id(m, run_id, eng)
    input_range, range_source, layer, layer_source, notes = _chosen(m, input_range, layer)
    out = (out or ws.explanations / run_id / image.stem).absolute()
    _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        task = rep.task(f"Grad-CAM of {run_id} in its image {image_id[7:19]}")
        try:
            done = eng.run_to_end(_spec(image_id, model, image, tmp, run_id, layer, input_range), timeout=timeout)
        finally:
            task.close()
        if done.returncode != 0:
            where = {_inside(image): str(image), f"{MODEL_DIR}/{model.name}": str(model)}
            raise _failure(done, run_id, image_id, where)
        missing = [name for name in runtime_explain.FILES if not (tmp / name).is_file()]
        if missing:
            raise CommandFailed(f"explain in the run's image wrote no {', '.join(missing)}",
                                "rerun with --debug and report it")
        doc = _completed(tmp, run_id, image_id, model, image, range_source, layer_source)
        _move_into_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Explanation(run_id, out, doc, notes)
