"""What launcher writes into the proofs it makes, read as an attacker would read them: a secret's record
that a dictionary does not open, a provenance signed only over files as they are now, a verification
summary that says PASSED only when the recorded image ran and names the key that signed it. Fast tier."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import hostile as h
import pytest
from runfactory import FakeRun, make_workspace, write_run

from launcher.attest import statement as st
from launcher.attest.check import Verified, verify_file
from launcher.attest.provenance import attest_run
from launcher.attest.signers import PemSigner, Trust
from launcher.attest.summary import summary
from launcher.errors import DigestMismatch
from launcher.specs import userenv

RUN = "20261125T100000-mnist_convnet-aaaaaa"


def test_a_secret_is_recorded_as_an_hmac_whose_salt_stays_on_this_machine(tmp_path: Path) -> None:
    value = "hunter2"  # a dictionary word
    salts = tmp_path / "cache"
    first = userenv.UserEnv(secret={"HF_TOKEN": value}).record(userenv.new_salt(salts, RUN))
    second = userenv.UserEnv(secret={"HF_TOKEN": value}).record(
        userenv.new_salt(salts, "20261125T100001-mnist_convnet-bbbbbb"))
    text = json.dumps(first)
    assert hashlib.sha256(value.encode()).hexdigest() not in text, "the plain sha256 of the value is recorded"
    assert first != second, "two runs given the same value record the same digest"
    assert userenv.is_secret(first["HF_TOKEN"]) and "value" not in first["HF_TOKEN"]
    salt = userenv.salt_file(salts, RUN)
    assert stat.S_IMODE(salt.stat().st_mode) == 0o600
    # on this machine the value can be checked; elsewhere (no salt) it cannot, and says so
    assert userenv.secret_matches(value, first["HF_TOKEN"], userenv.find_salt(salts, RUN)) is True
    assert userenv.secret_matches("other", first["HF_TOKEN"], userenv.find_salt(salts, RUN)) is False
    assert userenv.secret_matches(value, first["HF_TOKEN"], userenv.find_salt(tmp_path / "elsewhere", RUN)) is None
    # a manifest from before keeps its sha256 record, and is still checked by it
    old = {"sha256": "sha256:" + hashlib.sha256(value.encode()).hexdigest()}
    assert userenv.is_secret(old) and userenv.secret_matches(value, old, None) is True


def test_attest_hashes_the_files_it_signs_again(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws")
    run_dir = write_run(ws / "runs", FakeRun(run_id=RUN))
    private, _ = h.pem_keys(tmp_path / "keys")
    metrics = run_dir / "outputs" / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes() + b'{"epoch": 99}\n')  # changed after the run; manifest as it was
    with pytest.raises(DigestMismatch, match=r"metrics\.jsonl"):
        attest_run(run_dir, PemSigner(private), tmp_path / "cache")
    assert not (run_dir / "attestation" / "provenance.dsse.json").exists()


def test_attest_refuses_an_output_that_is_a_link(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws")
    run_dir = write_run(ws / "runs", FakeRun(run_id=RUN))
    private, _ = h.pem_keys(tmp_path / "keys")
    metrics = run_dir / "outputs" / "metrics.jsonl"
    (tmp_path / "copy.jsonl").write_bytes(metrics.read_bytes())
    metrics.unlink()
    metrics.symlink_to(tmp_path / "copy.jsonl")
    with pytest.raises(DigestMismatch, match="link"):
        attest_run(run_dir, PemSigner(private), tmp_path / "cache")


def _original(tmp_path: Path) -> Verified:
    ws = make_workspace(tmp_path / "ws")
    run_dir = write_run(ws / "runs", FakeRun(run_id=RUN))
    private, public = h.pem_keys(tmp_path / "keys")
    done = attest_run(run_dir, PemSigner(private), tmp_path / "cache")
    assert done.envelope is not None
    return verify_file(done.envelope, Trust.of(None, [public]), run_dir)


def test_a_summary_passes_only_for_the_recorded_image_and_names_its_signing_key(tmp_path: Path) -> None:
    original = _original(tmp_path)
    results = {n: {"status": "identical", "sha256": d}
               for n, d in st.subject_digests(original.statement, byproducts=False).items()}
    reproduction = {"uri": "runs/x/attestation/provenance.dsse.json", "envelope_sha256": "sha256:" + "0" * 64}
    same = summary(original, RUN, reproduction, "identical", results, other_image=False, verifier_key="SHA256:abc")
    other = summary(original, RUN, reproduction, "identical", results, other_image=True, verifier_key="SHA256:abc")
    assert same["predicate"]["verificationResult"] == "PASSED"
    assert other["predicate"]["verificationResult"] == "FAILED", "PASSED although another image ran"
    assert other["predicate"]["verifiedLevels"] == ["LAUNCHER_REPRODUCED_IDENTICAL", "LAUNCHER_OTHER_IMAGE"]
    assert same["predicate"]["verifier"]["id"] == "urn:launcher:verifier:SHA256:abc"
