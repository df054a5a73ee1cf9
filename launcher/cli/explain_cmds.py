"""`launcher explain RUN --image FILE`: the Grad-CAM of a run's model for an image of yours."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from launcher.cli.common import command, render, reporter, stdout, workspace_of
from launcher.cli.params import RunArg
from launcher.result import Result

if TYPE_CHECKING:
    from launcher.runs.explain import ExplanationRecord

app = typer.Typer()


def _print_explain(result: Result[ExplanationRecord]) -> None:
    d = result.data
    p = d["probabilities"]
    stdout.print(f"{d['run_id']}: predicted class {d['predicted']} with probability {d['probability']:.4f} "
                 f"(probabilities {', '.join(f'{v:.4f}' for v in p)})", markup=False)
    stdout.print(f"Grad-CAM at layer {d['layer']} ({d['layer_source']}), "
                 f"{' x '.join(str(v) for v in d['heatmap_shape'])} map", markup=False)
    lo, hi = d["input_range"]
    stdout.print(f"input: {d['image']['path']} resized to {' x '.join(str(v) for v in d['input_shape'])}, "
                 f"pixel values 0..255 mapped onto [{lo:g}, {hi:g}] ({d['input_range_source']})", markup=False)
    for note in d["notes"]:
        stdout.print(f"note: {note}", markup=False)
    for key in ("explain", "heatmap", "overlay"):
        stdout.print(f"wrote {d['paths'][key]}", markup=False)


@command(app, "explain")
def explain_cmd(
    ctx: typer.Context,
    run_id: RunArg,
    image: Annotated[Path, typer.Option(
        "--image", "-i", metavar="FILE", help="The image to explain: a PNG, JPEG, BMP or GIF file.")],
    layer: Annotated[str | None, typer.Option(
        "--layer", metavar="NAME", help="The layer whose feature maps Grad-CAM weighs. Default: the layer the "
        "run's probes recorded, else the model's last convolutional feature map.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", metavar="DIR", help="Where the results go (replaced if it holds an earlier explanation). "
        "Default: explanations/RUN/IMAGE-STEM/ in the workspace.")] = None,
    input_range: Annotated[str | None, typer.Option(
        "--input-range", metavar="LO,HI", help="The value range the model was trained on; the image's pixel values "
        "0..255 are mapped onto it. Default: the range the run recorded with its probes, else 0,1.")] = None,
) -> None:
    """Explain a run's model on an image of yours: its prediction and the Grad-CAM map of the predicted class.

    The model is the run's outputs/model/model.keras (pull the run first). The computation runs in the
    run's own pinned Docker image, with that image's TensorFlow and Keras, in a container with no
    network; this machine needs Docker, not TensorFlow. The image is converted to the model's channels,
    resized to its input size, and its pixel values mapped onto the range the model was trained on.

    Writes explain.json (probabilities, predicted class, layer, the heatmap's values), heatmap.png and
    overlay.png (the map over the resized image) into one folder, which appears only when all are written.

    Example: launcher explain 20261122T100000-catsdogs_convnet-a1b2c3 --image cat.jpg
    """
    from launcher.runs.explain import explain_run, parse_range

    ws = workspace_of(ctx)
    given = parse_range(input_range) if input_range is not None else None
    with reporter(ctx) as rep:
        res = explain_run(ws, run_id, image, layer=layer, out=out, input_range=given, reporter=rep)
    render(ctx, Result("explain", res.to_dict(), summary=res.summary_line()), _print_explain)
