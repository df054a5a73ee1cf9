"""Real training runs: the TensorFlow CPU image shipped to the SSH test host, mnist_convnet trained; and a
bundled run reproduced there, identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_attest import pem_key, protobuf_check
from test_reproduce import cli, payload, ssh_args
from testhost import TestHost

from launcher.hosts.hostspec import HostSpec
from launcher.hosts.ssh import SSHHost
from launcher.progress import RecordingReporter
from launcher.runs import lifecycle as runs

pytestmark = [pytest.mark.testhost, pytest.mark.tfimage]


def test_mnist_convnet_trains_on_the_ssh_host_and_comes_back_verified(
    testhost: TestHost, cpu_image: dict[str, Any]
) -> None:
    ws = cpu_image["workspace"]
    opts = {"identity": testhost.key, "known_hosts": testhost.known_hosts, "ssh_config": Path("/dev/null")}
    spec = runs.RunRequest(
        "mnist_convnet", seed=3, params={"epochs": 1, "train_samples": 256, "test_samples": 64}
    )
    rep = RecordingReporter()
    lines: list[str] = []

    def host_has_image() -> bool:
        probe = f"docker image inspect {cpu_image['id']} >/dev/null 2>&1 && echo yes || echo no"
        return testhost.exec("sh", "-c", probe).strip() == "yes"

    had_image = host_has_image()  # an earlier test (tests/test_resume.py) may have shipped it already
    with SSHHost.connect(testhost.spec, **opts) as host:  # type: ignore[arg-type]
        out = runs.run_recipe(
            ws, spec, host, rep, host_spec=HostSpec(testhost.spec, **opts), on_log=lines.append
        )
    manifest = out.runs[0]
    assert manifest["status"] == "succeeded", "\n".join(lines[-30:])
    assert manifest["image"]["id"] == cpu_image["id"]
    assert had_image or any(t.startswith("ship image") for t in rep.tasks)
    assert host_has_image()
    assert manifest["runtime"].get("framework") or manifest["runtime"]
    paths = {a["path"]: a["sha256"] for a in manifest["artifacts"]}
    for expected in ("outputs/model/canonical.npz", "outputs/metrics.jsonl", "outputs/logs/train.log"):
        assert expected in paths
    remote_out = f"/root/.launcher/runs/{manifest['run_id']}/out"
    listing = testhost.exec("sh", "-c", f"cd {remote_out} && find . -type f -print0 | xargs -0 sha256sum")
    assert paths == {
        "outputs/" + line[66:].removeprefix("./"): "sha256:" + line[:64] for line in listing.splitlines()
    }


def test_a_bundled_run_reproduced_on_the_ssh_test_host_is_identical_and_says_so_signed(
        testhost: TestHost, cpu_image: dict[str, Any], make_workspace: Any, tmp_path: Path) -> None:
    """A run made in one workspace, bundled, reproduced in a fresh one on the test host (which holds the image
    since the test above: the ship is not paid twice): identical, in a signed summary (PEM keys this time)."""
    ws = make_workspace(tmp_path / "author").root
    author_key, author_pub = pem_key(tmp_path / "keys", "author")
    reviewer_key, reviewer_pub = pem_key(tmp_path / "keys", "reviewer", "ecdsa")
    code, out, err = cli(ws, "run", "mnist_convnet", "--seed", "3", "--param", "epochs=1",
                         "--param", "train_samples=256", "--param", "test_samples=64")
    assert code == 0, err
    original = out["data"]["runs"][0]
    assert original["image"]["id"] == cpu_image["id"]
    bundle = tmp_path / "mnist.bundle"
    code, _, err = cli(ws, "bundle", original["run_id"], "-o", str(bundle), "--key", str(author_key))
    assert code == 0, err
    code, done, err = cli(None, "reproduce", str(bundle), "--into", str(tmp_path / "review"), *ssh_args(testhost),
                          "--trusted-key", str(author_pub), "--key", str(reviewer_key))
    assert code == 0, err
    rep = done["data"]["runs"][0]
    assert rep["verdict"] == "identical" and done["data"]["image"]["same"] is True
    assert rep["outputs"]["outputs/model/canonical.npz"]["status"] == "identical"
    vsa = Path(rep["verification"])
    code, checked, err = cli(None, "attest", "verify", str(vsa), "--key", str(reviewer_pub))
    assert code == 0, err
    assert checked["data"]["verification_result"] == "PASSED"
    assert checked["data"]["verified_levels"] == ["LAUNCHER_REPRODUCED_IDENTICAL"]
    protobuf_check(payload(vsa))
