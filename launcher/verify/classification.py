"""Why a run differs, in one line: the classification of an explanation (identical; an output differs;
nondeterminism in training; environment-dependent; an input change), and :func:`explain`, which puts an
explanation together from its parts (:mod:`launcher.verify.differences`)."""

from __future__ import annotations

from collections.abc import Sequence

from launcher.records.manifest import Manifest
from launcher.verify.differences import (
    CLASS_ENVIRONMENT,
    CLASS_IDENTICAL,
    CLASS_INPUT,
    CLASS_NONDETERMINISM,
    CLASS_OUTPUTS,
    MISSING,
    BatchesExplanation,
    Classification,
    DataExplanation,
    DifferingFile,
    Explanation,
    InitialWeightsExplanation,
    MetricsExplanation,
    ModelExplanation,
    explain_batches,
    explain_data,
    explain_initial_weights,
    explain_metrics,
    explain_model,
)
from launcher.verify.environment import EnvironmentRow, environment_diff
from launcher.verify.impact import ProbeImpact, Tolerances, explain_impact
from launcher.verify.stepdiff import StepsDiff, steps_diff, steps_phrase

INPUT_CATEGORIES = ("code", "data", "seed", "params")


def steps_to_the_end(steps: StepsDiff | None) -> bool:
    """launcher's weight digests agree at every step recorded in both runs, and both end at the same step."""
    if steps is None or steps.get("same") is not True:
        return False
    last = steps.get("last_step")
    return last is not None and last["reference"] is not None and last["reference"] == last["run"]


def training_identical(model: ModelExplanation | None, initial: InitialWeightsExplanation | None,
                       data: DataExplanation | None, batches: BatchesExplanation | None,
                       metrics: MetricsExplanation | None, steps: StepsDiff | None = None) -> bool:
    """Every model array, fingerprint and metric recorded in both runs is identical (and some were: the
    model, the metrics, or launcher's weight digests to the last step)."""
    if model is None and metrics is None and not steps_to_the_end(steps):
        return False
    if model is not None and model.get("identical") is not True:
        return False
    return all(part is None or part.get("same") is not False for part in (initial, data, batches, metrics, steps))


def classify(identical: bool, env: list[EnvironmentRow], data: DataExplanation | None,
             model: ModelExplanation | None, initial: InitialWeightsExplanation | None,
             batches: BatchesExplanation | None, seeded: bool = True,
             metrics: MetricsExplanation | None = None,
             files: Sequence[DifferingFile] | None = None,
             steps: StepsDiff | None = None) -> Classification:
    """One line: identical; only other outputs differ; nondeterminism in training;
    environment-dependent; or an input change. Never nondeterminism when training was identical."""
    if identical:
        return {"kind": CLASS_IDENTICAL, "causes": [], "line": "identical"}
    if files is not None and training_identical(model, initial, data, batches, metrics, steps):
        return _outputs_only(files, model is None and metrics is None, steps)
    by_cat: dict[str, list[str]] = {}
    for row in env:
        by_cat.setdefault(row["category"], []).append(row["key"])
    if data is not None and not data.get("same", True):
        by_cat.setdefault("data", []).insert(0, "dataset fingerprint")
    inputs = [c for c in INPUT_CATEGORIES if c in by_cat]
    if inputs:
        return _input_change(inputs, by_cat, env)
    if "hardware" in by_cat or "software" in by_cat:
        return _environment(by_cat)
    return _nondeterminism(model, initial, batches, steps, seeded)


def _outputs_only(files: Sequence[DifferingFile], by_steps: bool, steps: StepsDiff | None) -> Classification:
    """Training was identical: only other outputs differ (the first three named, with their kind)."""
    named = [_file_phrase(f, kind=True) for f in files[:3]] + ([f"and {len(files) - 3} more"] if len(files) > 3
                                                               else [])
    basis = "every model array, fingerprint and metric"
    if by_steps and steps is not None:
        last = steps.get("last_step")
        basis = (f"launcher's weight digests agree at all {steps['steps_compared']} steps recorded in both, to step "
                 f"{last['reference'] if last else '?'}")
    return {"kind": CLASS_OUTPUTS, "causes": ["outputs"],
            "line": f"an output differs: {', '.join(named) or 'none named'}; training identical ({basis})"}


def _input_change(inputs: list[str], by_cat: dict[str, list[str]], env: list[EnvironmentRow]) -> Classification:
    """An input differs (code, data, seed, params): each named with what changed."""
    parts = []
    for c in inputs:
        if c == "seed":
            seed = next((r for r in env if r["key"] == "seed"), None)
            parts.append(f"seed ({seed['reference']} -> {seed['run']})" if seed else "seed")
        elif c == "data":
            parts.append("data (" + ", ".join(by_cat["data"]) + ")")
        elif c == "code":
            parts.append("code (" + ", ".join(by_cat["code"]) + ")")
        else:
            names = ", ".join("script arguments" if k == "recipe.args" else k.removeprefix("params.")
                              for k in by_cat["params"])
            parts.append(f"params ({names})")
    return {"kind": CLASS_INPUT, "causes": inputs,
            "line": "differs in " + ", ".join(parts) + ": an input change"}


def _environment(by_cat: dict[str, list[str]]) -> Classification:
    """The inputs agree and the hardware or software differs (hardware said first)."""
    if "hardware" in by_cat:
        keys = by_cat["hardware"][:3]
        causes = ["hardware", "software"] if "software" in by_cat else ["hardware"]
        return {"kind": CLASS_ENVIRONMENT, "causes": causes,
                "line": f"differs on different hardware ({', '.join(keys)}): environment-dependent"}
    keys = by_cat["software"][:3]
    return {"kind": CLASS_ENVIRONMENT, "causes": ["software"],
            "line": f"differs in the software environment ({', '.join(keys)}): environment-dependent"}


def _nondeterminism(model: ModelExplanation | None, initial: InitialWeightsExplanation | None,
                    batches: BatchesExplanation | None, steps: StepsDiff | None, seeded: bool) -> Classification:
    """Nothing in the inputs or environment differs: training was not deterministic; where it shows."""
    where = []
    if initial is not None:
        where.append("initial weights " + ("identical" if initial.get("same") else "already differ"))
    if batches is not None and batches.get("same") is not None:
        where.append("batches " + ("identical" if batches["same"] else "differ"))
    if steps is not None and steps.get("same") is False:
        where.append(steps_phrase(steps))
    first = model.get("first_difference") if model is not None else None
    if first:
        where.append(f"first differing layer {first['layer']} array {first['array']}")
    detail = f" ({'; '.join(where)})" if where else ""
    return {"kind": CLASS_NONDETERMINISM, "causes": ["training"],
            "line": ("differs with the same environment and seed: nondeterminism in training" if seeded
                     else "differs with the same environment and no fixed seed (profile off?): "
                     "nondeterminism expected") + detail}


def with_impact(classification: Classification, impact: ProbeImpact | None) -> Classification:
    """The classification with the impact's kind and phrase added to its line."""
    if impact is None:
        return classification
    return {**classification, "impact": impact.get("kind"), "line": f"{classification['line']}; {impact['line']}"}


def _file_phrase(f: DifferingFile, kind: bool = False) -> str:
    name = str(f["path"]).removeprefix("outputs/")
    content = f.get("content")
    what = f"{f['kind']}; " if kind and f.get("kind") else ""
    if f.get("status") == MISSING:
        hint = f"; to leave it out: --ignore '{f['ignore']}'" if f.get("ignore") else ""
        return f"{name} ({what}in one run only{hint})"
    if content and content.get("difference"):
        return f"{name} ({what}{content['format']}: {content['difference']})" if kind else \
            f"{name} ({content['difference']})"
    hint = f"; {f['hint']}" if f.get("hint") else ""
    return f"{name} ({what}bytes; format not compared by content{hint})"


def explain(ref: Manifest, run: Manifest, files: list[DifferingFile] | None = None,
            tolerances: Tolerances | None = None) -> Explanation:
    """Where and why ``run`` differs from ``ref``, and, where both recorded probes, what the
    difference does to predictions and explanations (launcher.verify.impact)."""
    model = explain_model(ref, run)
    initial = explain_initial_weights(ref, run)
    data = explain_data(ref, run)
    batches = explain_batches(ref, run)
    steps = steps_diff(ref, run)
    metrics = explain_metrics(ref, run)
    env = environment_diff(ref, run)
    impact = explain_impact(ref, run, tolerances)
    cls = classify(False, env, data, model, initial, batches, seeded=ref.seed is not None, metrics=metrics,
                   files=files, steps=steps)
    return {
        "classification": with_impact(cls, impact),
        "model": model, "initial_weights": initial, "data": data, "batches": batches, "steps": steps,
        "metrics": metrics, "environment": env, "files": files or [], "impact": impact,
    }
