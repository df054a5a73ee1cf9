"""A host behind a bastion, for real: the bastion is a test host on the bridge and on an internal Docker
network; the target is a test host on the internal network alone, whose sshd answers the bastion only.
Both are named in an SSH config that launcher reads through `Include`, the target with `ProxyJump`.
`launcher run` (control over paramiko through the hop; the image and the outputs over OpenSSH through
the same hop) and `launcher pull` work; a changed key on the bastion is refused."""

from __future__ import annotations

import json
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest_testhost import _need_host_tools
from testhost import LABEL, TestHost, start_testhost
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode

pytestmark = [pytest.mark.docker, pytest.mark.testhost]
runner = CliRunner()


@pytest.fixture(scope="module")
def behind_bastion(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestHost, TestHost, Path]]:
    _need_host_tools()
    work = tmp_path_factory.mktemp("jump")
    net = f"launcher-jump-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "network", "create", "--internal", "--label", LABEL, net], check=True,
                   capture_output=True)
    started: list[TestHost] = []
    try:
        bastion = start_testhost(work / "bastion", also=(net,))
        started.append(bastion)
        target = start_testhost(work / "target", network=net, reachable=False)
        started.append(target)
        # this machine has an address on every Docker network, internal ones too: the target's sshd
        # answers the bastion alone, as a private subnet behind a bastion does
        fmt = f'{{{{(index .NetworkSettings.Networks "{net}").IPAddress}}}}'
        inner = subprocess.run(["docker", "inspect", "-f", fmt, bastion.container], capture_output=True, text=True,
                               check=True).stdout.strip()
        target.exec("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "22", "!", "-s", inner, "-j", "DROP")
        ssh = work / "ssh"
        (ssh / "conf.d").mkdir(parents=True)
        known = ssh / "known_hosts"
        known.write_text(bastion.known_hosts.read_text() + target.known_hosts.read_text())
        (ssh / "conf.d" / "lab.conf").write_text(
            f"Host lab-bastion\n  HostName {bastion.ip}\n  User root\n  IdentityFile {bastion.key}\n"
            f"  UserKnownHostsFile {known}\n"
            f"Host lab-gpu\n  HostName {target.ip}\n  User root\n  IdentityFile {target.key}\n"
            f"  UserKnownHostsFile {known}\n  ProxyJump lab-bastion\n")
        (ssh / "config").write_text(f"Include {ssh}/conf.d/*.conf\n")
        yield bastion, target, ssh
    finally:
        for h in started:
            h.stop()
        subprocess.run(["docker", "network", "rm", net], capture_output=True, check=False)


def _cli(ws: Path, *args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["--workspace", str(ws), "--quiet", *args])
    return res.exit_code, res.output


def test_the_target_is_reachable_only_through_the_bastion(behind_bastion: tuple[TestHost, TestHost, Path]) -> None:
    _, target, _ = behind_bastion
    with pytest.raises(OSError):
        socket.create_connection((target.ip, 22), timeout=3).close()


def test_run_and_pull_through_proxyjump_in_an_included_config(
    behind_bastion: tuple[TestHost, TestHost, Path], tiny_workspace: Path
) -> None:
    _, target, ssh = behind_bastion
    on = ["--host", "lab-gpu", "--ssh-config", str(ssh / "config")]
    code, out = _cli(tiny_workspace, "run", "tiny", *on, "--seed", "3", "--param", "sleep=3")
    assert code == 0, out
    code, out = _cli(tiny_workspace, "run", "tiny", *on, "--seed", "3", "--param", "sleep=3", "--detach")
    assert code == 0, out
    detached = max(p.name for p in (tiny_workspace / "runs").iterdir())
    code, out = _cli(tiny_workspace, "pull", detached, "--watch", "1")
    assert code == 0, out
    manifests = [json.loads(p.read_text()) for p in sorted((tiny_workspace / "runs").glob("*/manifest.json"))]
    assert [m["status"] for m in manifests] == ["succeeded", "succeeded"]
    assert {m["host"]["hostname"] for m in manifests} == {target.ip}
    # the image went over the bulk path (OpenSSH through the same hop): the target's engine has it
    assert manifests[0]["image"]["id"] in target.exec("docker", "images", "-q", "--no-trunc")
    code, out = _cli(tiny_workspace, "verify", "checksums", manifests[0]["run_id"], manifests[1]["run_id"])
    # tiny imports no known framework: no difference, but no determinism guaranteed either
    assert code == ExitCode.INCONCLUSIVE and "identical outputs" in out, out


def test_a_changed_key_on_the_bastion_is_refused(
    behind_bastion: tuple[TestHost, TestHost, Path], tiny_workspace: Path
) -> None:
    bastion, target, ssh = behind_bastion
    known = ssh / "known_hosts"
    good = known.read_text()
    other = ssh / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    try:  # the bastion's line now holds another key, as after a man-in-the-middle
        key_type, key = other.with_suffix(".pub").read_text().split()[:2]
        known.write_text(f"{bastion.ip} {key_type} {key}\n" + target.known_hosts.read_text())
        code, out = _cli(tiny_workspace, "ps", "--host", "lab-gpu", "--ssh-config", str(ssh / "config"))
        assert code == ExitCode.HOST_KEY_REJECTED, out
        assert f"the host key of {bastion.ip} CHANGED" in out
    finally:
        known.write_text(good)
