"""`launcher attest verify` as a reviewer runs it on files a stranger made: each test plays one attacker with
a hand-made statement, envelope, run folder or workspace, and checks the verdict is not "valid" unless the
reviewer has a reason to believe it. No Docker: fast tier (ssh-keygen and cryptography make real keys)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import hostile as h
import pytest
from conftest import need
from runfactory import FakeRun, make_workspace, write_run
from test_attest import allowed_signers, ssh_key
from typer.testing import CliRunner

from launcher.attest import dsse
from launcher.attest import statement as st
from launcher.attest.check import verify_file
from launcher.attest.provenance import ENVELOPE_FILE, STATEMENT_FILE, attest_run
from launcher.attest.signers import PemSigner, SSHSigner, Trust
from launcher.cli import app
from launcher.errors import DigestMismatch, ExitCode, UnknownSigner

RUN = "20261125T100000-mnist_convnet-aaaaaa"
OTHER = "20261125T110000-mnist_convnet-bbbbbb"


@pytest.fixture(autouse=True)
def no_user_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No trust root but the ones each test gives: an empty user configuration, no LAUNCHER_* variable."""
    config = tmp_path / "user-config"
    config.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    for var in ("LAUNCHER_ALLOWED_SIGNERS", "LAUNCHER_SIGNING_KEY"):
        monkeypatch.delenv(var, raising=False)
    return config


@pytest.fixture
def ssh() -> None:
    need(shutil.which("ssh-keygen") is not None, "OpenSSH's ssh-keygen signs and verifies SSH signatures")


def cli(ws: Path | None, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    where = ["--workspace", str(ws)] if ws is not None else []
    r = CliRunner().invoke(app, [*where, "--quiet", "--json", *args], env=env)
    return r.exit_code, json.loads(r.stdout) if r.stdout.strip() else {}, r.stderr


def pem(tmp_path: Path, name: str = "author") -> tuple[PemSigner, Path]:
    private, public = h.pem_keys(tmp_path / "keys", name)
    return PemSigner(private), public


def signed(path: Path, statement: dict[str, Any], *signers: Any) -> Path:
    payload = json.dumps(statement, sort_keys=True, indent=2).encode()
    dsse.write(path, dsse.sign(payload, st.PAYLOAD_TYPE, list(signers)))
    return path


def keyid_of(signer: Any) -> str:
    return str(signer.sign(b"x")[0])


def vsa(run_dir: Path, verifier: str, result: str = "PASSED", levels: tuple[str, ...] = (
        "LAUNCHER_REPRODUCED_IDENTICAL",)) -> dict[str, Any]:
    """A verification summary of the run in run_dir (its provenance attested), as reproduce writes one."""
    prov = json.loads((run_dir / "attestation" / STATEMENT_FILE).read_text())
    base = f"runs/{run_dir.name}/attestation"
    digest = {"sha256": hashlib.sha256((run_dir / "attestation" / ENVELOPE_FILE).read_bytes()).hexdigest()}
    statement_digest = {"sha256": hashlib.sha256((run_dir / "attestation" / STATEMENT_FILE).read_bytes()).hexdigest()}
    subjects = [{**s, "annotations": {"result": "identical"}} for s in prov["subject"]]
    return {"_type": st.STATEMENT_TYPE, "subject": subjects, "predicateType": st.VSA_TYPE, "predicate": {
        "verifier": {"id": f"urn:launcher:verifier:{verifier}"}, "timeVerified": "2026-11-25T10:00:00Z",
        "resourceUri": f"urn:launcher:run:{run_dir.name}", "policy": {"uri": "urn:launcher:policy:reproduce:v1"},
        "inputAttestations": [{"uri": f"{base}/{ENVELOPE_FILE}", "digest": digest},
                              {"uri": f"{base}/{STATEMENT_FILE}", "digest": statement_digest}],
        "verificationResult": result, "verifiedLevels": list(levels), "slsaVersion": "1.0"}}


@pytest.fixture
def author_run(tmp_path: Path) -> tuple[Path, PemSigner, Path]:
    ws = make_workspace(tmp_path / "ws")
    run_dir = write_run(ws / "runs", FakeRun(run_id=RUN))
    signer, public = pem(tmp_path)
    attest_run(run_dir, signer, tmp_path / "cache")
    return run_dir, signer, public


# ---------------------------------------------------------------- 2. whom the reviewer trusts


def test_a_workspace_cannot_choose_whom_its_reviewer_trusts(tmp_path: Path, ssh: None) -> None:
    # a cloned project ships an allowed-signers file naming the attacker's key as a colleague
    project = make_workspace(tmp_path / "cloned")
    mallory = ssh_key(tmp_path / "keys", "mallory", "colleague@example.com")
    allowed_signers(project / "allowed_signers", ("colleague@example.com", mallory))
    (project / "launcher.toml").write_text('[defaults]\nallowed_signers = "allowed_signers"\n')
    run_dir = write_run(project / "runs", FakeRun(run_id=RUN))
    done = attest_run(run_dir, SSHSigner(mallory), tmp_path / "cache")
    code, _, err = cli(project, "attest", "verify", str(done.envelope))
    assert code == ExitCode.USAGE, f"the workspace's own allowed_signers was trusted: {err}"
    assert "launcher.toml" in err and "--allowed-signers" in err
    # reproduce takes its trust the same way: refused before the bundle is even looked at
    code, _, err = cli(project, "reproduce", str(tmp_path / "any.bundle"), "--into", str(tmp_path / "r"),
                       "--key", str(mallory))
    assert code == ExitCode.USAGE and "launcher.toml" in err
    assert not (tmp_path / "r").exists()


def test_trust_comes_from_the_command_line_the_environment_or_the_user_s_own_configuration(
        tmp_path: Path, no_user_trust: Path, ssh: None) -> None:
    alice = ssh_key(tmp_path / "keys", "alice", "alice@example.com")
    run_dir = write_run(make_workspace(tmp_path / "ws") / "runs", FakeRun(run_id=RUN))
    envelope = str(attest_run(run_dir, SSHSigner(alice), tmp_path / "cache").envelope)
    (no_user_trust / "launcher").mkdir()
    mine = allowed_signers(no_user_trust / "launcher" / "allowed_signers", ("alice@example.com", alice))
    code, out, err = cli(None, "attest", "verify", envelope)
    assert code == 0, err
    assert out["data"]["trusted"] == [{"allowed_signers": str(mine), "from": "your configuration"}]
    assert f"trusting {mine}" in out["summary"] and "alice@example.com" in out["summary"]
    elsewhere = allowed_signers(tmp_path / "team_signers", ("alice@example.com", alice))
    code, out, err = cli(None, "attest", "verify", envelope, env={"LAUNCHER_ALLOWED_SIGNERS": str(elsewhere)})
    assert code == 0, err
    assert out["data"]["trusted"] == [{"allowed_signers": str(elsewhere), "from": "LAUNCHER_ALLOWED_SIGNERS"}]
    code, out, err = cli(None, "attest", "verify", envelope, "--allowed-signers", str(elsewhere))
    assert out["data"]["trusted"] == [{"allowed_signers": str(elsewhere), "from": "--allowed-signers"}]


def test_a_key_file_s_name_is_never_read_as_an_allowed_signers_line(tmp_path: Path, ssh: None) -> None:
    alice = ssh_key(tmp_path / "keys", "alice", "alice@example.com")
    for i in range(40):  # a key whose base64 has no "/", which a file name cannot hold
        mallory = ssh_key(tmp_path / "keys", f"mallory{i}", "mallory@example.com")
        if "/" not in mallory.with_suffix(".pub").read_text():
            break
    run_dir = write_run(make_workspace(tmp_path / "ws") / "runs", FakeRun(run_id=RUN))
    forged = attest_run(run_dir, SSHSigner(mallory), tmp_path / "cache").envelope
    assert forged is not None
    # a file named so that its name, written as a principal, adds a line trusting mallory's key
    injected = f'x namespaces="launcher" {mallory.with_suffix(".pub").read_text().strip()}\n*'
    crafted = tmp_path / "from-the-project" / injected
    crafted.parent.mkdir()
    crafted.write_text(alice.with_suffix(".pub").read_text())
    with pytest.raises(UnknownSigner):
        verify_file(forged, Trust.of(None, [crafted]))
    # and a plain space in the name no longer breaks a good signature
    spaced = tmp_path / "alice key.pub"
    shutil.copy(alice.with_suffix(".pub"), spaced)
    (run_dir / "attestation" / ENVELOPE_FILE).unlink()
    good = attest_run(run_dir, SSHSigner(alice), tmp_path / "cache").envelope
    assert good is not None
    assert verify_file(good, Trust.of(None, [spaced])).signers == [str(spaced)]


def test_every_principal_of_a_key_is_tried(tmp_path: Path, ssh: None) -> None:
    # the same key twice: first for git only, then for launcher; the second makes the signature good
    alice = ssh_key(tmp_path / "keys", "alice", "alice@example.com")
    key = alice.with_suffix(".pub").read_text().strip()
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'alice-git@example.com namespaces="git" {key}\nalice@example.com namespaces="launcher" {key}\n')
    run_dir = write_run(make_workspace(tmp_path / "ws") / "runs", FakeRun(run_id=RUN))
    envelope = attest_run(run_dir, SSHSigner(alice), tmp_path / "cache").envelope
    assert envelope is not None
    assert verify_file(envelope, Trust.of(allowed)).signers == ["alice@example.com"]


@pytest.mark.parametrize("sig", [b"SSHSIG\x00\x00\x00\x01garbage", b"\x01" * 64, b""])
def test_a_malformed_signature_by_nobody_trusted_is_an_unknown_signer(
        tmp_path: Path, author_run: tuple[Path, PemSigner, Path], sig: bytes, ssh: None) -> None:
    run_dir, _, public = author_run
    alice = ssh_key(tmp_path / "keys", "alice", "alice@example.com")
    allowed = allowed_signers(tmp_path / "allowed_signers", ("alice@example.com", alice))
    env = json.loads((run_dir / "attestation" / ENVELOPE_FILE).read_text())
    env["signatures"] = [{"keyid": "", "sig": base64.b64encode(sig).decode()}]
    path = tmp_path / "malformed.dsse.json"
    path.write_text(json.dumps(env))
    for trust in (Trust.of(allowed), Trust.of(None, [public])):
        with pytest.raises(UnknownSigner):
            verify_file(path, trust)


def test_a_corrupt_co_signature_does_not_break_a_good_one(
        tmp_path: Path, author_run: tuple[Path, PemSigner, Path]) -> None:
    run_dir, author, public = author_run
    colleague, colleague_public = pem(tmp_path, "colleague")
    both = attest_run(run_dir, colleague, tmp_path / "cache").envelope  # a co-signature beside the author's
    assert both is not None
    env = json.loads(both.read_text())
    sig = bytearray(base64.b64decode(env["signatures"][1]["sig"]))
    sig[5] ^= 1
    env["signatures"][1]["sig"] = base64.b64encode(bytes(sig)).decode()
    both.write_text(json.dumps(env))
    trust = Trust.of(None, [public, colleague_public])
    ok = verify_file(both, trust)
    assert ok.signers == [str(public)] and [c.outcome for c in ok.signatures] == ["good", "bad"]
    assert "1 signature by a trusted key that does not verify" in ok.summary_line()
    # and a later attest by the author keeps working
    attest_run(run_dir, author, tmp_path / "cache")
    assert verify_file(both, trust).signers == [str(public)]


# ---------------------------------------------------------------- 4. a valid signature on the wrong thing


@pytest.mark.parametrize(("result", "levels", "code"), [
    ("FAILED", ("LAUNCHER_REPRODUCED_DIFFERS",), ExitCode.NOT_REPRODUCIBLE),
    ("FAILED", ("LAUNCHER_REPRODUCED_INCONCLUSIVE",), ExitCode.INCONCLUSIVE),
    ("FAILED", ("LAUNCHER_REPRODUCED_IDENTICAL", "LAUNCHER_OTHER_IMAGE"), ExitCode.OTHER_IMAGE),
    ("PASSED", ("LAUNCHER_REPRODUCED_IDENTICAL",), ExitCode.OK),
])
def test_a_failed_verification_summary_is_not_a_valid_verdict(
        tmp_path: Path, author_run: tuple[Path, PemSigner, Path], result: str, levels: tuple[str, ...],
        code: ExitCode) -> None:
    run_dir, _, _ = author_run
    reviewer, reviewer_public = pem(tmp_path, "reviewer")
    path = signed(tmp_path / "verification.dsse.json", vsa(run_dir, keyid_of(reviewer), result, levels), reviewer)
    got, out, err = cli(None, "attest", "verify", str(path), "--key", str(reviewer_public), "--run", str(run_dir))
    assert got == code, err
    assert out["data"]["passed"] is (code == ExitCode.OK)
    if code != ExitCode.OK:
        assert result in out["summary"] and levels[0] in out["summary"]


def test_a_summary_checked_against_another_run_s_folder_is_refused(
        tmp_path: Path, author_run: tuple[Path, PemSigner, Path]) -> None:
    run_dir, _, _ = author_run
    # another run with the same outputs (same seed): only its manifest and provenance tell it apart
    other = write_run(run_dir.parent, FakeRun(run_id=OTHER))
    reviewer, reviewer_public = pem(tmp_path, "reviewer")
    path = signed(tmp_path / "verification.dsse.json", vsa(run_dir, keyid_of(reviewer)), reviewer)
    trust = Trust.of(None, [reviewer_public])
    assert verify_file(path, trust, run_dir).files_checked > 0
    with pytest.raises(DigestMismatch, match=RUN):
        verify_file(path, trust, other)


@pytest.mark.parametrize("subjects", [
    [{"name": "outputs/metrics.jsonl", "digest": {"sha512": "ab" * 64}}],
    [{"uri": "https://example.com/model", "digest": {"sha256": "ab" * 32}}],
    [{"name": "outputs/metrics.jsonl", "digest": {"gitCommit": "ab" * 20}}],
])
def test_a_statement_with_nothing_checkable_is_not_all_files_match(
        tmp_path: Path, author_run: tuple[Path, PemSigner, Path], subjects: list[dict[str, Any]]) -> None:
    run_dir, signer, public = author_run
    statement = {"_type": st.STATEMENT_TYPE, "subject": subjects, "predicateType": "https://example.com/p/v1",
                 "predicate": {}}
    path = signed(tmp_path / "odd.dsse.json", statement, signer)
    code, out, err = cli(None, "attest", "verify", str(path), "--key", str(public), "--run", str(run_dir))
    assert code in (ExitCode.CORRUPT, ExitCode.DIGEST_MISMATCH), out.get("summary")
    assert "all 0 files" not in err


def test_a_sha512_subject_is_checked(tmp_path: Path, author_run: tuple[Path, PemSigner, Path]) -> None:
    run_dir, signer, public = author_run
    good = hashlib.sha512((run_dir / "outputs" / "metrics.jsonl").read_bytes()).hexdigest()
    statement = {"_type": st.STATEMENT_TYPE, "predicateType": "https://example.com/p/v1", "predicate": {},
                 "subject": [{"name": "outputs/metrics.jsonl", "digest": {"sha512": good}}]}
    path = signed(tmp_path / "sha512.dsse.json", statement, signer)
    code, out, err = cli(None, "attest", "verify", str(path), "--key", str(public), "--run", str(run_dir))
    assert code == ExitCode.DIGEST_MISMATCH and "not named" in err  # the other outputs are files it does not name
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "outputs").mkdir()
    shutil.copy(run_dir / "outputs" / "metrics.jsonl", tmp_path / "only" / "outputs")
    code, out, err = cli(None, "attest", "verify", str(path), "--key", str(public), "--run", str(tmp_path / "only"))
    assert code == 0 and out["data"]["files_checked"] == 1, err


def test_duplicate_subject_names_are_refused(tmp_path: Path, author_run: tuple[Path, PemSigner, Path]) -> None:
    run_dir, signer, public = author_run
    prov = json.loads((run_dir / "attestation" / STATEMENT_FILE).read_text())
    first = prov["subject"][0]
    prov["subject"].insert(0, {"name": first["name"], "digest": {"sha256": "0" * 64}})  # the wrong one first
    path = signed(tmp_path / "dup.dsse.json", prov, signer)
    code, _, err = cli(None, "attest", "verify", str(path), "--key", str(public), "--run", str(run_dir))
    assert code == ExitCode.CORRUPT and "twice" in err


def test_predicate_type_and_verifier_are_required_when_asked(
        tmp_path: Path, author_run: tuple[Path, PemSigner, Path]) -> None:
    run_dir, _, public = author_run
    reviewer, reviewer_public = pem(tmp_path, "reviewer")
    summary = signed(tmp_path / "verification.dsse.json", vsa(run_dir, keyid_of(reviewer)), reviewer)
    envelope = str(run_dir / "attestation" / ENVELOPE_FILE)
    keys = ["--key", str(public), "--key", str(reviewer_public)]
    code, _, err = cli(None, "attest", "verify", envelope, *keys, "--predicate-type", "provenance")
    assert code == 0, err
    code, _, err = cli(None, "attest", "verify", str(summary), *keys, "--predicate-type", "provenance")
    assert code == ExitCode.INCOMPATIBLE and "verification summary" in err
    code, _, err = cli(None, "attest", "verify", str(summary), *keys, "--verifier", keyid_of(reviewer))
    assert code == 0, err
    code, _, err = cli(None, "attest", "verify", str(summary), *keys, "--verifier", str(public))
    assert code == ExitCode.UNKNOWN_SIGNER and "not signed by" in err


def test_a_summary_s_verifier_must_be_the_key_that_signed_it(
        tmp_path: Path, author_run: tuple[Path, PemSigner, Path]) -> None:
    run_dir, author, public = author_run
    reviewer, reviewer_public = pem(tmp_path, "reviewer")
    trust = Trust.of(None, [public, reviewer_public])
    # signed by the author, claiming the reviewer verified it
    claimed = signed(tmp_path / "a.dsse.json", vsa(run_dir, keyid_of(reviewer)), author)
    with pytest.raises(UnknownSigner, match="verifier"):
        verify_file(claimed, trust)
    # a verifier id that names no key at all (user@host)
    loose = signed(tmp_path / "b.dsse.json", vsa(run_dir, "root@laptop"), reviewer)
    with pytest.raises(UnknownSigner, match="verifier"):
        verify_file(loose, trust)


# ---------------------------------------------------------------- 5. --run: the folder as it is


def test_a_file_added_to_the_outputs_is_a_mismatch(tmp_path: Path, author_run: tuple[Path, PemSigner, Path]) -> None:
    run_dir, _, public = author_run
    envelope = run_dir / "attestation" / ENVELOPE_FILE
    assert verify_file(envelope, Trust.of(None, [public]), run_dir).files_checked > 0
    (run_dir / "outputs" / "model" / "backdoor.npz").write_bytes(b"extra")
    with pytest.raises(DigestMismatch, match=r"backdoor\.npz"):
        verify_file(envelope, Trust.of(None, [public]), run_dir)


@pytest.mark.parametrize("what", ["file", "folder"])
def test_an_output_replaced_by_a_link_is_a_mismatch(
        tmp_path: Path, author_run: tuple[Path, PemSigner, Path], what: str) -> None:
    run_dir, _, public = author_run
    elsewhere = tmp_path / "elsewhere"
    if what == "file":
        target = run_dir / "outputs" / "metrics.jsonl"
        elsewhere.mkdir()
        shutil.copy(target, elsewhere / "metrics.jsonl")
        target.unlink()
        target.symlink_to(elsewhere / "metrics.jsonl")
    else:
        target = run_dir / "outputs" / "model"
        shutil.copytree(target, elsewhere)
        shutil.rmtree(target)
        target.symlink_to(elsewhere)
    with pytest.raises(DigestMismatch, match="link"):
        verify_file(run_dir / "attestation" / ENVELOPE_FILE, Trust.of(None, [public]), run_dir)
