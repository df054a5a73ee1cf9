"""One real training run: the TensorFlow CPU image shipped to the SSH test host, mnist_convnet trained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from testhost import TestHost

from launcher.hosts.spec import HostSpec
from launcher.hosts.ssh import SSHHost
from launcher.progress import RecordingReporter
from launcher.runs import lifecycle as runs

pytestmark = [pytest.mark.testhost, pytest.mark.tfimage]


def test_mnist_convnet_trains_on_the_ssh_host_and_comes_back_verified(
    testhost: TestHost, cpu_image: dict[str, Any]
) -> None:
    ws = cpu_image["workspace"]
    opts = {"identity": testhost.key, "known_hosts": testhost.known_hosts, "ssh_config": Path("/dev/null")}
    spec = runs.RunSpec(
        "mnist_convnet", seed=3, params={"epochs": 1, "train_samples": 256, "test_samples": 64}
    )
    rep = RecordingReporter()
    lines: list[str] = []
    with SSHHost.connect(testhost.spec, **opts) as host:  # type: ignore[arg-type]
        out = runs.run_recipe(
            ws, spec, host, rep, host_spec=HostSpec(testhost.spec, **opts), on_log=lines.append
        )
    manifest = out.runs[0]
    assert manifest["status"] == "succeeded", "\n".join(lines[-30:])
    assert manifest["image"]["id"] == cpu_image["id"]
    assert any(t.startswith("ship image") for t in rep.tasks)
    assert manifest["runtime"].get("framework") or manifest["runtime"]
    paths = {a["path"]: a["sha256"] for a in manifest["artifacts"]}
    for expected in ("outputs/model/canonical.npz", "outputs/metrics.jsonl", "outputs/logs/train.log"):
        assert expected in paths
    remote_out = f"/root/.launcher/runs/{manifest['run_id']}/out"
    listing = testhost.exec("sh", "-c", f"cd {remote_out} && find . -type f -print0 | xargs -0 sha256sum")
    assert paths == {
        "outputs/" + line[66:].removeprefix("./"): "sha256:" + line[:64] for line in listing.splitlines()
    }
