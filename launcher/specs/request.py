"""What a run was asked to be: the options of ``launcher run`` (or what ``experiment``, ``diverge`` and
``reproduce`` ask for), each parsed once into a typed value here. A :class:`RunRequest` is never filled
in afterwards: ``launcher.runs.plan.plan_run`` resolves it (recipe, image, code, data, group, replicates)
into a ``ResolvedRun``."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.errors import UsageError
from launcher.records.records import CodePlan, ImageRecord, StartFrom
from launcher.runtime.probespec import ProbeError, ProbeSpec, parse_option
from launcher.runtime.steps import EPOCH, parse_every
from launcher.specs.recipes import ParamValue
from launcher.specs.topology import Topology


@dataclass(frozen=True)
class ProbesOption:
    """--probes SPEC parsed: the text as given (the launch record keeps it) and its probe set (None: off)."""

    text: str
    config: ProbeSpec | None


@dataclass(frozen=True)
class Checkpoints:
    """--checkpoint-every N (at least 1) and --keep-checkpoints (every checkpoint kept, not only the latest)."""

    every: int
    keep_all: bool = False


@dataclass(frozen=True)
class RunRequest:
    recipe: str
    variant: str = "cpu"
    seed: int | None = None
    profile: str = "deterministic"
    threads: int | None = None
    data: str | None = None  # --data: a folder on the host
    params: dict[str, ParamValue] = field(default_factory=dict)  # checked against the recipe when planned
    group: str | None = None  # None: a new group, named when the run is planned
    replicate: int = 0  # the number of the first replicate (a group continued)
    detach: bool = False
    ship_via: str | None = None  # None: docker save | load; or a registry address such as 127.0.0.1:5000
    data_from: str | None = None  # a dataset folder on this machine, sent to the host by content
    args: list[str] = field(default_factory=list)  # the script's own argv (after `--`)
    code: str | None = None  # --code DIR: the folder a plain script is sent with
    entry: str | None = None  # --entry FILE: the script of a folder without recipe.toml
    mount: bool = False  # mount the workspace recipe read-only instead of running the baked copy
    build: bool = True  # rebuild a stale image first; False: refuse to run stale code
    probes: ProbesOption | None = None  # --probes; None: the recipe's [probes]
    trace_every: str = EPOCH  # --trace-every as the runtime reads it (trace_option): epoch, off or a step count
    optrace: str | None = None  # LO:HI: trace these steps op by op (a `launcher diverge` re-execution)
    checkpoints: Checkpoints | None = None  # --checkpoint-every, --keep-checkpoints
    start_from: StartFrom | None = None  # a run's checkpoint the run starts from (a `launcher diverge` re-execution)
    env: dict[str, str] = field(default_factory=dict)  # --env: the user's variables, recorded with their values
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)  # --secret-env: recorded by sha256 only
    find_links: list[str] = field(default_factory=list)  # --find-links DIR: wheels no reachable index serves
    ca_bundle: str | None = None  # --ca-bundle FILE: the CA pip trusts for the index (locks and downloads)
    topology: Topology | None = None  # --nodes, --procs-per-node (specs.topology.topology_option); None: one process
    reduction: str = "default"  # --reduction: default or canonical (launcher.runtime.reduction)
    # given by a caller that has them already, used as they are (never filled in by the planning):
    code_plan: CodePlan | None = None  # the code as planned elsewhere (reproduce: a bundle's; diverge: as recorded)
    image: ImageRecord | None = None  # the image when it is not the variant's (a project layer, a recorded image)


def probe_option(text: str | None) -> ProbeSpec | None:
    """--probes SPEC as a probe set (None for off, or when not given); a bad SPEC is a UsageError,
    checked as recipe.toml's [probes] is."""
    if text is None:
        return None
    try:
        return parse_option(text)
    except ProbeError as exc:
        raise UsageError(f"--probes {text}: {exc}",
                         "give off, a count (--probes 8) or KEY=VALUE pairs with recipe.toml's [probes] keys "
                         "(--probes count=8,gradcam=false, --probes indices=0;3;7,layer=conv2d)") from None


def probes_option(text: str | None) -> ProbesOption | None:
    """--probes SPEC parsed (probe_option), with the text as given; None when not given."""
    return None if text is None else ProbesOption(text, probe_option(text))


def trace_option(text: str | None) -> str:
    """--trace-every as the runtime reads it: ``epoch`` (the default), ``off`` or a step count;
    anything else is a UsageError."""
    try:
        every = parse_every(text)
    except ValueError:
        raise UsageError(f"--trace-every {text}: not a number of steps, 'epoch' or 'off'",
                         "give a step count of at least 1 (--trace-every 10), epoch (the default) or off") from None
    return EPOCH if every is None else str(every)


def checkpoint_option(every: int | None, keep: bool = False) -> int | None:
    """--checkpoint-every N: None, or N when it is at least 1 (else a UsageError); --keep-checkpoints only with it."""
    if every is not None and every < 1:
        raise UsageError(f"--checkpoint-every {every}: not a number of epochs of at least 1",
                         "give how many epochs go between checkpoints (--checkpoint-every 1), or drop it")
    if keep and every is None:
        raise UsageError("--keep-checkpoints without --checkpoint-every: there are no checkpoints to keep",
                         "add --checkpoint-every N, or drop --keep-checkpoints")
    return every


def checkpoints_option(every: int | None, keep: bool = False) -> Checkpoints | None:
    """--checkpoint-every and --keep-checkpoints parsed (checkpoint_option); None: no checkpoints."""
    checked = checkpoint_option(every, keep)
    return None if checked is None else Checkpoints(checked, keep)
