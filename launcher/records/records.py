"""The JSON records of a run's folder (see :mod:`launcher.records.rundir`), as typed dictionaries.

Each class describes a JSON object on disk or inside one, key for key, so the bytes written stay
exactly what they were: ``runs/<id>/launch.json`` (:class:`LaunchRecord`), ``runs/<id>/manifest.json``
(:class:`ManifestData`), ``runs/<id>/.pulled.json`` (:class:`PulledFile` per path) and the parts
they share. Keys a reader treats as possibly absent (older records, or ones written only in some
cases) are ``NotRequired``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from launcher.hosts.base import HostDescription
from launcher.hosts.containerspec import SpecRecord
from launcher.records.ranks import TopologyRecord
from launcher.runtime.recipespec import ParamValue

if TYPE_CHECKING:
    from launcher.hosts.hostspec import HostRecord
    from launcher.hosts.provision import HostFacts, NoFacts
    from launcher.runtime.records import ProbeConfig, RuntimeDocument


class GitState(TypedDict, total=False):
    """A code folder's git state (launcher.specs.code.git_state): ``{}`` outside a git work tree."""

    commit: str
    dirty: bool


class ProjectRecord(TypedDict):
    """ImageRecord's ``project``: a plain script's project layer beside the variant's image
    (launcher.runs.project.image_for)."""

    folder: str
    requirements_lock_sha256: str | None
    system_lock_sha256: NotRequired[str | None]
    layer: str  # the layer's diff ID
    packages: list[str]  # name==version of each wheel in the layer
    system_packages: NotRequired[list[str]]
    variant_image_id: str  # the variant's image the layer sits on


class ImageRecord(TypedDict):
    """The image a run uses (launch.json's and manifest.json's ``image``), from the variant's build
    record (launcher.specs.runspec.image_record); the manifest adds what ran in the container."""

    id: str
    tag: str | None
    variant: str
    base_digest: str | None
    lock_sha256: str | None
    git_commit: str | None
    git_dirty: bool | None
    launcher_version: str
    recipes: NotRequired[dict[str, str]]  # recipe name -> baked code digest; dropped before launch.json
    project: NotRequired[ProjectRecord]  # a plain script's project layer
    runtime_digest: NotRequired[str | None]  # the manifest's: computed by the runtime in the container
    packages_digest: NotRequired[str | None]


# a run's status: how it ended (ManifestData.status, one of launcher.records.manifest.STATUSES), or that it goes on
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
RUNNING = "running"  # PullStatus.status

# the placement kind of runs on one host's Docker engine (DirectPlacement), and of launch records from
# before placements were recorded
DIRECT = "direct"

# CodePlan.source, LaunchRecipe.code_source, ManifestRecipe.code_source: where the code a run executes is
BAKED = "image"  # the recipe's copy baked into the image
MOUNTED = "mounted"  # a snapshot of a folder here, mounted read-only


class CodePlan(TypedDict):
    """What code a run executes and where the host has it (launcher.specs.runspec.plan_code;
    launch.json's ``code`` without its ``git``): baked in the image, or a snapshot to mount."""

    source: str  # BAKED | MOUNTED
    git: NotRequired[GitState]
    local: NotRequired[str]  # the snapshot here
    root: NotRequired[str]
    files: NotRequired[int]
    bytes: NotRequired[int]
    entry: NotRequired[str]
    digest: NotRequired[str]
    host_path: NotRequired[str]  # where the host mounts it from (Placement.send_code)
    sent: NotRequired[bool]


class LaunchRecipe(TypedDict):
    """The ``recipe`` of launch.json: what the host expected to run (the manifest records what ran)."""

    name: str
    framework: str
    entry: str
    script: bool
    code_source: str | None
    git: GitState
    args: list[str]
    volatile: list[str]
    expected_digest: str | None
    identity: NotRequired[str]  # a plain script's project/path (launcher.specs.identity)


class ProbesRecord(TypedDict):
    """The probe set of a run (launch.json's and manifest.json's ``probes``)."""

    source: str  # "option" | "recipe" | "none"
    option: NotRequired[str]  # --probes as given
    config: ProbeConfig | None  # ProbeSpec.as_dict(), owned by launcher.runtime.probespec


class TraceRecord(TypedDict):
    every: str  # "epoch", "off" or a step count


class CheckpointRecord(TypedDict):
    every: int
    keep: NotRequired[str]  # latest (the default) | all (--keep-checkpoints)


class DeterminismRecord(TypedDict):
    """The ``determinism`` of launch.json and manifest.json: the profile and the environment it set."""

    profile: str
    threads: int | None
    env: dict[str, str]


class EnvValue(TypedDict, total=False):
    """One --env value ({"value"}) or --secret-env value ({"hmac"}: keyed with the run's salt, which stays on
    the machine that ran it; {"sha256"} from an older launcher), as launcher.specs.userenv records it."""

    value: str
    hmac: str
    sha256: str


class DataSource(TypedDict):
    """Where a run's data came from: a folder on the host, or one sent from here (datasets.Placed)."""

    kind: str  # "host" | "sent"
    path: str
    local: NotRequired[str]
    digest: NotRequired[str]
    files: NotRequired[int]
    bytes: NotRequired[int]
    sent: NotRequired[bool]


class ShipRecord(TypedDict):
    """How the image reached the host (launcher.transfers.ship.ShipResult.to_dict)."""

    image_id: str
    skipped: bool
    bytes_sent: int
    layers_sent: int
    layers_skipped: int
    seconds: float


class Segment(TypedDict):
    """One container of a resumable run (``segments`` of launch.json and manifest.json)."""

    segment: int
    container: str | None
    resumed_from: str | None
    host: NotRequired[str]
    started_at: NotRequired[str | None]
    ended_at: NotRequired[str | None]
    exit_code: NotRequired[int | None]


class ImageSource(TypedDict):
    """Where a job array's tasks get the image (launch.json's ``placement.image_source``):
    a registry, pulled by digest, or the archive on the shared filesystem."""

    kind: str  # launcher.targets.slurm's REGISTRY_VIA or SHARED_VIA
    registry: NotRequired[str]  # the rest: kind REGISTRY_VIA only
    ref: NotRequired[str]  # REGISTRY/REPO@DIGEST
    image_id: NotRequired[str]


class SlurmRunInfo(TypedDict):
    """What a replicate's manifest records of its Slurm task (``RunState.info``, the manifest's placement;
    launcher.targets.slurm.SlurmPlacement.state)."""

    kind: str
    job_id: str | None
    array_index: int | str | None  # the launch record's number; task.json's text once the task wrote it
    partition: str | None
    image_source: ImageSource
    runtime: str
    node: NotRequired[str | None]
    nodes: NotRequired[list[str]]  # a run of several nodes: the job's nodes by name, node 0's first
    error: NotRequired[str | None]
    node_facts: NotRequired[HostFacts | NoFacts]


class RayRunInfo(TypedDict):
    """What a replicate's manifest records of its Ray task (``RunState.info``, the manifest's placement;
    launcher.targets.ray.RayPlacement.state): the Ray job, the task, the node by ID and address, its facts."""

    kind: str
    job_id: str | None  # the Ray job's submission ID
    image_source: ImageSource
    task_id: NotRequired[str | None]
    node_id: NotRequired[str | None]
    node: NotRequired[str | None]  # the node's address as Ray names it
    nodes: NotRequired[list[str]]  # a run of several nodes: every node's address, node 0's first
    node_ids: NotRequired[list[str]]
    error: NotRequired[str | None]
    node_facts: NotRequired[HostFacts | NoFacts]


class RayTask(TypedDict):
    """The ``ray`` of launch.json: the run's task in the Ray job of its group (targets.ray.RayPlacement.start_array)."""

    job_id: str  # the Ray job's submission ID
    index: int
    array_size: int
    array_dir: str  # the group's folder on the head (job.json, driver.py, runs.txt)
    run_dir: str


class SlurmJob(TypedDict):
    """The ``slurm`` of launch.json: the run's task in its job array (targets.slurm.SlurmPlacement.start_array)."""

    job_id: str
    array_index: int
    array_size: int
    log: str
    run_dir: str


@dataclass(frozen=True)
class RunState:
    """A placed run as its target sees it. ended: it will not change any more (exited, or never started).
    status: what the target says the run came to when that is more than its exit code ("cancelled");
    image_ran: the image ID the run started from, where the target learns it only then; info: what the
    manifest records about where it ran (a cluster: job ID, array index, node, the node's facts)."""

    running: bool
    ended: bool
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    status: str | None = None
    image_ran: str | None = None
    info: SlurmRunInfo | RayRunInfo | None = None  # a cluster's task; None where the target adds nothing (direct)


class PlacementRecord(TypedDict):
    """The ``placement`` of launch.json: Placement.record(), what reopens the run's target (its ``kind``; a
    Slurm cluster adds the rest, launcher.targets.slurm.SlurmPlacement.record)."""

    kind: str
    partition: NotRequired[str | None]
    options: NotRequired[dict[str, str]]  # --slurm-opt: sbatch option -> value ("" for a flag)
    max_parallel: NotRequired[int | None]
    image_source: NotRequired[ImageSource]
    runtime: NotRequired[str]
    resources: NotRequired[dict[str, float]]  # a Ray target: each replicate's task resources (num_cpus, ...)
    hosts: NotRequired[list[HostRecord]]  # one node per host: each node's host, as HostSpec.to_record() keeps it


class StartedRecord(TypedDict):
    """What a target answers once it started a run (Placement.start): LaunchRecord's keys of the same names."""

    container: str
    container_spec: NotRequired[SpecRecord]
    image_ran: NotRequired[str]
    slurm: NotRequired[SlurmJob]
    ray: NotRequired[RayTask]
    node_containers: NotRequired[list[str]]  # a run of several nodes: each node's container, node 0's first
    network: NotRequired[str]  # and the private network launcher made for them ("host": one node per host)
    node_dirs: NotRequired[list[str | None]]  # one node per host: the run's directory on each node's host
    # (None: the host shares node 0's, as a cluster's shared home)
    node_specs: NotRequired[list[SpecRecord]]  # each node's container as started (launcher resume starts them again)


class ManifestPlacement(TypedDict):
    """The ``placement`` of manifest.json: the target's kind and what it said of where the run ran
    (RunState.info; a Slurm task's keys are launcher.targets.slurm.SlurmRunInfo's)."""

    kind: str
    job_id: NotRequired[str | None]
    array_index: NotRequired[int | str | None]
    partition: NotRequired[str | None]
    image_source: NotRequired[ImageSource]
    runtime: NotRequired[str]
    node: NotRequired[str | None]
    node_id: NotRequired[str | None]  # a Ray task's node, by Ray's ID
    node_ids: NotRequired[list[str]]
    nodes: NotRequired[list[str]]
    task_id: NotRequired[str | None]
    error: NotRequired[str | None]
    node_facts: NotRequired[HostFacts | NoFacts]


class StartPoint(TypedDict):
    """Where a re-execution starts: a run's checkpoint, and what starting there saves."""

    run: str
    checkpoint: str  # its folder under outputs/checkpoints/
    step: int  # the optimizer steps done at the checkpoint
    epochs: int  # the epochs done
    steps_total: int | None  # the steps the run made in all (its last step fingerprint)
    seconds: float | None  # how long the run took, start to end (its manifest)
    seconds_saved: float | None  # the run's time for the steps not re-executed, in proportion of steps
    rerun_seconds: NotRequired[float | None]  # how long the re-execution took (launcher diverge's answer)


class StartFrom(TypedDict):
    """RunRequest.start_from: the folder prepared here that becomes the outputs, and the point it stands at."""

    folder: str
    point: StartPoint


class LaunchRecord(TypedDict):
    """``runs/<id>/launch.json``: a run as it was started (launcher.runs.lifecycle), completed with what
    its target said when it started it (``container``, ``container_spec``, ``image_ran``, ``slurm``; a record of an
    older launcher kept ``argv``, the container's `docker run` command line, instead of its spec)."""

    record_version: NotRequired[int]  # launcher.records.rundir.LAUNCH_VERSION (a record without it is version 1)
    run_id: str
    group: str
    replicate: NotRequired[int]
    host: HostDescription  # Host.describe(), owned by launcher.hosts (an SSH host adds where it is)
    host_options: NotRequired[HostRecord]  # HostSpec.to_record(), owned by launcher.hosts.hostspec
    placement: NotRequired[PlacementRecord]  # Placement.record(): its "kind" and what the target adds
    container: NotRequired[str]
    remote_dir: str
    recipe: LaunchRecipe
    code: NotRequired[CodePlan]
    params: NotRequired[dict[str, ParamValue]]  # the recipe's params, checked against its recipe.toml
    probes: NotRequired[ProbesRecord]
    trace: NotRequired[TraceRecord]
    checkpoint: NotRequired[CheckpointRecord]
    seed: NotRequired[int | None]
    determinism: DeterminismRecord
    env: NotRequired[dict[str, EnvValue]]
    image: ImageRecord
    data: NotRequired[str | None]
    data_source: NotRequired[DataSource | None]
    variant: NotRequired[str]
    facts: NotRequired[HostFacts | NoFacts]  # the host's fact sheet (launcher.hosts.provision), {} if none was read
    ship: NotRequired[ShipRecord]
    launched_at: str
    # what the target adds once it started the run (Placement.start), or why it could not
    container_spec: NotRequired[SpecRecord]
    argv: NotRequired[list[str]]  # version 1's: the rendered command line (read back into container_spec)
    image_ran: NotRequired[str]
    slurm: NotRequired[SlurmJob]
    ray: NotRequired[RayTask]
    node_containers: NotRequired[list[str]]
    network: NotRequired[str]
    node_dirs: NotRequired[list[str | None]]
    node_specs: NotRequired[list[SpecRecord]]
    topology: NotRequired[TopologyRecord]
    start_error: NotRequired[str]
    segments: NotRequired[list[Segment]]  # launcher resume: each container the run had
    start_from: NotRequired[StartPoint]  # a diverge re-execution started from a run's checkpoint


class PulledFile(TypedDict):
    """A verified output file: ``.pulled.json``'s value per path (with mtime_ns), PullResult.files."""

    size: int
    sha256: str
    mtime_ns: NotRequired[int]


class PullSummary(TypedDict):
    """A pull's counts (launcher.transfers.pull.PullResult.to_dict)."""

    files: int
    transferred: int
    skipped: int
    refused: list[str]
    bytes: int


class PullStatus(TypedDict):
    """What launcher.runs.collect.pull_record answers for a run that still goes (``launcher pull``)."""

    run_id: str
    status: str  # RUNNING
    pulled: PullSummary


class ArtifactEntry(TypedDict):
    """The entries of manifest.json's ``artifacts``."""

    path: str  # relative to the run folder, posix
    size: int
    sha256: str


class ExitRecord(TypedDict, total=False):
    """``outputs/_launcher/exit.json``: how the script ended, as the runtime recorded it (absent where the
    runtime did not get that far)."""

    exit_code: int
    started_at: str
    ended_at: str


class CodePart(TypedDict, total=False):
    """A part of ``outputs/_launcher/code.json`` (launcher.runtime.runner.record_code): a code tree's
    digest and counts, where it came from (the recipe's), or only a digest (the runtime's, packages')."""

    digest: str | None
    files: int
    bytes: int
    path: str
    source: str
    entry: str


class CodeRecord(TypedDict, total=False):
    """``outputs/_launcher/code.json``: what code ran, computed by the runtime inside the container; each
    part absent where an older or interrupted runtime did not write it."""

    recipe: CodePart
    lib: CodePart  # the shared recipe library (recipes/_lib), where the recipe used one
    runtime: CodePart
    packages: CodePart
    lock_sha256: str | None


class ManifestRecipe(TypedDict):
    """The ``recipe`` of manifest.json: the code that ran, as the runtime computed it in the container."""

    name: str
    tree_digest: NotRequired[str | None]
    framework: NotRequired[str]
    entry: NotRequired[str | None]
    code_source: NotRequired[str | None]
    files: NotRequired[int | None]  # how many files the code has (CodePart.files)
    args: NotRequired[list[str]]
    git: NotRequired[GitState]
    lib_digest: NotRequired[str]
    volatile: NotRequired[list[str]]
    identity: NotRequired[str]


class ManifestHost(HostDescription):
    """The ``host`` of manifest.json: the launch record's host with the host's fact sheet ({} if none was read)."""

    facts: HostFacts | NoFacts


class ManifestData(TypedDict):
    """``runs/<id>/manifest.json`` (schema version 1; launcher.records.manifest reads and writes it). The
    required keys are the ones :func:`launcher.records.manifest.validate` checks."""

    schema_version: int
    run_id: str
    group: str
    replicate: NotRequired[int]
    recipe: ManifestRecipe
    params: NotRequired[dict[str, ParamValue]]
    env: NotRequired[dict[str, EnvValue]]
    # launch.json's, passed through: a ProbesRecord, TraceRecord, DataSource or null; launcher.attest
    # reads them as plain dicts after its own isinstance checks, so they stay loose here
    probes: NotRequired[Any]
    trace: NotRequired[Any]
    seed: int | None
    determinism: DeterminismRecord
    image: ImageRecord
    host: ManifestHost
    placement: NotRequired[ManifestPlacement]  # its kind and what its target recorded (RunState.info)
    runtime: NotRequired[RuntimeDocument]  # _launcher/runtime.json as it was written ({} where none)
    started_at: str
    ended_at: NotRequired[str]
    exit_code: NotRequired[int]
    status: str  # one of launcher.records.manifest.STATUSES
    data: NotRequired[str | None]
    data_source: NotRequired[Any]
    artifacts: list[ArtifactEntry]
    checkpoint: NotRequired[CheckpointRecord]
    segments: NotRequired[list[Segment]]
    topology: NotRequired[TopologyRecord]


RunRecord = ManifestData | LaunchRecord | PullStatus  # a run as a command answers it: ended, detached or going


def placement_kind(record: LaunchRecord | ManifestData, default: str | None = DIRECT) -> str | None:
    """The kind of target a run was placed by: its record's ``placement.kind``, else ``default`` (records
    from before placements were recorded are direct)."""
    placed = record.get("placement")
    return (placed.get("kind") if placed else None) or default
