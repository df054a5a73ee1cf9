"""A run's files against its own manifest: each re-hashed (concurrently), so a file damaged or changed
after the pull is caught as corrupt before anything is compared (launcher.verify.verdicts)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from launcher.errors import Corrupt
from launcher.hashing import sha256_file
from launcher.progress import NullReporter, Reporter
from launcher.records.manifest import Manifest

HASH_WORKERS = max(2, min(4, os.cpu_count() or 2))


def repull_hint(m: Manifest) -> str:
    return f"the file changed after the pull; re-pull the run (`launcher pull {m.run_id}`)"


# ---------------------------------------------------------------- integrity


@dataclass(frozen=True)
class IntegrityStats:
    files: int
    bytes: int


def check_integrity(manifests: Iterable[Manifest], reporter: Reporter | None = None,
                    workers: int = HASH_WORKERS) -> IntegrityStats:
    """Re-hash every artifact of every run against its manifest, files hashed concurrently."""
    jobs: list[tuple[Manifest, str, int, str]] = []
    for m in manifests:
        for art in m.artifacts:
            p = m.file(art.path)
            try:
                size = p.stat().st_size
            except FileNotFoundError:
                raise Corrupt(f"run {m.run_id}: {art.path} is in its manifest but not in the run directory",
                              f"re-pull the run (`launcher pull {m.run_id}`)") from None
            if size != art.size:
                raise Corrupt(f"run {m.run_id}: {art.path} is {size} bytes, its manifest says {art.size}",
                              repull_hint(m))
            jobs.append((m, art.path, art.size, art.sha256))
    total = sum(j[2] for j in jobs)
    task = (reporter or NullReporter()).task("checking files against their manifests", total=total, unit="B")

    def one(job: tuple[Manifest, str, int, str]) -> tuple[Manifest, str, str, str]:
        m, rel, size, want = job
        got = sha256_file(m.file(rel))
        task.advance(size)
        return m, rel, want, got

    # Largest first, so the pool is not left waiting on one big file at the end.
    ordered = sorted(jobs, key=lambda j: -j[2])
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        for m, rel, want, got in pool.map(one, ordered):
            if got != want:
                raise Corrupt(f"run {m.run_id}: {rel} does not match its manifest "
                              f"(sha256 {got[7:19]}…, recorded {want[7:19]}…)",
                              repull_hint(m))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on a mismatch, hash nothing more
        task.close()
    return IntegrityStats(files=len(jobs), bytes=total)
