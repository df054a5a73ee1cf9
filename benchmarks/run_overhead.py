"""What `launcher run` costs over a plain `docker run` of the same image and script (target: at most 0.5 s more).

Two sides, each a whole command timed from its start to its exit, as a user waits for it:

  * docker:   `docker run --rm -v DIR:/w:ro IMAGE python /w/trivial.py`, where IMAGE is the
              workspace's TensorFlow CPU image and trivial.py is
              `import tensorflow as tf; print(tf.reduce_sum(tf.ones(3)))`, printing the time
              before and after that work (`bench-start T`, `bench-end T`);
  * launcher: `python -m launcher run DIR/trivial.py` in that workspace (the CLI starting, the
              image checked against the workspace, the code snapshot and launch record, the
              container started detached, its log followed, the runtime seeding TensorFlow and
              recording fingerprints around the script, the outputs pulled and hashed, the
              manifest written, the container removed).

The sides run in rotating order (docker first, then launcher first, ...), so a slow spell of the
machine does not land on one side only, after one untimed run of each (the image's files in the
page cache). The script's own work (TensorFlow's import above all) is the same on both sides but
moves by a second from run to run here, more than the difference measured; so each run's time
outside it (the whole command less the span between the two marks: the CLI, docker, the runtime's
interpreters, TensorFlow's teardown, the pull) is the measure. Prints each side's best and median
whole time and its median time outside the script; the overhead is the difference of the latter,
checked against 0.5 s. (Before this measure, the best whole times were compared: a lucky container
run on one side moved that by half a second.)

    python benchmarks/run_overhead.py [--workspace DIR] [--repeat 7]

Without --workspace it makes a scratch copy of this repository's workspace pinned to a base
bootstrapped into the local registry (started if needed) and builds its cpu image (minutes the
first time, less with the layers cached). With --workspace, the cpu image is built there first if
it is missing or out of date, and each launcher run adds a run directory under its runs/.

Measured on this machine (2 cores, shared with other work), `--workspace` with the image built, load 0.9-1.5:
  this state:      docker 0.97 s, launcher 1.32 s outside the script (medians of 7): +0.35 s; again +0.41 s
  the state before (c30d746), on its own image minutes apart: docker 1.01 s, launcher 1.54 s: +0.53 s
  (under load 1-2 the same state measured +0.82 s; when issue 26 set the target, whole commands: about +1.8 s)
  Typer's internals behind launcher/cli/typercompat.py, no atexit._run_exitfuncs (load 2.2-3.0): this state
  +0.99 s, the state before +0.77 s and +0.27 s (docker's side alone moved 1.47 s -> 3.01 s between runs: too
  noisy to tell them apart); the CLI alone (start to refusal of a missing recipe, 25 alternating runs each)
  0.243 s against 0.253 s before, a paired median of -5 ms.
Within 0.5 s. Where the time went, by timestamps on each subprocess and in the container:
  * before the container: the CLI's start to `docker run -d` 0.52 s -> 0.23-0.37 s. The local host makes
    folders, reads free space, ownership and its fact sheet in process (mkdir, df, id and facts.sh were
    subprocesses); the image is inspected once (the check's JSON serves the ship) and while git lists the
    code; git is asked once per folder; a run imports neither the other commands' modules, nor docker-py,
    pydantic, the lock's and the project layer's machinery, nor rich before its container has started;
    what collecting the run needs (manifest, pull) is imported on a thread while the container runs.
  * in the container: the runtime's two interpreters reach the script's first line in ~0.10 s instead of
    ~0.17 s (quiet; 0.16 s instead of 0.38 s under load): NumPy is seeded by the import watch when the code
    imports it instead of being imported for every script, and each interpreter imports only what a plain
    run needs (no tomllib, platform, dataclasses, hashlib, zipfile, shutil, regexes compiled at first use).
  * after the container ends: one `docker inspect`, the pull, the manifest, `docker rm`: about as long as
    plain `docker run --rm` takes to remove its container and return.
What remains is mostly fixed cost: Python and typer at the CLI's start (~0.15 s), the runtime's parent and
child interpreters (the parent keeps a crashing script's exit code and log), `docker logs --follow` started
after `docker run -d` returns.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the script says when its own work starts and ends (the container shares the host's clock): that span, TensorFlow's
# import above all, is the same work on both sides and varies by a second from run to run here, so each side's
# time is also reported without it
SCRIPT = ("import time\nprint('bench-start', time.time(), flush=True)\nimport tensorflow as tf\n"
          "print(tf.reduce_sum(tf.ones(3)))\nprint('bench-end', time.time(), flush=True)\n")
MARK = re.compile(r"^bench-(start|end) ([0-9.]+)$", re.M)
TARGET_S = 0.5
SIDES = ("docker", "launcher")


def scratch_workspace(root: Path) -> Path:
    from launcher.images import pins as images
    from launcher.images import registry
    from launcher.images.bootstrap import bootstrap
    from launcher.scaffold import init_workspace
    from launcher.workspace import Workspace, default_cache_dir

    init_workspace(root, from_workspace=Workspace.at(REPO))
    ws = Workspace.at(root)
    registry.start_local_registry(default_cache_dir() / "registry")
    ref = bootstrap(default_cache_dir(), registry_address=registry.DEFAULT_LOCAL).ref
    lock = images.load(ws)
    for v in list(lock.pins):
        lock.pins[v] = images.BasePin(v, ref, python="3.11", source="bootstrap")
    images.save(ws, lock)
    return root


def launcher_argv(ws: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", "--workspace", str(ws), *args]


def cpu_image(ws: Path) -> str:
    """The workspace's cpu image, built first (by `launcher build`) when missing or out of date."""
    from launcher.images import buildrecord
    from launcher.workspace import Workspace

    built = subprocess.run(launcher_argv(ws, "build", "--variant", "cpu"), capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(f"launcher build --variant cpu failed (exit {built.returncode}):\n{built.stdout[-2000:]}"
                         f"{built.stderr[-2000:]}")
    record = buildrecord.read_record(Workspace.at(ws), "cpu")
    if record is None:
        raise SystemExit(f"{ws}: no cpu build record after `launcher build`")
    return record.image_id


# launcher's bytecode cached, as where it is installed: PYTHONDONTWRITEBYTECODE (set in some sandboxes and CI) would
# have every run compile its ~80 modules again (about 0.3 s more)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(argv: list[str], expect: str) -> tuple[float, float]:
    """The command's wall time, and the span of the script's own work within it."""
    start = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=ENV)
    wall = time.perf_counter() - start
    if res.returncode != 0 or expect not in res.stdout:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed (exit {res.returncode}):\n"
                         f"{res.stdout[-2000:]}{res.stderr[-2000:]}")
    marks = {m.group(1): float(m.group(2)) for m in MARK.finditer(res.stdout)}
    if set(marks) != {"start", "end"}:
        raise SystemExit(f"{' '.join(argv[:6])} ...: the script's start and end marks are missing from its output")
    return wall, marks["end"] - marks["start"]


def median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, help="a workspace whose cpu image is built (default: a scratch one)")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="launcher-bench-overhead-") as tmp:
        ws = args.workspace.resolve() if args.workspace else scratch_workspace(Path(tmp) / "ws")
        image = cpu_image(ws)
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "trivial.py").write_text(SCRIPT)
        expect = "tf.Tensor(3.0, shape=(), dtype=float32)"
        argv = {
            "docker": ["docker", "run", "--rm", "-v", f"{project}:/w:ro", image, "python", "/w/trivial.py"],
            "launcher": launcher_argv(ws, "run", str(project / "trivial.py")),
        }
        for side in SIDES:  # untimed: the image's files read once, the CLI's bytecode written
            timed(argv[side], expect)
        walls: dict[str, list[float]] = {s: [] for s in SIDES}
        outside: dict[str, list[float]] = {s: [] for s in SIDES}  # each wall time less the script's own span
        for i in range(args.repeat):
            order = SIDES[i % 2:] + SIDES[:i % 2]
            for side in order:
                wall, span = timed(argv[side], expect)
                walls[side].append(wall)
                outside[side].append(wall - span)
                print(f"  {side:<8} run {i + 1}: {wall:.2f} s, {wall - span:.2f} s outside the script",
                      file=sys.stderr, flush=True)
    report(image, args.repeat, walls, outside)
    return 0


def report(image: str, repeat: int, walls: dict[str, list[float]], outside: dict[str, list[float]]) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average at the end: {load:.2f} (other work on the machine makes single runs noisy)")
    print(f"trivial TensorFlow script, image {image[7:19]}, {repeat} runs per side in rotating order "
          f"(this machine has {os.cpu_count()} cores)")
    print(f"{'side':<20}{'best s':>8}{'median s':>10}{'outside the script: median s':>31}  runs")
    labels = {"docker": "docker run --rm", "launcher": "launcher run"}
    for side in SIDES:
        print(f"{labels[side]:<20}{min(walls[side]):>8.2f}{median(walls[side]):>10.2f}{median(outside[side]):>31.2f}  "
              + ", ".join(f"{w:.2f}" for w in walls[side]))
    whole = median(walls["launcher"]) - median(walls["docker"])
    net = median(outside["launcher"]) - median(outside["docker"])
    print(f"launcher - docker: {whole:+.2f} s of whole commands (medians; the script's own time varies by a second "
          f"between runs here), {net:+.2f} s outside the script's own work (the same work on both sides)")
    print(f"overhead {net:+.2f} s (target <= {TARGET_S} s): " + ("within" if net <= TARGET_S else "NOT within"))


if __name__ == "__main__":
    sys.exit(main())
