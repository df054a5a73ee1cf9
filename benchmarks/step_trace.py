"""What step fingerprints cost: mnist_convnet with the default trace (a digest of the weights at step 0
and each epoch's end) and with `--trace-every 1` (every optimizer step), against `--trace-every off`.

The three sides run with the same seed under the default `deterministic` profile, in rotating order
(off first, then default first, ...), so a slow spell of the machine does not land on one side only.
The time counted is the container's wall time (`docker run` to its exit: TensorFlow starting,
training, saving), best of --repeat per side, so the ratios include the start-up every run pays
anyway; `training` also prints the seconds between the first and the last line of the training log
that Keras writes per epoch. Prints each side / off (target for the default: <= 1.02) and whether
training was bit-identical on every side (reading the weights must not disturb it).

Runs are started as launcher starts them: the runtime in the TensorFlow CPU image (`--image`, built
from this checkout), the trace setting passed as LAUNCHER_TRACE_EVERY, as `launcher run
--trace-every` passes it.

Usage: python benchmarks/step_trace.py --image IMAGE [--epochs 12] [--repeat 2] [--seed 1]
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

RECIPE = "mnist_convnet"
IDENTITY = ("model/canonical.npz", "fingerprints/batches.jsonl", "metrics.jsonl", "weights/layers.json")
SIDES = {"off": "off", "default": "epoch", "every step": "1"}


def run_once(image: str, env: dict[str, str], out: Path, params: dict[str, object], trace: str) -> float:
    out.mkdir(parents=True)
    os.chmod(out, 0o777)
    argv = ["docker", "run", "--rm", "--label", "org.launcher.benchmark=step_trace"]
    for key, value in {**env, "LAUNCHER_TRACE_EVERY": trace}.items():
        argv += ["-e", f"{key}={value}"]
    argv += ["-e", f"LAUNCHER_OWNER={os.getuid()}:{os.getgid()}", "-v", f"{out}:/launcher/out", image,
             "python", "-m", "launcher.runtime", "run", "--recipe", f"/opt/launcher/recipes/{RECIPE}",
             "--code-source", "image", "--out", "/launcher/out", "--params", json.dumps(params)]
    start = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=7200)
    wall = time.perf_counter() - start
    log = (out / "logs/train.log").read_text() if (out / "logs/train.log").is_file() else res.stderr
    if res.returncode != 0:
        raise SystemExit(f"run failed (exit {res.returncode}):\n{log[-3000:]}")
    traced = (out / "fingerprints/steps.jsonl").is_file()
    if traced != (trace != "off"):
        raise SystemExit(f"{out}: steps.jsonl {'missing' if trace != 'off' else 'written with off'}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", required=True, help="the TensorFlow CPU image (ID or tag) built from this checkout")
    parser.add_argument("--epochs", type=int, default=12, help="epochs of training (the recipe's default: 12)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per side (the best time counts)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    params: dict[str, object] = {"epochs": args.epochs}
    env = profile_env("deterministic", args.seed)
    names = list(SIDES)
    walls: dict[str, list[float]] = {s: [] for s in names}
    with tempfile.TemporaryDirectory(prefix="launcher-bench-steps-") as tmp:
        for i in range(args.repeat):
            order = names[i % len(names):] + names[:i % len(names)]
            for side in order:
                out = Path(tmp) / f"{side.replace(' ', '-')}-{i}"
                walls[side].append(run_once(args.image, env, out, params, SIDES[side]))
                print(f"  {side:<11} run {i + 1}: wall {walls[side][-1]:.1f} s", file=sys.stderr, flush=True)
        first = {side: Path(tmp) / f"{side.replace(' ', '-')}-0" for side in names}
        identical = all((first["off"] / rel).read_bytes() == (first[s] / rel).read_bytes()
                        for s in names for rel in IDENTITY)
        rows = {s: len((first[s] / "fingerprints/steps.jsonl").read_text().splitlines())
                for s in names if s != "off"}
    best = {s: min(walls[s]) for s in names}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average at the end: {load:.2f} (other work on the machine makes single runs noisy)")
    print(f"{RECIPE}, {args.epochs} epochs, digits data, seed {args.seed}, profile deterministic, best of "
          f"{args.repeat} (this machine has {os.cpu_count()} cores)")
    print(f"{'side':<24}{'wall s':>9}{'rows':>7}  runs")
    for side in names:
        label = {"off": "--trace-every off", "default": "default (epoch)", "every step": "--trace-every 1"}[side]
        print(f"{label:<24}{best[side]:>9.1f}{rows.get(side, 0):>7}  " + ", ".join(f"{w:.1f}" for w in walls[side]))
    print(f"training bit-identical on every side: {identical}")
    print(f"default / off = {best['default'] / best['off']:.3f} (target <= 1.02)")
    print(f"--trace-every 1 / off = {best['every step'] / best['off']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
