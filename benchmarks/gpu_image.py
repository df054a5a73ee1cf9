"""A GPU image for real, where it can be checked without a GPU (issue 11, item 5; issue 13, item 4).

Builds a GPU variant of this project (`launcher init --from .`, then `launcher build --variant gpu`, or
`--variant torch-gpu`) on this machine, then checks inside the image, with no GPU present:
- `pip freeze` equals lockfiles/VARIANT.txt, package for package and version for version;
- the framework is a CUDA build: TensorFlow's tf.sysconfig.get_build_info() (or PyTorch's
  torch.version.cuda and torch.backends.cudnn.version()) names its CUDA and cuDNN versions, and the
  CUDA libraries it was built against are in the image (the nvidia-* wheels of the lock);
and that a GPU run against a host without a usable GPU is refused with NO_GPU (exit 23) before
anything is shipped (the local engine here has no NVIDIA runtime).

It prints the build time (the CPU image is built first, in the same workspace, so the base and
the shared wheels are in place; with the cache warm that build is a no-op), the image size, and
each check; the issue sets no time target for this build. The image is several GB (the CUDA
wheels alone are about 3 GB): unless --keep, the script removes the image and its cached layers.

Usage: python benchmarks/gpu_image.py [--variant gpu|torch-gpu] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# the launcher installed beside the Python that runs this script (a virtualenv's bin/), else the one on PATH
LAUNCHER = str(Path(sys.executable).with_name("launcher")) if Path(sys.executable).with_name("launcher").is_file() \
    else (shutil.which("launcher") or "launcher")

FREEZE = """
import importlib.metadata as md
freeze = sorted(f"{d.metadata['Name'].lower().replace('_', '-')}=={d.version}" for d in md.distributions())
"""
PROBES = {
    "gpu": FREEZE + """
import json
import tensorflow as tf
info = tf.sysconfig.get_build_info()
print(json.dumps({"framework": "TensorFlow " + tf.__version__, "cuda_build": tf.test.is_built_with_cuda(),
                  "cuda_version": info.get("cuda_version"), "cudnn_version": info.get("cudnn_version"),
                  "gpus_seen": len(tf.config.list_physical_devices("GPU")), "freeze": freeze}))
""",
    "torch-gpu": FREEZE + """
import json
import torch
print(json.dumps({"framework": "PyTorch " + torch.__version__, "cuda_build": torch.version.cuda is not None,
                  "cuda_version": torch.version.cuda, "cudnn_version": torch.backends.cudnn.version(),
                  "gpus_seen": torch.cuda.device_count(), "freeze": freeze}))
""",
}
RECIPE = {"gpu": "mnist_convnet", "torch-gpu": "mnist_torch"}


def launcher(ws: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run([LAUNCHER, "-w", str(ws), *args], capture_output=True, text=True, check=False)
    if check and cp.returncode != 0:
        raise SystemExit(f"launcher {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}{cp.stderr}")
    return cp


def locked(lockfile: Path) -> list[str]:
    out = []
    for line in lockfile.read_text().splitlines():
        if "==" in line and not line.startswith((" ", "#")):
            name, version = line.split(" ")[0].split("==")
            out.append(f"{name.lower().replace('_', '-')}=={version}")
    return sorted(out)


def image_of(ws: Path, variant: str) -> str:
    sys.path.insert(0, str(REPO))
    from launcher.specs.runspec import image_record
    from launcher.workspace import Workspace

    return str(image_record(Workspace.at(ws), variant)["id"])


def gpu_images(variant: str) -> list[str]:
    label = f"label=org.launcher.variant={variant}"
    return subprocess.run(["docker", "images", "-q", "--no-trunc", "--filter", label],
                          capture_output=True, text=True, check=False).stdout.split()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=sorted(PROBES), default="gpu", help="the GPU variant to build")
    ap.add_argument("--keep", action="store_true", help="keep the GPU image and its cached layers")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="launcher-gpu-image-"))
    variant = args.variant
    before = set(gpu_images(variant))
    ws = work / "ws"
    out: dict[str, Any] = {}
    try:
        launcher(REPO, "init", str(ws), "--from", str(REPO))
        launcher(ws, "base", "bootstrap", "--start-registry")
        t = time.perf_counter()
        launcher(ws, "build", "--variant", "cpu")
        out["cpu_build_s"] = time.perf_counter() - t  # with the shared cache warm, as in CI
        t = time.perf_counter()
        launcher(ws, "build", "--variant", variant)
        out["gpu_build_s"] = time.perf_counter() - t
        image_id = image_of(ws, variant)
        size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", image_id], capture_output=True,
                              text=True, check=True).stdout.strip()
        out["gpu_image"] = image_id
        out["gpu_image_bytes"] = int(size)
        probe = subprocess.run(["docker", "run", "--rm", "--network", "none", image_id, "python", "-c",
                                PROBES[variant]], capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            raise SystemExit(f"the probe failed in the GPU image:\n{probe.stderr[-3000:]}")
        facts = json.loads(probe.stdout.strip().splitlines()[-1])
        want = locked(ws / "lockfiles" / f"{variant}.txt")
        have = [p for p in facts.pop("freeze") if not p.startswith(("pip==", "setuptools==", "wheel=="))
                or p in want]
        out.update(facts)
        out["freeze_equals_lock"] = have == want
        out["freeze_missing"] = sorted(set(want) - set(have))
        out["freeze_extra"] = sorted(set(have) - set(want))
        refused = launcher(ws, "run", RECIPE[variant], "--variant", variant, "--param", "epochs=1", check=False)
        out["no_gpu_exit"] = refused.returncode
        out["no_gpu_message"] = (refused.stdout + refused.stderr).strip().splitlines()[-1:]
        out["shipped_anything"] = any((ws / "runs").glob("*/launch.json")) if (ws / "runs").is_dir() else False
    finally:
        if not args.keep:
            made = sorted(set(gpu_images(variant)) - before)  # the image and its environment image, both labelled
            if made:
                subprocess.run(["docker", "rmi", "-f", *made], capture_output=True, check=False)
            launcher(ws, "cache", "prune", check=False) if ws.is_dir() else None
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    ok = {True: "ok", False: "FAILED"}
    print(f"launcher build --variant {variant}: {out['gpu_build_s']:.0f} s, "
          f"image {out['gpu_image_bytes'] / 1e9:.2f} GB (the CPU build before it: {out['cpu_build_s']:.0f} s)")
    differs = "" if out["freeze_equals_lock"] else f" (missing {out['freeze_missing']}, extra {out['freeze_extra']})"
    print(f"pip freeze in the image equals lockfiles/{variant}.txt: {ok[out['freeze_equals_lock']]}{differs}")
    cuda = bool(out["cuda_build"] and out["cuda_version"] and out["cudnn_version"])
    print(f"{out['framework']} is a CUDA build: {ok[cuda]} (CUDA {out['cuda_version']}, cuDNN "
          f"{out['cudnn_version']}; GPUs seen here: {out['gpus_seen']})")
    refused_ok = out["no_gpu_exit"] == 23 and not out["shipped_anything"]
    print(f"a GPU run on this GPU-less engine is refused with NO_GPU (23) before anything is shipped: "
          f"{ok[refused_ok]} (exit {out['no_gpu_exit']}: {' '.join(out['no_gpu_message'])})")
    sys.exit(0 if out["freeze_equals_lock"] and cuda and refused_ok else 1)


if __name__ == "__main__":
    main()
