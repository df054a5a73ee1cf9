"""The records of a report: what reports/<name>/report.json holds, section by section.

Each is a TypedDict (plain JSON in the file; the bytes written stay those of a dict). Non-finite
floats are written as null (stats.nan_to_null), hence ``float | None`` where a value can be one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NotRequired, TypedDict

if TYPE_CHECKING:  # verify's records, as verify writes them
    from launcher.verify.modeldiff import FirstDifference
    from launcher.verify.stepdiff import StepsStrip
    from launcher.verify.verdicts import CheckRecord as GroupCheck

REPORT_FILE = "report.json"  # reports/<name>/report.json: a ReportDoc

class Summary(TypedDict):
    """A final metric over a group's runs (report.json groups[].final[metric])."""

    n: int
    mean: float | None
    stdev: float | None
    min: float | None
    max: float | None
    values: list[float]


class ShareNumbers(TypedDict):
    """The seed-fixed share of one metric with its interval (None where there is no share)."""

    stdev_ratio: float | None
    variance_ratio: float | None
    stdev_ratio_interval: list[float] | None
    variance_ratio_interval: list[float] | None
    interval_factor: float | None
    runs_per_group_to_exclude_100: int | None


class ShareReading(ShareNumbers):
    """The share, its interval and what it says (stats.read_share)."""

    status: str
    reading: str


class MetricSpread(ShareReading):
    """report.json seed_fixed_spread.metrics[metric]: the share with the two standard deviations."""

    stdev_same_seed: float | None
    stdev_different_seeds: float | None
    n_same_seed: int
    n_different_seeds: int


class SeedFixedSpread(TypedDict):
    """report.json seed_fixed_spread: per metric, the share of the spread left with the seed fixed."""

    same_seed_group: str
    different_seeds_group: str
    confidence: float
    interval: str
    tight_factor: float
    runs_per_group_for_tight: int | None
    advice: str
    metrics: dict[str, MetricSpread]


class RunRow(TypedDict):
    """report.json runs[]: one run of a group."""

    run_id: str
    group: str
    replicate: int
    seed: int | None
    status: str
    epochs: int
    final: dict[str, float | None]


class GroupRow(TypedDict):
    """report.json groups[]: one experiment group."""

    name: str
    kind: str
    colour: str
    seeds: list[int | None]
    runs: list[str]
    final: dict[str, Summary]


class RunDifferences(TypedDict):
    """One replicate's metrics minus the reference's, epoch by epoch."""

    run_id: str
    epochs: list[int]
    metrics: dict[str, list[float | None]]


class EpochDifferences(TypedDict):
    """report.json differences[group]."""

    reference: str
    runs: list[RunDifferences]


class LayerDivergence(TypedDict):
    """How far one layer of a replicate's final weights is from the reference's."""

    layer: str
    status: str  # identical, differs, missing, shape
    arrays: int
    arrays_differing: int
    elements: int
    elements_differing: int | None
    max_abs_diff: float | None
    rel_l2: float | None


class RunWeights(TypedDict):
    run_id: str
    layers: list[LayerDivergence]


class WeightDivergence(TypedDict):
    """report.json weights[group]: per replicate and layer, the final weights against the reference."""

    reference: str
    layers: list[str]
    runs: list[RunWeights]
    notes: list[str]












class ComparedRun(TypedDict):
    """report.json comparisons[group].runs[]: a replicate as `verify checksums` judged it."""

    run_id: str
    status: str
    classification: str | None  # verify's RunRecord: None where its explanation named no kind
    line: str | None
    first_difference: FirstDifference | None
    steps: StepsStrip | None


class Comparison(TypedDict):
    """report.json comparisons[group]: the group checked bit for bit against its first run."""

    verdict: str
    reference: str
    checks: dict[str, GroupCheck]  # models, initial_weights, data, batches, metrics
    runs: list[ComparedRun]


class ProbeRun(TypedDict):
    """report.json probes[group].runs[]: one run's probe impact against the reference."""

    run_id: str
    kind: str | None
    line: str
    identical: bool
    flips: NotRequired[int]
    max_prob_change: NotRequired[float]
    heatmap_max_abs_diff: NotRequired[float]
    heatmap_mean_abs_diff: NotRequired[float]
    correlation_min: NotRequired[float]
    overlap_min_iou: NotRequired[float]


class FlipRow(TypedDict):
    probe: int
    index: int
    classes: list[int | None]
    flipped_in: int
    label: NotRequired[int]


class FlipTable(TypedDict):
    """Probe examples whose predicted class differs from the reference's in some run."""

    runs: list[str]
    rows: list[FlipRow]


class Drawn(TypedDict):
    files: dict[str, str]  # panel -> PNG path relative to the report
    difference_scale: float


class Picture(Drawn):
    """report.json probes[group].pictures[]: one probe image pictured."""

    probe: int
    index: int
    run_id: str
    mean_abs_diff: float
    classes: list[int] | None


class GroupProbes(TypedDict):
    """report.json probes[group]: the group's probe comparison."""

    reference: str
    runs: list[ProbeRun]
    notes: list[str]
    pictures: list[Picture]
    flips: NotRequired[FlipTable]


class ReportDoc(TypedDict):
    """reports/<name>/report.json."""

    schema: str
    name: str
    directory: str
    metrics: list[str]
    groups: list[GroupRow]
    runs: list[RunRow]
    seed_fixed_spread: SeedFixedSpread | None
    plots: dict[str, str]
    difference_plots: dict[str, str]
    weights_plot: str | None
    differences: dict[str, EpochDifferences]
    weights: dict[str, WeightDivergence]
    comparisons: dict[str, Comparison]
    probes: dict[str, GroupProbes]
    notes: list[str]
