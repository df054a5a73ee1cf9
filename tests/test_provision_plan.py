"""The fact parser and the install plan, from canned facts (no host needed)."""

from __future__ import annotations

import shlex

import pytest

from launcher.errors import HostNotReady
from launcher.hosts.provision import DOCKERD_LOG, install_plan, parse_facts
from launcher.hosts.scripts import text as host_script

READY = """os=Ubuntu 22.04.4 LTS
os_id=ubuntu
os_version=22.04
kernel=6.5.0-1017-azure
arch=x86_64
user=azureuser
uid=1000
systemd=1
cpu_model=AMD EPYC 7V13 64-Core Processor
cpu_cores=24
ram_bytes=232000000000
disk_free_bytes=100000000000
sudo=1
docker_installed=1
docker_client=Docker version 24.0.7
docker_usable=1
docker_info=24.0.7|{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}|/var/lib/docker
nvidia_smi=1
gpu=NVIDIA A100 80GB PCIe, 535.129.03, 81920 MiB
nvidia_ctk=1
"""


def test_parse_facts_reads_every_field() -> None:
    f = parse_facts(READY)
    assert f["os_id"] == "ubuntu" and f["cpu_cores"] == 24 and f["ram_bytes"] == 232000000000
    assert f["docker"]["server_version"] == "24.0.7" and f["docker"]["nvidia_runtime"] is True
    assert f["nvidia"]["gpus"] == [
        {"name": "NVIDIA A100 80GB PCIe", "driver": "535.129.03", "memory": "81920 MiB"}
    ]
    assert f["is_root"] is False and f["sudo"] is True


def test_a_ready_host_plans_nothing_so_install_is_idempotent() -> None:
    assert install_plan(parse_facts(READY), gpu=True) == []


def test_a_bare_ubuntu_gpu_vm_gets_docker_and_the_nvidia_toolkit() -> None:
    bare = (
        "\n".join(line for line in READY.splitlines() if not line.startswith(("docker", "nvidia_ctk")))
        + "\ndocker_installed=0\nnvidia_ctk=0\n"
    )
    cmds = [s.command for s in install_plan(parse_facts(bare), gpu=True)]
    assert cmds[:3] == [
        "sudo apt-get update",
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io",
        "sudo systemctl enable --now docker",
    ]
    assert "sudo usermod -aG docker azureuser" in cmds
    assert any("nvidia-container-toolkit.list" in c for c in cmds)
    assert "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y nvidia-container-toolkit" in cmds
    assert cmds[-2:] == [
        "sudo nvidia-ctk runtime configure --runtime=docker",
        "sudo systemctl restart docker",
    ]
    assert not any("ubuntu-drivers" in c for c in cmds)  # the driver is there already
    assert not any("nvidia" in c for c in (s.command for s in install_plan(parse_facts(bare))))


def test_root_gets_no_sudo_and_no_group_change() -> None:
    facts = parse_facts(
        READY.replace("uid=1000", "uid=0").replace("docker_installed=1", "docker_installed=0")
    )
    cmds = [s.command for s in install_plan(facts)]
    assert cmds and not any(c.startswith("sudo") or "usermod" in c for c in cmds)


def test_unsupported_os_is_a_clear_error() -> None:
    with pytest.raises(HostNotReady, match="Ubuntu and Debian"):
        install_plan(parse_facts(READY.replace("os_id=ubuntu", "os_id=fedora")))


def _no_systemd(facts: str) -> str:
    return facts.replace("systemd=1", "systemd=0")


DOCKERD = f"sudo sh -c {shlex.quote(host_script('dockerd.sh'))} sh"
START_BG = f"{DOCKERD} start {DOCKERD_LOG} 60"
WAIT = f"{DOCKERD} wait {DOCKERD_LOG} 60"


def test_without_systemd_docker_is_started_in_the_background_and_awaited() -> None:
    """A host where systemd does not run the services (a container, WSL): dockerd in its own session,
    then `docker info` awaited; systemctl would fail there."""
    kept = (ln for ln in _no_systemd(READY).splitlines() if not ln.startswith("docker"))
    bare = "\n".join(kept) + "\ndocker_installed=0\n"
    facts = parse_facts(bare)
    assert facts["systemd"] is False and parse_facts(READY)["systemd"] is True
    cmds = [s.command for s in install_plan(facts)]
    assert cmds == [
        "sudo apt-get update",
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io",
        START_BG,
        WAIT,
        "sudo usermod -aG docker azureuser",
    ]
    # the GPU runtime: dockerd stopped by its pid file, started again, awaited
    gpu = [s.command for s in install_plan(facts, gpu=True)]
    assert gpu[-4] == "sudo nvidia-ctk runtime configure --runtime=docker"
    assert gpu[-3] == f"{DOCKERD} stop {DOCKERD_LOG} 60" and gpu[-2:] == [START_BG, WAIT]
    assert not any("systemctl" in c for c in gpu)


def test_an_installed_docker_that_does_not_answer_is_started_not_reinstalled() -> None:
    """After a reboot of a host without systemd (or a stopped service), --install starts Docker again;
    a daemon that answers but refuses this user is a group matter, not a start."""
    down = READY.replace("docker_usable=1", "docker_usable=0").replace(
        "docker_info=", "docker_error=Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?\nx=")
    cmds = [s.command for s in install_plan(parse_facts(down))]
    assert cmds == ["sudo systemctl enable --now docker", "sudo usermod -aG docker azureuser"]
    assert [s.command for s in install_plan(parse_facts(_no_systemd(down)))][:2] == [START_BG, WAIT]
    denied = READY.replace("docker_usable=1", "docker_usable=0").replace(
        "docker_info=", "docker_error=permission denied while trying to connect to the Docker daemon socket\nx=")
    assert [s.command for s in install_plan(parse_facts(denied))] == ["sudo usermod -aG docker azureuser"]
