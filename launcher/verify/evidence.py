"""What a verdict can prove: which files are evidence of training, and whether determinism was in force.

Every artifact is classed by kind from its path alone (one place, :func:`kind_of`): the trained
model or its weights, checkpoints, predictions, metrics, logs, launcher's own records, other.
Two runs that agree prove reproducibility only when something training produced was compared
(:data:`TRAINING_KINDS`) and their determinism was in force; otherwise the verdict is
*inconclusive* (exit 37) and says what to save or change (:func:`inconclusive_reasons`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import NotRequired, TypedDict

from launcher.records import rundir
from launcher.records.manifest import Manifest
from launcher.verify.contenttf import SAVED_MODEL_PB, SAVED_MODEL_PBTXT
from launcher.verify.differences import CANONICAL_MODEL, DIFFERS, IDENTICAL, IGNORED, LAYERS, UNREADABLE
from launcher.verify.formats import model_suffixes
from launcher.verify.stepdiff import is_steps

KIND_NAMED = "named evidence"  # files matching `verify checksums --evidence GLOB`
KIND_MODEL = "model"
KIND_CHECKPOINT = "checkpoint"
KIND_PREDICTIONS = "predictions"
KIND_METRICS = "metrics"
KIND_STEPS = "weight digests"  # launcher's step fingerprints of the trained parameters (fingerprints/steps.jsonl)
KIND_FIGURE = "figure"
KIND_LOGS = "logs"
KIND_RECORDS = "records"
KIND_OTHER = "other"
KINDS = (KIND_NAMED, KIND_MODEL, KIND_CHECKPOINT, KIND_PREDICTIONS, KIND_METRICS, KIND_STEPS, KIND_FIGURE,
         KIND_LOGS, KIND_RECORDS, KIND_OTHER)
# What training produced: agreeing on one of these proves something about training. A figure does not:
# it draws a result launcher cannot read back out of it.
TRAINING_KINDS = frozenset({KIND_NAMED, KIND_MODEL, KIND_CHECKPOINT, KIND_PREDICTIONS, KIND_METRICS, KIND_STEPS})

_MODEL_SUFFIXES_UNCOMPARED = (".onnx",)  # models launcher compares by bytes only; the others: launcher.verify.formats
_MODEL_FOLDERS = frozenset({"model", "models", "weights", "saved_model", "savedmodel"})
_MODEL_FILES = frozenset({CANONICAL_MODEL, LAYERS})
_CHECKPOINT_WORDS = ("checkpoint", "ckpt")
_TF_CHECKPOINT = re.compile(r"(\.index|\.data-\d+-of-\d+|\.ckpt)$|^checkpoint$")
_PREDICTION_WORDS = ("prediction", "predict", "preds")
_TABLE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl")
_METRIC_WORDS = ("metric", "history", "result", "score", "eval", "loss", "acc", "stats", "progress", "log")
_LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
_LOG_FOLDERS = frozenset({"logs", "log"})
_FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".eps", ".ps", ".jpg", ".jpeg", ".gif", ".bmp", ".tif", ".tiff", ".webp")
SAVED_MODEL_FILES = (SAVED_MODEL_PB, SAVED_MODEL_PBTXT)


def matches(path: str, globs: Iterable[str]) -> bool:
    """A glob matches the path from the run directory or from its outputs/ (``*`` crosses ``/``)."""
    rel = path.removeprefix("outputs/")
    return any(fnmatch.fnmatchcase(path, g) or fnmatch.fnmatchcase(rel, g) for g in globs)


def savedmodel_dirs(paths: Iterable[str]) -> frozenset[str]:
    """The folders (paths relative to the run) that hold a SavedModel: a saved_model.pb in them."""
    return frozenset(p.rpartition("/")[0] for p in paths if p.rpartition("/")[2] in SAVED_MODEL_FILES)


def kind_of(path: str, savedmodels: Iterable[str] = (), named: Iterable[str] = ()) -> str:
    """The kind of evidence an artifact is (path relative to the run, e.g. ``outputs/model.keras``)."""
    if named and matches(path, named):
        return KIND_NAMED
    rel = path.removeprefix("outputs/")
    if is_steps(path):  # rank 0's, and every other rank's of a run of several processes
        return KIND_STEPS
    if path == rundir.LAUNCH or rel.startswith(("_launcher/", "fingerprints/")):
        return KIND_RECORDS
    if path in _MODEL_FILES:
        return KIND_MODEL
    pure = PurePosixPath(rel.lower())
    name, folders = pure.name, list(pure.parts[:-1])
    if name.endswith(_FIGURE_SUFFIXES) and not rel.startswith("probes/"):
        return KIND_FIGURE
    if rel.startswith("probes/") or any(w in name for w in _PREDICTION_WORDS):
        return KIND_PREDICTIONS
    if any(w in part for part in [*folders, pure.stem] for w in _CHECKPOINT_WORDS):
        return KIND_CHECKPOINT
    if any(path == d or path.startswith(d + "/") for d in savedmodels):
        return KIND_MODEL
    if name.endswith((*model_suffixes(), *_MODEL_SUFFIXES_UNCOMPARED)) or _MODEL_FOLDERS & set(folders):
        return KIND_MODEL
    if _TF_CHECKPOINT.search(name):
        return KIND_CHECKPOINT
    if name.startswith("events.out.tfevents") or "metrics" in folders:
        return KIND_METRICS
    if name.endswith(_TABLE_SUFFIXES) and any(w in pure.stem for w in _METRIC_WORDS):
        return KIND_METRICS
    if name.endswith(_LOG_SUFFIXES) or _LOG_FOLDERS & set(folders) or name in ("stdout", "stderr"):
        return KIND_LOGS
    return KIND_OTHER


def classify(paths: Iterable[str], named: Iterable[str] = ()) -> dict[str, str]:
    """Path -> kind for every path, SavedModel folders recognised from their saved_model.pb."""
    paths = list(paths)
    roots = savedmodel_dirs(paths)
    named = list(named)
    return {p: kind_of(p, roots, named) for p in paths}


# ---------------------------------------------------------------- determinism

DETERMINISTIC_PROFILES = ("strict", "deterministic", "seeded")
CAUSE_IN_FORCE = "in-force"
CAUSE_PROFILE_OFF = "profile-off"
CAUSE_NO_FRAMEWORK = "no-framework"
CAUSE_NOT_APPLIED = "not-applied"
_NO_FRAMEWORK = ("no known framework was imported (TensorFlow/Keras, PyTorch, JAX): only Python and NumPy "
                 "were seeded")
_DETERMINISM_FIX = {
    CAUSE_PROFILE_OFF: "run again with `--determinism deterministic` (the default) or `--determinism seeded`",
    CAUSE_NO_FRAMEWORK: "if the script trains with TensorFlow/Keras, PyTorch or JAX, make sure the run imports it "
                        "(launcher applies determinism when it is imported); with Python and NumPy alone, launcher "
                        "cannot guarantee more than their seeds",
    CAUSE_NOT_APPLIED: "run again with `--determinism deterministic`",
}


class DeterminismRecord(TypedDict):
    """A run's determinism as written in verify's JSON (``evidence.determinism.runs``)."""

    in_force: bool
    reason: str
    cause: str


@dataclass(frozen=True)
class Determinism:
    in_force: bool
    reason: str
    cause: str  # one of the CAUSE_* above

    def to_dict(self) -> DeterminismRecord:
        return {"in_force": self.in_force, "reason": self.reason, "cause": self.cause}


def frameworks_of(m: Manifest) -> list[str]:
    """The frameworks the run imported (runtime.json ``frameworks``; older runs: its one ``framework``)."""
    rt = m.runtime
    found = rt.get("frameworks")
    if isinstance(found, list):
        return [str(f) for f in found]
    fw = rt.get("framework")
    return [str(fw["name"])] if isinstance(fw, dict) and fw.get("name") else []


def determinism_of(m: Manifest) -> Determinism:
    """Whether determinism was in force in a run, and why (runtime.json ``determinism``; for older
    runs: a seeding profile and a framework the runtime applied it to)."""
    rt = m.runtime
    profile = str(rt.get("profile") or m.determinism.get("profile") or "off")
    frameworks = frameworks_of(m)
    rec = rt.get("determinism")
    if isinstance(rec, Mapping) and isinstance(rec.get("in_force"), bool):
        in_force, reason = bool(rec["in_force"]), str(rec.get("reason") or "")
    else:
        in_force = profile in DETERMINISTIC_PROFILES and isinstance(rt.get("framework"), dict)
        reason = ""
    if in_force:
        cause = CAUSE_IN_FORCE
        reason = reason or f"profile {profile} applied to {', '.join(frameworks) or 'the framework'}"
    elif profile not in DETERMINISTIC_PROFILES:
        cause = CAUSE_PROFILE_OFF
        reason = reason or f"profile {profile}: nothing was seeded or made deterministic"
    elif not frameworks:
        cause = CAUSE_NO_FRAMEWORK
        reason = reason or _NO_FRAMEWORK
    else:
        cause = CAUSE_NOT_APPLIED
        reason = reason or f"profile {profile} was not applied to {', '.join(frameworks)}"
    return Determinism(in_force, reason, cause)


# ---------------------------------------------------------------- evidence per kind

class KindSummary(TypedDict):
    """One kind of file in verify's JSON (``evidence.kinds``): how many, how many compared, and the outcome."""

    files: int
    compared: int
    identical: int
    differs: int
    unreadable: int
    ignored: int
    outcome: str  # one of the OUTCOME_* below
    training: bool  # the kind is something training produced


class Inconclusive(TypedDict):
    """Why runs that agree prove nothing, with the fix (``inconclusive`` in verify's JSON)."""

    reason: str  # no-evidence | determinism
    line: str
    fix: str
    runs: NotRequired[list[str]]  # determinism: the runs it was not in force in


ROW_ALONE = "alone"  # a row of a run checked alone: held, not compared

OUTCOME_IDENTICAL = "identical"
OUTCOME_DIFFERS = "differs"
OUTCOME_PARTLY = "partly compared"
OUTCOME_NOT_COMPARED = "not compared"
OUTCOME_ALONE = "checked alone"


@dataclass(frozen=True)
class RowOutcome:
    """One artifact row reduced to what evidence needs: its kind and how it compared."""

    path: str
    kind: str
    outcome: str  # identical | differs | unreadable | ignored (the artifact statuses) | ROW_ALONE
    reason: str | None = None  # why it was not compared (unreadable or ignored)
    fix: str | None = None
    proves: str | None = None  # identical: what it proves about training, where only its content says so

    @property
    def evidence(self) -> bool:
        """Compared (or held alone) and, for launcher's weight digests, showing training: weights that moved."""
        if self.kind not in TRAINING_KINDS or self.outcome not in (IDENTICAL, DIFFERS, ROW_ALONE):
            return False
        return self.kind != KIND_STEPS or self.outcome != IDENTICAL or self.proves is not None


def kinds_summary(rows: Sequence[RowOutcome], alone: bool = False) -> dict[str, KindSummary]:
    """Per kind, in KINDS order: how many files, how many were compared, and the kind's outcome."""
    out: dict[str, KindSummary] = {}
    for kind in KINDS:
        mine = [r for r in rows if r.kind == kind]
        if not mine:
            continue
        count = {o: sum(r.outcome == o for r in mine) for o in (IDENTICAL, DIFFERS, UNREADABLE, IGNORED)}
        compared = count[IDENTICAL] + count[DIFFERS]
        if alone:
            outcome = OUTCOME_ALONE
        elif count[DIFFERS]:
            outcome = OUTCOME_DIFFERS
        elif not compared:
            outcome = OUTCOME_NOT_COMPARED
        else:
            outcome = OUTCOME_IDENTICAL if compared == len(mine) - count[IGNORED] else OUTCOME_PARTLY
        out[kind] = {"files": len(mine), "compared": compared, "identical": count[IDENTICAL],
                     "differs": count[DIFFERS], "unreadable": count[UNREADABLE], "ignored": count[IGNORED],
                     "outcome": outcome, "training": kind in TRAINING_KINDS}
    return out


SAVE_HINT = ("save the model: `--save-model` if the script has one, `model.save(\"model.keras\")` in Keras, "
             "`torch.save(model.state_dict(), \"model.pt\")` in PyTorch, into the run's working directory or "
             "$LAUNCHER_OUT; or name the file that holds the result with `launcher verify checksums --evidence GLOB`")


def _names(rows: Sequence[RowOutcome], limit: int = 3) -> str:
    names = [r.path.removeprefix("outputs/") for r in rows[:limit]]
    return ", ".join(names) + (f" and {len(rows) - limit} more" if len(rows) > limit else "")


def evidence_reason(rows: Sequence[RowOutcome], alone: bool = False) -> Inconclusive | None:
    """Why nothing training produced was compared (or, alone, held), with the one fix; None when something was."""
    training = [r for r in rows if r.kind in TRAINING_KINDS]
    if any(r.evidence for r in training):
        return None
    unreadable = [r for r in training if r.outcome == UNREADABLE]
    ignored = [r for r in training if r.outcome == IGNORED]
    held = sorted({r.kind for r in rows}, key=KINDS.index)
    if unreadable:
        first = unreadable[0]
        line = f"the training outputs could not be read: {_names(unreadable)} ({first.reason})"
        fix = first.fix or SAVE_HINT
    elif ignored:
        line = f"the training outputs were left out of the comparison: {_names(ignored)} ({ignored[0].reason})"
        fix = "drop the `--ignore` glob (or the recipe's `volatile` glob) that leaves them out"
    else:
        what = ("the run holds" if alone else "the runs hold") + (
            f" only {', '.join(held)}" if held else " no files")
        still = any(r.kind == KIND_STEPS and r.outcome == IDENTICAL for r in training)
        line = f"nothing that training produced was {'saved' if alone else 'compared'} ({what})" + (
            "; launcher's weight digests saw no update (the weights at the last step are those of step 0)"
            if still else "")
        fix = SAVE_HINT
    return {"reason": "no-evidence", "line": line, "fix": fix}


def determinism_reason(runs: Mapping[str, Determinism]) -> Inconclusive | None:
    """Why the runs' agreement does not prove determinism, with the fix; None when it was in force in all."""
    off = {rid: d for rid, d in runs.items() if not d.in_force}
    if not off:
        return None
    reasons = sorted({d.reason for d in off.values()})
    first = next(iter(off.values()))
    who = "the runs" if len(off) == len(runs) else f"{len(off)} of {len(runs)} runs ({', '.join(off)})"
    return {"reason": "determinism", "line": f"determinism was not in force in {who}: {'; '.join(reasons)}",
            "fix": _DETERMINISM_FIX.get(first.cause, _DETERMINISM_FIX[CAUSE_NOT_APPLIED]), "runs": list(off)}
