"""Azure through its SDK for Python (the optional extra `launcher[azure]`): the resources of one VM in
its own resource group, listed by launcher's tags, deleted with the group. Every SDK failure becomes one
of launcher's errors naming the limit that was hit and the fix (launcher.vms.azuresdk: loading the SDK,
credentials, errors). The SDK is imported only in these two modules, lazily."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypedDict

from launcher.errors import NotFound, UsageError
from launcher.progress import NullReporter, Reporter
from launcher.vms.azuresdk import ARM_SCOPE, credential, error_of, require_sdk, translate
from launcher.vms.vmspec import (
    SUBSCRIPTION_ENV,
    TAG_CREATED,
    TAG_NAME,
    TAG_OWNER,
    TAG_USER,
    Names,
    VmSpec,
    group_name,
    shutdown_time,
)

ENDPOINT_ENV = "LAUNCHER_AZURE_ENDPOINT"  # another Resource Manager (a sovereign cloud, Azure Stack, a test double)
SCHEDULE_API = "2018-09-15"  # Microsoft.DevTestLab/schedules, written as a generic resource
POLL_S = 5


@dataclass
class VmInfo:
    """One launcher VM as `vm ls` shows it."""

    name: str
    group: str
    state: str
    size: str | None
    region: str
    address: str | None
    created: str | None
    age_s: int | None
    user: str | None

    def to_dict(self) -> VmRecord:
        return {"name": self.name, "group": self.group, "state": self.state, "size": self.size,
                "region": self.region, "address": self.address, "created": self.created, "age_s": self.age_s,
                "user": self.user}


class VmRecord(TypedDict):
    """A VM as `vm ls --json` and `vm up --json` list it (``VmInfo.to_dict``)."""

    name: str
    group: str
    state: str
    size: str | None
    region: str
    address: str | None
    created: str | None
    age_s: int | None
    user: str | None


class _ClientOptions(TypedDict, total=False):
    """Keyword arguments of the SDK's management clients."""

    polling_interval: int
    base_url: str
    credential_scopes: list[str]


@dataclass
class _Build:
    """One `vm up` under way: what it was asked for, and the resources each step made for the next."""

    spec: VmSpec
    n: Names
    tags: dict[str, str]
    ssh_from: str
    custom_data: str
    made_group: bool = False
    nsg: Any = None
    subnet_id: str | None = None
    pip: Any = None
    nic: Any = None
    vm: Any = None

    @property
    def loc(self) -> str:
        return self.spec.region


class AzureCloud:
    """The Azure Resource Manager of one subscription, through the SDK's management clients."""

    def __init__(self, subscription: str, cred: Any, endpoint: str | None = None) -> None:
        require_sdk()
        from azure.mgmt.compute import ComputeManagementClient
        from azure.mgmt.network import NetworkManagementClient
        from azure.mgmt.resource.resources import ResourceManagementClient

        self.subscription = subscription
        kw: _ClientOptions = {"polling_interval": POLL_S}
        if endpoint:
            kw["base_url"] = endpoint
            kw["credential_scopes"] = [ARM_SCOPE]
        self.resource = ResourceManagementClient(cred, subscription, **kw)
        self.network = NetworkManagementClient(cred, subscription, **kw)
        self.compute = ComputeManagementClient(cred, subscription, **kw)

    @classmethod
    def connect(cls, subscription: str | None) -> AzureCloud:
        if not subscription:
            raise UsageError("no Azure subscription given",
                             f"pass --subscription ID or export {SUBSCRIPTION_ENV} "
                             "(`az account show --query id -o tsv` prints yours)")
        return cls(subscription, credential(), os.environ.get(ENDPOINT_ENV) or None)

    # --- vm up -------------------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        try:
            return bool(self.resource.resource_groups.check_existence(group_name(name)))
        except Exception as exc:
            raise translate(exc, "checking the resource group", None) from None

    def create(self, spec: VmSpec, ssh_from: str, custom_data: str, reporter: Reporter | None = None) -> VmInfo:
        """Every resource of the VM, in its own resource group; on any failure the group is deleted
        (and waited for) before the error is raised, so nothing is left behind."""
        rep = reporter or NullReporter()
        b = _Build(spec, Names.of(spec.name), spec.tags(), ssh_from, custom_data)
        steps = self._steps(b)
        doing = steps[0][0]
        task = rep.task(f"vm up {spec.name}: resources", total=len(steps))
        try:
            for what, step in steps:
                doing = what
                step(b)
                task.advance()
            address = self.network.public_ip_addresses.get(b.n.group, b.n.public_ip).ip_address
        except BaseException as exc:
            task.update(description=f"vm up {spec.name}: failed while {doing}")
            err = translate(exc, doing, spec) if isinstance(exc, Exception) else None
            left = self._delete_after_failure(spec, b.n.group, doing, rep) if b.made_group else "nothing was created"
            if err is None:
                raise
            err.message = f"{err.message.rstrip('.')}; {left}"
            raise err from None
        task.close()
        return VmInfo(name=spec.name, group=b.n.group, state="running", size=spec.size, region=spec.region,
                      address=address, created=b.tags[TAG_CREATED], age_s=0, user=spec.admin_user)

    def _steps(self, b: _Build) -> list[tuple[str, Callable[[_Build], None]]]:
        """The resources in the order they are made, each with what the error says was being done."""
        n, spec = b.n, b.spec
        steps: list[tuple[str, Callable[[_Build], None]]] = [
            (f"creating resource group {n.group}", self._make_group),
            (f"creating the network security group {n.nsg}", self._make_nsg),
            (f"creating the virtual network {n.vnet}", self._make_vnet),
            (f"creating the public IP {n.public_ip}", self._make_public_ip),
            (f"creating the network interface {n.nic}", self._make_nic),
            (f"creating the virtual machine {n.vm} ({spec.size} in {spec.region})", self._make_vm),
        ]
        if spec.auto_shutdown is not None:
            steps.append((f"creating the auto-shutdown schedule {n.schedule}", self._make_schedule))
        return steps

    def _make_group(self, b: _Build) -> None:
        from azure.mgmt.resource.resources import models as rm

        self.resource.resource_groups.create_or_update(b.n.group, rm.ResourceGroup(location=b.loc, tags=b.tags))
        b.made_group = True

    def _make_nsg(self, b: _Build) -> None:
        from azure.mgmt.network import models as nm

        rule = nm.SecurityRule(name="ssh-from-caller", properties=nm.SecurityRulePropertiesFormat(
            protocol="Tcp", access="Allow", direction="Inbound", priority=100,
            source_address_prefix=b.ssh_from, source_port_range="*",
            destination_address_prefix="*", destination_port_range="22",
            description="SSH from the address that ran `launcher vm up`"))
        b.nsg = self.network.network_security_groups.begin_create_or_update(b.n.group, b.n.nsg, nm.NetworkSecurityGroup(
            location=b.loc, tags=b.tags, properties=nm.NetworkSecurityGroupPropertiesFormat(security_rules=[rule]),
        )).result()

    def _make_vnet(self, b: _Build) -> None:
        from azure.mgmt.network import models as nm

        n = b.n
        subnet = nm.Subnet(name=n.subnet, properties=nm.SubnetPropertiesFormat(
            address_prefix="10.0.0.0/24", network_security_group=nm.NetworkSecurityGroup(id=b.nsg.id)))
        vnet = self.network.virtual_networks.begin_create_or_update(n.group, n.vnet, nm.VirtualNetwork(
            location=b.loc, tags=b.tags, properties=nm.VirtualNetworkPropertiesFormat(
                address_space=nm.AddressSpace(address_prefixes=["10.0.0.0/16"]), subnets=[subnet]),
        )).result()
        b.subnet_id = next(s.id for s in vnet.subnets or [] if s.name == n.subnet)

    def _make_public_ip(self, b: _Build) -> None:
        from azure.mgmt.network import models as nm

        b.pip = self.network.public_ip_addresses.begin_create_or_update(b.n.group, b.n.public_ip, nm.PublicIPAddress(
            location=b.loc, tags=b.tags, sku=nm.PublicIPAddressSku(name="Standard"),
            properties=nm.PublicIPAddressPropertiesFormat(public_ip_allocation_method="Static",
                                                          public_ip_address_version="IPv4"),
        )).result()

    def _make_nic(self, b: _Build) -> None:
        from azure.mgmt.network import models as nm

        ipconf = nm.NetworkInterfaceIPConfiguration(
            name="ipconfig1", properties=nm.NetworkInterfaceIPConfigurationPropertiesFormat(
                subnet=nm.Subnet(id=b.subnet_id), primary=True, private_ip_allocation_method="Dynamic",
                public_ip_address=nm.PublicIPAddress(id=b.pip.id)))
        b.nic = self.network.network_interfaces.begin_create_or_update(b.n.group, b.n.nic, nm.NetworkInterface(
            location=b.loc, tags=b.tags, properties=nm.NetworkInterfacePropertiesFormat(ip_configurations=[ipconf]),
        )).result()

    def _make_vm(self, b: _Build) -> None:
        from azure.mgmt.compute import models as cm

        spec, n, image = b.spec, b.n, b.spec.image
        props = cm.VirtualMachineProperties(
            hardware_profile=cm.HardwareProfile(vm_size=spec.size),
            storage_profile=cm.StorageProfile(
                image_reference=cm.ImageReference(publisher=image.publisher, offer=image.offer, sku=image.sku,
                                                  version=image.version),
                # Standard SSD: every size takes it (Premium SSD only the sizes with an "s" in their names)
                os_disk=cm.OSDisk(name=n.os_disk, create_option="FromImage", delete_option="Delete",
                                  managed_disk=cm.ManagedDiskParameters(storage_account_type="StandardSSD_LRS"))),
            os_profile=cm.OSProfile(
                computer_name=spec.name, admin_username=spec.admin_user, custom_data=b.custom_data,
                linux_configuration=cm.LinuxConfiguration(
                    disable_password_authentication=True,
                    ssh=cm.SshConfiguration(public_keys=[cm.SshPublicKey(
                        path=f"/home/{spec.admin_user}/.ssh/authorized_keys", key_data=spec.ssh_public_key)]))),
            network_profile=cm.NetworkProfile(network_interfaces=[cm.NetworkInterfaceReference(
                id=b.nic.id, properties=cm.NetworkInterfaceReferenceProperties(primary=True))]),
        )
        if spec.spot:
            props.priority = "Spot"
            props.eviction_policy = "Deallocate"
            props.billing_profile = cm.BillingProfile(max_price=-1)
        b.vm = self.compute.virtual_machines.begin_create_or_update(
            n.group, n.vm, cm.VirtualMachine(location=b.loc, tags=b.tags, properties=props)).result()

    def _make_schedule(self, b: _Build) -> None:
        from azure.mgmt.resource.resources import models as rm

        spec, n = b.spec, b.n
        assert spec.auto_shutdown is not None  # the step is there only then
        sched_id = (f"/subscriptions/{self.subscription}/resourceGroups/{n.group}"
                    f"/providers/Microsoft.DevTestLab/schedules/{n.schedule}")
        self.resource.resources.begin_create_or_update_by_id(sched_id, rm.GenericResource(
            location=b.loc, tags=b.tags, properties={
                "status": "Enabled", "taskType": "ComputeVmShutdownTask",
                "dailyRecurrence": {"time": shutdown_time(spec.created, spec.auto_shutdown)},
                "timeZoneId": "UTC", "targetResourceId": b.vm.id,
                "notificationSettings": {"status": "Disabled", "timeInMinutes": 30}}),
            api_version=SCHEDULE_API).result()

    def _delete_after_failure(self, spec: VmSpec, group: str, doing: str, rep: Reporter) -> str:
        """Delete the half-made VM's resource group; what the error adds about what was left behind."""
        rep.note(f"vm up {spec.name} failed while {doing}; deleting resource group {group}")
        try:
            self.resource.resource_groups.begin_delete(group).result()
            return f"nothing left behind: resource group {group} deleted"
        except Exception as exc2:
            code, msg = error_of(exc2)
            return (f"and deleting resource group {group} failed too ({code}: {msg[:200]}); "
                    f"delete it with `launcher vm down {spec.name}`")

    # --- vm ls / down ------------------------------------------------------------------------------

    def list(self) -> list[VmInfo]:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            groups = list(self.resource.resource_groups.list(filter=f"tagName eq '{TAG_OWNER}' and tagValue eq 'vm'"))
        except Exception as exc:
            raise translate(exc, "listing resource groups") from None
        now = datetime.now(timezone.utc)
        out = []
        for g in groups:
            tags = dict(g.tags or {})
            if tags.get(TAG_OWNER) != "vm" or not tags.get(TAG_NAME):
                continue
            name = tags[TAG_NAME]
            n = Names.of(name)
            group = g.name or n.group
            created = tags.get(TAG_CREATED)
            age = None
            if created:
                try:
                    age = int((now - datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(
                        tzinfo=timezone.utc)).total_seconds())
                except ValueError:
                    age = None
            group_state = str(getattr(g.properties, "provisioning_state", "") or "")
            size = address = None
            try:
                vm = self.compute.virtual_machines.get(group, n.vm, expand="instanceView")
                size = vm.hardware_profile.vm_size if vm.hardware_profile else None
                codes = [s.code or "" for s in (vm.instance_view.statuses if vm.instance_view else None) or []]
                power = next((c.split("/", 1)[1] for c in codes if c.startswith("PowerState/")), None)
                state = power or str(vm.provisioning_state or "unknown").lower()
                try:
                    address = self.network.public_ip_addresses.get(group, n.public_ip).ip_address
                except ResourceNotFoundError:
                    address = None
            except ResourceNotFoundError:
                state = "no VM (incomplete)"
            except Exception as exc:
                raise translate(exc, f"reading VM {name}") from None
            if group_state.lower() == "deleting":
                state = "deleting"
            out.append(VmInfo(name=name, group=group, state=state, size=size,
                              region=g.location or "", address=address, created=created, age_s=age,
                              user=tags.get(TAG_USER)))
        return sorted(out, key=lambda v: v.name)

    def delete(self, name: str, reporter: Reporter | None = None) -> None:
        """Delete the VM's resource group (only one launcher tagged as its VM) and wait until it is gone."""
        from azure.core.exceptions import ResourceNotFoundError

        rep = reporter or NullReporter()
        group = group_name(name)
        try:
            g = self.resource.resource_groups.get(group)
        except ResourceNotFoundError:
            raise NotFound(f"no launcher VM named {name} in subscription {self.subscription} "
                           f"(no resource group {group})", "`launcher vm ls` lists them") from None
        except Exception as exc:
            raise translate(exc, f"reading resource group {group}") from None
        tags = dict(g.tags or {})
        if tags.get(TAG_OWNER) != "vm" or tags.get(TAG_NAME) != name:
            raise UsageError(f"resource group {group} is not tagged as launcher's VM {name}; launcher leaves it alone",
                             "delete it yourself if it is yours (`az group delete -n " + group + "`)")
        task = rep.task(f"vm down {name}: deleting resource group {group}", total=1)
        try:
            self.resource.resource_groups.begin_delete(group).result()
        except ResourceNotFoundError:
            pass
        except Exception as exc:
            raise translate(exc, f"deleting resource group {group}") from None
        finally:
            task.close()
