"""A group of replicates once it ran: the first one that failed (what its error shows, and what was
not run because of it), and whether the runs' seeds were really launcher's.

A replicate that fails inside its container (exit code other than 0) stops its command: the
replicates not yet started are not started (``run --runs N``, ``experiment``), and on a target that
starts a group at once (a Slurm job array) the others are cancelled. Repeating a script that died on
an import error N times tells nothing more and costs N times as much.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, TypeGuard

from launcher.errors import LauncherError
from launcher.records.records import FAILED, ManifestData, RunRecord
from launcher.records.rundir import OUTPUTS, TRAIN_LOG, RunDir
from launcher.workspace import Workspace

if TYPE_CHECKING:
    from launcher.targets.placement import Placement

TAIL_LINES = 10


class FailureRecord(TypedDict):
    """A Failure in a command's JSON answer (``failure``)."""

    run_id: str
    group: str
    replicate: int
    exit_code: int | None
    log_tail: list[str]
    not_started: int
    cancelled: list[str]
    rank: int | None  # a run of several processes: the rank that failed first, and its node
    node: int | None
    log: str  # the failed log's path under the run folder


@dataclass(frozen=True)
class Failure:
    """The first replicate of a command that failed, and what that stopped."""

    run_id: str
    group: str
    replicate: int
    exit_code: int | None
    log_tail: list[str]
    not_started: int = 0  # later replicates not started because of it
    cancelled: list[str] = field(default_factory=list)  # replicates already going, stopped because of it
    rank: int | None = None  # a run of several processes: the rank that failed first (its log is log_tail's)
    node: int | None = None
    log: str = f"{OUTPUTS}/{TRAIN_LOG}"  # under the run's folder

    def line(self) -> str:
        what = f"replicate #{self.replicate} (run {self.run_id}) failed with exit {self.exit_code}"
        if self.rank is not None:
            what += f" (rank {self.rank} on node {self.node} failed first; the other ranks were stopped)"
        rest = []
        if self.not_started:
            rest.append(f"{self.not_started} later replicate{'s' if self.not_started != 1 else ''} not started")
        if self.cancelled:
            rest.append(f"{len(self.cancelled)} replicate{'s' if len(self.cancelled) != 1 else ''} already going "
                        "cancelled")
        return what + (f"; {', '.join(rest)}" if rest else "")

    def to_dict(self) -> FailureRecord:
        return {"run_id": self.run_id, "group": self.group, "replicate": self.replicate, "exit_code": self.exit_code,
                "log_tail": list(self.log_tail), "not_started": self.not_started, "cancelled": list(self.cancelled),
                "rank": self.rank, "node": self.node, "log": self.log}


def is_failed(run: RunRecord) -> TypeGuard[ManifestData]:
    """Whether the run ended and failed (only a manifest says so)."""
    return dict(run).get("status") == FAILED


def log_tail(ws: Workspace, run_id: str, placement: Placement | None = None, n: int = TAIL_LINES) -> list[str]:
    """The last n lines of a run's log: its pulled train.log, else what its placement still has
    (a Slurm task that never started its container logs only there)."""
    pulled = RunDir(ws.runs / run_id).train_log
    try:
        lines = pulled.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    if not lines and placement is not None:
        try:
            launch = RunDir(ws.runs / run_id).read_launch()
            lines = "".join(placement.logs(launch, follow=False)).splitlines()
        except (OSError, ValueError, LauncherError):
            lines = []
    return [line.rstrip() for line in lines[-n:]]


def failure_of(ws: Workspace, manifest: ManifestData, placement: Placement | None = None, *, not_started: int = 0,
               cancelled: Sequence[str] = ()) -> Failure:
    run_id = str(manifest["run_id"])
    code = manifest.get("exit_code")
    topology = manifest.get("topology")
    failed = topology.get("failed") if topology else None
    if failed:  # a run of several processes: the rank that failed first, with its own log
        return Failure(run_id, str(manifest.get("group", "")), int(manifest.get("replicate") or 0),
                       code if isinstance(code, int) else None, [line.rstrip() for line in failed["last_lines"]],
                       not_started, list(cancelled), rank=failed["rank"], node=failed["node"], log=failed["log"])
    return Failure(run_id, str(manifest.get("group", "")), int(manifest.get("replicate") or 0),
                   code if isinstance(code, int) else None, log_tail(ws, run_id, placement), not_started,
                   list(cancelled))


def seed_override_note(manifests: Iterable[RunRecord]) -> str | None:
    """A warning when runs meant to differ in seed seeded themselves (the runtime's ``seed_calls``): the
    script's own seed then overrides launcher's, and the "different seeds" are not different. A call
    that passes on the run's own seed (read from LAUNCHER_SEED) does not count."""
    runs = list(manifests)
    own: dict[str, list[str]] = {}
    for run in runs:
        m = dict(run)  # read by key: only a manifest has a runtime
        runtime = m.get("runtime")
        calls = runtime.get("seed_calls") if isinstance(runtime, dict) else None
        if not isinstance(calls, list):
            continue  # an older runtime did not say
        for c in calls:
            if isinstance(c, dict) and c.get("seed") != m.get("seed"):
                seed = c.get("seed")
                own.setdefault(str(m.get("run_id")), []).append(f"{c.get('api')}({'?' if seed is None else seed})")
    if not own:
        return None
    seen = sorted({call for calls in own.values() for call in calls})
    return (f"{len(own)} of {len(runs)} runs seed themselves ({', '.join(seen[:4])}"
            f"{', ...' if len(seen) > 4 else ''}): the script's own seed overrides launcher's, so these runs' "
            "seeds are not different; seed from the run's seed (int(os.environ['LAUNCHER_SEED'])) or drop the "
            "script's own seeding")


def inconsistency_notes(manifests: Iterable[RunRecord]) -> list[str]:
    """A warning per run of several processes whose data-parallel ranks held different weights at a recorded step
    (the manifest's ``topology.inconsistent``): one replica was not what the others were."""
    notes = []
    for run in manifests:
        m = dict(run)  # read by key: only a manifest has a completed topology
        topology = m.get("topology")
        found = topology.get("inconsistent") if isinstance(topology, dict) else None
        if isinstance(found, dict):
            notes.append(f"run {m.get('run_id')}: rank {found.get('rank')}'s weights differ from rank 0's at step "
                         f"{found.get('step')} (data-parallel replicas should hold the same weights after every step; "
                         f"`launcher verify` on its replicates compares every rank's)")
    return notes
