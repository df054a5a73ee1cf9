"""A run's provenance: an in-toto Statement v1 whose subjects are the run's outputs (the manifest's
paths and sha256s) and whose predicate is SLSA Provenance v1, mapped from what launcher recorded.

- buildDefinition.buildType: ``urn:launcher:run:v1``;
- externalParameters: code (Manifest.code_name), recipe, entry, variant, params, seed, determinism profile
  and threads, script args, the names of the user's env variables;
- internalParameters: the environment launcher injected (the profile's), launcher's version, the probe set;
- resolvedDependencies: code tree, recipes/_lib, the variant lock, the project's locks (image.project), the
  base image, the image, launcher's runtime, the installed packages, the dataset sent and the dataset as
  the code read it (by these names: CODE, LIB, ... below);
- runDetails.builder: ``urn:launcher:<placement>:<host kind>:<host>``, launcher's version, the host's facts;
- runDetails.metadata: invocationId = run id, startedOn, finishedOn;
- runDetails.byproducts: the logs (outputs/logs/...) and manifest.json.

`launcher attest RUN...` writes it to ``runs/<id>/attestation/provenance.json`` and, signed,
``provenance.dsse.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from launcher import __version__
from launcher.attest import dsse, schema
from launcher.attest import statement as st
from launcher.attest.signers import Signer
from launcher.errors import Corrupt, DigestMismatch, UsageError
from launcher.hashing import atomic_write_bytes, sha256_file
from launcher.images import imagerecord
from launcher.images.imagerecord import BuiltImage
from launcher.progress import NullReporter, Reporter
from launcher.records.manifest import Manifest, load_manifest
from launcher.records.records import placement_kind
from launcher.records.store import resolve_run
from launcher.verify.differences import DATASET as DATASET_FINGERPRINT
from launcher.workspace import Workspace

BUILD_TYPE = f"{st.URI}:run:v1"
ATTESTATION_DIR = "attestation"
STATEMENT_FILE = "provenance.json"
ENVELOPE_FILE = "provenance.dsse.json"
BYPRODUCT_PREFIX = "outputs/logs/"

# The names of resolved dependencies, which the bundle and reproduce look up.
CODE = "code"
LIB = "recipes/_lib"
LOCK = "variant lock"
PROJECT_LOCK = "requirements.lock"
SYSTEM_LOCK = "system.lock"
BASE = "base image"
IMAGE = "image"
RUNTIME = "launcher runtime"
PACKAGES = "installed packages"
DATASET = "dataset"
DATASET_READ = "dataset as read"


class DeterminismParameters(TypedDict):
    profile: str | None
    threads: int | None


class ExternalParameters(TypedDict):
    """buildDefinition.externalParameters: what the run was asked to do."""

    code: str
    recipe: str
    entry: str | None
    codeSource: str | None
    variant: str | None
    params: dict[str, Any]  # the user's recipe params: free-form JSON
    seed: int | None
    determinism: DeterminismParameters
    args: list[str]
    env: list[str]  # the names of the user's variables (never their values)


class InternalParameters(TypedDict):
    """buildDefinition.internalParameters: what launcher added."""

    injectedEnv: dict[str, str]
    launcherVersion: str
    probes: dict[str, Any] | None  # the manifest's probe record, as the run wrote it


class BuildDefinition(TypedDict):
    buildType: str
    externalParameters: ExternalParameters
    internalParameters: InternalParameters
    resolvedDependencies: list[st.ResourceDescriptor]


class Builder(TypedDict):
    id: str
    version: dict[str, str]
    builderDependencies: NotRequired[list[st.ResourceDescriptor]]


class BuildMetadata(TypedDict):
    invocationId: str
    startedOn: str
    finishedOn: NotRequired[str]


class RunDetails(TypedDict):
    builder: Builder
    metadata: BuildMetadata
    byproducts: list[st.ResourceDescriptor]


class ProvenancePredicate(TypedDict):
    """The SLSA Provenance v1 predicate of runs/<id>/attestation/provenance.json."""

    buildDefinition: BuildDefinition
    runDetails: RunDetails


Provenance = st.Statement[ProvenancePredicate]


class AttestedRecord(TypedDict):
    """One run of `launcher attest`'s JSON result."""

    run_id: str
    statement: str
    envelope: str | None
    subjects: int
    statement_sha256: str
    keyids: list[str]


def attestation_dir(run_dir: Path) -> Path:
    return run_dir / ATTESTATION_DIR


def _digest(value: Any) -> str | None:
    text = str(value or "")
    return text if text.startswith("sha256:") and len(text) == 71 else None


def _dep(name: str, digest: Any, **annotations: Any) -> st.ResourceDescriptor | None:
    d = _digest(digest)
    notes = {k: v for k, v in annotations.items() if v not in (None, "", [], {})}
    return st.descriptor(name, d, annotations=notes) if d else None


def _dataset_read(m: Manifest) -> str | None:
    """The dataset's fingerprint as the code loaded it (fingerprints/dataset.json), where recorded."""
    if m.artifact(DATASET_FINGERPRINT) is None:
        return None
    try:
        return _digest(json.loads(m.file(DATASET_FINGERPRINT).read_text()).get("digest"))
    except (OSError, ValueError, AttributeError):
        return None


def resolved_dependencies(m: Manifest, image: BuiltImage | None) -> list[st.ResourceDescriptor]:
    rec, img = m.recipe, m.image
    # the manifest's image.project and data_source records (launcher.records.manifest)
    project: Mapping[str, Any] = img["project"] if isinstance(img.get("project"), dict) else {}
    source: Mapping[str, Any] = m.data["data_source"] if isinstance(m.data.get("data_source"), dict) else {}
    folder = project.get("folder")
    found = [
        _dep(CODE, rec.get("tree_digest"), code=m.code_name, source=rec.get("code_source"), entry=rec.get("entry"),
             files=rec.get("files"), git=rec.get("git")),
        _dep(LIB, rec.get("lib_digest")),
        _dep(LOCK, img.get("lock_sha256"), path=f"lockfiles/{img.get('variant')}.txt"),
        _dep(PROJECT_LOCK, project.get("requirements_lock_sha256"),
             path=f"{folder}/requirements.lock" if folder else None, packages=project.get("packages")),
        _dep(SYSTEM_LOCK, project.get("system_lock_sha256"), path=f"{folder}/system.lock" if folder else None,
             packages=project.get("system_packages")),
        _dep(BASE, img.get("base_digest"), ref=image.base_ref if image else None),
        _dep(IMAGE, img.get("id"), tag=img.get("tag"), variant=img.get("variant"), git_commit=img.get("git_commit"),
             git_dirty=img.get("git_dirty"), project_layer=project.get("layer"),
             variant_image=project.get("variant_image_id")),
        _dep(RUNTIME, img.get("runtime_digest")),
        _dep(PACKAGES, img.get("packages_digest")),
        _dep(DATASET, source.get("digest"), files=source.get("files"), bytes=source.get("bytes")),
        _dep(DATASET_READ, _dataset_read(m)),
    ]
    return [d for d in found if d is not None]


def builder_id(m: Manifest) -> str:
    placement = placement_kind(m.data)
    return f"{st.URI}:{placement}:{m.host.get('kind') or 'local'}:{m.host.get('name') or 'local'}"


class HostFacts(TypedDict, total=False):
    """The host's facts a provenance names (runDetails.builder.builderDependencies' annotations): those known."""

    os: str
    kernel: str
    arch: str
    cpu_model: str
    cpu_cores: int
    ram_bytes: int
    docker: str
    nvidia_driver: str
    gpus: list[str | None]


_HOST_FACTS = ("os", "kernel", "arch", "cpu_model", "cpu_cores", "ram_bytes")


def _host_facts(m: Manifest) -> HostFacts:
    # the facts' values as the host reported them (manifest.json host.facts, launcher.hosts' HostFacts or {}),
    # kept as they are: read by name here, as a mapping
    facts: Mapping[str, object] = m.host.get("facts") or {}
    out = cast(HostFacts, {k: facts[k] for k in _HOST_FACTS if facts.get(k) is not None})
    docker = facts.get("docker")
    if isinstance(docker, dict) and docker.get("server_version"):
        out["docker"] = docker["server_version"]
    nvidia = facts.get("nvidia")
    if isinstance(nvidia, dict) and nvidia.get("driver"):
        out["nvidia_driver"] = nvidia["driver"]
        out["gpus"] = [g.get("name") if isinstance(g, dict) else g for g in nvidia.get("gpus") or []]
    return out


def _env_names(m: Manifest) -> list[str]:
    env = m.data.get("env")
    return sorted(env) if isinstance(env, dict) else []


def _launcher_version(m: Manifest) -> str:
    """The launcher that built the run's image (this one where the manifest does not say)."""
    return str(m.image.get("launcher_version") or __version__)


def _build_definition(m: Manifest, image: BuiltImage | None) -> BuildDefinition:
    rec, det = m.recipe, m.determinism
    return {
        "buildType": BUILD_TYPE,
        "externalParameters": {
            "code": m.code_name, "recipe": m.recipe_name, "entry": rec.get("entry"),
            "codeSource": rec.get("code_source"), "variant": m.image.get("variant"),
            "params": dict(m.params), "seed": m.seed,
            "determinism": {"profile": det.get("profile"), "threads": det.get("threads")},
            "args": list(rec.get("args") or []), "env": _env_names(m),
        },
        "internalParameters": {
            "injectedEnv": dict(det.get("env") or {}),
            "launcherVersion": _launcher_version(m),
            "probes": m.data.get("probes"),
        },
        "resolvedDependencies": resolved_dependencies(m, image),
    }


def _run_details(m: Manifest) -> RunDetails:
    facts = _host_facts(m)
    builder: Builder = {"id": builder_id(m), "version": {"launcher": _launcher_version(m)}}
    if facts:
        builder["builderDependencies"] = [st.descriptor("host", annotations=facts)]
    metadata: BuildMetadata = {"invocationId": m.run_id, "startedOn": m.started_at}
    if m.data.get("ended_at"):
        metadata["finishedOn"] = str(m.data["ended_at"])
    byproducts = [st.descriptor(a.path, a.sha256) for a in m.artifacts if a.path.startswith(BYPRODUCT_PREFIX)]
    byproducts.append(st.descriptor(m.path.name, sha256_file(m.path)))
    return {"builder": builder, "metadata": metadata, "byproducts": byproducts}


def predicate(m: Manifest, image: BuiltImage | None) -> ProvenancePredicate:
    return {"buildDefinition": _build_definition(m, image), "runDetails": _run_details(m)}


def provenance(m: Manifest, image: BuiltImage | None = None) -> Provenance:
    """The statement of one finished run. Its subjects are every output but the logs (byproducts)."""
    if m.status != "succeeded":
        raise UsageError(f"run {m.run_id} {m.status} (exit {m.data.get('exit_code')}): a provenance statement "
                         "names the outputs of a run that succeeded", "attest a run that succeeded")
    subjects = [st.descriptor(a.path, a.sha256) for a in m.artifacts if not a.path.startswith(BYPRODUCT_PREFIX)]
    if not subjects:
        raise UsageError(f"run {m.run_id} wrote nothing besides its logs: there is no output to attest",
                         "save what the run produces (its model, metrics) into its working directory")
    statement = st.make(subjects, st.PROVENANCE_TYPE, predicate(m, image))
    schema.check(statement, f"the provenance of {m.run_id}")
    return statement


@dataclass
class Attested:
    run_id: str
    statement: Path
    envelope: Path | None
    subjects: int
    digest: str  # of the statement's bytes (the signed payload)
    keyids: list[str] = field(default_factory=list)

    def to_dict(self) -> AttestedRecord:
        return {"run_id": self.run_id, "statement": str(self.statement),
                "envelope": str(self.envelope) if self.envelope else None, "subjects": self.subjects,
                "statement_sha256": self.digest, "keyids": self.keyids}


def _signed(path: Path, payload: bytes, signer: Signer) -> dsse.Envelope:
    """The envelope of payload with signer's signature: added to the signatures already there when the
    statement is unchanged (an author and a co-signer), a new envelope when it changed."""
    fresh = dsse.sign(payload, st.PAYLOAD_TYPE, [signer])
    try:
        old = dsse.read(path) if path.is_file() else None
    except Corrupt:
        old = None
    if old is None or old.payload != payload or old.payload_type != st.PAYLOAD_TYPE:
        return fresh
    keyid, sig = fresh.signatures[0]
    kept = tuple(s for s in old.signatures if s[0] != keyid)
    return dsse.Envelope(old.payload_type, payload, (*kept, (keyid, sig)))


def _as_recorded(m: Manifest) -> None:
    """Every output is the regular file the manifest records, hashed again: a signature covers the files as
    they are, not as they were when the run was pulled."""
    from launcher.attest.check import file_problem

    wrong = []
    for a in m.artifacts:
        problem = file_problem(m.run_dir, a.path)
        if problem is None and sha256_file(m.run_dir / a.path) != a.sha256:
            problem = "changed since the run"
        if problem is not None:
            wrong.append(f"{a.path} ({problem})")
    if wrong:
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise DigestMismatch(f"run {m.run_id}: {len(wrong)} outputs are not what its manifest records: "
                             + "; ".join(wrong[:3]) + more + "; nothing was signed",
                             f"restore them (`launcher pull {m.run_id}` again where the host still has them), or "
                             "run again")


def attest_run(run_dir: Path, signer: Signer | None, cache_dir: Path) -> Attested:
    """Write runs/<id>/attestation/provenance.json and, with a signer, provenance.dsse.json (atomically; a
    signature by another key on the same statement is kept beside the new one). The outputs are hashed
    again first: DigestMismatch names any that changed."""
    m = load_manifest(run_dir)
    _as_recorded(m)
    project = m.image.get("project")
    image_id = str((project.get("variant_image_id") if project else None) or m.image.get("id") or "")
    statement = provenance(m, imagerecord.find(cache_dir, image_id) if image_id else None)
    payload = st.encode(statement)
    folder = attestation_dir(run_dir)
    atomic_write_bytes(folder / STATEMENT_FILE, payload)
    envelope_path = None
    keyids: list[str] = []
    if signer is not None:
        envelope_path = folder / ENVELOPE_FILE
        envelope = _signed(envelope_path, payload, signer)
        dsse.write(envelope_path, envelope)
        keyids = [k for k, _ in envelope.signatures]
    return Attested(m.run_id, folder / STATEMENT_FILE, envelope_path, len(statement["subject"]),
                    st.statement_digest(statement), keyids)


class AttestOutcomeRecord(TypedDict):
    """`attest`'s Result data: each run's statement and who signed them (None: unsigned)."""

    runs: list[AttestedRecord]
    signer: str | None


@dataclass
class AttestOutcome:
    runs: list[Attested]
    signer: str | None

    def to_dict(self) -> AttestOutcomeRecord:
        return {"runs": [a.to_dict() for a in self.runs], "signer": self.signer}

    def summary_line(self) -> str:
        n = len(self.runs)
        what = f"{n} run{'s' if n != 1 else ''} attested"
        if self.signer is None:
            return what + " (unsigned: give --key FILE, or signing_key in launcher.toml, to sign)"
        return what + f", signed with {self.signer}"


def attest_runs(ws: Workspace, refs: Sequence[str], signer: Signer | None,
                reporter: Reporter | None = None) -> AttestOutcome:
    if not refs:
        raise UsageError("no run given", "name the runs to attest: `launcher attest RUN...` (see `launcher ps`)")
    rep = reporter or NullReporter()
    done = []
    for ref in refs:
        run_dir = resolve_run(ws, ref)
        task = rep.task(f"attesting {run_dir.name}")
        try:
            done.append(attest_run(run_dir, signer, ws.cache_dir))
        finally:
            task.close()
    return AttestOutcome(done, signer.describe() if signer else None)
