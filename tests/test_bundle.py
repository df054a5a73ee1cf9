"""Bundles of real runs of the tiny image on the local engine: deterministic, signed, every file checked,
and a pinned base carried as its registry's own bytes (restored into a fresh registry with the same digest)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import tarfile
from pathlib import Path
from typing import Any

import pytest
from test_attest import allowed_signers, ssh_key
from typer.testing import CliRunner

from launcher.attest.signers import Trust
from launcher.attest.unpack import open_bundle
from launcher.cli import app
from launcher.errors import DigestMismatch, ExitCode
from launcher.images import basearchive, registry
from launcher.images.imageref import ImageRef

pytestmark = [pytest.mark.docker, pytest.mark.registry]


def cli(ws: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["--workspace", str(ws), "--json", "--quiet", *args])
    data = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.exit_code, data, result.stderr


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    alice = ssh_key(tmp_path / "keys", "alice", "alice@example.com")
    return {"key": alice, "allowed": allowed_signers(tmp_path / "allowed_signers", ("alice@example.com", alice))}


def rewrite_member(src: Path, dst: Path, name: str, change: Any) -> None:
    """A copy of the tar with one member's bytes changed (the rest as they were)."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tout:
        for member in tin:
            data = tin.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            if member.name == name:
                data = change(data)
                member.size = len(data)
            tout.addfile(member, io.BytesIO(data))


def test_a_bundle_of_a_real_run_is_deterministic_signed_and_refused_once_edited(
        tiny_workspace: Path, keys: dict[str, Path], tmp_path: Path) -> None:
    code, out, err = cli(tiny_workspace, "run", "tiny", "--seed", "5", "--param", "size_kb=8")
    assert code == 0, err
    run_id = out["data"]["runs"][0]["run_id"]
    first, second = tmp_path / "a.bundle", tmp_path / "b.bundle"
    code, made, err = cli(tiny_workspace, "bundle", run_id, "-o", str(first), "--key", str(keys["key"]))
    assert code == 0, err
    assert made["data"]["base_included"] is True and made["data"]["runs"] == [run_id]
    code, _, err = cli(tiny_workspace, "bundle", run_id, "-o", str(second), "--key", str(keys["key"]))
    assert code == 0, err
    with tarfile.open(first) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and {m.mtime for m in members} == {0} and {m.uid for m in members} == {0}
    assert f"runs/{run_id}/outputs/model/weights.bin" in names and f"runs/{run_id}/manifest.json" in names
    image_key = next(n.split("/")[1] for n in names if n.startswith("images/"))
    for part in ("recipes/tiny/train.py", "lockfiles/cpu.txt", "lockfiles/images.lock", "dockerfiles/cpu.Dockerfile",
                 "config.json"):
        assert f"images/{image_key}/{part}" in names, part
    assert any(n.startswith("base/") and n.endswith("index.json") for n in names)
    # the same run bundled twice: the same bytes except the signature (an SSH signature is randomised)
    with tarfile.open(first) as a, tarfile.open(second) as b:
        for ma, mb in zip(a.getmembers(), b.getmembers(), strict=True):
            if ma.name not in ("bundle.dsse.json", f"runs/{run_id}/attestation/provenance.dsse.json"):
                assert (ma.name, a.extractfile(ma).read()) == (mb.name, b.extractfile(mb).read())  # type: ignore
    opened = open_bundle(first, Trust.of(keys["allowed"]), tmp_path / "open")
    assert [r.run_id for r in opened.runs] == [run_id] and opened.bundle.signers == ["alice@example.com"]
    config = opened.image_dir(image_key) / "config.json"
    assert "sha256:" + hashlib.sha256(config.read_bytes()).hexdigest() == out["data"]["runs"][0]["image"]["id"]

    code, verified, err = cli(tiny_workspace, "attest", "verify", str(first), "--allowed-signers", str(keys["allowed"]))
    assert code == 0, err
    assert verified["data"]["runs"][0]["run_id"] == run_id

    # the code edited after signing: refused, naming the file, before anything is built
    edited = tmp_path / "edited.bundle"
    rewrite_member(first, edited, f"images/{image_key}/recipes/tiny/train.py", lambda b: b + b"\n# edited\n")
    with pytest.raises(DigestMismatch, match=r"recipes/tiny/train\.py"):
        open_bundle(edited, Trust.of(keys["allowed"]), tmp_path / "open-edited")
    code, _, err = cli(tiny_workspace, "attest", "verify", str(edited), "--allowed-signers", str(keys["allowed"]))
    assert code == ExitCode.DIGEST_MISMATCH, err
    # the bundle's own statement changed: the signature fails
    forged = tmp_path / "forged.bundle"

    def forge(raw: bytes) -> bytes:
        env = json.loads(raw)
        import base64

        payload = base64.b64decode(env["payload"]).replace(b'"withData": false', b'"withData": true')
        return json.dumps({**env, "payload": base64.b64encode(payload).decode()}).encode()

    rewrite_member(first, forged, "bundle.dsse.json", forge)
    code, _, err = cli(tiny_workspace, "attest", "verify", str(forged), "--allowed-signers", str(keys["allowed"]))
    assert code == ExitCode.BAD_SIGNATURE, err
    mallory = ssh_key(tmp_path / "keys", "mallory", "mallory@example.com")
    others = allowed_signers(tmp_path / "others", ("mallory@example.com", mallory))
    code, _, err = cli(tiny_workspace, "attest", "verify", str(first), "--allowed-signers", str(others))
    assert code == ExitCode.UNKNOWN_SIGNER, err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(storage: Path) -> None:
    pid = int((storage / "registry.pid").read_text())
    os.kill(pid, signal.SIGTERM)  # the registry this test started, by its own pid
    os.waitpid(pid, 0)


def test_a_base_travels_as_its_registry_bytes_and_comes_back_with_the_same_digest(
        tmp_path: Path, engine: dict[str, Any]) -> None:
    address = f"127.0.0.1:{_free_port()}"
    first = tmp_path / "registry-a"
    registry.start_local_registry(first, address)
    try:
        ref = ImageRef.parse(f"{address}/tiny-base:one")
        layer = tmp_path / "layer.tar.gz"
        layer.write_bytes(b"\x1f\x8b" + os.urandom(4096))
        config = tmp_path / "config.json"
        config.write_bytes(b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}')
        descs = []
        for path, media in ((config, "application/vnd.docker.container.image.v1+json"),
                            (layer, "application/vnd.docker.image.rootfs.diff.tar.gzip")):
            digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
            registry.push_blob(ref, digest, path)
            descs.append({"mediaType": media, "size": path.stat().st_size, "digest": digest})
        media = "application/vnd.docker.distribution.manifest.v2+json"
        body = json.dumps({"schemaVersion": 2, "mediaType": media, "config": descs[0], "layers": descs[1:]}).encode()
        pinned = ref.pinned(registry.put_manifest(ref, media, body))
        assert basearchive.served(pinned)
        basearchive.export(pinned, tmp_path / "layout")
    finally:
        _stop(first)
    assert not basearchive.served(pinned)
    assert basearchive.check(tmp_path / "layout")[0] == pinned
    # a fresh registry at the same address (another machine's launcher would start its own)
    second = tmp_path / "registry-b"
    done = basearchive.restore(tmp_path / "layout", present=basearchive.served,
                               start_registry=lambda addr: registry.start_local_registry(second, addr))
    try:
        assert done == f"pushed into {address}" and basearchive.served(pinned)
        assert registry.resolve_digest(pinned) == ImageRef.parse(pinned).digest
    finally:
        _stop(second)
    blob = next((tmp_path / "layout" / "blobs" / "sha256").glob(descs[1]["digest"][7:]))
    blob.write_bytes(blob.read_bytes()[:-1])
    with pytest.raises(Exception, match="does not match"):
        basearchive.check(tmp_path / "layout")
