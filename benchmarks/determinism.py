"""What determinism costs: mnist_convnet under the `off`, default (`deterministic`) and `strict`
profiles, each run twice.

Prints each profile's training time (the recipe's own "Elapsed Time", fit + evaluate) as a ratio
of `off` measured in the same invocation (target: default <= 1.10; the seeds paid 3.75 for
single-threaded determinism), the container's wall time, and whether the profile's two runs were
bit-identical (canonical weights, batch order, metrics).

Runs are started as launcher starts them: in the TensorFlow CPU image (`--image`), or with a
TensorFlow interpreter on this host (`--python`), the runtime applying each profile.

Usage: python benchmarks/determinism.py (--image IMAGE | --python PYTHON) [--epochs 3]
       [--train-samples 0] [--repeat 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.determinism import default_threads, profile_env

REPO = Path(__file__).resolve().parent.parent
PROFILES = ("off", "deterministic", "strict")
IDENTITY = ("model/canonical.npz", "fingerprints/batches.jsonl", "metrics.jsonl", "weights/layers.json")
ELAPSED = re.compile(r"^Elapsed Time: ([0-9.]+)", re.MULTILINE)


def run_once(args: argparse.Namespace, env: dict[str, str], out: Path, params: dict[str, object]) -> float:
    out.mkdir(parents=True)
    if args.image:
        argv = ["docker", "run", "--rm"]
        for key, value in env.items():
            argv += ["-e", f"{key}={value}"]
        argv += ["-v", f"{out}:/launcher/out", args.image, "python", "-m", "launcher.runtime", "run",
                 "--recipe", "/opt/launcher/recipes/mnist_convnet", "--out", "/launcher/out",
                 "--params", json.dumps(params)]
        full_env = None
    else:
        argv = [args.python, "-m", "launcher.runtime", "run", "--recipe", str(REPO / "recipes/mnist_convnet"),
                "--out", str(out), "--params", json.dumps(params)]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "TF_"))}
        full_env.update(env)
        full_env["PYTHONPATH"] = str(REPO)
        full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    res = subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=3600)
    log = (out / "logs/train.log").read_text() if (out / "logs/train.log").is_file() else res.stderr
    if res.returncode != 0:
        raise SystemExit(f"run failed (exit {res.returncode}):\n{log[-3000:]}")
    m = ELAPSED.search(log)
    if m is None:
        raise SystemExit(f"no 'Elapsed Time' in the log:\n{log[-3000:]}")
    return float(m.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--image", help="the TensorFlow CPU image (ID or tag)")
    where.add_argument("--python", help="a Python with tensorflow and framework-reproducibility installed")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-samples", type=int, default=0, help="0 = all 1,500 built-in digits")
    parser.add_argument("--repeat", type=int, default=3, help="runs per profile (bit identity needs 2; "
                        "the best time counts, which damps other load on the machine)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    params = {"epochs": args.epochs, "train_samples": args.train_samples}
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="launcher-bench-") as tmp:
        # interleaved, so a slow spell of the machine does not land on one profile only
        times: dict[str, list[float]] = {p: [] for p in PROFILES}
        walls: dict[str, list[float]] = {p: [] for p in PROFILES}
        for i in range(args.repeat):
            for profile in PROFILES:
                env = profile_env(profile, args.seed)
                start = time.perf_counter()
                times[profile].append(run_once(args, env, Path(tmp) / f"{profile}-{i}", params))
                walls[profile].append(time.perf_counter() - start)
                print(f"  {profile:<13} run {i + 1}: training {times[profile][-1]:.2f} s, "
                      f"wall {walls[profile][-1]:.2f} s", file=sys.stderr, flush=True)
        for profile in PROFILES:
            outs = [Path(tmp) / f"{profile}-{i}" for i in range(args.repeat)]
            identical = args.repeat > 1 and all(
                (outs[0] / rel).read_bytes() == (o / rel).read_bytes() for o in outs[1:] for rel in IDENTITY)
            results[profile] = {"train_s": min(times[profile]), "wall_s": min(walls[profile]),
                                "identical": identical}
    off = results["off"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average at the end: {load:.2f} (other work on the machine makes single runs noisy)")
    print(f"mnist_convnet, {args.epochs} epochs, built-in digits, seed {args.seed}, best of {args.repeat} "
          f"(default threads {default_threads()}, this machine has {os.cpu_count()} cores)")
    print(f"{'profile':<14}{'training s':>11}{'ratio':>8}{'wall s':>9}{'ratio':>8}  bit-identical over "
          f"{args.repeat} runs")
    for profile in PROFILES:
        r = results[profile]
        name = "default" if profile == "deterministic" else profile
        print(f"{name:<14}{r['train_s']:>11.2f}{r['train_s'] / off['train_s']:>8.2f}"  # type: ignore[operator]
              f"{r['wall_s']:>9.2f}{r['wall_s'] / off['wall_s']:>8.2f}  {r['identical']}")  # type: ignore[operator]
    ratio = results["deterministic"]["train_s"] / off["train_s"]  # type: ignore[operator]
    print(f"default / off = {ratio:.2f} (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
