"""`launcher reproduce run.bundle`: someone else's run, repeated in a fresh workspace and judged.

1. the bundle is unpacked and checked (:mod:`launcher.attest.unpack`): its signature, every file, each
   run's signed provenance against the files the reproduction uses. Nothing is built before this passes;
2. a fresh workspace is made from the bundle (the recipes as the image held them, the lock, the
   Dockerfile, images.lock: each checked against the provenance or the image config it names; not a
   lock's .in, which no image is built from), the pinned base made pullable from the bundle
   (:mod:`launcher.images.basearchive`);
3. the image is built with the build date and git labels of the recorded image's config, and its ID
   compared with the one the run recorded: another image is refused (OTHER_IMAGE, 44) unless
   ``allow_other_image``, which the verdict then names (and which cannot pass);
4. the run is repeated (the same code, params, seed, profile, threads, script arguments, variables) on the
   target, then ``verify checksums`` compares it with the original (its outputs are in the bundle):
   identical (0), inconclusive (37) or differs (3). The bundled code is copied (the files its digest
   covers, nothing else) and planned here, without git: git never runs on a stranger's code, whose
   configuration or hooks it would obey;
5. the reproduction's own provenance is signed, and a verification summary (:mod:`launcher.attest.summary`)
   naming the original statement, the verifier's key, the verdict and each output's result.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from launcher.attest import dsse
from launcher.attest import statement as st
from launcher.attest.bundle import RUNS_DIR
from launcher.attest.provenance import ATTESTATION_DIR, attest_run
from launcher.attest.signers import Signer, Trust
from launcher.attest.summary import ENVELOPE_FILE, STATEMENT_FILE, OutputResult, summary
from launcher.attest.unpack import OpenedBundle, OpenedRun, open_bundle
from launcher.errors import Corrupt, DigestMismatch, ExitCode, NotFound, OtherImage, RunFailed, UsageError
from launcher.hashing import atomic_write_bytes, sha256_file
from launcher.hosts import dockerapi
from launcher.hosts.base import Host
from launcher.hosts.hostspec import HostSpec
from launcher.images import basearchive, imagerecord, registry
from launcher.images.build import PACKAGE_DIR, build
from launcher.images.tree import DEFAULT_EPOCH
from launcher.progress import NullReporter, Reporter
from launcher.records.manifest import Manifest
from launcher.records.records import BAKED, CodePlan
from launcher.runtime import code as codedigest
from launcher.specs.request import RunRequest, probes_option, trace_option
from launcher.targets.placement import Placement
from launcher.verify.differences import REFERENCE
from launcher.verify.verdicts import verify_checksums
from launcher.workspace import Workspace, default_cache_dir

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
    trusted: list[dict[str, str]]  # what the bundle's signatures were checked against (Trust.roots())
    runs: list[ReproductionRecord]


@dataclass
class ReproduceOutcome:
    bundle: Path
    workspace: Path
    image: ImageCheck
    base: str
    runs: list[Reproduction] = field(default_factory=list)
    signed_by: list[str] = field(default_factory=list)
    trusted: list[dict[str, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return max((r.exit_code for r in self.runs), key=_WORST.index, default=ExitCode.OK)

    def to_dict(self) -> ReproduceOutcomeRecord:
        return {"bundle": str(self.bundle), "workspace": str(self.workspace), "image": self.image, "base": self.base,
                "signed_by": self.signed_by, "trusted": self.trusted, "runs": [r.to_dict() for r in self.runs]}

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
    """The fresh workspace: the bundle's recipes, the variant's lock, images.lock and Dockerfile (each checked
    when the bundle was opened). A lock's .in is no input of the image: an older bundle's is left out."""
    src = opened.image_dir(run.image)
    variant = str(run.image_facts["variant"])
    shutil.copytree(src / "recipes", into / "recipes")
    (into / "lockfiles").mkdir()
    (into / "dockerfiles").mkdir()
    for part in (f"lockfiles/{variant}.txt", "lockfiles/images.lock", f"dockerfiles/{variant}.Dockerfile"):
        shutil.copyfile(src / part, into / part)
    (into / "lockfiles" / f"{variant}.in").write_text(f"# locked in {variant}.txt (from a bundle)\n")
    (into / RUNS_DIR).mkdir()
    return Workspace.at(into, cache_dir)


def _secrets(run: OpenedRun, secret_env: Mapping[str, str], salts: Path) -> list[str]:
    """The run's --secret-env variables: each given, and the same value where this machine can tell (the
    machine that ran it keeps each run's salt); notes for those it cannot check."""
    from launcher.specs import userenv

    notes = []
    env = run.manifest.data.get("env") if isinstance(run.manifest.data.get("env"), dict) else {}
    for name, rec in sorted((env or {}).items()):
        if not isinstance(rec, dict) or not userenv.is_name(name) or userenv.reserved_reason(name):
            raise Corrupt(f"run {run.run_id} records an environment variable {name!r} launcher would refuse",
                          "do not use this bundle: launcher never records such a variable")
        if not userenv.is_secret(rec):
            continue
        if name not in secret_env:
            raise UsageError(f"run {run.run_id} was given the secret variable {name} (its value is not recorded)",
                             f"pass it: --secret-env {name} (its value from your environment; ask the author)")
        same = userenv.secret_matches(secret_env[name], rec, userenv.find_salt(salts, run.run_id))
        if same is False:
            raise UsageError(f"--secret-env {name}: the value differs from the one the run was given",
                             f"ask the author for {name}'s value")
        if same is None:
            notes.append(f"--secret-env {name}: not checked against the run's record (its salt stays on the machine "
                         "that ran it); a wrong value shows as outputs that differ")
    return notes


def _preflight(run: OpenedRun, *, allow_other_image: bool, data_from: Path | None,
               secret_env: Mapping[str, str], salts: Path | None = None) -> list[str]:
    """What would make the reproduction pointless or impossible, said before anything is built; notes for
    what cannot be checked here."""
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
    notes = _secrets(run, secret_env, salts or default_cache_dir())
    if run.manifest.data.get("data") and run.data is None and data_from is None:
        raise UsageError(f"run {run.run_id} read a dataset, which the bundle does not carry",
                         "pass --data-from DIR (the same files: verify compares the dataset's fingerprint), or ask "
                         "for a bundle made --with-data")
    if data_from is not None and run.data is None:
        _same_data(run, data_from)
    return notes


def _same_data(run: OpenedRun, data_from: Path) -> None:
    """--data-from holds the dataset the run's provenance names (where it names one)."""
    from launcher.attest import provenance as prov
    from launcher.transfers.datasets import scan

    dep = st.dependency(run.provenance.statement, prov.DATASET)
    want = st.from_digest_set(dep.get("digest")) if dep else None
    got = scan(data_from).digest
    if want is not None and got != want:
        raise DigestMismatch(f"--data-from {data_from}: these files ({got[7:19]}) are not the dataset run "
                             f"{run.run_id} was sent ({want[7:19]}), which its signed provenance names",
                             "give the same files (ask the author, or for a bundle made --with-data)")


def _base(run: OpenedRun, ws: Workspace) -> str:
    ref = str(run.image_facts["baseRef"])

    def present(r: str) -> bool:
        return dockerapi.image_exists(r) or basearchive.served(r)

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
    """The image rebuilt with the git labels and build date of the recorded image's config (which the
    provenance names by its sha256), and compared with it."""
    facts = run.image_facts
    recorded = str(facts["variantImageId"])
    original = imagerecord.BuiltImage(recorded, config.read_bytes(), None)
    record = build(ws, str(facts["variant"]), git=original.git, epoch=original.epoch or DEFAULT_EPOCH, reporter=rep)
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


def _code(run: OpenedRun, ws: Workspace) -> CodePlan | None:
    """The mounted code's plan, made here without git (git obeys a repository's own configuration and
    hooks, and this is a stranger's code): the files its digest covers, copied to a folder named like the
    author's project (a plain script's identity is project/path) and snapshotted by that digest, which
    must be the recorded one before anything runs. None for a baked recipe."""
    if run.code is None:
        return None
    from launcher.specs.code import CodeTree, snapshot

    files = tuple(rel for rel, _ in codedigest.iter_files(run.code))
    target = ws.root / "code" / run.code.name
    for rel in files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run.code / rel, target / rel)
    digest = codedigest.digest_lines([codedigest.file_line(rel, target / rel) for rel in files])
    recorded = str(run.manifest.recipe.get("tree_digest"))
    if digest != recorded:
        raise DigestMismatch(f"the code of run {run.run_id} copied to {target} is not the code it ran "
                             f"({digest[7:19]}, recorded {recorded[7:19]})", "nothing was run; make the bundle again")
    entry = str(run.manifest.recipe.get("entry") or "") if run.manifest.recipe.get("identity") else ""
    tree = CodeTree(target, files, entry, digest, sum((target / rel).stat().st_size for rel in files), {})
    return tree.plan(snapshot(tree, ws.cache_dir))


def _record(m: Manifest, key: str) -> Mapping[str, Any]:
    """One of the manifest's records (env, probes, trace: launcher.records.manifest), {} where it has none."""
    value = m.data.get(key)
    return value if isinstance(value, dict) else {}


def _request(run: OpenedRun, plan: CodePlan | None, data_from: Path | None,
             secret_env: Mapping[str, str]) -> RunRequest:
    """The run as recorded, its code already planned (so nothing plans it again with git)."""
    from launcher.specs.userenv import is_secret

    m = run.manifest
    det = m.determinism
    env, probes, trace = (_record(m, key) for key in ("env", "probes", "trace"))
    code_dir = Path(str(plan["root"])) if plan is not None and plan.get("root") else None
    if code_dir is None:
        recipe, code = m.recipe_name, None
        plan = {"source": BAKED, "git": {}}  # the image's copy, checked against the recorded digest
    elif m.recipe.get("identity"):
        recipe, code = str(code_dir / str(m.recipe.get("entry"))), str(code_dir)
    else:
        recipe, code = str(code_dir), None
    data = run.data or data_from
    return RunRequest(recipe=recipe, variant=str(run.image_facts["variant"]), seed=m.seed,
                      profile=str(det.get("profile") or "deterministic"),
                      threads=det.get("threads") if det.get("profile") == "deterministic" else None,
                      params=dict(m.params), args=[str(a) for a in m.recipe.get("args") or []], code=code,
                      data_from=str(data) if data else None, group=f"{m.run_id}-reproduced",
                      probes=probes_option(probes.get("option") if probes.get("source") == "option" else None),
                      trace_every=trace_option(str(trace["every"]) if trace.get("every") else None),
                      env={k: v["value"] for k, v in env.items() if "value" in v},
                      secret_env={k: secret_env[k] for k, v in env.items() if is_secret(v)}, code_plan=plan)


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
                        report.verdict, results, other_image=other_image, verifier_key=signer.keyid())
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
    made = not into.exists()
    _fresh(into)
    try:
        opened = open_bundle(bundle, trust, into / BUNDLE_DIR, rep)
        runs = _choose(opened, only)
        notes = [n for run in runs for n in _preflight(run, allow_other_image=allow_other_image, data_from=data_from,
                                                       secret_env=secrets, salts=cache_dir)]
    except BaseException:
        if made:  # refused before anything was built: leave no folder behind
            shutil.rmtree(into, ignore_errors=True)
        raise
    for note in notes:
        rep.note(note)
    ws = _workspace(opened, runs[0], into, cache_dir)
    base = _base(runs[0], ws)
    image = _image(ws, runs[0], opened.image_dir(runs[0].image) / "config.json", allow_other_image, rep)
    outcome = ReproduceOutcome(bundle, into, image, base, signed_by=opened.bundle.signers, trusted=trust.roots())
    for run in runs:
        shutil.copytree(run.folder, ws.runs / run.run_id)
        request = _request(run, _code(run, ws), data_from, secrets)
        done = run_recipe(ws, request, target, rep, host_spec=host_spec, on_log=on_log)
        if done.failure is not None or done.failed:
            raise RunFailed(f"the reproduction of {run.run_id} failed: {done.failure or done.failed[0]['run_id']}",
                            "see its log with `launcher logs RUN --workspace " + str(into) + "`")
        outcome.runs.append(_judge(ws, run, str(done.runs[0]["run_id"]), signer, not image["same"]))
    return outcome
