"""A pinned base image carried by hand: its registry manifest, config and compressed layers as an OCI
image layout (``oci-layout``, ``index.json``, ``blobs/sha256/<hex>``), exactly the bytes the registry
holds, so the manifest's sha256 *is* the digest images.lock pins and every blob is checked by name.

Why not ``docker save``: its archive is uncompressed and holds no registry manifest, so it cannot be
checked against the pinned digest, and an image `docker load` made has no repository digest: a build
``FROM name@sha256:...`` would still try to pull it. A bootstrapped base cannot be made again either:
``debootstrap`` from the live Debian archive gives another digest once the archive moves on. So a
bundle carries the base this way and ``restore`` pushes it, byte for byte, into the registry its
reference names (launcher's own local registry, started when it is a loopback address), where the
build pulls it by digest as it always does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from launcher.errors import Corrupt, NotFound, RegistryUnavailable, UsageError
from launcher.hashing import atomic_write_bytes, sha256_file
from launcher.images import registry
from launcher.images.imageref import ImageRef, is_loopback

LAYOUT = {"imageLayoutVersion": "1.0.0"}
SINGLE = ("application/vnd.docker.distribution.manifest.v2+json", "application/vnd.oci.image.manifest.v1+json")
REF_NAME = "org.opencontainers.image.ref.name"


def _blob(folder: Path, digest: str) -> Path:
    return folder / "blobs" / "sha256" / digest.removeprefix("sha256:")


def export(ref: str, into: Path) -> int:
    """Write the OCI layout of the pinned ref (NAME:TAG@sha256:...) into the folder into; its bytes."""
    parsed = ImageRef.parse(ref)
    if parsed.digest is None:
        raise UsageError(f"{ref} has no digest", "pin the base in images.lock by digest")
    session = registry.Session(parsed)  # one login for the manifest and every blob
    media, body = registry.get_manifest(parsed, parsed.digest, session=session)
    manifest = json.loads(body)
    if media not in SINGLE and manifest.get("mediaType") not in SINGLE:
        raise UsageError(f"the base {ref} is a multi-platform index ({media}): launcher carries one image's "
                         "manifest", "leave it out with --without-base: a registry's image by digest can be pulled "
                         "again wherever that registry answers")
    atomic_write_bytes(_blob(into, parsed.digest), body)
    total = len(body)
    for desc in [manifest["config"], *manifest.get("layers", [])]:
        total += registry.get_blob(parsed, str(desc["digest"]), _blob(into, str(desc["digest"])), session=session)
    atomic_write_bytes(into / "oci-layout", json.dumps(LAYOUT).encode())
    index = {"schemaVersion": 2, "manifests": [{"mediaType": media, "digest": parsed.digest, "size": len(body),
                                                "annotations": {REF_NAME: ref}}]}
    atomic_write_bytes(into / "index.json", json.dumps(index, indent=2, sort_keys=True).encode())
    return total


def check(folder: Path) -> tuple[str, str, bytes]:
    """Every blob of the layout against its name; (ref, media type, manifest bytes)."""
    try:
        index = json.loads((folder / "index.json").read_text())
        entry = index["manifests"][0]
        ref, digest, media = entry["annotations"][REF_NAME], str(entry["digest"]), str(entry["mediaType"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        raise Corrupt(f"{folder} is not an OCI image layout launcher wrote", "make the bundle again") from None
    manifest_path = _blob(folder, digest)
    if not manifest_path.is_file() or sha256_file(manifest_path) != digest:
        raise Corrupt(f"{folder}: the manifest of {ref} does not match {digest}", "make the bundle again")
    body = manifest_path.read_bytes()
    manifest = json.loads(body)
    for desc in [manifest["config"], *manifest.get("layers", [])]:
        path = _blob(folder, str(desc["digest"]))
        if not path.is_file() or sha256_file(path) != desc["digest"]:
            raise Corrupt(f"{folder}: a blob of {ref} is missing or does not match {desc['digest']}",
                          "make the bundle again")
    if ImageRef.parse(ref).digest != digest:
        raise Corrupt(f"{folder}: {ref} is not the image whose manifest it holds", "make the bundle again")
    return ref, media, body


def restore(folder: Path, *, start_registry: Callable[[str], object], present: Callable[[str], bool]) -> str:
    """Make the base in folder pullable by its reference again; what was done, in a few words.

    present(ref): whether the local engine has the image, or its registry serves the digest already;
    start_registry(address): start launcher's local registry on that loopback address."""
    ref, media, body = check(folder)
    if present(ref):
        return "already there"
    parsed = ImageRef.parse(ref)
    if not is_loopback(parsed.registry):
        raise RegistryUnavailable(f"the base {ref} is in {parsed.registry}, which does not serve it to this machine",
                                  "log in to that registry (docker login), or pin a base you can reach")
    if not registry.ping(parsed.registry):
        start_registry(parsed.registry)
    manifest = json.loads(body)
    session = registry.Session(parsed)
    for desc in [manifest["config"], *manifest.get("layers", [])]:
        registry.push_blob(parsed, str(desc["digest"]), _blob(folder, str(desc["digest"])), session=session)
    got = registry.put_manifest(parsed, media, body, session=session)
    if got != parsed.digest:
        raise Corrupt(f"the registry {parsed.registry} stored {ref} as {got}", "check the registry")
    return f"pushed into {parsed.registry}"


def served(ref: str) -> bool:
    """Whether the registry of ref serves its digest now (False when it does not answer)."""
    parsed = ImageRef.parse(ref)
    try:
        return parsed.digest is not None and registry.resolve_digest(ref, timeout=5) == parsed.digest
    except (NotFound, RegistryUnavailable):
        return False
