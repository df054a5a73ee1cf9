"""Bundles and envelopes made by hand, as a stranger would send them: an honest one first (every file what
`launcher bundle` would carry, every digest right, signed by a key the reviewer trusts), then the same
parts changed the way an attacker would change them and signed again with that trusted key (the attacker
is the signer: a colleague's stolen key, or a colleague gone bad).

No Docker, no registry: the image's config, the lock, the Dockerfile and the base pin are written here so
that they agree with each other as a real build's do (the config's sha256 is the image ID, its labels
name the lock, the base, the runtime, the recipes and the Dockerfile's part). Signatures use a PEM
Ed25519 key (cryptography, no process) unless a test passes another signer.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runfactory import FakeRun, make_workspace, refresh_manifest, write_run

from launcher import __version__
from launcher.attest import dsse
from launcher.attest import statement as st
from launcher.attest.provenance import attest_run
from launcher.attest.signers import PemSigner, Signer, Trust
from launcher.hashing import sha256_bytes
from launcher.images import pins
from launcher.images.build import PACKAGE_DIR, env_content_of
from launcher.runtime import code as codedigest

RUN_ID = "20261125T100000-tiny-a1b2c3"
VARIANT = "cpu"
BASE_REF = "127.0.0.1:5000/launcher-base:bookworm@sha256:" + "2" * 64
DOCKERFILE = "ARG BASE\nFROM ${BASE}\nCOPY lock.txt /lock.txt\n"
LOCK = "numpy==2.0.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
TRAIN = "import os\nprint('training', os.environ.get('LAUNCHER_SEED'))\n"


def pem_keys(folder: Path, name: str = "author") -> tuple[Path, Path]:
    """A PEM Ed25519 key pair: (private, public)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    folder.mkdir(parents=True, exist_ok=True)
    key = ed25519.Ed25519PrivateKey.generate()
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@dataclass
class Forged:
    """A bundle's parts before the tar: its files (bundle path -> bytes) and its predicate."""

    files: dict[str, bytes]
    predicate: dict[str, Any]
    run_dir: Path  # the author's run folder the bundle was made from
    image_key: str
    code_prefix: str | None = None
    data_prefix: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def run_prefix(self) -> str:
        return f"runs/{RUN_ID}"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _files_under(prefix: str, root: Path) -> dict[str, bytes]:
    return {f"{prefix}/{p.relative_to(root).as_posix()}": p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _config(labels: dict[str, str]) -> bytes:
    config = {"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "5" * 64]},
              "history": [{"created": "2026-01-01T00:00:00Z"}]}
    return json.dumps(config, sort_keys=True).encode()


def honest(tmp: Path, signer: Signer, *, mounted: bool = False, data: dict[str, bytes] | None = None,
           code_files: dict[str, str] | None = None, runtime_digest: str | None = None) -> Forged:
    """The parts of a bundle `launcher bundle` would make of one run of the recipe tiny (baked in its
    image), or of a plain script myproj/train.py (mounted), optionally with its dataset."""
    author = make_workspace(tmp / "author")
    recipes = _tree(author / "recipes", {"tiny/recipe.toml": 'description = "tiny"\n', "tiny/train.py": TRAIN})
    lock_sha = sha256_bytes(LOCK.encode())
    runtime = runtime_digest or codedigest.runtime_digest(PACKAGE_DIR)
    env_content = env_content_of(VARIANT, DOCKERFILE, lock_sha, BASE_REF, runtime)
    labels = {"org.launcher.env-content": env_content, "org.launcher.base": BASE_REF,
              "org.launcher.lock-sha256": lock_sha, "org.launcher.runtime-digest": runtime,
              "org.launcher.recipes-digest": codedigest.code_digest(recipes), "org.launcher.git-commit": "0" * 40,
              "org.launcher.git-dirty": "false", "org.launcher.version": __version__,
              "org.launcher.base-digest": BASE_REF.split("@", 1)[1]}
    config = _config(labels)
    image_id = sha256_bytes(config)
    key = image_id[7:23]
    run_dir = write_run(author / "runs", FakeRun(run_id=RUN_ID, recipe="tiny", image_id=image_id))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["image"].update(base_digest=BASE_REF.split("@", 1)[1], lock_sha256=lock_sha, variant=VARIANT)
    code_root = None
    if mounted:
        code_root = _tree(tmp / "myproj", code_files or {"train.py": TRAIN, "helpers.py": "X = 1\n"})
        manifest["recipe"].update(name="train", identity="myproj/train.py", entry="train.py", code_source="mounted",
                                  tree_digest=codedigest.code_digest(code_root))
    else:
        manifest["recipe"].update(name="tiny", entry="train.py", code_source="baked",
                                  tree_digest=codedigest.code_digest(recipes / "tiny"))
    data_root = None
    if data is not None:
        from launcher.transfers.datasets import scan

        data_root = tmp / "dataset"
        for rel, raw in data.items():
            (data_root / rel).parent.mkdir(parents=True, exist_ok=True)
            (data_root / rel).write_bytes(raw)
        found = scan(data_root)
        manifest["data"] = "/data/sent"
        manifest["data_source"] = {"kind": "sent", "path": "/data/sent", "local": str(data_root),
                                   "digest": found.digest, "files": len(found.files), "bytes": 0}
    refresh_manifest(run_dir, manifest)
    attest_run(run_dir, signer, tmp / "author-cache")

    prefix = f"images/{key}"
    files: dict[str, bytes] = {f"runs/{RUN_ID}/manifest.json": (run_dir / "manifest.json").read_bytes(),
                               f"runs/{RUN_ID}/attestation/provenance.dsse.json":
                                   (run_dir / "attestation" / "provenance.dsse.json").read_bytes()}
    files.update(_files_under(f"runs/{RUN_ID}/outputs", run_dir / "outputs"))
    files.update(_files_under(f"{prefix}/recipes", recipes))
    files[f"{prefix}/lockfiles/{VARIANT}.txt"] = LOCK.encode()
    files[f"{prefix}/lockfiles/images.lock"] = pins.ImagesLock({VARIANT: pins.BasePin(VARIANT, BASE_REF)}).render(
    ).encode()
    files[f"{prefix}/dockerfiles/{VARIANT}.Dockerfile"] = DOCKERFILE.encode()
    files[f"{prefix}/config.json"] = config
    code_prefix = data_prefix = None
    if code_root is not None:
        code_prefix = f"code/{manifest['recipe']['tree_digest'][7:23]}/myproj"
        files.update(_files_under(code_prefix, code_root))
    if data_root is not None:
        data_prefix = f"runs/{RUN_ID}/data"
        files.update(_files_under(data_prefix, data_root))
    facts = {"variant": VARIANT, "imageId": image_id, "variantImageId": image_id, "baseRef": BASE_REF,
             "baseDigest": BASE_REF.split("@", 1)[1], "git": {"commit": "0" * 40, "dirty": False},
             "epoch": 1767225600, "runtimeDigest": runtime, "lockSha256": lock_sha,
             "recipesDigest": labels["org.launcher.recipes-digest"], "envContent": env_content,
             "launcherVersion": __version__, "project": None}
    predicate = {"launcherVersion": __version__, "withData": data is not None, "withBase": False, "bases": {},
                 "images": {key: facts},
                 "runs": [{"runId": RUN_ID, "image": key, "code": code_prefix, "base": None, "data": data_prefix}]}
    return Forged(files, predicate, run_dir, key, code_prefix, data_prefix)


def statement_of(files: dict[str, bytes], predicate: dict[str, Any], *, sizes: bool = True,
                 subjects: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if subjects is None:
        subjects = [{"name": n, "digest": {"sha256": sha256_bytes(b)[7:]},
                     **({"annotations": {"size": len(b)}} if sizes else {})} for n, b in sorted(files.items())]
    return {"_type": st.STATEMENT_TYPE, "subject": subjects, "predicateType": st.BUNDLE_TYPE, "predicate": predicate}


def sign_statement(statement: dict[str, Any], signer: Signer) -> bytes:
    payload = json.dumps(statement, sort_keys=True, indent=2).encode() + b"\n"
    return dsse.sign(payload, st.PAYLOAD_TYPE, [signer]).to_bytes()


def envelope_of(payload: bytes | dict[str, Any], signers: Iterable[Signer] = ()) -> bytes:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload, sort_keys=True).encode()
    return dsse.sign(raw, st.PAYLOAD_TYPE, list(signers)).to_bytes()


Member = tuple[tarfile.TarInfo, bytes]


def regular(name: str, data: bytes, mode: int = 0o644) -> Member:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    return info, data


def sparse(name: str, real_size: int, data: bytes = b"x" * 10) -> Member:
    """A PAX (GNU 0.1) sparse member: data bytes in the archive, real_size bytes once extracted."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    info.pax_headers = {"GNU.sparse.major": "0", "GNU.sparse.minor": "1", "GNU.sparse.name": name,
                        "GNU.sparse.map": f"0,{len(data)}", "GNU.sparse.size": str(real_size)}
    return info, data


def link(name: str, target: str, *, hard: bool = False) -> Member:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info, b""


def write_tar(path: Path, members: Iterable[Member]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def members_of(files: dict[str, bytes], envelope: bytes) -> list[Member]:
    from launcher.attest.bundle import ENVELOPE

    return [regular(n, b) for n, b in sorted({**files, ENVELOPE: envelope}.items())]


def bundle(path: Path, forged: Forged, signer: Signer, *, sizes: bool = True,
           change: Callable[[list[Member]], list[Member]] | None = None) -> Path:
    """The tar of forged, its statement signed by signer; change: the members edited after signing."""
    envelope = sign_statement(statement_of(forged.files, forged.predicate, sizes=sizes), signer)
    members = members_of(forged.files, envelope)
    return write_tar(path, change(members) if change else members)


def trust_pem(public: Path) -> Trust:
    return Trust.of(None, [public])


def pem_signer(private: Path) -> PemSigner:
    return PemSigner(private)


def payload_of(envelope: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(base64.b64decode(json.loads(envelope.read_text())["payload"]))
    return data


def files_under(root: Path) -> list[str]:
    """Every path below root (files, folders, links), relative, sorted."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []
