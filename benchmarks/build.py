"""Build benchmark: cold build, no-op build, a recipe edit, and `rebuild --verify` against a plain rebuild.

Prints each measurement as a ratio against a reference measured in the same run:
  * no-op build time / cold build time            (target <= 0.02)
  * build time after a one-line recipe edit / cold build time  (target <= 0.05): only the
    recipes layer is rebuilt, the environment image is reused
  * `rebuild --verify` time / plain no-cache build  (target <= 1.2), where the plain
    rebuild is `docker build --no-cache` of the same context with no normalisation or check
  * whether the rebuilt image ID matched the recorded one; the verified build is the one
    after the recipe edit, so this also shows that an edited recipe rebuilds to the same ID

    python benchmarks/build.py [--workspace DIR] [--small]

Without --workspace it makes a scratch copy of this repository's workspace pinned to a
bootstrapped base in the local registry (started if needed). --small swaps the TensorFlow
lock for a three-package one, for a quick check.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.images import build, registry, wheels
from launcher.images import pins as images
from launcher.images.bootstrap import bootstrap
from launcher.images.lock import lock_variant
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace, default_cache_dir

REPO = Path(__file__).resolve().parents[1]


def scratch_workspace(root: Path, small: bool) -> Workspace:
    init_workspace(root, from_workspace=Workspace.at(REPO))
    ws = Workspace.at(root)
    registry.start_local_registry(default_cache_dir() / "registry")
    ref = bootstrap(default_cache_dir(), registry_address=registry.DEFAULT_LOCAL).ref
    lock = images.load(ws)
    for v in list(lock.pins):
        lock.pins[v] = images.BasePin(v, ref, python="3.11", source="bootstrap")
    images.save(ws, lock)
    if small:
        ws.lock_in("cpu").write_text("six==1.17.0\npip\nsetuptools\n")
        ws.lock_txt("cpu").unlink()
        lock_variant(ws, "cpu")
    return ws


def plain_rebuild(ws: Workspace, variant: str) -> float:
    inputs = build.gather(ws, variant)
    house = wheels.download(inputs.lockfile, ws.wheelhouse, python=inputs.pin.python, platform=inputs.pin.platform)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp)
        build._context(ws, inputs, house, ctx)
        started = time.monotonic()
        subprocess.run(["docker", "build", "-q", "--no-cache", "--network", "none", "--build-arg",
                        f"{images.BASE_ARG}={inputs.pin.ref}", "--build-arg", "SOURCE_DATE_EPOCH=315532800",
                        "-t", "launcher-bench/plain:latest", str(ctx)], check=True, capture_output=True)
        elapsed = time.monotonic() - started
    subprocess.run(["docker", "rmi", "launcher-bench/plain:latest"], capture_output=True)
    return elapsed


EDITED_RECIPE = "mnist_convnet"


def edit_recipe(ws: Workspace) -> Path:
    """A one-line edit of a recipe's training script, as a researcher makes all day."""
    script = ws.recipes / EDITED_RECIPE / "train.py"
    script.write_text(script.read_text() + "# benchmark: a one-line edit\n")
    return script


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path)
    ap.add_argument("--variant", default="cpu")
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="launcher-bench-") as tmp:
        ws = Workspace.at(args.workspace) if args.workspace else scratch_workspace(Path(tmp) / "ws", args.small)
        t0 = time.monotonic()
        first = build.build(ws, args.variant, nocache=True)
        cold = time.monotonic() - t0
        t0 = time.monotonic()
        again = build.build(ws, args.variant)
        noop = time.monotonic() - t0
        assert again.noop, "the second build was not a no-op"
        edited = edit_recipe(ws)
        t0 = time.monotonic()
        after_edit = build.build(ws, args.variant)
        recipe_edit = time.monotonic() - t0
        assert not after_edit.noop and after_edit.image_id != first.image_id, "the recipe edit changed nothing"
        assert after_edit.extra.get("env_image_id") == first.extra.get("env_image_id"), "the environment was rebuilt"
        plain = plain_rebuild(ws, args.variant)
        t0 = time.monotonic()
        from launcher.images import rebuild

        report = rebuild.rebuild(ws, args.variant, verify=True)
        verify = time.monotonic() - t0
    print(f"image                      {first.tag} ({first.extra.get('files')} files)")
    print(f"cold build                 {cold:8.1f} s")
    print(f"no-op build                {noop:8.3f} s   ratio to cold     {noop / cold:.4f}  (target <= 0.02)")
    print(f"recipe edit, build again   {recipe_edit:8.2f} s   ratio to cold     {recipe_edit / cold:.4f}  "
          f"(target <= 0.05; {edited.relative_to(ws.root)})")
    print(f"plain no-cache rebuild     {plain:8.1f} s   (docker build only, the reference)")
    print(f"rebuild --verify           {verify:8.1f} s   ratio to plain    {verify / plain:.2f}  (target <= 1.2)")
    print(f"tree digest matched        {report.tree_matches}")
    print(f"rebuilt image ID matched   {report.id_matches}  ({report.rebuilt_image_id[:19]}…, after the recipe edit)")
    return 0 if report.tree_matches else 3


if __name__ == "__main__":
    sys.exit(main())
