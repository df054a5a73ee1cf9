"""A VM's life: `vm up` (plan, create, alias, wait until SSH answers with the key launcher made),
`vm ls`, `vm down` (delete its resource group, wait, drop the alias)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from launcher.errors import (
    AuthFailed,
    HostKeyRejected,
    HostUnreachable,
    LauncherError,
    TimedOut,
    UsageError,
)
from launcher.hosts import sshconfig
from launcher.progress import NullReporter, Reporter
from launcher.vms import aliases, cloudinit
from launcher.vms.azure import AzureCloud, VmInfo, VmRecord
from launcher.vms.vmspec import PlanStep, VmSpec, check_name, group_name, parse_cidr, plan, subscription_of

ADDRESS_URL_ENV = "LAUNCHER_MY_ADDRESS_URL"  # where the caller's public address is asked
ADDRESS_URL = "https://api.ipify.org"
SSH_WAIT_S = 600

CloudFactory = Callable[[str | None], AzureCloud]


def my_address(url: str | None = None) -> str:
    """This machine's public address as the internet sees it (what the NSG rule lets in)."""
    import requests

    where = url or os.environ.get(ADDRESS_URL_ENV) or ADDRESS_URL
    try:
        response = requests.get(where, timeout=10)
        response.raise_for_status()
        text = response.text.strip()
        return parse_cidr(text)
    except (requests.RequestException, UsageError) as exc:
        raise HostUnreachable(f"cannot find this machine's public address at {where} ({type(exc).__name__})",
                              "give the address or network SSH may come from with --ssh-from CIDR") from None


class VmRow(VmRecord):
    """A VM as `vm ls` lists it: with whether launcher's SSH config has its alias."""

    alias: bool


class UpRecord(TypedDict):
    """`vm up`'s Result data: the VM asked for, the plan, and (unless a dry run) what was made."""

    name: str
    group: str
    size: str
    region: str
    image: str
    spot: bool
    user: str
    subscription: str | None
    ssh_from: str | None
    auto_shutdown_s: int | None
    dry_run: bool
    plan: list[PlanStep]
    vm: VmRecord | None
    host_key_fingerprint: str | None
    ready: bool
    ssh_config: str
    known_hosts: str


@dataclass
class UpResult:
    spec: VmSpec
    steps: list[PlanStep]
    dry_run: bool
    ssh_from: str | None = None
    vm: VmInfo | None = None
    host_key_fingerprint: str | None = None
    ready: bool = False

    def to_dict(self) -> UpRecord:
        s = self.spec
        return {
            "name": s.name, "group": s.group, "size": s.size, "region": s.region, "image": s.image.urn,
            "spot": s.spot, "user": s.admin_user, "subscription": s.subscription, "ssh_from": self.ssh_from,
            "auto_shutdown_s": int(s.auto_shutdown.total_seconds()) if s.auto_shutdown else None,
            "dry_run": self.dry_run, "plan": self.steps, "vm": self.vm.to_dict() if self.vm else None,
            "host_key_fingerprint": self.host_key_fingerprint, "ready": self.ready,
            "ssh_config": str(sshconfig.own_ssh_config()), "known_hosts": str(aliases.known_hosts_path()),
        }


def up(spec: VmSpec, *, dry_run: bool = False, wait_ssh_s: float = SSH_WAIT_S, reporter: Reporter | None = None,
       connect: CloudFactory = AzureCloud.connect) -> UpResult:
    """Create the VM (everything in its own resource group), write its SSH alias and host key, and wait
    until SSH answers with that key and the first-boot setup is done."""
    rep = reporter or NullReporter()
    if dry_run:
        return UpResult(spec, plan(spec), dry_run=True, ssh_from=spec.ssh_from)
    if aliases.lookup(spec.name) is not None:
        raise UsageError(f"launcher already has a VM named {spec.name} (an alias in {sshconfig.own_ssh_config()})",
                         f"choose another name, or `launcher vm down {spec.name}` first")
    cloud = connect(spec.subscription)
    if cloud.exists(spec.name):
        raise UsageError(f"resource group {spec.group} already exists in subscription {cloud.subscription}",
                         f"choose another name, or `launcher vm down {spec.name}` first")
    ssh_from = spec.ssh_from or my_address()
    host_key = cloudinit.HostKey.generate()
    vm = cloud.create(spec, ssh_from, cloudinit.custom_data(spec.admin_user, host_key), rep)
    if not vm.address:
        raise HostUnreachable(f"VM {spec.name} has no public address", f"`launcher vm down {spec.name}` and retry")
    aliases.add(spec.name, vm.address, spec.admin_user, spec.identity, host_key.public)
    result = UpResult(spec, plan(spec, ssh_from), dry_run=False, ssh_from=ssh_from, vm=vm,
                      host_key_fingerprint=host_key.fingerprint)
    if wait_ssh_s > 0:
        wait_ready(spec.name, wait_ssh_s, rep)
        result.ready = True
    return result


def wait_ready(name: str, timeout_s: float, reporter: Reporter | None = None, interval_s: float = 5) -> None:
    """Until the VM answers SSH with the host key launcher made (a different key is refused at once:
    never trust-on-first-use) and its first-boot setup has written its marker."""
    from launcher.hosts.ssh import SSHHost

    rep = reporter or NullReporter()
    task = rep.task(f"vm up {name}: waiting for SSH and first-boot setup", total=1)
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    try:
        while True:
            try:
                host = SSHHost.connect(name)
                try:
                    done = host.run(["test", "-f", cloudinit.READY_MARKER], check=False).returncode == 0
                finally:
                    host.close()
                if done:
                    task.close()
                    return
                last = "SSH answers; first-boot setup still running"
            except HostKeyRejected as exc:
                raise HostKeyRejected(
                    f"VM {name} answered with a host key other than the one launcher made for it ({exc.message}): "
                    "its image did not install the key from cloud-init, or something is in between",
                    f"do not trust it; `launcher vm down {name}`, and use an image that runs cloud-init") from None
            except (HostUnreachable, AuthFailed, TimedOut) as exc:
                last = exc.one_line()
            if time.monotonic() > deadline:
                raise TimedOut(f"VM {name} was made, but it was not ready after {int(timeout_s)} s ({last})",
                               f"try `launcher provision --host {name}` in a while, or `launcher vm down {name}`")
            time.sleep(interval_s)
    except BaseException:
        task.update(description=f"vm up {name}: not ready")
        raise


def ls(subscription: str | None, connect: CloudFactory = AzureCloud.connect) -> list[VmRow]:
    cloud = connect(subscription_of(subscription))
    return [{**vm.to_dict(), "alias": aliases.lookup(vm.name) is not None} for vm in cloud.list()]


@dataclass
class DownResult:
    name: str
    group: str
    alias_removed: bool


def down(name: str, subscription: str | None, *, reporter: Reporter | None = None,
         connect: CloudFactory = AzureCloud.connect) -> DownResult:
    """Delete the VM's resource group and wait for it; then drop its alias and host key."""
    check_name(name)
    cloud = connect(subscription_of(subscription))
    try:
        cloud.delete(name, reporter)
    except LauncherError as exc:
        if exc.exit_code.name == "NOT_FOUND" and aliases.lookup(name) is not None:
            aliases.remove(name)
            exc.message += f"; its stale alias in {sshconfig.own_ssh_config()} was removed"
        raise
    return DownResult(name=name, group=group_name(name), alias_removed=aliases.remove(name))
