"""`launcher vm up` → `provision --host NAME` → `run --host NAME` → `vm down`, for real over SSH: the Azure
double (tests/azuredouble.py) "boots" the VM on a fresh SSH test host (a container with its own sshd and
Docker engine) from what launcher sent — the admin user with the user's key, then the cloud-init custom
data: launcher's host key as the only host key, no password login, and the setup script run for real —
and points the VM's public IP at it. launcher reaches it through the alias in its own SSH config, with
strict host-key checking against the key it made; a changed key is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azuredouble import AzureDouble, boot_on_testhost
from conftest_testhost import _need_host_tools
from testhost import TestHost, start_testhost
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.vms import aliases

pytestmark = [pytest.mark.docker, pytest.mark.testhost]
runner = CliRunner()


@pytest.fixture
def vm_host(tmp_path: Path) -> Iterator[TestHost]:
    _need_host_tools()
    host = start_testhost(tmp_path / "vm")  # its own: booting it replaces its host keys
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture
def azure(azure_sdk: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          vm_host: TestHost) -> Iterator[AzureDouble]:
    double = AzureDouble(tmp_path / "double").start()
    double.on_vm_created = lambda vm: boot_on_testhost(vm_host, vm)
    for k, v in double.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AZURE_TOKEN_CREDENTIALS", raising=False)
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "launcher-home"))
    try:
        yield double
    finally:
        double.stop()


def cli(*args: str, ws: Path | None = None) -> tuple[int, dict[str, Any], str]:
    res = runner.invoke(app, [*(["--workspace", str(ws)] if ws else []), "--json", "--quiet", *args])
    try:
        return res.exit_code, json.loads(res.stdout), res.output
    except ValueError:
        raise AssertionError(f"not JSON (exit {res.exit_code}): {res.output}") from None


def test_vm_up_provision_run_down_over_ssh(azure: AzureDouble, vm_host: TestHost, tiny_workspace: Path) -> None:
    # the test host's key pair stands for the user's; launcher reaches the "VM" at the test host's address
    code, up, out = cli("vm", "up", "gpu1", "--size", "Standard_D4s_v5", "--region", "westeurope",
                        "--ssh-key", str(vm_host.key.with_suffix(".pub")))
    assert code == 0, out
    assert up["data"]["ready"] is True and up["data"]["vm"]["address"] == vm_host.ip
    assert azure.violations == []
    # only launcher's host key is left on the host, and it is the one in launcher's known_hosts
    keys = vm_host.exec("sh", "-c", "ls /etc/ssh/ssh_host_*").split()
    assert keys == ["/etc/ssh/ssh_host_ed25519_key", "/etc/ssh/ssh_host_ed25519_key.pub"]
    on_host = vm_host.exec("cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()[:2]
    assert aliases.host_key_of("gpu1") == " ".join(on_host)
    # cloud-init's setup ran: the admin user may use Docker, the marker is written
    assert "docker" in vm_host.exec("id", "-nG", "azureuser").split()
    assert vm_host.exec("test", "-f", "/var/lib/launcher/vm-ready", check=False) == ""

    code, prov, out = cli("provision", "--host", "gpu1")
    assert code == 0, out
    facts = prov["data"]["facts"]
    assert facts["user"] == "azureuser" and facts["docker"]["usable"] is True

    code, run, out = cli("run", "tiny", "--host", "gpu1", "--param", "size_kb=16", ws=tiny_workspace)
    assert code == 0, out
    assert run["data"]["runs"][0]["status"] == "succeeded"

    # a different key at that address is refused, never trusted on first use
    kh = aliases.known_hosts_path()
    good = kh.read_text()
    from launcher.vms.cloudinit import HostKey

    kh.write_text(good.replace(" ".join(on_host), HostKey.generate().public))
    code, _, out = cli("provision", "--host", "gpu1")
    assert code == ExitCode.HOST_KEY_REJECTED, out
    kh.write_text(good)

    code, _, out = cli("vm", "down", "gpu1", "--yes")
    assert code == 0, out
    assert azure.groups() == [] and aliases.lookup("gpu1") is None
    assert "gpu1" not in aliases.own_ssh_config().read_text().split()


def test_first_boot_setup_installs_what_an_image_lacks(base_ref: str) -> None:
    """cloud-init's runcmd on an image without Docker (the bootstrapped Debian base here): it installs Docker from the
    distribution, puts the admin user in the docker group and marks the VM ready; run twice, it changes
    nothing more (cloud-init runs it once, but a rerun must be harmless)."""
    import subprocess

    from conftest import need

    from launcher.vms.cloudinit import READY_MARKER, setup_script

    _need_host_tools()
    script = setup_script()
    cmd = ("useradd -m -s /bin/sh azureuser && cat > /tmp/setup.sh && ! command -v docker && "
           "sh /tmp/setup.sh azureuser && sh /tmp/setup.sh azureuser && command -v docker && "
           f"id -nG azureuser && cat {READY_MARKER}")
    cp = subprocess.run(["docker", "run", "--rm", "-i", base_ref, "sh", "-c", cmd], input=script.encode(),
                        capture_output=True, timeout=900, check=False)
    err = cp.stderr.decode(errors="replace")
    need(cp.returncode == 0 or ("Could not resolve" not in err and "Temporary failure" not in err),
         f"Debian's package archive is not reachable from a container: {err[-300:]}")
    assert cp.returncode == 0, err[-2000:]
    out = cp.stdout.decode().split()
    assert out[0] == "/usr/bin/docker" and "docker" in out[1:-1] and out[-1].endswith("Z")


@pytest.mark.usefixtures("azure_sdk")  # before vm_host: no test host started for a skip
def test_a_vm_that_answers_with_another_host_key_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           vm_host: TestHost) -> None:
    """The "VM" gets the user and key but ignores the custom data (keeps its own host keys): launcher
    refuses it at the first connection instead of trusting what it finds there."""
    double = AzureDouble(tmp_path / "double").start()

    def boot_without_cloud_init(vm: dict[str, Any]) -> str:
        osp = vm["body"]["properties"]["osProfile"]
        key = osp["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"]
        vm_host.exec("sh", "-c", "useradd -m -s /bin/sh -p '*' azureuser && mkdir -p /home/azureuser/.ssh && "
                     f"echo '{key}' > /home/azureuser/.ssh/authorized_keys && chown -R azureuser /home/azureuser")
        return vm_host.ip

    double.on_vm_created = boot_without_cloud_init
    for k, v in double.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "launcher-home"))
    try:
        code, res, out = cli("vm", "up", "gpu1", "--size", "Standard_D4s_v5", "--region", "westeurope",
                             "--ssh-key", str(vm_host.key.with_suffix(".pub")))
        assert code == ExitCode.HOST_KEY_REJECTED, out
        assert "other than the one launcher made" in res["summary"] and "vm down gpu1" in res["summary"]
        # nothing of the host's own key was recorded
        assert vm_host.exec("cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()[1] not in \
            aliases.known_hosts_path().read_text()
    finally:
        double.stop()
