"""What recording probes costs: catsdogs_convnet with its default probe set (recipe.toml's [probes]:
16 validation images, outputs and Grad-CAM) against the same run with `--probes off`.

Both run at the recipe's default size (no param overrides; `--epochs N` shortens training where a
default run takes too long on the machine: the probes are recorded once, after fit(), so fewer
epochs make their share larger and the ratio an upper bound) with the same seed under the default
`deterministic` profile, in alternating order (probes first, then off first, ...), so a slow spell of
the machine does not land on one side only.

The runtime records no timings of its own beyond exit.json's whole seconds, so the time counted is
the container's wall time (`docker run` to its exit: start, training, probes, saving the model),
best of --repeat per side. Prints the ratio with probes / without (target <= 1.05), and whether
training was bit-identical with and without probes (the probes must not disturb it).

Runs are started as launcher starts them: the runtime in the TensorFlow CPU image (`--image`, an
image built from this checkout, so its runtime knows --no-probes), with the argv `launcher run
--probes off` gives it.

Usage: python benchmarks/probes.py --image IMAGE [--epochs N] [--repeat 2] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.determinism import profile_env

RECIPE = "catsdogs_convnet"
IDENTITY = ("model/canonical.npz", "fingerprints/batches.jsonl", "metrics.jsonl", "weights/layers.json")
SIDES = ("probes", "off")


def run_once(image: str, env: dict[str, str], out: Path, params: dict[str, object], probes: bool) -> float:
    out.mkdir(parents=True)
    os.chmod(out, 0o777)
    argv = ["docker", "run", "--rm", "--label", "org.launcher.benchmark=probes"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    argv += ["-e", f"LAUNCHER_OWNER={os.getuid()}:{os.getgid()}", "-v", f"{out}:/launcher/out", image,
             "python", "-m", "launcher.runtime", "run", "--recipe", f"/opt/launcher/recipes/{RECIPE}",
             "--code-source", "image", "--out", "/launcher/out", *([] if probes else ["--no-probes"]),
             "--params", json.dumps(params)]
    start = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=7200)
    wall = time.perf_counter() - start
    log = (out / "logs/train.log").read_text() if (out / "logs/train.log").is_file() else res.stderr
    if res.returncode != 0:
        raise SystemExit(f"run failed (exit {res.returncode}):\n{log[-3000:]}")
    recorded = (out / "probes/probes.json").is_file()
    if recorded != probes:
        raise SystemExit(f"{out}: probes {'missing' if probes else 'recorded with --no-probes'}:\n{log[-3000:]}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", required=True, help="the TensorFlow CPU image (ID or tag) built from this checkout")
    parser.add_argument("--epochs", type=int, help="shorter training than the recipe's default (90 epochs)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per side (the best time counts)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    params: dict[str, object] = {} if args.epochs is None else {"epochs": args.epochs}
    env = profile_env("deterministic", args.seed)
    walls: dict[str, list[float]] = {s: [] for s in SIDES}
    with tempfile.TemporaryDirectory(prefix="launcher-bench-probes-") as tmp:
        for i in range(args.repeat):
            for side in SIDES if i % 2 == 0 else SIDES[::-1]:
                walls[side].append(run_once(args.image, env, Path(tmp) / f"{side}-{i}", params, side == "probes"))
                print(f"  {side:<7} run {i + 1}: wall {walls[side][-1]:.1f} s", file=sys.stderr, flush=True)
        a, b = Path(tmp) / "probes-0", Path(tmp) / "off-0"
        identical = all((a / rel).read_bytes() == (b / rel).read_bytes() for rel in IDENTITY)
        probes_doc = json.loads((a / "probes/probes.json").read_text())
    best = {s: min(walls[s]) for s in SIDES}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average at the end: {load:.2f} (other work on the machine makes single runs noisy)")
    size = f"{args.epochs} epochs (--epochs)" if args.epochs else "its default size (90 epochs)"
    print(f"{RECIPE} at {size}, synthetic data, seed {args.seed}, profile deterministic, best of {args.repeat} "
          f"(this machine has {os.cpu_count()} cores); probe set: {probes_doc.get('count')} images, Grad-CAM at "
          f"{(probes_doc.get('gradcam') or {}).get('layer')}")
    print(f"{'side':<22}{'wall s':>9}  runs")
    for side in SIDES:
        name = "default probes" if side == "probes" else "--probes off"
        print(f"{name:<22}{best[side]:>9.1f}  " + ", ".join(f"{w:.1f}" for w in walls[side]))
    print(f"training bit-identical with and without probes: {identical}")
    print(f"with / without probes = {best['probes'] / best['off']:.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
