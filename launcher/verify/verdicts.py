"""Checksum verdicts across runs, and the explanations when they differ.

``verify_checksums`` re-hashes every run's files against its own manifest (a file damaged
after the pull is Corrupt, not a difference) and checks each run against itself (its canonical
weights against its per-layer digests and its native save: a file altered after training is
Corrupt too). It then compares each artifact's sha256 with the reference run; a file whose
bytes differ is compared by its content (:mod:`launcher.verify.content`: a .keras save, an event
file, a log with times), and for every run whose content differs it explains where (model
arrays, initial weights, dataset and batch fingerprints, metrics, other outputs) and why (the
environment diff of the two manifests, reduced to a one-line classification).

Runs that agree prove something only when a file training produced was compared and their
determinism was in force (:mod:`launcher.verify.evidence`); otherwise the verdict is
``inconclusive`` (exit 37) and says what to save or change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypedDict

from launcher.errors import ExitCode, UsageError
from launcher.progress import Reporter
from launcher.records.integrity import IntegrityStats, check_integrity
from launcher.records.manifest import Manifest, describe_code
from launcher.records.store import select_runs, short_digest, skipped_in_group
from launcher.verify.artifacts import (
    VOLATILE,
    ArtifactRecord,
    ArtifactRow,
    BytesOnlyGroup,
    IgnoredGroup,
    bytes_only_groups,
    bytes_only_phrases,
    compare_artifacts,
    ignore_glob,
    ignored_groups,
    recipe_volatile,
)
from launcher.verify.classification import explain, steps_to_the_end
from launcher.verify.consistency import Consistency, check_consistency
from launcher.verify.differences import (
    BATCHES,
    CLASS_IDENTICAL,
    CLASS_OUTPUTS,
    DATASET,
    DIFFERS,
    IDENTICAL,
    IDENTICAL_CONTENT,
    INITIAL_WEIGHTS,
    METRICS,
    MISSING,
    REFERENCE,
    DifferingFile,
    Explanation,
)
from launcher.verify.evidence import (
    KIND_MODEL,
    KIND_STEPS,
    TRAINING_KINDS,
    DeterminismRecord,
    Inconclusive,
    KindSummary,
    RowOutcome,
    determinism_of,
    determinism_reason,
    evidence_reason,
    kinds_summary,
    matches,
)
from launcher.verify.formats import holds_model
from launcher.verify.impact import Tolerances
from launcher.verify.modeldiff import FirstDifference
from launcher.verify.stepdiff import STEPS
from launcher.workspace import Workspace

SCHEMA = "launcher.verify.verdicts/v1"

CONSISTENT = "consistent"  # the verdict on one run checked alone
INCONCLUSIVE = "inconclusive"  # no difference found, but nothing proven (exit 37)

# ---------------------------------------------------------------- the report (verify's JSON: docs/verify-json.md)


class RunRecord(TypedDict):
    """One run of the verdict (``runs`` in verify's JSON)."""

    run_id: str
    group: str
    replicate: int
    seed: int | None
    recipe: str
    code_name: str
    run_status: str
    status: str  # reference | identical | differs
    classification: str | None  # the explanation's kind; None for the reference
    line: str | None
    first_difference: FirstDifference | None
    identical_in_content: list[str]
    code: str


class CheckRecord(TypedDict):
    """One of the verdict's ``checks``: is this part (models, data, ...) the same in every run?"""

    all_same: bool | None  # None: no run besides the reference could be checked
    checked: int
    of: int
    differing: list[str]


class DeterminismSummary(TypedDict):
    in_force: bool
    runs: dict[str, DeterminismRecord]


class EvidenceRecord(TypedDict):
    """The verdict's ``evidence``: what was compared per kind of file, and whether determinism was in force."""

    kinds: dict[str, KindSummary]
    training: bool
    named: list[str]
    determinism: DeterminismSummary


class IntegrityRecord(TypedDict):
    files: int
    bytes: int
    ok: bool


class NotCompared(TypedDict):
    launcher: list[str]
    ignore: list[str]


class VerdictRecord(TypedDict):
    """The verdict as `launcher verify checksums --json` writes it (``SCHEMA``; docs/verify-json.md)."""

    schema: str
    verdict: str
    mode: str
    selection: str | None
    reference: str
    recipe: str
    code_name: str
    across_code: bool
    summary: str
    inconclusive: list[Inconclusive]
    evidence: EvidenceRecord
    integrity: IntegrityRecord
    consistency: dict[str, Consistency]
    checks: dict[str, CheckRecord]
    runs: list[RunRecord]
    artifacts: list[ArtifactRecord]
    explanations: dict[str, Explanation]
    bytes_only: list[BytesOnlyGroup]
    ignored: list[IgnoredGroup]
    not_compared: NotCompared
    skipped: list[dict[str, str]]


@dataclass
class RunVerdict:
    manifest: Manifest
    status: str  # reference | identical | differs
    explanation: Explanation | None = None  # differs: where and why
    content_only: list[DifferingFile] = field(default_factory=list)  # files identical in content only

    def to_dict(self) -> RunRecord:
        m = self.manifest
        exp = self.explanation
        cls = exp.get("classification") if exp else None
        kind, line = (cls.get("kind"), cls.get("line")) if cls else (CLASS_IDENTICAL, _identical_line(self))
        model = exp.get("model") if exp else None
        return {
            "run_id": m.run_id, "group": m.group, "replicate": m.replicate, "seed": m.seed,
            "recipe": m.recipe_name, "code_name": m.code_name, "run_status": m.status, "status": self.status,
            "classification": kind if self.status != REFERENCE else None,
            "line": line if self.status != REFERENCE else "reference",
            "first_difference": model.get("first_difference") if model else None,
            "identical_in_content": [f["path"] for f in self.content_only],
            "code": describe_code(m.recipe),
        }


def _identical_line(v: RunVerdict) -> str:
    if not v.content_only:
        return "identical"
    return "identical in content; bytes differ only in " + "; ".join(bytes_only_phrases(v.content_only))


@dataclass
class VerifyReport:
    reference: Manifest
    runs: list[RunVerdict]
    artifacts: list[ArtifactRow]
    integrity: IntegrityStats
    skipped: list[dict[str, str]] = field(default_factory=list)
    mode: str = "compare"  # compare | alone
    selection: str | None = None  # how the runs were chosen, when not named
    consistency: dict[str, Consistency] = field(default_factory=dict)
    ignore: list[str] = field(default_factory=list)
    evidence_globs: list[str] = field(default_factory=list)
    across_code: bool = False

    @property
    def identical(self) -> bool:
        """No compared file differs (which proves something only when not ``inconclusive``)."""
        return all(r.status in (REFERENCE, IDENTICAL) for r in self.runs)

    @property
    def inconclusive(self) -> list[Inconclusive]:
        """Why runs that agree prove nothing (no training output compared, determinism not in force); [] else."""
        if self.mode == "alone" or not self.identical:
            return []
        found = [evidence_reason(self.outcomes()),
                 determinism_reason({r.manifest.run_id: determinism_of(r.manifest) for r in self.runs})]
        return [x for x in found if x is not None]

    @property
    def outputs_only(self) -> bool:
        """Runs differ, each only in outputs training does not decide: its model, metrics and weight digests
        agree, and no file of a training kind (a model, checkpoint, metrics, predictions) differs."""
        exps = [r.explanation for r in self.differing]
        return bool(exps) and all(e is not None and e["classification"]["kind"] == CLASS_OUTPUTS
                                  and not any(f.get("kind") in TRAINING_KINDS for f in e["files"]) for e in exps)

    @property
    def exit_code(self) -> ExitCode:
        if not self.identical:
            return ExitCode.OUTPUT_DIFFERS if self.outputs_only else ExitCode.NOT_REPRODUCIBLE
        return ExitCode.INCONCLUSIVE if self.inconclusive else ExitCode.OK

    def by_digests(self) -> str | None:
        """What launcher's weight digests prove, when they are the only evidence of training compared."""
        evidence = [r for r in self.outcomes() if r.evidence]
        if evidence and all(r.kind == KIND_STEPS for r in evidence):
            return evidence[0].proves
        return None

    @property
    def differing(self) -> list[RunVerdict]:
        return [r for r in self.runs if r.status == DIFFERS]

    @property
    def verdict(self) -> str:
        if self.mode == "alone":
            return CONSISTENT
        if not self.identical:
            return DIFFERS
        return INCONCLUSIVE if self.inconclusive else IDENTICAL

    def outcomes(self) -> list[RowOutcome]:
        return [a.outcome(self.reference.run_id, self.mode == "alone") for a in self.artifacts]

    def _code_tail(self) -> str:
        """The runs ran other code (only with --across-code): say which part, and in which runs."""
        tail = ""
        for index, what in ((0, "code name"), (1, "code"), (2, "recipe library")):
            ref_value = self.reference.code_key[index]
            by_code: dict[str, list[str]] = {}
            for r in self.runs:
                if r.manifest.code_key[index] != ref_value:
                    by_code.setdefault(str(r.manifest.code_key[index]), []).append(r.manifest.run_id)
            if by_code:
                show: Callable[[object], str] = str if index == 0 else short_digest
                where = [f"{show(c)} in " + (ids[0] if len(ids) == 1 else f"{len(ids)} runs")
                         for c, ids in sorted(by_code.items())[:3]]
                tail += f"; the {what} differs ({show(ref_value)} in {self.reference.run_id}, " + ", ".join(where) + ")"
        if tail and not self.identical:
            tail += ": the difference may come from the code"
        return tail

    def summary_line(self) -> str:
        n = len(self.runs)
        ref = self.reference.run_id
        prefix = f"{self.selection}: " if self.selection else ""
        if self.mode == "alone":
            return prefix + self._alone_line()
        skipped = [a for a in self.artifacts if not a.checked
                   and any(c["status"] not in (REFERENCE, IDENTICAL) for c in a.cells.values())]
        names = [a.path.removeprefix("outputs/") for a in skipped]
        files = "1 file" if len(skipped) == 1 else f"{len(skipped)} files"
        tail = (f"; {files} left out of the comparison differ{'s' if len(skipped) == 1 else ''} in bytes "
                f"({', '.join(names[:3])}"
                + (f" and {len(names) - 3} more" if len(names) > 3 else "") + ")") if skipped else ""
        tail += self._code_tail()
        if not self.identical:
            return prefix + self._differs_line() + tail
        reasons = self.inconclusive
        if reasons:
            # with nothing of training compared there is no output to call identical, only no difference
            found = "no difference found" if any(x["reason"] == "no-evidence" for x in reasons) else "identical outputs"
            return (f"{prefix}inconclusive: {found}{tail}; but " + " and ".join(x["line"] for x in reasons)
                    + "; fix: " + "; and ".join(x["fix"] for x in reasons))
        content = list({f["path"]: f for r in self.runs for f in r.content_only}.values())
        digests = self.by_digests()
        how = f" by {digests}" if digests else ""
        if not content:
            return f"{prefix}identical{how}: all {n} runs are bit-identical to {ref}{tail}"
        return (f"{prefix}identical in content{how}: all {n} runs match {ref}; bytes differ only in volatile parts: "
                + "; ".join(bytes_only_phrases(content)) + tail)

    def _differs_line(self) -> str:
        """How many runs differ, in what; an output alone, or launcher's weight digests, said as such."""
        n, ref = len(self.runs), self.reference.run_id
        differing = [r for r in self.differing if r.explanation]
        if self.outputs_only and differing:
            first = differing[0].explanation
            assert first is not None
            return f"{first['classification']['line']} ({len(self.differing)} of {n - 1} runs against {ref})"
        kinds = sorted({r.explanation["classification"]["kind"] for r in differing if r.explanation})
        found = {str(f["path"]): f for r in differing if r.explanation for f in r.explanation.get("files") or []}
        steps = found.pop(STEPS, None)
        if steps is not None and not any(f.get("kind") in TRAINING_KINDS for f in found.values()):
            content = steps.get("content")
            said = (content["difference"] if content else None) or "they differ"
            return (f"{len(self.differing)} of {n - 1} runs differ from {ref} by launcher's weight digests "
                    f"({', '.join(kinds)}): {said}" + (f"; content differs also in {_named(found)}" if found else ""))
        named = _named(found) + ("" if steps is None else (", " if found else "") + "launcher's weight digests")
        return (f"{len(self.differing)} of {n - 1} runs differ from {ref} ({', '.join(kinds)}): "
                f"content differs in {named}")

    def _alone_line(self) -> str:
        ref = self.reference.run_id
        cons = self.consistency.get(ref)
        parts = [f"{self.integrity.files} files match its manifest"]
        matched = ["weights/layers.json"] if cons is not None and cons.get("layers") else []
        native = cons.get("native") if cons is not None else None
        if native is not None and native.get("ok"):
            matched.append(f"its native save {str(native['source']).removeprefix('outputs/')}")
        if matched:
            parts.append("canonical weights match " + " and ".join(matched))
        line = f"consistent: run {ref} checked alone: " + ", ".join(parts)
        none = evidence_reason(self.outcomes(), alone=True)
        return line + (f"; it holds no evidence of training: {none['line']}; fix: {none['fix']}" if none else "")

    def checks(self) -> dict[str, CheckRecord]:
        """Models, initial weights, training data, batches, metrics: all the same as the reference?"""
        others = [r for r in self.runs if r.status != REFERENCE]
        out: dict[str, CheckRecord] = {}
        paths = {a.path for a in self.reference.artifacts}  # a byte-identical run proves only what was recorded
        recorded = {"initial_weights": INITIAL_WEIGHTS in paths, "data": DATASET in paths,
                    "batches": BATCHES in paths, "metrics": METRICS in paths}
        for name, key in (("models", "model"), ("initial_weights", "initial_weights"),
                          ("data", "data"), ("batches", "batches"), ("metrics", "metrics")):
            checked, differing = 0, []
            for r in others:
                if r.status == IDENTICAL:
                    checked += self._model_compared(r.manifest.run_id) if key == "model" else recorded[key]
                    continue
                same = _part_same(r.explanation, key)
                if same is None:  # not recorded, or could not be read
                    continue
                checked += 1
                if not same:
                    differing.append(r.manifest.run_id)
            # all_same is None when no run besides the reference could be checked.
            out[name] = {"all_same": (not differing) if checked else None, "checked": checked + 1,
                         "of": len(self.runs), "differing": differing}
        return out

    def _model_compared(self, run_id: str) -> bool:
        """A model file of a format launcher reads was compared (not unreadable) with the reference's, or the
        model's weight digests to the last step, where they show training (launcher.verify.stepevidence)."""
        if any(a.path == STEPS and a.checked and ((a.cells.get(run_id) or {}).get("content") or {}).get("evidence")
               for a in self.artifacts):
            return True
        return any(a.checked and holds_model(a.path) and a.kind == KIND_MODEL
                   and (a.cells.get(run_id) or {}).get("status") in (IDENTICAL, IDENTICAL_CONTENT)
                   for a in self.artifacts)

    def evidence(self) -> EvidenceRecord:
        determinism = {r.manifest.run_id: determinism_of(r.manifest) for r in self.runs}
        outcomes = self.outcomes()
        return {"kinds": kinds_summary(outcomes, alone=self.mode == "alone"),
                "training": evidence_reason(outcomes, alone=self.mode == "alone") is None,
                "named": list(self.evidence_globs),
                "determinism": {"in_force": all(d.in_force for d in determinism.values()),
                                "runs": {rid: d.to_dict() for rid, d in determinism.items()}}}

    def to_dict(self) -> VerdictRecord:  # verify's Result data
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "mode": self.mode,
            "selection": self.selection,
            "reference": self.reference.run_id,
            "recipe": self.reference.recipe_name,
            "code_name": self.reference.code_name,
            "across_code": self.across_code,
            "summary": self.summary_line(),
            "inconclusive": self.inconclusive,
            "evidence": self.evidence(),
            "integrity": {"files": self.integrity.files, "bytes": self.integrity.bytes, "ok": True},
            "consistency": self.consistency,
            "checks": self.checks(),
            "runs": [r.to_dict() for r in self.runs],
            "artifacts": [a.to_dict() for a in self.artifacts],
            "explanations": {r.manifest.run_id: r.explanation for r in self.runs
                             if r.status == DIFFERS and r.explanation is not None},
            "bytes_only": bytes_only_groups([f for r in self.runs for f in r.content_only]),
            "ignored": ignored_groups(self.artifacts),
            "not_compared": {"launcher": list(VOLATILE), "ignore": list(self.ignore)},
            "skipped": self.skipped,
        }


def _named(files: dict[str, DifferingFile]) -> str:
    names = sorted(p.removeprefix("outputs/") for p in files)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _part_same(exp: Explanation | None, part: str) -> bool | None:
    """Whether one part of an explanation (model, initial_weights, data, batches, metrics) found the
    run the same as the reference; None where it was not recorded or could not be read."""
    if exp is None:
        return None
    if part == "model":
        model, steps = exp.get("model"), exp.get("steps")
        if model is None and steps is not None and steps.get("same") is not None:  # the weight digests say it
            return steps_to_the_end(steps)
        return None if model is None else model.get("identical")
    found = {"initial_weights": exp.get("initial_weights"), "data": exp.get("data"), "batches": exp.get("batches"),
             "metrics": exp.get("metrics")}[part]
    return None if found is None else found.get("same")


def _run_files(rows: list[ArtifactRow], run_id: str, statuses: tuple[str, ...]) -> list[DifferingFile]:
    out: list[DifferingFile] = []
    for row in rows:
        cell = row.cells.get(run_id) or {}
        if row.checked and cell.get("status") in statuses:
            entry: DifferingFile = {"path": row.path, "status": cell["status"], "content": cell.get("content"),
                                    "kind": row.kind}
            if cell["status"] == MISSING:
                entry["ignore"] = ignore_glob(row.path)
            if cell.get("hint"):
                entry["hint"] = cell["hint"]
            out.append(entry)
    return out


def _check_evidence_globs(runs: list[Manifest], globs: list[str]) -> None:
    for glob in globs:
        if not any(matches(a.path, [glob]) for m in runs for a in m.artifacts):
            raise UsageError(f"--evidence {glob!r} matches no file in the runs compared "
                             f"({', '.join(m.run_id for m in runs)})",
                             f"give a glob of a file under outputs/ (e.g. 'model.keras', 'checkpoints/*.pt'; "
                             f"* crosses /): the run's files are under {runs[0].run_dir / 'outputs'}")


def verify_checksums(ws: Workspace, run_ids: list[str] | None = None, against: str | None = None,
                     group: str | None = None, reporter: Reporter | None = None,
                     explainer: Callable[..., Explanation] = explain,
                     ignore: Iterable[str] = (), tolerances: Tolerances | None = None,
                     evidence: Iterable[str] = (), across_code: bool = False) -> VerifyReport:
    """Compare runs by content: the named runs (or the latest group) against the first or ``against``.

    One run (named alone, or the only run of its code) is checked alone: against its manifest and
    its own records. ``ignore``: globs of files listed but not compared; ``evidence``: globs of
    files that hold the result of training (compared as such); ``across_code``: compare runs of
    different code (refused otherwise).
    """
    sel = select_runs(ws, run_ids, against, group, across_code=across_code)
    ref, runs = sel.reference, sel.runs
    ignore, named = list(ignore), list(evidence)
    _check_evidence_globs(runs, named)
    skipped = [] if run_ids else skipped_in_group(ws, runs[-1].group if group is None else group)
    stats = check_integrity(runs, reporter)
    consistency = {m.run_id: check_consistency(m) for m in runs}
    recipe_globs = sorted({g for m in runs for g in recipe_volatile(ws, m)})
    rows, differs = compare_artifacts(ref, runs, recipe_globs, ignore, named)
    verdicts = [RunVerdict(ref, REFERENCE)]
    for m in runs[1:]:
        if differs[m.run_id]:
            if reporter is not None:
                reporter.note(f"{m.run_id} differs from {ref.run_id}: explaining")
            files = _run_files(rows, m.run_id, (DIFFERS, MISSING))
            verdicts.append(RunVerdict(m, DIFFERS, explainer(ref, m, files=files, tolerances=tolerances)))
        else:
            verdicts.append(RunVerdict(m, IDENTICAL, content_only=_run_files(rows, m.run_id, (IDENTICAL_CONTENT,))))
    return VerifyReport(reference=ref, runs=verdicts, artifacts=rows, integrity=stats, skipped=skipped,
                        mode="alone" if sel.alone else "compare", selection=sel.note, consistency=consistency,
                        ignore=ignore, evidence_globs=named, across_code=across_code)
