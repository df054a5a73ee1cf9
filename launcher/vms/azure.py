"""Azure through its SDK for Python (the optional extra `launcher[azure]`): the resources of one VM in
its own resource group, listed by launcher's tags, deleted with the group. Every SDK failure becomes one
of launcher's errors naming the limit that was hit and the fix. The SDK is imported only here, lazily."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypedDict

from launcher.errors import (
    AuthFailed,
    CloudFailed,
    CloudQuota,
    HostUnreachable,
    LauncherError,
    MissingExtra,
    NoCloudCredentials,
    NotFound,
    NotOffered,
    UsageError,
)
from launcher.progress import NullReporter, Reporter
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
ARM_SCOPE = "https://management.azure.com/.default"
SCHEDULE_API = "2018-09-15"  # Microsoft.DevTestLab/schedules, written as a generic resource
POLL_S = 5
_PUBLIC_AUTHORITIES = ("login.microsoftonline.com", "login.chinacloudapi.cn", "login.microsoftonline.us")


def _sdk() -> None:
    import importlib

    try:
        for module in ("azure.identity", "azure.mgmt.compute", "azure.mgmt.network", "azure.mgmt.resource.resources"):
            importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(f"the Azure SDK is not installed (no module {exc.name})",
                           "pip install 'launcher[azure]'") from None
    # The SDK logs its own multi-line warnings (a failed credential chain); launcher reports them as one line.
    logging.getLogger("azure").addHandler(logging.NullHandler())
    logging.getLogger("azure").propagate = False


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


def _error_of(exc: Exception) -> tuple[str, str]:
    """(code, message) of an SDK error: from its parsed OData error, else from the response body."""
    err = getattr(exc, "error", None)
    code, message = getattr(err, "code", None), getattr(err, "message", None)
    if not code:
        response = getattr(exc, "response", None)
        try:
            body = json.loads(response.text()) if response is not None else {}
        except (ValueError, AttributeError, TypeError):
            body = {}
        inner = body.get("error") if isinstance(body, dict) else None
        if isinstance(inner, dict):
            code, message = inner.get("code"), inner.get("message")
    text = str(message or getattr(exc, "message", None) or exc)
    return str(code or ""), " ".join(text.split())


def _limit_of(message: str) -> str:
    """The sentence of a quota error that names the limit, with its numbers."""
    first = re.split(r"(?<=\.)\s", message, maxsplit=1)[0]
    numbers = re.findall(r"(Current Limit: \d+|Current Usage: \d+|Additional Required: \d+)", message)
    return first.rstrip(".") + (f" ({', '.join(numbers)})" if numbers else "")


def translate(exc: Exception, doing: str, spec: VmSpec | None = None) -> LauncherError:
    """An SDK exception -> launcher's error: which limit was hit and how to fix it."""
    from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

    if isinstance(exc, LauncherError):
        return exc
    size = spec.size if spec else "SIZE"
    region = spec.region if spec else "REGION"
    code, message = _error_of(exc)
    status = getattr(exc, "status_code", None)
    short = message if len(message) <= 400 else message[:400] + "..."
    if isinstance(exc, ServiceRequestError):
        return HostUnreachable(f"cannot reach Azure Resource Manager while {doing}: {short}",
                               "check this machine's network and proxy settings, then try again")
    if isinstance(exc, ClientAuthenticationError) or status == 401:
        return AuthFailed(f"Azure refused the credentials while {doing} ({code or status}: {short})",
                          "log in again (`az login`) or check AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET")
    if status == 403 or code in ("AuthorizationFailed", "LinkedAuthorizationFailed"):
        return AuthFailed(f"this identity may not act in the subscription while {doing} ({code}: {short})",
                          "ask for the Contributor role on the subscription for it "
                          "(`az role assignment create --role Contributor ...`)")
    if code == "SkuNotAvailable" or (code == "InvalidParameter" and "vmSize" in message):
        return NotOffered(f"size {size} is not offered in {region} to this subscription ({code}: {short})",
                          f"`az vm list-skus --location {region} --size {size} --all --output table` shows "
                          "where it is and its restrictions; choose another --size or --region")
    if code in ("PlatformImageNotFound", "ImageNotFound", "InvalidTemplateDeployment") or (
            code == "InvalidParameter" and "imageReference" in message):
        urn = spec.image.urn if spec else "the image"
        return NotOffered(f"image {urn} is not offered in {region} ({code}: {short})",
                          f"`az vm image list --location {region} --all --publisher {urn.split(':')[0]} -o table` "
                          "lists the images there; give one with --image")
    quota = (code == "QuotaExceeded" or code.endswith(("LimitReached", "LimitExceeded"))
             or (code == "OperationNotAllowed" and "quota" in message.lower()))
    if quota:
        family = "low-priority (Spot) cores" if spec is not None and spec.spot else f"the vCPU family of {size}"
        return CloudQuota(f"Azure quota hit while {doing}: {_limit_of(message)} ({code})",
                          f"ask for a higher limit of {family} in {region} (portal: Quotas > Compute; "
                          f"`az vm list-usage --location {region} -o table` shows use and limits), "
                          "or choose a smaller --size or another --region")
    if code in ("AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest"):
        return NotOffered(f"Azure has no capacity for {size} in {region} now ({code}: {short})",
                          "try again later, or choose another --size or --region")
    return CloudFailed(f"Azure refused {doing} ({code or status}: {short})",
                       "fix what the message names and run the command again")


def _custom_authority() -> bool:
    host = os.environ.get("AZURE_AUTHORITY_HOST", "")
    host = re.sub(r"^https?://", "", host).split("/")[0].lower()
    return bool(host) and host not in _PUBLIC_AUTHORITIES


class _Watched:
    """One credential of the chain, watched: a credential that tried and failed (rather than having
    nothing to offer) is an auth failure, not a missing credential."""

    def __init__(self, cred: Any, failures: list[tuple[str, Exception]]) -> None:
        self._cred, self._failures = cred, failures
        self._credential_name = getattr(cred, "_credential_name", type(cred).__name__)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from azure.identity import CredentialUnavailableError

        try:
            return getattr(self._cred, method)(*args, **kwargs)
        except CredentialUnavailableError:
            raise
        except Exception as exc:
            self._failures.append((self._credential_name, exc))
            raise

    def get_token(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("get_token", *args, **kwargs)

    def get_token_info(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("get_token_info", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cred, name)


def credential() -> Any:
    """Azure's usual chain (DefaultAzureCredential: environment, workload identity, managed identity,
    az login, ...), checked by getting a token: NoCloudCredentials when no credential has anything to
    offer, AuthFailed when one tried and was refused."""
    _sdk()
    from azure.core.exceptions import ClientAuthenticationError
    from azure.identity import DefaultAzureCredential

    kw: dict[str, bool] = {"disable_instance_discovery": True} if _custom_authority() else {}
    chain = DefaultAzureCredential(**kw)
    failures: list[tuple[str, Exception]] = []
    chain.credentials = tuple(_Watched(c, failures) for c in chain.credentials)
    try:
        chain.get_token(ARM_SCOPE)
    except ClientAuthenticationError:
        if failures:
            name, exc = failures[0]
            first = " ".join(str(getattr(exc, "message", None) or exc).split())[:300]
            raise AuthFailed(f"Azure refused the credentials of {name}: {first}",
                             "log in again (`az login`) or check AZURE_CLIENT_ID, AZURE_TENANT_ID and "
                             "AZURE_CLIENT_SECRET") from None
        raise NoCloudCredentials(
            "no Azure credentials found (tried the environment, workload identity, managed identity, az login)",
            "run `az login`, or export AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET of a service "
            "principal") from None
    return chain


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
        _sdk()
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
            code, msg = _error_of(exc2)
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
