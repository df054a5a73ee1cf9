"""A bundle opened and checked before anything is built from it.

1. unpacked safely (regular files only, no absolute or escaping names, no links);
2. ``bundle.dsse.json``: signed by a key the reviewer trusts (43 / 41), and every file in the tar is one
   it names, with that sha256 (42): an edited file, one added or one left out is refused;
3. each run's ``provenance.dsse.json``: signed by a trusted key, its subjects and byproducts (the
   outputs, logs and manifest.json) matching the bundled files, and its resolved dependencies matching
   what the bundle would rebuild from: the code (tree digest), recipes/_lib, the variant lock, the base
   in images.lock, the image's config (whose sha256 is the image ID).
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypedDict, cast

from launcher.attest import provenance as prov
from launcher.attest import schema
from launcher.attest import statement as st
from launcher.attest.bundle import ENVELOPE, IMAGES_DIR, RUNS_DIR, BundlePredicate, ImageFacts
from launcher.attest.check import Verified, check_files, open_signed
from launcher.attest.signers import Trust
from launcher.errors import Corrupt, DigestMismatch, UnsafePath
from launcher.hashing import atomic_path, sha256_file
from launcher.images import pins as images
from launcher.progress import NullReporter, Reporter
from launcher.runs.manifest import Manifest, load_manifest
from launcher.runtime import code as codedigest


@dataclass
class OpenedRun:
    run_id: str
    folder: Path  # <root>/runs/<id>: manifest.json, attestation/, outputs/
    manifest: Manifest
    provenance: Verified
    image: str  # the images/<key> folder's key
    image_facts: ImageFacts
    code: Path | None  # the mounted code's folder (named as the run's project), None for a baked recipe
    base: Path | None
    data: Path | None


class OpenedRunRecord(TypedDict):
    run_id: str
    signed_by: list[str]
    image: str
    code: str | None  # the code's folder, relative to the bundle's root (None: a baked recipe)
    base: bool
    data: bool


class OpenedBundleRecord(TypedDict):
    """`attest verify`'s Result data for a bundle (the command adds "valid")."""

    bundle: str
    files: int
    signed_by: list[str]
    statement_sha256: str
    runs: list[OpenedRunRecord]


@dataclass
class OpenedBundle:
    path: Path
    root: Path
    bundle: Verified
    runs: list[OpenedRun]

    @property
    def predicate(self) -> BundlePredicate:
        return _bundle_predicate(self.bundle, self.path)

    def image_dir(self, key: str) -> Path:
        return self.root / IMAGES_DIR / key

    def to_dict(self) -> OpenedBundleRecord:
        return {"bundle": str(self.path), "files": len(self.bundle.statement["subject"]) + 1,
                "signed_by": self.bundle.signers, "statement_sha256": self.bundle.statement_sha256,
                "runs": [{"run_id": r.run_id, "signed_by": r.provenance.signers, "image": r.image,
                          "code": r.code.relative_to(self.root).as_posix() if r.code else None,
                          "base": r.base is not None, "data": r.data is not None} for r in self.runs]}

    def summary_line(self) -> str:
        n, files = len(self.runs), len(self.bundle.statement["subject"])
        runs_by = ", ".join(sorted({s for r in self.runs for s in r.provenance.signers}))
        return (f"valid: {self.path.name} holds {n} run{'s' if n != 1 else ''} and {files} files, all as signed "
                f"by {', '.join(self.bundle.signers)}; each run's provenance signed by {runs_by}")


def _safe(name: str, source: Path) -> str:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\\" in name:
        raise UnsafePath(f"{source} holds the entry {name!r}, which leaves the bundle's folder",
                         "do not use this bundle: launcher never writes such an entry")
    return p.as_posix()


def extract(path: Path, into: Path, reporter: Reporter | None = None) -> dict[str, str]:
    """Unpack the bundle's regular files into into; name -> sha256 of what was written."""
    task = (reporter or NullReporter()).task(f"unpacking {path.name}", total=path.stat().st_size, unit="B")
    found: dict[str, str] = {}
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                name = _safe(member.name, path)
                if member.isdir():
                    continue
                if not member.isfile():
                    raise UnsafePath(f"{path} holds {name}, which is not a regular file (a link or a device)",
                                     "do not use this bundle: launcher bundles regular files only")
                if name in found:
                    raise Corrupt(f"{path} holds {name} twice", "ask its author for the bundle again")
                target = into / name
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with src, atomic_path(target) as tmp, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out)
                target.chmod(0o755 if member.mode & 0o100 else 0o644)
                found[name] = sha256_file(target)
                task.advance(member.size)
    except (tarfile.TarError, EOFError) as exc:
        raise Corrupt(f"{path} is not a complete tar ({exc})", "ask its author for the bundle again") from None
    finally:
        task.close()
    return found


def _check_listing(found: dict[str, str], bundle: Verified, path: Path) -> None:
    """Every file is one the signed bundle statement names, with its sha256, and none it names is missing."""
    signed = st.subject_digests(bundle.statement)
    problems = [f"{n} (changed)" for n in sorted(signed) if n in found and found[n] != signed[n]]
    problems += [f"{n} (missing)" for n in sorted(signed) if n not in found]
    problems += [f"{n} (not signed)" for n in sorted(found) if n not in signed and n != ENVELOPE]
    if problems:
        more = f" and {len(problems) - 4} more" if len(problems) > 4 else ""
        raise DigestMismatch(f"{path}: {len(problems)} files differ from what its signature covers: "
                             + "; ".join(problems[:4]) + more,
                             "nothing was built; ask its author for the bundle again (it was changed after signing)")


def _need(ok: bool, run_id: str, what: str) -> None:
    if not ok:
        raise DigestMismatch(f"run {run_id}: {what} differs from what its signed provenance names",
                             "nothing was built; ask its author for the bundle again (it was changed after signing)")


def _check_dependencies(run: OpenedRun, image_dir: Path) -> None:
    """The files the reproduction builds and runs from are the ones the run's provenance names."""
    statement, rid = run.provenance.statement, run.run_id

    def want(name: str) -> str | None:
        dep = st.dependency(statement, name)
        return st.from_digest_set(dep.get("digest")) if dep else None

    code = run.code or image_dir / "recipes" / run.manifest.recipe_name
    _need(code.is_dir() and codedigest.code_digest(code) == want(prov.CODE), rid, f"the code ({code.name})")
    if want(prov.LIB):
        _need(codedigest.code_digest(image_dir / "recipes" / "_lib") == want(prov.LIB), rid, "recipes/_lib")
    variant = str(run.image_facts.get("variant"))
    lock = image_dir / "lockfiles" / f"{variant}.txt"
    _need(lock.is_file() and sha256_file(lock) == want(prov.LOCK), rid, f"the lock {lock.name}")
    pin = images.load_file(image_dir / "lockfiles" / "images.lock").get(variant)
    _need(pin.digest == want(prov.BASE), rid, "the base image in images.lock")
    config = image_dir / "config.json"
    image_id = str(run.image_facts.get("variantImageId") or "")
    _need(config.is_file() and sha256_file(config) == image_id, rid, "the image's config")
    _need(want(prov.IMAGE) == run.image_facts.get("imageId"), rid, "the image ID")


def _bundle_predicate(bundle: Verified, path: Path) -> BundlePredicate:
    """The bundle statement's predicate, once the fields open_bundle reads are there (runs naming images)."""
    pred = bundle.statement["predicate"]
    if not isinstance(pred, dict):
        raise Corrupt(f"{path}: {ENVELOPE}'s predicate is not an object", "make it with `launcher bundle`")
    runs, images = pred.get("runs") or [], pred.get("images")
    ok = isinstance(runs, list) and isinstance(images, dict) and all(
        isinstance(r, dict) and isinstance(r.get("runId"), str) and isinstance(images.get(r.get("image")), dict)
        for r in runs)
    if not ok:
        raise Corrupt(f"{path}: {ENVELOPE} does not list its runs and their images as a bundle does",
                      "make it with `launcher bundle`")
    return cast(BundlePredicate, {**pred, "runs": runs})


def _inside(root: Path, part: str | None) -> Path | None:
    """A part of the bundle (its code, base, data) where the bundle carries it."""
    return root / part if part else None


def open_bundle(path: Path, trust: Trust, into: Path, reporter: Reporter | None = None) -> OpenedBundle:
    """Unpack and check the bundle at path into the folder into (see the module's text)."""
    found = extract(path, into, reporter)
    if ENVELOPE not in found:
        raise Corrupt(f"{path} has no {ENVELOPE}: it is not a bundle launcher made", "make it with `launcher bundle`")
    bundle = open_signed(into / ENVELOPE, trust)
    if bundle.predicate_type != st.BUNDLE_TYPE:
        raise Corrupt(f"{path}: {ENVELOPE} is a {bundle.predicate_type} statement, not a bundle's",
                      "make it with `launcher bundle`")
    _check_listing(found, bundle, path)
    pred = _bundle_predicate(bundle, path)
    runs: list[OpenedRun] = []
    for entry in pred["runs"]:
        rid = entry["runId"]
        folder = into / RUNS_DIR / rid
        verified = open_signed(folder / prov.ATTESTATION_DIR / prov.ENVELOPE_FILE, trust)
        if verified.predicate_type != st.PROVENANCE_TYPE:
            raise Corrupt(f"{path}: run {rid}'s statement is not a provenance statement", "make the bundle again")
        schema.check(verified.statement, f"run {rid}'s provenance")
        check_files(verified.statement, folder, f"run {rid}'s signed provenance")
        run = OpenedRun(rid, folder, load_manifest(folder), verified, str(entry["image"]),
                        pred["images"][entry["image"]],
                        _inside(into, entry.get("code")), _inside(into, entry.get("base")),
                        _inside(into, entry.get("data")))
        _need(run.manifest.run_id == rid, rid, "the manifest")
        _check_dependencies(run, into / IMAGES_DIR / run.image)
        runs.append(run)
    if not runs:
        raise Corrupt(f"{path} holds no run", "make it with `launcher bundle RUN...`")
    return OpenedBundle(path, into, bundle, runs)


def verify_bundle(path: Path, trust: Trust, reporter: Reporter | None = None) -> OpenedBundle:
    """Check a bundle as reproduce would, in a folder removed afterwards (`launcher attest verify BUNDLE`)."""
    with tempfile.TemporaryDirectory(prefix="launcher-unbundle-") as tmp:
        return open_bundle(path, trust, Path(tmp), reporter)
