"""The records the runtime writes under the outputs folder, as typed JSON documents.

Each TypedDict names the file (or the line of a ``.jsonl`` file) it describes; the bytes on disk
are those of the plain dict, written canonically by :mod:`launcher.runtime.fingerprints`. The
runtime runs on the image's Python: ``NotRequired`` and numpy's types are read by the type
checker only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:
    from typing import NotRequired

    from numpy.typing import ArrayLike

# the files the runtime writes, relative to the outputs folder (named in launcher.runtime.outfiles)
from launcher.runtime.outfiles import ARRAYS_JSON as ARRAYS_JSON
from launcher.runtime.outfiles import BATCHES as BATCHES
from launcher.runtime.outfiles import CANONICAL_MODEL as CANONICAL_MODEL
from launcher.runtime.outfiles import DATASET_JSON as DATASET_JSON
from launcher.runtime.outfiles import EXIT_JSON as EXIT_JSON
from launcher.runtime.outfiles import INITIAL_WEIGHTS as INITIAL_WEIGHTS
from launcher.runtime.outfiles import LAYERS_JSON as LAYERS_JSON
from launcher.runtime.outfiles import METRICS as METRICS
from launcher.runtime.outfiles import RUNTIME_JSON as RUNTIME_JSON
from launcher.runtime.outfiles import STEPS as STEPS

# a JSON value as json.loads gives it: a plain script's params are any JSON the user passes
JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]

# name -> an array, a framework's tensor or anything numpy.asarray reads (fingerprints.as_array)
NamedArrays = Mapping[str, "ArrayLike"]


class DatasetRecord(TypedDict):
    """A dataset of recipe.toml (DatasetSpec.as_dict): in `recipes show`, and the runtime's
    ``LAUNCHER_DATASET``, against which the data a run reads is checked."""

    name: str
    param: str
    source: str
    format: str
    fingerprint: str | None
    files: dict[str, str]
    description: str


class ProbeConfig(TypedDict):
    """A probe set as JSON (ProbeSpec.as_dict): the runtime's ``LAUNCHER_PROBES`` and ``--probes``,
    probes.json's ``config``, a launch record's probes."""

    split: str
    count: int
    indices: list[int]
    gradcam: bool
    layer: str | None
    fingerprint: str | None


class ArrayEntry(TypedDict):
    """One array of an arrays fingerprint: its digest (fingerprints.array_digest), shape and dtype."""

    sha256: str
    shape: list[int]
    dtype: str


class FilesFingerprint(TypedDict):
    """``fingerprints/dataset.json`` of a run that read files (``--data``): relative path -> sha256."""

    digest: str
    kind: Literal["files"]
    entries: dict[str, str]


class ArraysFingerprint(TypedDict):
    """``fingerprints/dataset.json``, ``arrays.json``, ``train_data*.json`` of arrays; probes' inputs."""

    digest: str
    kind: Literal["arrays"]
    entries: dict[str, ArrayEntry]


DataFingerprint = FilesFingerprint | ArraysFingerprint


class WeightsFingerprint(TypedDict):
    """``fingerprints/initial_weights.json``: ``layer/i`` -> the array's digest."""

    digest: str
    arrays: dict[str, str]


class LayerArray(TypedDict):
    index: int
    shape: list[int]
    dtype: str
    sha256: str


class LayerEntry(TypedDict):
    name: str
    arrays: list[LayerArray]


class LayersDocument(TypedDict):
    """``weights/layers.json``: the final weights, layer by layer in model order."""

    layers: list[LayerEntry]
    digest: str


class EpochBatches(TypedDict):
    """A line of ``fingerprints/batches.jsonl``: one epoch's batches by content (or why not)."""

    epoch: int
    digest: str | None
    batches: list[str]
    unrecorded: NotRequired[str]
    fit: NotRequired[int]  # the fit() call, from the second one on


# a line of metrics.jsonl: "epoch" (and "fit" from the second fit() on) and the script's own metric
# names, each a number or, where it is none, its text
MetricsLine = dict[str, float | str]


class StepRow(TypedDict):
    """A line of ``fingerprints/steps.jsonl``: the weights at an optimizer step, layer by layer."""

    step: int
    digest: str
    layers: dict[str, str]
    epoch: NotRequired[int]
    loss: NotRequired[float]
    module: NotRequired[str]  # the class of the model the digests cover (torch: "parameters" without one)
    optimizer: NotRequired[str]  # the class of the optimizer that updates it; "by hand" for a loop without one


class OpRow(TypedDict):
    """A line of the operation trace (optrace.OPS): one operation of a traced step."""

    step: int
    order: int
    kind: str
    name: str
    digest: str
    shape: list[int]
    dtype: str
    array: NotRequired[str]  # its key in the step's .npz, when small enough to keep
    layer: NotRequired[str]  # weights and updated: the layer it belongs to, as the step fingerprints name it


class OpTraceInfo(TypedDict):
    """``optrace/trace.json``: what a re-execution's operation trace could observe, and how."""

    framework: str  # keras | torch | jax
    operations: bool  # layer inputs and outputs and gradients were traced (False: only the weights)
    xla: bool  # the training step was compiled with XLA, as in the run traced
    weights: str  # where the weights were read, in words
    note: NotRequired[str]


JsonlLine = EpochBatches | MetricsLine | StepRow | OpRow  # what fingerprints.append_jsonl writes


class CheckpointFile(TypedDict):
    """``checkpoints/latest.json``: the folder of the latest checkpoint."""

    name: str


class CheckpointState(TypedDict):
    """``checkpoints/epoch-NNNN/state.json``: where training stands, and the appended files' sizes."""

    epoch: int
    next_epoch: int
    step: int
    framework: str
    files: dict[str, int]
    trace_epoch: NotRequired[int]  # the step trace's next epoch-boundary number (a loop that does not number them)


class RngState(TypedDict):
    """``checkpoints/epoch-NNNN/rng.json``: ``random.getstate()`` and ``numpy.random.get_state()``
    as JSON arrays of mixed items (version, words, gauss / kind, keys, pos, has_gauss, cached)."""

    python: list[Any]
    numpy: NotRequired[list[Any]]


class Determinism(TypedDict):
    """runtime.json's ``determinism``: whether the profile was in force, and why (or why not)."""

    in_force: bool
    reason: str


class SeedCall(TypedDict):
    """One of runtime.json's ``seed_calls``: a seeding call of the code itself."""

    api: str
    seed: int | str | None  # the seed, its repr where it is not an int


class Threads(TypedDict):
    intra_op: int
    inter_op: int


class CudnnFlags(TypedDict):
    deterministic: bool
    benchmark: bool


class Applied(TypedDict, total=False):
    """runtime.json's ``applied[name]``: what the profile did to one framework. Each framework
    records its own keys (see frameworks/fw_*.py); ``error`` replaces them when applying failed."""

    name: str
    version: str | None
    error: str
    imported_by: str
    seeded: list[str]
    threads: Threads
    devices: list[str]
    cuda: str | None
    cudnn: str | int | None
    # TensorFlow
    op_determinism: str | None
    build: dict[str, str]
    keras: str | None  # Keras' version, recorded on TensorFlow's entry
    # Keras (its own entry)
    backend: str | None
    fit_recorded: bool
    # PyTorch
    deterministic_algorithms: bool
    cudnn_flags: CudnnFlags
    # JAX
    xla_flags: str | None
    deterministic_ops: bool
    note: str
    jaxlib: str | None
    distributed: dict[str, Any]  # a process of a run of several: the process count and its id


class PythonInfo(TypedDict):
    version: str
    implementation: str
    executable: str


class PlatformInfo(TypedDict):
    system: str
    machine: str
    release: str
    cpu_count: int | None


class RuntimeDocument(TypedDict, total=False):
    """``_launcher/runtime.json``: the profile, what was imported and applied, the code's own seeds.

    The runtime (launcher.runtime.hooks) writes every key; a reader (the manifest's ``runtime``, the
    verifier) takes any key as possibly absent: an older or interrupted runtime wrote some only, or none."""

    profile: str
    seed: int | None
    threads: int | None
    seeded: dict[str, int]
    framework: Applied | None
    frameworks: list[str]
    applied: dict[str, Applied]
    seed_calls: list[SeedCall]
    seed_calls_total: int
    determinism: Determinism
    python: PythonInfo
    platform: PlatformInfo
    env: dict[str, str]
