"""What a bundled run is rebuilt and rerun from, held against what its signed provenance names.

The provenance names the code (its tree digest), recipes/_lib, the variant lock, the base image and the
image ID, and the dataset sent (its digest). The image ID is the sha256 of the image's config, so every
label of that config is covered too: the Dockerfile's part (``org.launcher.env-content``, a digest of
the Dockerfile's text, the lock, the base reference and launcher's runtime), the base reference, every
recipe baked beside the run's (``org.launcher.recipes-digest``). A bundle's own facts about the image must
say what those labels say. Any difference is DigestMismatch (42), before anything is built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.attest import provenance as prov
from launcher.attest import statement as st
from launcher.attest.bundle import ImageFacts
from launcher.errors import BadData, Corrupt, DigestMismatch, LauncherError
from launcher.hashing import sha256_file
from launcher.images.imagerecord import LABEL
from launcher.records.manifest import Manifest
from launcher.runtime import code as codedigest

# the bundle's facts about an image (bundle.ImageFacts) and the config label each must equal
_FACT_LABELS = (("baseRef", "base"), ("lockSha256", "lock-sha256"), ("runtimeDigest", "runtime-digest"),
                ("recipesDigest", "recipes-digest"), ("envContent", "env-content"))


def _need(ok: bool, run_id: str, what: str, against: str = "its signed provenance") -> None:
    if not ok:
        raise DigestMismatch(f"run {run_id}: {what} differs from what {against} names",
                             "nothing was built; ask its author for the bundle again (it was changed after signing)")


def _labels(config: Path, run_id: str) -> dict[str, str]:
    try:
        data = json.loads(config.read_bytes())
        labels = (data.get("config") or {}).get("Labels") or {}
    except (OSError, ValueError, AttributeError):
        raise Corrupt(f"run {run_id}: its image's config is not an image config", "make the bundle again") from None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def _image(run_id: str, statement: st.Statement[object], facts: ImageFacts, image_dir: Path) -> dict[str, str]:
    """The image's config is the one the provenance names (by the image ID); its labels."""
    config = image_dir / "config.json"
    image_id = str(facts.get("variantImageId") or "")
    _need(config.is_file() and sha256_file(config) == image_id, run_id, "the image's config (its sha256)",
          "the bundle")
    image = st.dependency(statement, prov.IMAGE) or {}
    recorded = st.from_digest_set(image.get("digest"))
    notes: dict[str, Any] = image.get("annotations") or {}
    layered = notes.get("variant_image") if facts.get("project") else recorded  # a project layer's variant image
    _need(recorded == facts.get("imageId") and layered == image_id, run_id, "the image ID")
    return _labels(config, run_id)


def check_dependencies(run_id: str, statement: st.Statement[object], manifest: Manifest, facts: ImageFacts,
                       image_dir: Path, *, code: Path | None, data: Path | None, base: Path | None) -> None:
    """Every file the reproduction builds and runs from is one the run's provenance names (see the module)."""
    from launcher.images import basearchive
    from launcher.images import pins as images
    from launcher.images.build import env_content_of
    from launcher.images.imageref import ImageRef
    from launcher.transfers.datasets import scan

    def want(name: str) -> str | None:
        dep = st.dependency(statement, name)
        return st.from_digest_set(dep.get("digest")) if dep else None

    labels = _image(run_id, statement, facts, image_dir)

    def label(name: str) -> str | None:
        return labels.get(LABEL + name)

    folder = code or image_dir / "recipes" / manifest.recipe_name
    _need(folder.is_dir() and codedigest.code_digest(folder) == want(prov.CODE), run_id, f"the code ({folder.name})")
    if want(prov.LIB):
        _need(codedigest.code_digest(image_dir / "recipes" / "_lib") == want(prov.LIB), run_id, "recipes/_lib")
    variant = str(facts.get("variant"))
    lock = image_dir / "lockfiles" / f"{variant}.txt"
    _need(lock.is_file() and sha256_file(lock) == want(prov.LOCK) == label("lock-sha256"), run_id,
          f"the lock {lock.name}")
    try:
        pin = images.load_file(image_dir / "lockfiles" / "images.lock").get(variant)
    except LauncherError as exc:
        raise Corrupt(f"run {run_id}: the bundle's images.lock cannot be read ({exc.message})",
                      "make the bundle again") from None
    _need(pin.digest == want(prov.BASE), run_id, "the base image in images.lock")
    _need(pin.ref == label("base"), run_id, "the base's reference in images.lock", "its image's config")
    dockerfile = image_dir / "dockerfiles" / f"{variant}.Dockerfile"
    text = dockerfile.read_text(errors="replace") if dockerfile.is_file() else None
    _need(text is not None and env_content_of(variant, text, str(label("lock-sha256")), str(label("base")),
                                              str(label("runtime-digest"))) == label("env-content"),
          run_id, f"the Dockerfile {dockerfile.name}", "its image's config")
    _need(codedigest.code_digest(image_dir / "recipes") == label("recipes-digest"), run_id,
          "the recipes baked in its image", "its image's config")
    for fact, name in _FACT_LABELS:
        _need(facts.get(fact) == label(name), run_id, f"the bundle's {fact}", "its image's config")
    if data is not None:
        try:
            got = scan(data).digest
        except BadData as exc:
            raise Corrupt(f"run {run_id}: the bundled dataset cannot be read ({exc.message})",
                          "make the bundle again") from None
        _need(want(prov.DATASET) is not None and got == want(prov.DATASET), run_id, "the bundled dataset")
    if base is not None:
        ref, _, _ = basearchive.check(base)
        _need(ref == label("base") and ImageRef.parse(ref).digest == want(prov.BASE), run_id, "the bundled base image")
