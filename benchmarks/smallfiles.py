"""Pulling many small files (image samples, per-step checkpoints, profiler traces) from a fresh SSH test
host (tests/testhost.py), against OpenSSH `scp -r` of the same folder in the same run.

Prints, with targets:
- 20,000 files of about 200 bytes (about 4 MB): launcher's verified pull as a ratio of `scp -r` (>= 0.8);
- files per second at 20,000 and at 100,000 files (`--big`): the time per file must not grow with the count.
Usage: python benchmarks/smallfiles.py [--files 20000] [--big 100000] [--json]
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
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

MAKE = ("import os, sys\n"
        "root, n = sys.argv[1], int(sys.argv[2])\n"
        "for i in range(n):\n"
        "    d = os.path.join(root, f'step{i // 1000:03d}')\n"
        "    os.makedirs(d, exist_ok=True)\n"
        "    with open(os.path.join(d, f'sample{i:06d}.json'), 'w') as f:\n"
        "        f.write(('{\"step\": %d, \"loss\": %.6f}' % (i, 1 / (i + 1))).ljust(200))\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--big", type=int, default=100000, help="a second, larger count (0: skip)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import testhost as th

    from launcher.hosts.ssh import SSHHost
    from launcher.transfers.pull import pull_outputs

    work = Path(tempfile.mkdtemp(prefix="launcher-bench-small-"))
    host = th.start_testhost(work / "host")
    out: dict[str, Any] = {}
    try:
        with SSHHost.connect(host.spec, identity=host.key, known_hosts=host.known_hosts,
                             ssh_config=Path("/dev/null")) as h:
            h.fast_ciphers = False
            scp_opts = h.openssh_options(scp=True)
        for n in [args.files, *([args.big] if args.big else [])]:
            remote = f"/root/small{n}"
            host.exec("python3", "-c", MAKE, remote, str(n), timeout=600)
            dest = work / f"scp{n}"
            t = time.perf_counter()
            subprocess.run(["scp", "-q", "-r", *scp_opts, f"{host.ip}:{remote}", str(dest)], check=True)
            scp_s = time.perf_counter() - t
            shutil.rmtree(dest)
            with SSHHost.connect(host.spec, identity=host.key, known_hosts=host.known_hosts,
                                 ssh_config=Path("/dev/null")) as h:
                t = time.perf_counter()
                res = pull_outputs(h, remote, work / f"pull{n}" / "outputs")
                pull_s = time.perf_counter() - t
            assert len(res.transferred) == n, (len(res.transferred), n)
            shutil.rmtree(work / f"pull{n}")
            out[str(n)] = {"files": n, "scp_s": round(scp_s, 2), "pull_s": round(pull_s, 2),
                           "ratio_vs_scp": round(scp_s / pull_s, 3), "files_per_s": round(n / pull_s)}
    finally:
        host.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for rec in out.values():
        print(f"{rec['files']} small files: launcher pull {rec['pull_s']:.1f} s ({rec['files_per_s']} files/s), "
              f"scp -r {rec['scp_s']:.1f} s: ratio {rec['ratio_vs_scp']:.2f}"
              + (" (target >= 0.8)" if rec["files"] == args.files else ""))
    if len(out) == 2:
        small, big = out.values()
        print(f"time per file at {big['files']} files / at {small['files']}: "
              f"{small['files_per_s'] / big['files_per_s']:.2f} (1.0 = linear)")


if __name__ == "__main__":
    main()
