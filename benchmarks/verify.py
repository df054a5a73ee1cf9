"""Benchmarks for `launcher verify`.

1. Verifying two runs holding 1 GB of artifacts in all, as a ratio of `sha256sum` over the same
   files measured in the same process (target <= 1.2). Both read from the page cache: the
   files are read once before timing.
2. A deep diff of a 25M-parameter model, target <= 3 s, also printed as a ratio of `sha256sum` over
   the two model files: every element of its big layer differing (the slow path), then one row in
   seven of a 5000 x 5000 matrix (differences scattered over every slice).
3. Verifying two runs that each hold a 25M-parameter Keras 3 `.keras` full-model save, saved at
   different times (other zip dates and `date_saved`, the same weights), so every array is
   compared by content: seconds (target <= 3 s) and the ratio to `sha256sum` over the same files.

Usage: python benchmarks/verify.py [--gib 1.0] [--params 25000000] [--repeat 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from runfactory import FakeRun, make_workspace, refresh_manifest, write_run

from launcher.runtime.fingerprints import canonical_json, canonical_npz_bytes, layers_document
from launcher.verify.modeldiff import diff_models
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def sha256sum(paths: list[Path]) -> None:
    subprocess.run(["sha256sum", *map(str, paths)], check=True, stdout=subprocess.DEVNULL)


def make_runs(root: Path, total_bytes: int) -> tuple[Workspace, list[Path]]:
    """Two identical runs, each with half of total_bytes in a canonical model and a native save."""
    ws = Workspace.at(make_workspace(root), root / "cache")
    per_run = total_bytes // 2
    rng = np.random.default_rng(0)
    n = per_run // 2 // 4
    layers = [("dense", [rng.standard_normal(n, dtype=np.float32)])]
    weights = canonical_npz_bytes(layers)
    digests = canonical_json(layers_document(layers)).encode()
    native = rng.integers(0, 256, per_run - len(weights), dtype=np.uint8).tobytes()
    files: list[Path] = []
    for i in range(2):
        d = write_run(ws.runs, FakeRun(run_id=f"bench-{i}", replicate=i))
        (d / "outputs/model/canonical.npz").write_bytes(weights)
        (d / "outputs/weights/layers.json").write_bytes(digests)  # the runtime's per-layer digests of them
        (d / "outputs/model/model.weights.h5").write_bytes(native)
        refresh_manifest(d)
        files += [p for p in (d / "outputs").rglob("*") if p.is_file()]
    return ws, files


def bench_verify(root: Path, gib: float, repeat: int) -> float:
    ws, files = make_runs(root / "ws", int(gib * (1 << 30)))
    size = sum(p.stat().st_size for p in files)
    sha256sum(files)  # warm the page cache for both
    ref = best_of(repeat, lambda: sha256sum(files))
    report = verify_checksums(ws)
    assert report.identical
    ours = best_of(repeat, lambda: verify_checksums(ws))
    ratio = ours / ref
    print(f"verify, 2 runs, {size / (1 << 30):.2f} GiB in {len(files)} files: {ours:.2f} s; "
          f"sha256sum: {ref:.2f} s; ratio {ratio:.2f} (target <= 1.2) {'OK' if ratio <= 1.2 else 'SLOW'}")
    return ratio


def bench_modeldiff(root: Path, params: int, repeat: int) -> float:
    """The slower of the two patterns, in seconds."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal(params - 1000, dtype=np.float32)
    head = rng.standard_normal(1000, dtype=np.float32)
    every = time_modeldiff(root, "all of one layer differ", repeat,
                           [("dense", [a]), ("out", [head])], [("dense", [a + np.float32(1e-3)]), ("out", [head])])
    side = int((params - 1000) ** 0.5)
    m = rng.standard_normal((side, side), dtype=np.float32)
    changed = m.copy()
    changed[::7] += np.float32(1e-3)
    rows = time_modeldiff(root, f"one row in 7 of a {side} x {side} matrix differs", repeat,
                          [("dense", [m]), ("out", [head])], [("dense", [changed]), ("out", [head])])
    return max(every, rows)


def time_modeldiff(root: Path, what: str, repeat: int, ref_layers: list[tuple[str, list[np.ndarray]]],
                   other_layers: list[tuple[str, list[np.ndarray]]]) -> float:
    pa, pb = root / "a.npz", root / "b.npz"
    pa.write_bytes(canonical_npz_bytes(ref_layers))
    pb.write_bytes(canonical_npz_bytes(other_layers))
    n = sum(x.size for _, arrays in ref_layers for x in arrays)
    sha256sum([pa, pb])
    ref = best_of(repeat, lambda: sha256sum([pa, pb]))
    diff = diff_models(pa, pb)
    assert diff.first_difference is not None and diff.first_difference.layer == "dense"
    ours = best_of(repeat, lambda: diff_models(pa, pb))
    print(f"deep model diff, {n / 1e6:.0f}M parameters ({what}): {ours:.2f} s "
          f"(target <= 3 s) {'OK' if ours <= 3 else 'SLOW'}; sha256sum of the two files: {ref:.2f} s; "
          f"ratio {ours / ref:.2f}")
    return ours


def keras_archive(layers: list[tuple[str, list[np.ndarray]]], when: tuple[int, ...], saved: str) -> bytes:
    """A .keras file as Keras 3 writes it: metadata.json, config.json, model.weights.h5 (needs h5py)."""
    import h5py

    h5 = io.BytesIO()
    with h5py.File(h5, "w") as f:
        for name, arrays in layers:
            for i, a in enumerate(arrays):
                f.create_dataset(f"layers/{name}/vars/{i}", data=a)
    config = {"class_name": "Sequential", "config": {"layers": [{"class_name": "Dense", "config": {"name": n}}
                                                                for n, _ in layers]}}
    members = {"metadata.json": json.dumps({"keras_version": "3.12.0", "date_saved": saved}).encode(),
               "config.json": json.dumps(config).encode(), "model.weights.h5": h5.getvalue()}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=when), data)
    return out.getvalue()


def bench_keras_content(root: Path, params: int, repeat: int) -> float:
    ws = Workspace.at(make_workspace(root / "kws"), root / "cache")
    rng = np.random.default_rng(2)
    hidden = (params - 1000) // 1000
    layers = [("dense", [rng.standard_normal((1000, hidden), dtype=np.float32), np.zeros(hidden, np.float32)]),
              ("dense_1", [rng.standard_normal((hidden, 1), dtype=np.float32),
                           np.zeros(1, np.float32)])]
    n = sum(a.size for _, arrays in layers for a in arrays)
    files: list[Path] = []
    for i in range(2):
        d = write_run(ws.runs, FakeRun(run_id=f"bench-keras-{i}", replicate=i))
        (d / "outputs/model.keras").write_bytes(
            keras_archive(layers, (2026, 11, 22, 10, 2 * i, 0), f"2026-11-22@10:0{2 * i}:00"))
        refresh_manifest(d)
        files += [p for p in (d / "outputs").rglob("*") if p.is_file()]
    sha256sum(files)
    ref = best_of(repeat, lambda: sha256sum(files))
    report = verify_checksums(ws)
    row = next(r for r in report.artifacts if r.path == "outputs/model.keras")
    assert report.identical and row.cells["bench-keras-1"]["status"] == "identical-content", report.summary_line()
    ours = best_of(repeat, lambda: verify_checksums(ws))
    print(f"verify, 2 runs each with a {n / 1e6:.0f}M-parameter .keras save compared by content: {ours:.2f} s "
          f"(target <= 3 s) {'OK' if ours <= 3 else 'SLOW'}; sha256sum of the same files: {ref:.2f} s; "
          f"ratio {ours / ref:.2f}")
    return ours


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="artifact bytes over both runs, in GiB")
    ap.add_argument("--params", type=int, default=25_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="launcher-bench-", dir=args.dir))
    try:
        ratio = bench_verify(root, args.gib, args.repeat)
        seconds = bench_modeldiff(root, args.params, args.repeat)
        keras_seconds = bench_keras_content(root, args.params, args.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ratio <= 1.2 and seconds <= 3 and keras_seconds <= 3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
