"""What going through Slurm costs per replicate: a real two-node test cluster (tests/slurmcluster.py).

In the same run, 8 replicates of the tiny recipe (a few outputs, `--param sleep=S`):
- reference: `launcher run tiny --runs 8` directly on one host (the login node's own Docker engine),
  one replicate after the other;
- cluster: `launcher run tiny --runs 8 --scheduler slurm --slurm-opt exclusive` through the login node:
  one job array that Slurm spreads over the nodes, one replicate per node at a time.
Both ship the image first in an untimed warm-up, so neither pays for a first transfer.

The overhead per replicate is the node time a replicate costs through Slurm minus its time when run
directly: (cluster wall time x nodes used) / 8 - (direct wall time) / 8, in seconds (target <= 2 s).
Usage: python benchmarks/cluster.py [--runs 8] [--sleep 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))


def _cli(ws: Path, *args: str) -> None:
    from typer.testing import CliRunner

    from launcher.cli import app

    res = CliRunner().invoke(app, ["--workspace", str(ws), "--quiet", *args])
    if res.exit_code != 0:
        raise SystemExit(f"launcher {' '.join(args)} failed ({res.exit_code}): {res.output[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--sleep", type=float, default=2.0, help="seconds each replicate's recipe sleeps")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from conftest_testhost import make_workspace  # the tiny recipes' workspace, built as `launcher build` does
    from slurmcluster import start_cluster

    from launcher.images import registry
    from launcher.images.bootstrap import bootstrap
    from launcher.workspace import default_cache_dir

    tmp = Path(tempfile.mkdtemp(prefix="launcher-bench-cluster-"))
    cluster = start_cluster(tmp / "cluster")
    try:
        registry.start_local_registry(default_cache_dir() / "registry", registry.DEFAULT_LOCAL)
        base = bootstrap(default_cache_dir(), registry_address=registry.DEFAULT_LOCAL).ref
        ws = make_workspace(tmp / "ws", {"base": base})
        on = ["--host", cluster.login.alias, "--ssh-config", str(cluster.login.ssh_config)]
        params = ["--param", f"sleep={args.sleep}"]
        _cli(ws, "run", "tiny", *on, *params)  # warm-up: the image reaches the login node's engine
        _cli(ws, "run", "tiny", *on, "--scheduler", "slurm", "--slurm-opt", "exclusive", *params)  # and the cluster
        t0 = time.perf_counter()
        _cli(ws, "run", "tiny", *on, "--runs", str(args.runs), *params)
        direct = time.perf_counter() - t0
        before = {p.name for p in (ws / "runs").iterdir()}
        t0 = time.perf_counter()
        _cli(ws, "run", "tiny", *on, "--scheduler", "slurm", "--slurm-opt", "exclusive", "--runs", str(args.runs),
             *params)
        slurm = time.perf_counter() - t0
        nodes = set()
        for d in (ws / "runs").iterdir():
            if d.name not in before:
                nodes.add(json.loads((d / "manifest.json").read_text())["placement"]["node"])
        overhead = slurm * len(nodes) / args.runs - direct / args.runs
        out: dict[str, Any] = {
            "replicates": args.runs, "direct_s": round(direct, 2), "slurm_s": round(slurm, 2),
            "nodes_used": len(nodes), "slurm_to_direct_wall_ratio": round(slurm / direct, 3),
            "overhead_per_replicate_s": round(overhead, 2), "target_overhead_s": 2.0,
        }
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{args.runs} replicates: direct on one host {direct:.1f} s; through Slurm {slurm:.1f} s on "
          f"{len(nodes)} nodes (wall ratio {slurm / direct:.2f})")
    print(f"overhead per replicate through Slurm: {overhead:+.2f} node-seconds (target <= 2 s): "
          + ("OK" if overhead <= 2.0 else "OVER TARGET"))


if __name__ == "__main__":
    main()
