"""Project-layer benchmark: what a change to a project's requirements.in costs, against a full image build.

A plain-script project with its own requirements.in (tabulate, msgpack) is locked and its layer
built once; then requirements.in gains a package (humanize) and launcher does what `launcher run`
does before it starts: lock the project again (pip-tools in the base image, against lockfiles/cpu.txt)
and build the project layer (the new wheels downloaded into an empty wheel pool, installed offline by
the image's pip, tarred, loaded on top of the cpu image). The reference, measured in the same run, is
a full build of the cpu image without the Docker build cache (its wheels already in the pool, so the
reference leaves out downloads the project side pays: the ratio is conservative).

Prints:
  * project layer after the change / full image build   (target <= 0.1)
  * lock + project layer after the change / full build    (what `launcher run` waits for)
  * that the cpu image's ID did not change, and the layer's did

    python benchmarks/project_layer.py [--workspace DIR]

Without --workspace it makes a scratch copy of this repository's workspace pinned to a base
bootstrapped into the local registry (started if needed). Needs Docker and the package index.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from launcher.images import build, buildrecord, registry
from launcher.images import pins as images
from launcher.images.bootstrap import bootstrap
from launcher.runs import project
from launcher.scaffold import init_workspace
from launcher.specs.recipes import load_recipe
from launcher.specs.request import RunRequest
from launcher.workspace import Workspace, default_cache_dir

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "import humanize, msgpack, tabulate\nprint(tabulate.tabulate([[humanize.intcomma(1797)]]))\n"


def scratch_workspace(root: Path) -> Workspace:
    init_workspace(root, from_workspace=Workspace.at(REPO))
    ws = Workspace.at(root)
    registry.start_local_registry(default_cache_dir() / "registry")
    ref = bootstrap(default_cache_dir(), registry_address=registry.DEFAULT_LOCAL).ref
    lock = images.load(ws)
    for v in list(lock.pins):
        lock.pins[v] = images.BasePin(v, ref, python="3.11", source="bootstrap")
    images.save(ws, lock)
    return ws


def fresh_cache(ws: Workspace, into: Path) -> Workspace:
    """The workspace with an empty cache but for the image configs: the layer is built, and its wheels
    downloaded, as on a machine that never saw this project."""
    (into / "images").mkdir(parents=True)
    (into / "images" / "configs").symlink_to(ws.cache_dir / "images" / "configs")
    return Workspace.at(ws.root, cache_dir=into)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="launcher-bench-") as tmp:
        ws = Workspace.at(args.workspace) if args.workspace else scratch_workspace(Path(tmp) / "ws")
        proj = Path(tmp) / "myproj"
        proj.mkdir()
        (proj / "train.py").write_text(SCRIPT)
        (proj / "requirements.in").write_text("tabulate\nmsgpack\n")
        spec = RunRequest(recipe=str(proj / "train.py"), variant="cpu")
        recipe = load_recipe(ws, spec.recipe)
        first = build.build(ws, "cpu")
        project.prepare(ws, spec, recipe)  # the project as it was: locked, its layer built

        started = time.monotonic()
        full = build.build(ws, "cpu", nocache=True)
        full_s = time.monotonic() - started
        print(f"full cpu image build, no cache: {full_s:.1f} s (image {full.image_id[7:19]}, "
              f"{'the same ID' if full.image_id == first.image_id else 'ANOTHER ID'} as before)")

        before = project.image_for(ws, spec, recipe)
        (proj / "requirements.in").write_text("tabulate\nmsgpack\nhumanize\n")
        started = time.monotonic()
        project.ensure_lock(ws, spec, recipe)
        lock_s = time.monotonic() - started
        started = time.monotonic()
        after = project.image_for(fresh_cache(ws, Path(tmp) / "cache"), spec, recipe)
        layer_s = time.monotonic() - started
        assert before and after
        unchanged = buildrecord.read_record(ws, "cpu")
        same = unchanged is not None and unchanged.image_id == full.image_id
        print(f"after adding humanize to requirements.in: lock {lock_s:.1f} s, project layer {layer_s:.1f} s "
              f"(packages {', '.join(after['project']['packages'])})")
        print(f"cpu image unchanged: {same}; layer {before['project']['layer'][7:19]} -> "
              f"{after['project']['layer'][7:19]}")
        print(f"project layer / full build: {layer_s / full_s:.4f} (target <= 0.1)")
        print(f"lock + project layer / full build: {(lock_s + layer_s) / full_s:.4f}")
        return 0 if same and layer_s / full_s <= 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
