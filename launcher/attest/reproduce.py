"""`launcher reproduce run.bundle`: someone else's run, repeated in a fresh workspace and judged.

1. the bundle is unpacked and checked (:mod:`launcher.attest.unpack`): its signature, every file, each
   run's signed provenance against the files the reproduction uses. Nothing is built before this passes;
2. a fresh workspace is made from the bundle (the recipes as the image held them, the lock, the
   Dockerfile, images.lock), the pinned base made pullable from the bundle (:mod:`launcher.images.basearchive`);
3. the image is built with the recorded build date and git labels, and its ID compared with the one the
   run recorded: another image is refused (OTHER_IMAGE, 44) unless ``allow_other_image``, which the
   verdict then names;
4. the run is repeated (the same code, params, seed, profile, threads, script arguments, variables) on the
   target, then ``verify checksums`` compares it with the original (its outputs are in the bundle):
   identical (0), inconclusive (37) or differs (3);
5. the reproduction's own provenance is signed, and a verification summary (:mod:`launcher.attest.summary`)
   naming the original statement, the verifier, the verdict and each output's result.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from launcher import proc
from launcher.attest import dsse
from launcher.attest import statement as st
from launcher.attest.bundle import RUNS_DIR
from launcher.attest.provenance import ATTESTATION_DIR, attest_run
from launcher.attest.signers import Signer, Trust
from launcher.attest.summary import ENVELOPE_FILE, STATEMENT_FILE, OutputResult, summary
from launcher.attest.unpack import OpenedBundle, OpenedRun, open_bundle
from launcher.errors import ExitCode, NotFound, OtherImage, RunFailed, UsageError
from launcher.hashing import atomic_write_bytes, sha256_file
from launcher.hosts import engine
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.images import basearchive, imagerecord, registry
from launcher.images.build import PACKAGE_DIR, build
from launcher.images.tree import DEFAULT_EPOCH
from launcher.progress import NullReporter, Reporter
from launcher.runs.manifest import Manifest
from launcher.runs.placement import Placement
from launcher.runs.runspec import RunSpec
from launcher.runs.userenv import secret_digest
from launcher.runtime import code as codedigest
from launcher.verify.differences import REFERENCE
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace

BUNDLE_DIR = ".launcher/bundle"  # where the bundle is unpacked inside the reproduction's workspace
_WORST = (ExitCode.OK, ExitCode.INCONCLUSIVE, ExitCode.OUTPUT_DIFFERS, ExitCode.NOT_REPRODUCIBLE)


class ImageCheck(TypedDict):
    """The rebuilt image against the recorded one (`launcher reproduce`'s JSON result: image)."""

    recorded: str
    rebuilt: str
    same: bool
    differs_in: NotRequired[str]


class ReproductionRecord(TypedDict):
    """One run of `launcher reproduce`'s JSON result."""

    original: str
    reproduced: str
    verdict: str
    exit_code: int
    summary: str
    verification: str
    outputs: dict[str, OutputResult]


@dataclass
class Reproduction:
    original: str
    reproduced: str
    verdict: str
    exit_code: ExitCode
    line: str
    summary_path: Path
    results: dict[str, OutputResult]

    def to_dict(self) -> ReproductionRecord:
        return {"original": self.original, "reproduced": self.reproduced, "verdict": self.verdict,
                "exit_code": int(self.exit_code), "summary": self.line, "verification": str(self.summary_path),
                "outputs": self.results}


class ReproduceOutcomeRecord(TypedDict):
    """`reproduce`'s Result data: the bundle, the rebuilt image against the recorded one, and each run."""

    bundle: str
    workspace: str
    image: ImageCheck
    base: str
    signed_by: list[str]
    runs: list[ReproductionRecord]


@dataclass
class ReproduceOutcome:
    bundle: Path
    workspace: Path
    image: ImageCheck
    base: str
    runs: list[Reproduction] = field(default_factory=list)
    signed_by: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return max((r.exit_code for r in self.runs), key=_WORST.index, default=ExitCode.OK)

    def to_dict(self) -> ReproduceOutcomeRecord:
        return {"bundle": str(self.bundle), "workspace": str(self.workspace), "image": self.image, "base": self.base,
                "signed_by": self.signed_by, "runs": [r.to_dict() for r in self.runs]}

    def summary_line(self) -> str:
        rebuilt, recorded = self.image["rebuilt"][7:19], self.image["recorded"][7:19]
        image = "" if self.image["same"] else (f"; in another image than the recorded one ({rebuilt} for {recorded}, "
                                               "--allow-other-image)")
        return "; ".join(f"{r.original} reproduced as {r.reproduced}: {r.line}" for r in self.runs) + image


def _fresh(into: Path) -> None:
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise UsageError(f"{into} exists and is not empty: a reproduction starts in a fresh workspace",
                         "give another folder with --into DIR, or remove that one")
    into.mkdir(parents=True, exist_ok=True)


def _choose(opened: OpenedBundle, only: str | None) -> list[OpenedRun]:
    runs = [r for r in opened.runs
            if only is None or r.run_id.startswith(only) or r.run_id.rsplit("-", 1)[-1].startswith(only)]
    if not runs:
        raise NotFound(f"the bundle holds no run {only!r}", "its runs: " + ", ".join(r.run_id for r in opened.runs))
    if len({r.image for r in runs}) > 1:
        raise UsageError(f"the bundle's runs used {len({r.image for r in runs})} images; one reproduction rebuilds one",
                         "reproduce them one at a time with --run RUN")
    return runs


def _workspace(opened: OpenedBundle, run: OpenedRun, into: Path, cache_dir: Path | None) -> Workspace:
    """The fresh workspace: the bundle's recipes, lockfiles and Dockerfile for the run's variant."""
    src = opened.image_dir(run.image)
    shutil.copytree(src / "recipes", into / "recipes")
    shutil.copytree(src / "lockfiles", into / "lockfiles")
    shutil.copytree(src / "dockerfiles", into / "dockerfiles")
    variant = str(run.image_facts["variant"])
    if not (into / "lockfiles" / f"{variant}.in").is_file():  # a variant is a .in and a Dockerfile
        (into / "lockfiles" / f"{variant}.in").write_text(f"# locked in {variant}.txt (from a bundle)\n")
    (into / RUNS_DIR).mkdir()
    return Workspace.at(into, cache_dir)


def _preflight(run: OpenedRun, *, allow_other_image: bool, data_from: Path | None,
               secret_env: Mapping[str, str]) -> None:
    """What would make the reproduction pointless or impossible, said before anything is built."""
    facts = run.image_facts
    if facts.get("project"):
        raise UsageError(f"run {run.run_id} ran in its project's own image layer (requirements.lock, system.lock), "
                         "which this launcher cannot rebuild from a bundle yet", "reproduce it with a launcher that "
                         "has project layers, or rerun the project by hand from the bundled code and locks")
    runtime = codedigest.runtime_digest(PACKAGE_DIR)
    if runtime != facts.get("runtimeDigest") and not allow_other_image:
        version = facts.get("launcherVersion") or "the author's"
        raise OtherImage(f"this launcher's in-container runtime ({runtime[7:19]}) is not the one image "
                         f"{str(facts['variantImageId'])[7:19]} holds ({str(facts.get('runtimeDigest'))[7:19]}): "
                         "the rebuilt image would differ", f"use launcher {version} (pip install it in a venv), or "
                         "pass --allow-other-image to run it anyway")
    env = run.manifest.data.get("env") if isinstance(run.manifest.data.get("env"), dict) else {}
    for name, rec in sorted((env or {}).items()):
        if "sha256" in rec:
            if name not in secret_env:
                raise UsageError(f"run {run.run_id} was given the secret variable {name} (recorded by its sha256 only)",
                                 f"pass it: --secret-env {name} (its value from your environment, checked against "
                                 "that sha256)")
            if secret_digest(secret_env[name]) != rec["sha256"]:
                raise UsageError(f"--secret-env {name}: the value differs from the one the run was given "
                                 "(its sha256)", f"ask the author for {name}'s value")
    if run.manifest.data.get("data") and run.data is None and data_from is None:
        raise UsageError(f"run {run.run_id} read a dataset, which the bundle does not carry",
                         "pass --data-from DIR (the same files: verify compares the dataset's fingerprint), or ask "
                         "for a bundle made --with-data")


def _base(run: OpenedRun, ws: Workspace) -> str:
    ref = str(run.image_facts["baseRef"])

    def present(r: str) -> bool:
        return engine.image_exists(r) or basearchive.served(r)

    if run.base is None:
        if present(ref):
            return "already there"
        raise NotFound(f"the base image {ref} is neither here nor served by its registry, and the bundle was made "
                       "--without-base", "ask for a bundle with its base (without --without-base)")
    return basearchive.restore(run.base, present=present,
                               start_registry=lambda addr: registry.start_local_registry(ws.cache_dir / "registry",
                                                                                         addr))


def image_difference(recorded: bytes, rebuilt: bytes) -> str:
    """Where two image configs differ: labels by name, layers by position."""
    a, b = json.loads(recorded), json.loads(rebuilt)
    la, lb = (x.get("config", {}).get("Labels") or {} for x in (a, b))
    labels = sorted(k for k in set(la) | set(lb) if la.get(k) != lb.get(k))
    da, db = (x.get("rootfs", {}).get("diff_ids") or [] for x in (a, b))
    layers = [i for i in range(max(len(da), len(db))) if (da[i:i + 1] or [None]) != (db[i:i + 1] or [None])]
    parts = [f"labels {', '.join(labels)}"] if labels else []
    parts += [f"layers {', '.join(str(i) for i in layers)} of {len(da)}"] if layers else []
    return "; ".join(parts) or "the configs' other fields"


def _image(ws: Workspace, run: OpenedRun, config: Path, allow_other_image: bool, rep: Reporter) -> ImageCheck:
    facts = run.image_facts
    git = facts.get("git") or {}
    record = build(ws, str(facts["variant"]), git=(str(git.get("commit") or "unknown"), bool(git.get("dirty"))),
                   epoch=int(facts.get("epoch") or DEFAULT_EPOCH), reporter=rep)
    recorded = str(facts["variantImageId"])
    out: ImageCheck = {"recorded": recorded, "rebuilt": record.image_id, "same": record.image_id == recorded}
    if not out["same"]:
        rebuilt = imagerecord.find(ws.cache_dir, record.image_id)
        where = image_difference(config.read_bytes(), rebuilt.config) if rebuilt else "unknown parts"
        out["differs_in"] = where
        if not allow_other_image:
            raise OtherImage(f"the rebuilt image {record.image_id[7:19]} is not the one run {run.run_id} recorded "
                             f"({recorded[7:19]}): they differ in {where}",
                             "nothing was run; pass --allow-other-image to run it anyway (the verdict then says so)")
        rep.note(f"the rebuilt image differs from the recorded one ({where}): running in it (--allow-other-image)")
    return out


def _code(run: OpenedRun, ws: Workspace) -> Path | None:
    """The mounted code, as a folder named like the author's project (a plain script's identity is
    project/path), made its own git work tree so no ignore rule (an enclosing repository's, or its own
    .gitignore) drops a file of the snapshot; checked against the recorded digest before anything runs."""
    if run.code is None:
        return None
    target = ws.root / "code" / run.code.name
    shutil.copytree(run.code, target)
    try:  # every file staged: the snapshot is already the author's selection, ignored-but-tracked files too
        proc.run(["git", "init", "-q", target], check=False)
        proc.run(["git", "-C", target, "add", "--all", "--force", "."], check=False)
    except NotFound:  # without git, launcher lists a code folder by walking it: no ignore rule applies
        pass
    from launcher.runs import code

    entry = str(run.manifest.recipe.get("entry") or "")
    selected = code.select(target, target / entry if run.manifest.recipe.get("identity") else None)
    if selected.digest != run.manifest.recipe.get("tree_digest"):
        raise UsageError(f"the code of run {run.run_id} unpacked to {target} takes other files here "
                         f"({selected.digest[7:19]}, recorded {str(run.manifest.recipe.get('tree_digest'))[7:19]})",
                         "this should not happen: report it to launcher's maintainers with both digests")
    return target


def _record(m: Manifest, key: str) -> Mapping[str, Any]:
    """One of the manifest's records (env, probes, trace: launcher.runs.manifest), {} where it has none."""
    value = m.data.get(key)
    return value if isinstance(value, dict) else {}


def _spec(run: OpenedRun, code_dir: Path | None, data_from: Path | None, secret_env: Mapping[str, str]) -> RunSpec:
    m = run.manifest
    det = m.determinism
    env, probes, trace = (_record(m, key) for key in ("env", "probes", "trace"))
    if code_dir is None:
        recipe, code = m.recipe_name, None
    elif m.recipe.get("identity"):
        recipe, code = str(code_dir / str(m.recipe.get("entry"))), str(code_dir)
    else:
        recipe, code = str(code_dir), None
    data = run.data or data_from
    return RunSpec(recipe=recipe, variant=str(run.image_facts["variant"]), seed=m.seed,
                   profile=str(det.get("profile") or "deterministic"),
                   threads=det.get("threads") if det.get("profile") == "deterministic" else None,
                   params=dict(m.params), args=[str(a) for a in m.recipe.get("args") or []], code=code,
                   data_from=str(data) if data else None, group=f"{m.run_id}-reproduced",
                   probes=probes.get("option") if probes.get("source") == "option" else None,
                   trace_every=str(trace["every"]) if trace.get("every") else None,
                   env={k: v["value"] for k, v in env.items() if "value" in v},
                   secret_env={k: secret_env[k] for k, v in env.items() if "sha256" in v})


def _judge(ws: Workspace, run: OpenedRun, new_id: str, signer: Signer, other_image: bool) -> Reproduction:
    report = verify_checksums(ws, [run.run_id, new_id])
    cells = {a.path: a.cells.get(new_id) or {} for a in report.artifacts}
    new = {a.path: a.sha256 for a in report.runs[-1].manifest.artifacts}
    results: dict[str, OutputResult] = {
        path: {"status": cells.get(path, {}).get("status") or "missing", "sha256": new.get(path)}
        for path in st.subject_digests(run.provenance.statement, byproducts=False)}
    for rec in results.values():
        if rec["status"] == REFERENCE:
            rec["status"] = "identical"
    reproduced = attest_run(ws.runs / new_id, signer, ws.cache_dir)
    assert reproduced.envelope is not None
    rel = reproduced.envelope.relative_to(ws.root).as_posix()
    statement = summary(run.provenance, run.run_id, {"uri": rel, "envelope_sha256": sha256_file(reproduced.envelope)},
                        report.verdict, results, other_image=other_image)
    folder = ws.runs / new_id / ATTESTATION_DIR
    payload = st.encode(statement)
    atomic_write_bytes(folder / STATEMENT_FILE, payload)
    dsse.write(folder / ENVELOPE_FILE, dsse.sign(payload, st.PAYLOAD_TYPE, [signer]))
    return Reproduction(run.run_id, new_id, report.verdict, report.exit_code, report.summary_line(),
                        folder / ENVELOPE_FILE, results)


def reproduce(bundle: Path, into: Path, target: Host | Placement, *, trust: Trust, signer: Signer | None,
              host_spec: HostSpec | None = None, allow_other_image: bool = False, data_from: Path | None = None,
              secret_env: Mapping[str, str] | None = None, only: str | None = None, cache_dir: Path | None = None,
              reporter: Reporter | None = None, on_log: Callable[[str], None] | None = None) -> ReproduceOutcome:
    """Check the bundle, rebuild, rerun, verify and sign the verdict (see the module's text)."""
    from launcher.runs.lifecycle import run_recipe

    if signer is None:
        raise UsageError("a reproduction signs its verdict, and no key was given",
                         "pass --key FILE (an SSH or PEM private key), or set signing_key in launcher.toml")
    rep, secrets, into = reporter or NullReporter(), dict(secret_env or {}), into.resolve()
    if not bundle.is_file():
        raise NotFound(f"no bundle {bundle}", "give the file `launcher bundle` wrote")
    _fresh(into)
    opened = open_bundle(bundle, trust, into / BUNDLE_DIR, rep)
    runs = _choose(opened, only)
    for run in runs:
        _preflight(run, allow_other_image=allow_other_image, data_from=data_from, secret_env=secrets)
    ws = _workspace(opened, runs[0], into, cache_dir)
    base = _base(runs[0], ws)
    image = _image(ws, runs[0], opened.image_dir(runs[0].image) / "config.json", allow_other_image, rep)
    outcome = ReproduceOutcome(bundle, into, image, base, signed_by=opened.bundle.signers)
    for run in runs:
        shutil.copytree(run.folder, ws.runs / run.run_id)
        spec = _spec(run, _code(run, ws), data_from, secrets)
        done = run_recipe(ws, spec, target, rep, host_spec=host_spec, on_log=on_log)
        if done.failure is not None or done.failed:
            raise RunFailed(f"the reproduction of {run.run_id} failed: {done.failure or done.failed[0]['run_id']}",
                            "see its log with `launcher logs RUN --workspace " + str(into) + "`")
        outcome.runs.append(_judge(ws, run, str(done.runs[0]["run_id"]), signer, not image["same"]))
    return outcome
