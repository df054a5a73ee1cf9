"""Independent re-execution, end to end: a bundle made in one workspace is reproduced in a second, fresh
workspace (with a fresh launcher cache, as on another machine) on the SSH test host; the reproduction's
signed verification summary verifies; a bundle changed after signing is refused before anything is built;
an image other than the recorded one is refused unless allowed, and then named. (A TensorFlow run whose
reproduction is identical: tests/test_runs_tf.py, where the test host already holds the image.)"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_attest import allowed_signers, protobuf_check, ssh_key
from test_bundle import rewrite_member
from testhost import TestHost
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.images import build as build_mod

pytestmark = [pytest.mark.docker, pytest.mark.registry]


def cli(ws: Path | None, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    where = ["--workspace", str(ws)] if ws is not None else []
    result = CliRunner().invoke(app, [*where, "--json", "--quiet", *args], env=env)
    data = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.exit_code, data, result.stderr


def ssh_args(th: TestHost) -> list[str]:
    return ["--host", th.spec, "--identity", str(th.key), "--known-hosts", str(th.known_hosts),
            "--ssh-config", "/dev/null"]


def spy_processes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every command launcher runs from now on, as it is run."""
    from launcher import proc

    ran: list[list[str]] = []
    real = proc.run

    def spy(argv: Any, *a: Any, **kw: Any) -> Any:
        ran.append([str(x) for x in argv])
        return real(argv, *a, **kw)

    monkeypatch.setattr(proc, "run", spy)
    return ran


def git_on_bundled_files(ran: list[list[str]], into: Path) -> list[list[str]]:
    """The git commands that ran on the bundle's files (its recipes, its code) in the reproduction's workspace."""
    bundled = tuple(str(into / part) for part in ("recipes", "code", ".launcher"))
    return [a for a in ran if Path(a[0]).name == "git" and any(x.startswith(bundled) for x in a)]


@pytest.fixture
def people(tmp_path: Path) -> dict[str, Path]:
    """The author (an SSH key) and the reviewer (an SSH key), and an allowed-signers file naming both."""
    author = ssh_key(tmp_path / "keys", "author", "author@example.com")
    reviewer = ssh_key(tmp_path / "keys", "reviewer", "reviewer@example.com")
    return {"author": author, "reviewer": reviewer,
            "allowed": allowed_signers(tmp_path / "allowed_signers", ("author@example.com", author),
                                       ("reviewer@example.com", reviewer))}


def payload(envelope: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(base64.b64decode(json.loads(envelope.read_text())["payload"]))
    return data


def write_project(root: Path) -> Path:
    """A plain script with a module beside it, reading its data and writing a model and metrics."""
    root.mkdir(parents=True)
    (root / "helpers.py").write_text("import hashlib\n\ndef mix(seed, data):\n"
                                     "    return hashlib.sha256(f'{seed}'.encode() + data).digest() * 64\n")
    (root / "train.py").write_text(
        "import json, os\nfrom pathlib import Path\nfrom helpers import mix\n"
        "data = (Path(os.environ['LAUNCHER_DATA']) / 'numbers.txt').read_bytes()\n"
        "Path('model').mkdir(exist_ok=True)\n"
        "Path('model/weights.bin').write_bytes(mix(os.environ['LAUNCHER_SEED'], data))\n"
        "Path('metrics.jsonl').write_text(json.dumps({'epoch': 0, 'loss': len(data)}) + '\\n')\n")
    return root / "train.py"


@pytest.mark.testhost
def test_a_bundle_is_reproduced_in_a_fresh_workspace_on_the_ssh_test_host(
        testhost: TestHost, tiny_workspace: Path, people: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "numbers.txt").write_text("1 2 3\n")
    script = write_project(tmp_path / "myproj")
    code, out, err = cli(tiny_workspace, "run", str(script), "--seed", "9", "--data-from", str(data), "--", "--fast")
    assert code == 0, err
    original = out["data"]["runs"][0]
    bundle = tmp_path / "proof.bundle"
    code, _, err = cli(tiny_workspace, "bundle", original["run_id"], "-o", str(bundle), "--with-data",
                          "--key", str(people["author"]))
    assert code == 0, err

    # the reviewer: another workspace and another cache (another machine, to launcher), the author's key trusted
    reviewer_env = {"LAUNCHER_CACHE": str(tmp_path / "reviewer-cache")}
    edited = tmp_path / "edited.bundle"
    code_key = original["recipe"]["tree_digest"][7:23]
    rewrite_member(bundle, edited, f"code/{code_key}/myproj/helpers.py", lambda b: b.replace(b"* 64", b"* 65"))
    code, _, err = cli(None, "reproduce", str(edited), "--into", str(tmp_path / "refused"), *ssh_args(testhost),
                       "--allowed-signers", str(people["allowed"]), "--key", str(people["reviewer"]), env=reviewer_env)
    assert code == ExitCode.DIGEST_MISMATCH, err
    assert "myproj/helpers.py (changed)" in err and "nothing was built" in err
    assert not (tmp_path / "refused" / "recipes").exists() and not (tmp_path / "refused" / "runs").exists()
    assert not (tmp_path / "reviewer-cache" / "builds").exists()  # no image was built

    into = tmp_path / "review"
    ran = spy_processes(monkeypatch)
    code, done, err = cli(None, "reproduce", str(bundle), "--into", str(into), *ssh_args(testhost),
                          "--allowed-signers", str(people["allowed"]), "--key", str(people["reviewer"]),
                          env=reviewer_env)
    assert git_on_bundled_files(ran, into) == []  # git obeys a repository's config and hooks: never a stranger's
    # the tiny image has no framework, so determinism is not in force: identical outputs, but inconclusive
    assert code == ExitCode.INCONCLUSIVE, err
    d = done["data"]
    assert d["image"]["same"] is True and d["image"]["rebuilt"] == original["image"]["id"]
    assert (tmp_path / "reviewer-cache" / "builds").is_dir()  # rebuilt here, from the bundle's inputs
    rep = d["runs"][0]
    assert rep["verdict"] == "inconclusive" and rep["outputs"]["outputs/model/weights.bin"]["status"] == "identical"
    new_manifest = json.loads((into / "runs" / rep["reproduced"] / "manifest.json").read_text())
    assert new_manifest["host"]["kind"] == "ssh" and new_manifest["recipe"]["identity"] == "myproj/train.py"
    assert new_manifest["recipe"]["args"] == ["--fast"] and new_manifest["seed"] == 9
    assert new_manifest["data_source"]["digest"] == original["data_source"]["digest"]

    vsa = Path(rep["verification"])
    code, checked, err = cli(None, "attest", "verify", str(vsa), "--allowed-signers", str(people["allowed"]),
                             "--run", str(into / "runs" / original["run_id"]), "--verifier", "reviewer@example.com",
                             "--predicate-type", "summary")
    # a valid summary of a reproduction that did not pass: its verdict's exit code, not 0
    assert code == ExitCode.INCONCLUSIVE, err
    assert checked["data"]["valid"] is True and checked["data"]["passed"] is False
    assert checked["data"]["verification_result"] == "FAILED"
    assert checked["data"]["verified_levels"] == ["LAUNCHER_REPRODUCED_INCONCLUSIVE"]
    assert checked["data"]["trusted"] == [{"allowed_signers": str(people["allowed"]), "from": "--allowed-signers"}]
    # the summary names the reviewer's key, which signed it
    reviewer_key = checked["data"]["signatures"][0]["keyid"]
    assert checked["data"]["verifier"] == f"urn:launcher:verifier:{reviewer_key}"
    code, _, err = cli(None, "attest", "verify", str(vsa), "--allowed-signers", str(people["allowed"]),
                       "--verifier", "author@example.com")
    assert code == ExitCode.UNKNOWN_SIGNER, err
    # the summary checked against another run's folder (the reproduction's own): refused
    code, _, err = cli(None, "attest", "verify", str(vsa), "--allowed-signers", str(people["allowed"]),
                       "--run", str(into / "runs" / rep["reproduced"]))
    assert code == ExitCode.DIGEST_MISMATCH, err
    statement = payload(vsa)
    protobuf_check(statement)
    pred = statement["predicate"]
    assert pred["resourceUri"] == f"urn:launcher:run:{original['run_id']}"
    original_envelope = into / "runs" / original["run_id"] / "attestation" / "provenance.dsse.json"
    inputs = {a["uri"]: a["digest"]["sha256"] for a in pred["inputAttestations"]}
    assert inputs[f"runs/{original['run_id']}/attestation/provenance.dsse.json"] == \
        hashlib.sha256(original_envelope.read_bytes()).hexdigest()
    reproduction = payload(into / "runs" / rep["reproduced"] / "attestation" / "provenance.dsse.json")
    assert reproduction["predicate"]["runDetails"]["builder"]["id"] == f"urn:launcher:direct:ssh:{testhost.spec}"
    results = {s["name"]: s["annotations"]["result"] for s in statement["subject"]}
    assert results["outputs/model/weights.bin"] == "identical" and results["outputs/metrics.jsonl"] == "identical"
    # a reviewer who trusts only the author refuses the reproduction's signature
    only_author = allowed_signers(tmp_path / "only-author", ("author@example.com", people["author"]))
    code, _, err = cli(None, "attest", "verify", str(vsa), "--allowed-signers", str(only_author))
    assert code == ExitCode.UNKNOWN_SIGNER, err


def test_another_image_is_refused_before_running_unless_allowed_and_then_named(
        tiny_workspace: Path, people: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = cli(tiny_workspace, "run", "tiny", "--seed", "4", "--param", "size_kb=4")
    assert code == 0, err
    run_id = out["data"]["runs"][0]["run_id"]
    bundle = tmp_path / "tiny.bundle"
    code, _, err = cli(tiny_workspace, "bundle", run_id, "-o", str(bundle), "--key", str(people["author"]),
                       "--without-base")
    assert code == 0, err
    # the reviewer's launcher has another in-container runtime (one comment more): its images differ
    package = tmp_path / "other-launcher" / "launcher"
    shutil.copytree(build_mod.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(package / "runtime" / "__init__.py", "a") as f:
        f.write("# another launcher\n")
    monkeypatch.setattr(build_mod, "PACKAGE_DIR", package)
    monkeypatch.setattr("launcher.workflows.reproduce.PACKAGE_DIR", package)
    args = ["--allowed-signers", str(people["allowed"]), "--key", str(people["reviewer"])]
    code, _, err = cli(None, "reproduce", str(bundle), "--into", str(tmp_path / "no"), *args)
    assert code == ExitCode.OTHER_IMAGE == 44, err
    assert "runtime" in err and "--allow-other-image" in err
    assert not (tmp_path / "no" / "runs").exists()
    ran = spy_processes(monkeypatch)
    code, done, err = cli(None, "reproduce", str(bundle), "--into", str(tmp_path / "yes"), *args,
                          "--allow-other-image")
    assert git_on_bundled_files(ran, tmp_path / "yes") == []
    assert code == ExitCode.INCONCLUSIVE, err
    image = done["data"]["image"]
    assert image["same"] is False and "org.launcher.runtime-digest" in image["differs_in"]
    assert "another image than the recorded one" in done["summary"]
    vsa = payload(Path(done["data"]["runs"][0]["verification"]))
    assert vsa["predicate"]["verifiedLevels"] == ["LAUNCHER_REPRODUCED_INCONCLUSIVE", "LAUNCHER_OTHER_IMAGE"]
    assert vsa["predicate"]["verificationResult"] == "FAILED"  # another image never passes the policy
    code, _, err = cli(None, "attest", "verify", done["data"]["runs"][0]["verification"],
                       "--allowed-signers", str(people["allowed"]))
    assert code == ExitCode.OTHER_IMAGE, err
