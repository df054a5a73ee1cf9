"""A bundle opened and checked before anything is built from it.

1. every tar header is read and checked before anything is written (:mod:`launcher.attest.tarread`): regular
   files only, names inside the folder, no ``.git``, no sparse member;
2. ``bundle.dsse.json`` is read into memory and verified: signed by a key the reviewer trusts (43 / 41),
   a bundle statement; every file in the tar is one it names, with its size, and none it names is
   missing (42); every path its predicate names is one of the bundle's own folders (21); no code file
   that no code digest covers (byte-code, VCS metadata: 21);
3. only then are the files it names written, each hashed as it is (42), into a folder renamed into place;
4. each run's ``provenance.dsse.json``: signed by a trusted key, its subjects and byproducts (the outputs,
   logs and manifest.json) matching the bundled files and nothing else in outputs/; and everything the
   reproduction builds and runs from is what that provenance names, directly or through the image's
   config (whose sha256 is the image ID it names): the code, recipes/_lib, the variant lock, the base,
   the Dockerfile and every baked recipe (the config's labels), the dataset (its digest).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypedDict, cast

from launcher.attest import provenance as prov
from launcher.attest import statement as st
from launcher.attest.bundle import ENVELOPE, IMAGES_DIR, RUNS_DIR, BundlePredicate, ImageFacts
from launcher.attest.check import Verified, check_files, open_signed, open_signed_bytes
from launcher.attest.deps import check_dependencies
from launcher.attest.signers import Trust
from launcher.attest.tarread import MAX_ENVELOPE, BundleTar, Member, open_tar, safe_name
from launcher.errors import Corrupt, DigestMismatch, LauncherError, UnsafePath
from launcher.progress import Reporter
from launcher.records.manifest import Manifest, load_manifest
from launcher.records.rundir import is_run_id
from launcher.runtime import code as codedigest
from launcher.specs.recipes import is_recipe_name
from launcher.workspace import VARIANT_NAME

_KEY = re.compile(r"^[0-9a-f]{16}$")  # bundle.KEY_LEN hex digits: an image's, a code tree's or a base's key
_FOLDER = r"[^/\\\x00]{1,255}"  # the code's project folder: one name (not ., .. or .git: checked apart)


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
    trusted: list[dict[str, str]]
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
                "signed_by": self.bundle.signers, "trusted": self.bundle.trusted,
                "statement_sha256": self.bundle.statement_sha256,
                "runs": [{"run_id": r.run_id, "signed_by": r.provenance.signers, "image": r.image,
                          "code": r.code.relative_to(self.root).as_posix() if r.code else None,
                          "base": r.base is not None, "data": r.data is not None} for r in self.runs]}

    def summary_line(self) -> str:
        n, files = len(self.runs), len(self.bundle.statement["subject"])
        runs_by = ", ".join(sorted({s for r in self.runs for s in r.provenance.signers}))
        return (f"valid: {self.path.name} holds {n} run{'s' if n != 1 else ''} and {files} files, all as signed "
                f"by {', '.join(self.bundle.signers)}; each run's provenance signed by {runs_by}; trusting "
                f"{self.bundle.trust_text}")


def _declared(entry: object) -> tuple[str, str, int | None] | None:
    """(name, sha256, size or None) of a bundle statement's subject."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    digest = st.from_digest_set(entry.get("digest"))
    notes = entry.get("annotations")
    size = notes.get("size") if isinstance(notes, dict) else None
    ok_size = isinstance(size, int) and not isinstance(size, bool) and size >= 0
    return (entry["name"], digest, size if ok_size else None) if digest else None


def _uncovered(name: str) -> bool:
    """Whether name is code no code digest counts (byte-code, VCS metadata, caches): it would run unchecked."""
    parts = PurePosixPath(name).parts
    in_code = parts[0] == "code" or (parts[0] == IMAGES_DIR and len(parts) > 2 and parts[2] == "recipes")
    return in_code and any(codedigest.skipped(p, i < len(parts) - 1) for i, p in enumerate(parts))


def _listing(tar: BundleTar, bundle: Verified, path: Path) -> dict[str, str]:
    """What to extract (name -> sha256): every file is one the signed statement names, with the size it
    declares, and none it names is missing; checked on the headers, before anything is written."""
    st.subject_digests(bundle.statement)  # a name twice: Corrupt
    signed: dict[str, tuple[str, int | None]] = {}
    for entry in bundle.statement["subject"]:
        found = _declared(entry)
        if found is None:
            raise Corrupt(f"{path}: {ENVELOPE} names a subject without a name and a sha256",
                          "make it with `launcher bundle`")
        name, digest, size = found
        if safe_name(name, f"{path}'s signed statement") != name:
            raise UnsafePath(f"{path}: its signed statement names {name!r}, not a plain path inside the bundle",
                             "do not use this bundle: launcher never writes such a name")
        if _uncovered(name):
            raise UnsafePath(f"{path} holds {name}, code no code digest covers (byte-code or VCS metadata): it "
                             "would run without being checked", "do not use this bundle: launcher never bundles it")
        signed[name] = (digest, size)
    members: dict[str, Member] = {n: m for n, m in tar.members.items() if n != ENVELOPE}
    problems = [f"{n} (missing)" for n in sorted(signed) if n not in members]
    problems += [f"{n} (not signed)" for n in sorted(members) if n not in signed]
    problems += [f"{n} ({members[n].size} bytes, signed {size})" for n, (_, size) in sorted(signed.items())
                 if n in members and size is not None and members[n].size != size]
    if problems:
        more = f" and {len(problems) - 4} more" if len(problems) > 4 else ""
        raise DigestMismatch(f"{path}: {len(problems)} files differ from what its signature covers: "
                             + "; ".join(problems[:4]) + more,
                             "nothing was written; ask its author for the bundle again (it was changed after signing)")
    return {n: d for n, (d, _) in signed.items()}


def _confined(value: object, pattern: str, what: str, path: Path) -> str | None:
    """A path the bundle statement names for a run's part: None, or one of the bundle's own folders."""
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise UnsafePath(f"{path}: its statement puts {what} at {value!r}, outside the bundle's own folders",
                         "do not use this bundle: launcher never writes such a path")
    return value


def _bundle_predicate(bundle: Verified, path: Path) -> BundlePredicate:
    """The bundle statement's predicate, once what open_bundle reads is there and every path it names is
    one of the bundle's folders (code/<key>/<project>, base/<key>, runs/<id>/data)."""
    pred = bundle.statement["predicate"]
    if not isinstance(pred, dict) or not isinstance(pred.get("runs") or [], list) \
            or not isinstance(pred.get("images"), dict):
        raise Corrupt(f"{path}: {ENVELOPE} does not list its runs and their images as a bundle does",
                      "make it with `launcher bundle`")
    images: dict[str, Any] = pred["images"]
    for key, facts in images.items():
        if not _KEY.match(str(key)) or not isinstance(facts, dict) or \
                not VARIANT_NAME.match(str(facts.get("variant"))):
            raise UnsafePath(f"{path}: its statement names an image {key!r} that is not one of its folders",
                             "do not use this bundle: launcher never writes such a name")
    runs: list[Any] = pred.get("runs") or []
    for r in runs:
        rid = r.get("runId") if isinstance(r, dict) else None
        if not isinstance(rid, str) or not is_run_id(rid):
            raise UnsafePath(f"{path}: its statement names a run {rid!r}, which is not a run id",
                             "do not use this bundle: launcher never writes such a name")
        _confined(r.get("image"), r"[0-9a-f]{16}", f"run {rid}'s image", path)
        if r.get("image") not in images:
            raise Corrupt(f"{path}: run {rid}'s image is not one the bundle describes",
                          "make it with `launcher bundle`")
        _confined(r.get("code"), rf"code/[0-9a-f]{{16}}/{_FOLDER}", f"run {rid}'s code", path)
        _confined(r.get("base"), r"base/[0-9a-f]{16}", f"run {rid}'s base", path)
        _confined(r.get("data"), re.escape(f"{RUNS_DIR}/{rid}/data"), f"run {rid}'s data", path)
        if str(r.get("code") or "").rsplit("/", 1)[-1].lower() in (".", "..", ".git"):
            raise UnsafePath(f"{path}: run {rid}'s code is not a folder of its own", "do not use this bundle")
    return cast(BundlePredicate, {**pred, "runs": runs})


def _inside(root: Path, part: str | None) -> Path | None:
    """A part of the bundle (its code, base, data) where the bundle carries it (confined: _bundle_predicate)."""
    return root / part if part else None


def _open_run(into: Path, entry: Any, pred: BundlePredicate, trust: Trust, path: Path) -> OpenedRun:
    rid = str(entry["runId"])
    folder = into / RUNS_DIR / rid
    verified = open_signed(folder / prov.ATTESTATION_DIR / prov.ENVELOPE_FILE, trust)
    if verified.predicate_type != st.PROVENANCE_TYPE:
        raise Corrupt(f"{path}: run {rid}'s statement is not a provenance statement", "make the bundle again")
    check_files(verified.statement, folder, f"run {rid}'s signed provenance")
    try:
        manifest = load_manifest(folder)
    except LauncherError as exc:
        raise Corrupt(f"{path}: run {rid}'s manifest cannot be read ({exc.message})", "make the bundle again") from None
    if manifest.run_id != rid:
        raise DigestMismatch(f"run {rid}: the manifest is another run's ({manifest.run_id})", "make the bundle again")
    run = OpenedRun(rid, folder, manifest, verified, str(entry["image"]), pred["images"][entry["image"]],
                    _inside(into, entry.get("code")), _inside(into, entry.get("base")),
                    _inside(into, entry.get("data")))
    entry_file = str(manifest.recipe.get("entry") or "")
    if run.code is None and not is_recipe_name(manifest.recipe_name):
        raise UnsafePath(f"run {rid}: its recipe {manifest.recipe_name!r} is not a recipe's name",
                         "do not use this bundle: launcher never records such a name")
    if run.code is not None and (not entry_file or ".." in PurePosixPath(entry_file).parts
                                 or entry_file.startswith("/") or not (run.code / entry_file).is_file()):
        raise UnsafePath(f"run {rid}: its script {entry_file!r} is not a file of its bundled code",
                         "do not use this bundle: launcher never records such a path")
    check_dependencies(rid, verified.statement, manifest, run.image_facts, into / IMAGES_DIR / run.image,
                       code=run.code, data=run.data, base=run.base)
    return run


def open_bundle(path: Path, trust: Trust, into: Path, reporter: Reporter | None = None) -> OpenedBundle:
    """Check the bundle at path and unpack it into the folder into, absent or empty (see the module's text)."""
    into = into.resolve()
    with open_tar(path) as tar:
        if ENVELOPE not in tar.members:
            raise Corrupt(f"{path} has no {ENVELOPE}: it is not a bundle launcher made",
                          "make it with `launcher bundle`")
        raw = tar.read(ENVELOPE, MAX_ENVELOPE)
        bundle = open_signed_bytes(raw, f"{path}'s {ENVELOPE}", into / ENVELOPE, trust)
        if bundle.predicate_type != st.BUNDLE_TYPE:
            raise Corrupt(f"{path}: {ENVELOPE} is a {bundle.predicate_type} statement, not a bundle's",
                          "make it with `launcher bundle`")
        wanted = _listing(tar, bundle, path)
        pred = _bundle_predicate(bundle, path)
        if not pred["runs"]:
            raise Corrupt(f"{path} holds no run", "make it with `launcher bundle RUN...`")
        tar.extract({**wanted, ENVELOPE: bundle.envelope_sha256}, into, reporter)
    return OpenedBundle(path, into, bundle, [_open_run(into, entry, pred, trust, path) for entry in pred["runs"]])


def verify_bundle(path: Path, trust: Trust, reporter: Reporter | None = None) -> OpenedBundle:
    """Check a bundle as reproduce would, in a folder removed afterwards (`launcher attest verify BUNDLE`)."""
    with tempfile.TemporaryDirectory(prefix="launcher-unbundle-") as tmp:
        return open_bundle(path, trust, Path(tmp) / "bundle", reporter)
