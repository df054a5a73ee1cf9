"""A VM launcher creates, as data: what `launcher vm up` was asked for, checked, and the plan of the
Azure resources it makes (one resource group per VM, tagged as launcher's, holding everything else)."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypedDict

from launcher.errors import NotFound, UsageError

# The Ubuntu HPC image: the NVIDIA driver, CUDA, Docker and the NVIDIA Container Toolkit already in it.
DEFAULT_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
DEFAULT_USER = "azureuser"
DEFAULT_AUTO_SHUTDOWN = "8h"
SUBSCRIPTION_ENV = "AZURE_SUBSCRIPTION_ID"

# Tags on the resource group and every resource in it: what `vm ls` lists and `vm down` may delete.
TAG_OWNER = "launcher"  # value "vm": made by launcher
TAG_NAME = "launcher-vm"  # the VM's name (its SSH alias)
TAG_CREATED = "launcher-created"  # UTC, ISO 8601
TAG_USER = "launcher-user"  # the admin user launcher logs in as

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$")
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?$")
_URN = re.compile(r"^[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+$")


def group_name(name: str) -> str:
    return f"launcher-vm-{name}"


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UsageError(f"{name!r} is not a usable VM name",
                         "use 2 to 40 lower-case letters, digits and dashes, starting with a letter "
                         "(it becomes the SSH alias and the resource group launcher-vm-NAME)")
    return name


def parse_auto_shutdown(text: str) -> timedelta | None:
    """'8h', '90m', '1h30m' -> the delay before the first daily shutdown; 'off' -> none."""
    t = text.strip().lower()
    if t in ("off", "none", "never", "0"):
        return None
    m = _DURATION.match(t)
    if not t or not m or not any(m.groups()):
        raise UsageError(f"--auto-shutdown {text!r} is not a duration",
                         "write it as 8h, 90m or 1h30m (or off for no shutdown schedule)")
    delta = timedelta(hours=int(m.group(1) or 0), minutes=int(m.group(2) or 0))
    if not timedelta(minutes=15) <= delta <= timedelta(hours=24):
        raise UsageError(f"--auto-shutdown {text} is outside 15m..24h",
                         "Azure's shutdown schedule is daily: give a delay from 15m to 24h, or off")
    return delta


def shutdown_time(now: datetime, delay: timedelta) -> str:
    """The daily shutdown time (HHMM, UTC) that first falls `delay` after now (rounded up to 5 min)."""
    at = now.astimezone(timezone.utc) + delay
    minute = -(-at.minute // 5) * 5
    at = at.replace(second=0, microsecond=0, minute=0) + timedelta(minutes=minute)
    return at.strftime("%H%M")


def parse_cidr(text: str) -> str:
    """An address or network -> its CIDR (an address alone is /32 or /128); never 'everyone'."""
    try:
        net = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise UsageError(f"--ssh-from {text!r} is not an address or a network",
                         "give an address (203.0.113.7) or a network in CIDR form (203.0.113.0/24)") from None
    if net.prefixlen == 0:
        raise UsageError(f"--ssh-from {text} would open SSH to the whole internet",
                         "give your own address or your network's range")
    return str(net)


@dataclass(frozen=True)
class ImageRef:
    publisher: str
    offer: str
    sku: str
    version: str

    @classmethod
    def parse(cls, urn: str) -> ImageRef:
        if not _URN.match(urn.strip()):
            raise UsageError(f"--image {urn!r} is not an image URN",
                             "write it as PUBLISHER:OFFER:SKU:VERSION, e.g. " + DEFAULT_IMAGE)
        p, o, s, v = urn.strip().split(":")
        return cls(p, o, s, v)

    @property
    def urn(self) -> str:
        return f"{self.publisher}:{self.offer}:{self.sku}:{self.version}"


def find_ssh_key(given: Path | None) -> tuple[Path, Path | None]:
    """The user's SSH public key (given, or ~/.ssh/id_ed25519.pub then id_rsa.pub) and its private
    key beside it when there is one."""
    if given is not None:
        pub = given.expanduser()
        if pub.suffix != ".pub" and pub.with_name(pub.name + ".pub").is_file():
            pub = pub.with_name(pub.name + ".pub")  # the private key named: take its public half
        if not pub.is_file():
            raise NotFound(f"no SSH public key at {pub}", "give --ssh-key FILE.pub, or make one with ssh-keygen")
    else:
        home = Path.home() / ".ssh"
        found = [home / n for n in ("id_ed25519.pub", "id_rsa.pub") if (home / n).is_file()]
        if not found:
            raise NotFound(f"no SSH public key in {home} (id_ed25519.pub or id_rsa.pub)",
                           "make one with `ssh-keygen -t ed25519`, or give --ssh-key FILE.pub")
        pub = found[0]
    text = pub.read_text(encoding="utf-8", errors="replace").strip()
    if not text.startswith(("ssh-ed25519 ", "ssh-rsa ", "ecdsa-sha2-")):
        raise UsageError(f"{pub} is not an OpenSSH public key", "give the .pub file that ssh-keygen wrote")
    private = pub.with_suffix("") if pub.suffix == ".pub" else None
    return pub, private if private is not None and private.is_file() else None


@dataclass(frozen=True)
class VmSpec:
    """What `launcher vm up` was asked for, checked."""

    name: str
    size: str
    region: str
    image: ImageRef
    ssh_public_key: str  # one line, as in a .pub file
    identity: Path | None  # the private key beside it (the alias's IdentityFile)
    ssh_from: str | None  # CIDR; None: the caller's address, found when the VM is made
    auto_shutdown: timedelta | None
    spot: bool = False
    admin_user: str = DEFAULT_USER
    subscription: str | None = None
    created: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def group(self) -> str:
        return group_name(self.name)

    def tags(self) -> dict[str, str]:
        return {TAG_OWNER: "vm", TAG_NAME: self.name,
                TAG_CREATED: self.created.strftime("%Y-%m-%dT%H:%M:%SZ"), TAG_USER: self.admin_user}


def subscription_of(given: str | None) -> str | None:
    """--subscription, else $AZURE_SUBSCRIPTION_ID."""
    return given or os.environ.get(SUBSCRIPTION_ENV) or None


def make_spec(name: str, *, size: str, region: str, image: str | None = None, spot: bool = False,
              auto_shutdown: str = DEFAULT_AUTO_SHUTDOWN, ssh_from: str | None = None, ssh_key: Path | None = None,
              user: str = DEFAULT_USER, subscription: str | None = None) -> VmSpec:
    check_name(name)
    if not re.match(r"^[A-Za-z][A-Za-z0-9_]+$", size):
        raise UsageError(f"--size {size!r} is not a VM size", "write an Azure size name such as Standard_NC6s_v3")
    if not re.match(r"^[a-z][a-z0-9]+$", region):
        raise UsageError(f"--region {region!r} is not a region name", "write it as Azure does, e.g. westeurope, eastus")
    if not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", user) or user in ("root", "admin", "administrator"):
        raise UsageError(f"--user {user!r} is not an admin user name Azure accepts",
                         "use lower-case letters and digits, not root or admin")
    pub, private = find_ssh_key(ssh_key)
    return VmSpec(
        name=name, size=size, region=region, image=ImageRef.parse(image or DEFAULT_IMAGE),
        ssh_public_key=pub.read_text(encoding="utf-8").strip().splitlines()[0], identity=private,
        ssh_from=parse_cidr(ssh_from) if ssh_from else None, auto_shutdown=parse_auto_shutdown(auto_shutdown),
        spot=spot, admin_user=user, subscription=subscription_of(subscription),
    )


@dataclass(frozen=True)
class Names:
    """The name of every resource of one VM, all in its own resource group."""

    group: str
    vnet: str
    subnet: str
    nsg: str
    public_ip: str
    nic: str
    vm: str
    os_disk: str
    schedule: str

    @classmethod
    def of(cls, name: str) -> Names:
        return cls(group=group_name(name), vnet=f"{name}-vnet", subnet="default", nsg=f"{name}-nsg",
                   public_ip=f"{name}-ip", nic=f"{name}-nic", vm=name, os_disk=f"{name}-osdisk",
                   schedule=f"shutdown-computevm-{name}")


class PlanStep(TypedDict):
    """A resource `vm up` makes, as its plan (and `vm up --json`'s ``plan``) lists it."""

    kind: str
    name: str
    detail: str


def plan(spec: VmSpec, ssh_from: str | None = None) -> list[PlanStep]:
    """The resources `vm up` makes, in order: what a dry run prints and what the cloud layer creates."""
    n = Names.of(spec.name)
    source = ssh_from or spec.ssh_from or "your address (found when the VM is made)"
    steps: list[PlanStep] = [
        {"kind": "resource group", "name": n.group, "detail": f"{spec.region}, tagged {TAG_OWNER}=vm"},
        {"kind": "network security group", "name": n.nsg, "detail": f"inbound SSH (TCP 22) only from {source}"},
        {"kind": "virtual network", "name": n.vnet, "detail": f"10.0.0.0/16, subnet {n.subnet} 10.0.0.0/24"},
        {"kind": "public IP", "name": n.public_ip, "detail": "static, Standard SKU"},
        {"kind": "network interface", "name": n.nic, "detail": f"in {n.subnet}, with {n.public_ip}"},
        {"kind": "virtual machine", "name": n.vm,
         "detail": f"{spec.size}, {spec.image.urn}{', Spot (deallocate on eviction)' if spec.spot else ''}, "
                   f"user {spec.admin_user} with your SSH key, no password login, host key made by launcher"},
    ]
    if spec.auto_shutdown is not None:
        hhmm = shutdown_time(spec.created, spec.auto_shutdown)
        steps.append({"kind": "auto-shutdown schedule", "name": n.schedule,
                      "detail": f"daily at {hhmm[:2]}:{hhmm[2:]} UTC (first in about "
                                f"{_human(spec.auto_shutdown)})"})
    return steps


def _human(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    h, m = divmod(minutes, 60)
    return " ".join(part for part in (f"{h}h" if h else "", f"{m}m" if m else "") if part)
