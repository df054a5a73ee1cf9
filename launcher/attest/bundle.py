"""`launcher bundle RUN... -o run.bundle`: what someone else needs to rebuild the image and rerun, in one
deterministic tar (entries sorted, owner root, every date 0), signed.

    bundle.dsse.json                          the bundle statement (signed): every other file by sha256
    runs/<id>/manifest.json, attestation/provenance.dsse.json, outputs/...   each run, its signed provenance
    runs/<id>/data/...                        its dataset (--with-data)
    images/<key>/recipes/...                  the recipes as the image holds them (its last layer)
    images/<key>/lockfiles/<variant>.txt, .in, images.lock;  dockerfiles/<variant>.Dockerfile
    images/<key>/config.json                  the image's config (its sha256 is the image ID)
    code/<key>/<project>/...                  mounted code: the snapshot the run mounted
    base/<key>/                               the pinned base as an OCI layout (not with --without-base)

Every input is checked against what the run recorded before it goes in: the Dockerfile and lock against
the image's labels, the recipes against its recipes layer, the code against its tree digest, the data
against its digest. The image itself is not carried (it is rebuilt), nor the data unless asked.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypedDict

from launcher import __version__
from launcher.attest import dsse
from launcher.attest import statement as st
from launcher.attest.provenance import ATTESTATION_DIR, ENVELOPE_FILE, attest_run
from launcher.attest.signers import Signer
from launcher.errors import BadData, Corrupt, NotFound, UsageError
from launcher.hashing import atomic_path, atomic_write_bytes, sha256_file
from launcher.images import basearchive, imagerecord
from launcher.images import pins as images
from launcher.images.build import env_content_of
from launcher.progress import NullReporter, Reporter
from launcher.records.integrity import check_integrity
from launcher.records.manifest import Manifest, load_manifest
from launcher.records.records import ProjectRecord
from launcher.records.rundir import MANIFEST, RunDir
from launcher.records.store import resolve_run
from launcher.runtime import code as codedigest
from launcher.workspace import Workspace

ENVELOPE = "bundle.dsse.json"
KEY_LEN = 16
# The bundle's folders (see above); a reproduction's workspace has the same runs/ folder.
RUNS_DIR = "runs"
IMAGES_DIR = "images"


class GitFacts(TypedDict):
    commit: str
    dirty: bool


class ImageFacts(TypedDict):
    """What the bundle says of an image (predicate.images[key]): its build inputs, from its labels."""

    variant: str
    imageId: str | None  # the image the run recorded (its project layer's, where it had one)
    variantImageId: str
    baseRef: str | None
    baseDigest: str | None
    git: GitFacts
    epoch: int
    runtimeDigest: str | None
    lockSha256: str | None
    recipesDigest: str | None
    envContent: str | None
    launcherVersion: str | None
    project: ProjectRecord | None  # the manifest's image.project record (launcher.records.manifest), as recorded


class BundledRun(TypedDict):
    """predicate.runs[]: a run and where its parts are in the bundle (None: not carried)."""

    runId: str
    image: str  # a key of predicate.images (images/<key>/)
    code: str | None
    base: str | None
    data: str | None


class BaseRef(TypedDict):
    ref: str | None


class BundlePredicate(TypedDict):
    """The predicate of a bundle's signed statement (bundle.dsse.json), urn:launcher:bundle:v1."""

    launcherVersion: str
    runs: list[BundledRun]
    images: dict[str, ImageFacts]
    bases: dict[str, BaseRef]
    withData: bool
    withBase: bool


def key_of(digest: str) -> str:
    return digest.removeprefix("sha256:")[:KEY_LEN]


@dataclass
class Staged:
    """The bundle's files before the tar: bundle path -> file on this machine."""

    files: dict[str, Path] = field(default_factory=dict)

    def add(self, name: str, path: Path) -> None:
        self.files[name] = path

    def add_tree(self, prefix: str, root: Path) -> None:
        for rel, path in codedigest.iter_files(root):
            self.files[f"{prefix}/{rel}"] = path


def _write(tmp: Path, rel: str, data: bytes) -> Path:
    path = tmp / rel
    atomic_write_bytes(path, data)
    return path


def variant_image_id(m: Manifest) -> str:
    project = m.image.get("project")
    return str((project.get("variant_image_id") if project else None) or m.image.get("id") or "")


def _image_facts(ws: Workspace, m: Manifest, built: imagerecord.BuiltImage) -> ImageFacts:
    variant = str(m.image.get("variant"))
    commit, dirty = built.git
    return {"variant": variant, "imageId": m.image.get("id"), "variantImageId": built.image_id,
            "baseRef": built.base_ref, "baseDigest": built.label("base-digest"), "git": {"commit": commit,
            "dirty": dirty}, "epoch": built.epoch, "runtimeDigest": built.label("runtime-digest"),
            "lockSha256": built.label("lock-sha256"), "recipesDigest": built.label("recipes-digest"),
            "envContent": built.label("env-content"), "launcherVersion": built.label("version"),
            "project": m.image.get("project")}


def _pin_text(ws: Workspace, variant: str, ref: str) -> bytes:
    try:
        have = images.load(ws).pins.get(variant)
    except (NotFound, LookupError):
        have = None
    pin = have if have is not None and have.ref == ref else images.BasePin(variant, ref)
    return images.ImagesLock({variant: pin}).render().encode()


def stage_image(ws: Workspace, m: Manifest, staged: Staged, tmp: Path) -> tuple[str, ImageFacts]:
    """The image's inputs, each checked against the image the run used; (key, facts)."""
    image_id = variant_image_id(m)
    built = imagerecord.find(ws.cache_dir, image_id)
    if built is None or built.recipes_layer is None or not built.base_ref:
        raise NotFound(f"run {m.run_id}: the build of its image {image_id[7:19]} is not in this machine's cache "
                       f"({ws.cache_dir}/images)", "bundle on the machine that built it, or build the same inputs "
                       f"again here (`launcher build --variant {m.image.get('variant')}`)")
    key, variant = key_of(image_id), str(m.image.get("variant"))
    prefix = f"{IMAGES_DIR}/{key}"
    facts = _image_facts(ws, m, built)
    recipes = tmp / prefix / "recipes"
    if not recipes.is_dir():
        imagerecord.extract_recipes(built.recipes_layer, recipes)
    if codedigest.code_digest(recipes) != facts["recipesDigest"]:
        raise Corrupt(f"the recipes layer of image {image_id[7:19]} in the cache does not match its label",
                      "prune the cache (`launcher cache prune`) and build again")
    staged.add_tree(f"{prefix}/recipes", recipes)
    lock, dockerfile = ws.lock_txt(variant), ws.dockerfile(variant)
    if not lock.is_file() or sha256_file(lock) != facts["lockSha256"]:
        raise NotFound(f"{lock} is not the lock image {image_id[7:19]} was built from ({facts['lockSha256']})",
                       "restore it (e.g. `git checkout` the commit the run names), then bundle again")
    text = dockerfile.read_text() if dockerfile.is_file() else ""
    if env_content_of(variant, text, str(facts["lockSha256"]), str(built.base_ref),
                      str(facts["runtimeDigest"])) != facts["envContent"]:
        raise NotFound(f"{dockerfile} is not the Dockerfile image {image_id[7:19]} was built from",
                       "restore it (e.g. `git checkout` the commit the run names), then bundle again")
    staged.add(f"{prefix}/lockfiles/{variant}.txt", lock)  # not its .in: no image is built from it
    staged.add(f"{prefix}/dockerfiles/{variant}.Dockerfile", dockerfile)
    staged.add(f"{prefix}/lockfiles/images.lock", _write(tmp, f"{prefix}/images.lock", _pin_text(
        ws, variant, str(built.base_ref))))
    staged.add(f"{prefix}/config.json", _write(tmp, f"{prefix}/config.json", built.config))
    return key, facts


def stage_code(ws: Workspace, m: Manifest, staged: Staged, image_prefix: str) -> str | None:
    """Mounted code: the snapshot the run mounted, as code/<key>/<project>; None for a baked recipe (the
    image's recipes hold it: checked here)."""
    digest = str(m.recipe.get("tree_digest") or "")
    if m.recipe.get("code_source") != "mounted":
        folder = staged.files.get(f"{image_prefix}/recipes/{m.recipe_name}/recipe.toml")
        if folder is None or codedigest.code_digest(folder.parent) != digest:
            raise Corrupt(f"run {m.run_id}: the recipe {m.recipe_name} in its image is not the code it ran ({digest})",
                          "prune the cache (`launcher cache prune`) and build again")
        return None
    launch = RunDir(m.run_dir).read_launch_quiet()
    # launch.json's code record (launcher.runs), as the launch wrote it
    code: dict[str, Any] = dict(launch.get("code") or {}) if launch else {}
    snapshot = Path(str(code.get("local") or ws.cache_dir / "code" / digest.removeprefix("sha256:")))
    if not snapshot.is_dir() or codedigest.code_digest(snapshot) != digest:
        raise NotFound(f"run {m.run_id}: the snapshot of its code ({digest[7:19]}) is no longer in {snapshot.parent}",
                       "bundle on the machine that ran it, before `launcher cache prune`")
    identity = str(m.recipe.get("identity") or "")
    name = identity.split("/", 1)[0] if identity else Path(str(code.get("root") or m.recipe_name)).name
    prefix = f"code/{key_of(digest)}/{name or 'code'}"
    staged.add_tree(prefix, snapshot)
    return prefix


def stage_data(m: Manifest, staged: Staged) -> str | None:
    source = m.data.get("data_source") if isinstance(m.data.get("data_source"), dict) else None
    if not m.data.get("data"):
        return None
    if not source or source.get("kind") != "sent" or not source.get("local") or not source.get("digest"):
        raise UsageError(f"run {m.run_id} read data from a path on its host ({m.data.get('data')}), which this "
                         "machine does not hold", "bundle without --with-data and send the data yourself")
    from launcher.transfers.datasets import scan

    local = Path(str(source["local"]))
    try:
        found = scan(local)
    except BadData as exc:
        raise NotFound(f"run {m.run_id}: its dataset {local} is gone ({exc.message})",
                       "bundle without --with-data") from None
    if found.digest != source["digest"]:
        raise Corrupt(f"run {m.run_id}: the dataset in {local} changed since the run ({found.digest[7:19]}, "
                      f"sent {str(source['digest'])[7:19]})", "bundle without --with-data, or restore the data")
    prefix = f"{RUNS_DIR}/{m.run_id}/data"
    for rel in sorted(found.files):
        staged.add(f"{prefix}/{rel}", found.root / rel)
    return prefix


class BundleOutcomeRecord(TypedDict):
    """`bundle`'s Result data."""

    bundle: str
    runs: list[str]
    files: int
    bytes: int
    base_included: bool
    signer: str
    statement_sha256: str


@dataclass
class BundleOutcome:
    path: Path
    runs: list[str]
    files: int
    bytes: int
    base: bool
    signer: str
    statement_sha256: str

    def to_dict(self) -> BundleOutcomeRecord:
        return {"bundle": str(self.path), "runs": self.runs, "files": self.files, "bytes": self.bytes,
                "base_included": self.base, "signer": self.signer, "statement_sha256": self.statement_sha256}

    def summary_line(self) -> str:
        base = "with its pinned base" if self.base else "without the base (--without-base)"
        return (f"{self.path}: {len(self.runs)} run{'s' if len(self.runs) != 1 else ''}, {self.files} files, "
                f"{self.bytes / 1e6:.1f} MB, {base}; signed with {self.signer}")


def make_bundle(ws: Workspace, refs: Sequence[str], out: Path, signer: Signer | None, *, with_data: bool = False,
                without_base: bool = False, reporter: Reporter | None = None) -> BundleOutcome:
    if not refs:
        raise UsageError("no run given", "name the runs to bundle: `launcher bundle RUN... -o run.bundle`")
    if signer is None:
        raise UsageError("a bundle is signed, and no key was given",
                         "pass --key FILE (an SSH or PEM private key), or set signing_key in launcher.toml")
    rep = reporter or NullReporter()
    with tempfile.TemporaryDirectory(prefix="launcher-bundle-") as tmp_name:
        tmp, staged = Path(tmp_name), Staged()
        predicate: BundlePredicate = {"launcherVersion": __version__, "runs": [], "images": {}, "bases": {},
                                      "withData": with_data, "withBase": not without_base}
        for ref in refs:
            m = load_manifest(resolve_run(ws, ref))
            check_integrity([m], rep)
            attest_run(m.run_dir, signer, ws.cache_dir)
            key, facts = stage_image(ws, m, staged, tmp)
            predicate["images"][key] = facts
            code = stage_code(ws, m, staged, f"{IMAGES_DIR}/{key}")
            prefix = f"{RUNS_DIR}/{m.run_id}"
            staged.add(f"{prefix}/{MANIFEST}", m.path)
            staged.add(f"{prefix}/{ATTESTATION_DIR}/{ENVELOPE_FILE}", m.run_dir / ATTESTATION_DIR / ENVELOPE_FILE)
            for art in m.artifacts:
                staged.add(f"{prefix}/{art.path}", m.file(art.path))
            base = None
            if not without_base:
                base = f"base/{key_of(str(facts['baseDigest']))}"
                if base.removeprefix("base/") not in predicate["bases"]:
                    task = rep.task(f"base image {facts['baseRef']}")
                    try:
                        basearchive.export(str(facts["baseRef"]), tmp / base)
                    finally:
                        task.close()
                    predicate["bases"][base.removeprefix("base/")] = {"ref": facts["baseRef"]}
                    for p in sorted((tmp / base).rglob("*")):
                        if p.is_file():
                            staged.add(p.relative_to(tmp).as_posix(), p)
            predicate["runs"].append({"runId": m.run_id, "image": key, "code": code, "base": base,
                                      "data": stage_data(m, staged) if with_data else None})
        return _seal(staged, predicate, out, signer, rep)


def _seal(staged: Staged, predicate: BundlePredicate, out: Path, signer: Signer, rep: Reporter) -> BundleOutcome:
    task = rep.task("hashing the bundle's files", total=len(staged.files))
    digests: dict[str, str] = {}
    for name, path in sorted(staged.files.items()):
        digests[name] = sha256_file(path)
        task.advance()
    task.close()
    # each file's size beside its sha256: a reader refuses a larger member from its header, before writing it
    statement = st.make([st.descriptor(n, d, annotations={"size": staged.files[n].stat().st_size})
                         for n, d in sorted(digests.items())], st.BUNDLE_TYPE, predicate)
    envelope = dsse.sign(st.encode(statement), st.PAYLOAD_TYPE, [signer]).to_bytes()
    total = sum(p.stat().st_size for p in staged.files.values())
    task = rep.task(f"writing {out}", total=total, unit="B")
    try:
        write_tar(out, staged.files, digests, envelope, on_bytes=task.advance)
    finally:
        task.close()
    runs = [r["runId"] for r in predicate["runs"]]
    return BundleOutcome(out, runs, len(digests) + 1, out.stat().st_size, bool(predicate["bases"]),
                         signer.describe(), st.statement_digest(statement))


class _Hashing(io.RawIOBase):
    """A file's read() that hashes what it hands on, so what went into the tar is what was signed."""

    def __init__(self, raw: IO[bytes], on_bytes: Callable[[int], object]) -> None:
        super().__init__()
        self.raw, self.h, self.on_bytes = raw, hashlib.sha256(), on_bytes

    def read(self, n: int | None = -1) -> bytes:
        block = self.raw.read(-1 if n is None else n)
        self.h.update(block)
        self.on_bytes(len(block))
        return block


def _info(name: str, size: int, executable: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, 0, 0, 0, "", ""
    info.mode = 0o755 if executable else 0o644
    return info


def write_tar(out: Path, files: dict[str, Path], digests: dict[str, str], envelope: bytes,
              on_bytes: Callable[[int], object] = lambda n: None) -> None:
    """The tar, atomically: names sorted, owner root, dates 0, modes 0644 or 0755 (the executable bit kept)."""
    with atomic_path(out) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted([*files, ENVELOPE]):
            if name == ENVELOPE:
                tar.addfile(_info(name, len(envelope), False), io.BytesIO(envelope))
                continue
            path = files[name]
            with open(path, "rb") as f:
                reader = _Hashing(f, on_bytes)
                tar.addfile(_info(name, path.stat().st_size, bool(path.stat().st_mode & 0o100)), reader)
            if "sha256:" + reader.h.hexdigest() != digests[name]:
                raise Corrupt(f"{path} changed while the bundle was written", "make the bundle again")
