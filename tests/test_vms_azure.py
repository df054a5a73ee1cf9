"""`launcher vm up | ls | down` with the real Azure SDK for Python against a local double of the Azure
REST API (tests/azuredouble.py: HTTPS on 127.0.0.1, its own CA, Entra's token endpoint, Resource Manager
with long-running operations), which checks every request against the REST contract and launcher's.
Not tested against Azure itself: it cannot be reached from here."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from azuredouble import CALLER, SUBSCRIPTION, AzureDouble, cloud_config
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, UsageError
from launcher.hosts.sshconfig import resolve_target
from launcher.vms import aliases, cloudinit
from launcher.vms.vmspec import ImageRef, parse_auto_shutdown, parse_cidr, shutdown_time

runner = CliRunner()


@pytest.fixture
def ssh_key(tmp_path: Path) -> Path:
    """The user's key pair (the public half is what `vm up --ssh-key` takes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = tmp_path / "user" / "id_ed25519"
    private.parent.mkdir()
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    private.chmod(0o600)
    private.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b" me@laptop\n")
    return private.with_suffix(".pub")


@pytest.fixture
def double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AzureDouble]:
    """The double, its credentials and subscription in the environment: for what launcher does before it
    calls Azure (a dry run, a missing subscription or SDK), which needs no SDK."""
    double = AzureDouble(tmp_path / "double").start()
    for k, v in double.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AZURE_TOKEN_CREDENTIALS", raising=False)
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "launcher-home"))
    try:
        yield double
    finally:
        double.stop()


@pytest.fixture
def azure(azure_sdk: None, double: AzureDouble) -> AzureDouble:
    """The double, called through the Azure SDK: skipped where launcher[azure] is not installed."""
    return double


def _up(name: str, ssh_key: Path, *extra: str) -> object:
    return runner.invoke(app, ["--json", "vm", "up", name, "--size", "Standard_NC4as_T4_v3", "--region",
                               "westeurope", "--ssh-key", str(ssh_key), "--no-wait", *extra])


# --- the spec, without Azure ------------------------------------------------------------------------

def test_durations_addresses_and_images_are_checked() -> None:
    assert parse_auto_shutdown("8h") == timedelta(hours=8)
    assert parse_auto_shutdown("1h30m") == timedelta(minutes=90)
    assert parse_auto_shutdown("off") is None
    for bad in ("5m", "25h", "soon", ""):
        with pytest.raises(UsageError):
            parse_auto_shutdown(bad)
    assert parse_cidr("203.0.113.7") == "203.0.113.7/32"
    assert parse_cidr("203.0.113.7/24") == "203.0.113.0/24"
    for bad in ("0.0.0.0/0", "everyone", "::/0"):
        with pytest.raises(UsageError):
            parse_cidr(bad)
    assert ImageRef.parse("Canonical:ubuntu-24_04-lts:server:latest").sku == "server"
    with pytest.raises(UsageError):
        ImageRef.parse("ubuntu")
    now = datetime(2026, 1, 1, 22, 41, tzinfo=timezone.utc)
    assert shutdown_time(now, timedelta(hours=8)) == "0645"  # the next day, rounded up to 5 minutes


def test_cloud_config_hands_over_only_launchers_host_key() -> None:
    key = cloudinit.HostKey.generate()
    text = cloudinit.user_data("azureuser", key)
    assert text.startswith("#cloud-config\n")
    cfg = json.loads(text.split("\n", 1)[1])  # JSON: what cloud-init reads as YAML
    assert cfg["ssh_keys"] == {"ed25519_private": key.private_openssh, "ed25519_public": key.public}
    assert cfg["ssh_deletekeys"] is True and cfg["ssh_genkeytypes"] == [] and cfg["ssh_pwauth"] is False
    assert cfg["runcmd"] == [["sh", cloudinit.SETUP_PATH, "azureuser"]]
    assert base64.b64decode(cloudinit.custom_data("azureuser", key)).decode() == text
    subprocess.run(["sh", "-n", "-c", cloudinit.setup_script()], check=True)


def test_alias_is_read_before_the_users_ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "lh"))
    key = cloudinit.HostKey.generate()
    aliases.add("gpu1", "20.1.2.3", "azureuser", tmp_path / "id", key.public)
    t = resolve_target("gpu1")
    assert (t.hostname, t.user, t.port) == ("20.1.2.3", "azureuser", 22)
    assert t.known_hosts == aliases.known_hosts_path() and t.identities == (str(tmp_path / "id"),)
    assert aliases.known_hosts_path().read_text().split()[:3] == ["20.1.2.3", *key.public.split()]
    other = tmp_path / "other_config"
    other.write_text("Host gpu1\n  HostName 10.9.9.9\n")
    assert resolve_target("gpu1", ssh_config=other).hostname == "10.9.9.9"  # --ssh-config is taken alone
    assert aliases.remove("gpu1") is True
    assert resolve_target("gpu1").hostname == "gpu1" and aliases.host_key_of("gpu1") is None


# --- against the double ----------------------------------------------------------------------------

def test_vm_up_ls_down(azure: AzureDouble, ssh_key: Path) -> None:
    res = _up("gpu1", ssh_key)
    assert res.exit_code == 0, res.output
    up = json.loads(res.stdout)["data"]
    assert azure.violations == []
    assert azure.groups() == ["launcher-vm-gpu1"]
    # every resource in the one group, tagged as launcher's
    kinds = {k: azure.of_kind(k) for k in ("nsg", "vnet", "pip", "nic", "vm", "schedule")}
    assert all(len(v) == 1 for v in kinds.values()), {k: len(v) for k, v in kinds.items()}
    assert all(r["tags"]["launcher"] == "vm" and r["tags"]["launcher-vm"] == "gpu1" for v in kinds.values()
               for r in v)
    # SSH only from the caller's address, as the double answered /myip
    rule = kinds["nsg"][0]["properties"]["securityRules"][0]["properties"]
    assert (rule["sourceAddressPrefix"], rule["destinationPortRange"]) == (CALLER + "/32", "22")
    # the user's key, no password, the default image, no Spot
    vm = kinds["vm"][0]["body"]["properties"]
    assert vm["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == \
        ssh_key.read_text().strip()
    assert vm["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert vm["storageProfile"]["imageReference"]["offer"] == "ubuntu-hpc" and "priority" not in vm
    # the auto-shutdown schedule of that VM
    sched = kinds["schedule"][0]
    assert sched["name"] == "shutdown-computevm-gpu1"
    assert sched["properties"]["targetResourceId"].lower() == kinds["vm"][0]["id"].lower()
    # the host key in the custom data is the one in launcher's known_hosts, under the VM's address
    cfg = cloud_config(kinds["vm"][0])
    address = kinds["pip"][0]["properties"]["ipAddress"]
    known = aliases.known_hosts_path().read_text().split()
    assert known[:3] == [address, *cfg["ssh_keys"]["ed25519_public"].split()]
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_ssh_private_key(cfg["ssh_keys"]["ed25519_private"].encode(), None)
    assert private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
                                             ).decode() == cfg["ssh_keys"]["ed25519_public"]
    assert up["host_key_fingerprint"] == cloudinit.HostKey("", cfg["ssh_keys"]["ed25519_public"]).fingerprint
    t = resolve_target("gpu1")
    assert (t.hostname, t.user, t.identities) == (address, "azureuser", (str(ssh_key.with_suffix("")),))
    # long-running operations were polled as ARM does
    assert any("/operations/" in r.path for r in azure.arm_requests())

    res = runner.invoke(app, ["vm", "ls", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["data"]["vms"]
    assert {k: row[k] for k in ("name", "state", "size", "region", "address", "alias")} == {
        "name": "gpu1", "state": "running", "size": "Standard_NC4as_T4_v3", "region": "westeurope",
        "address": address, "alias": True}
    assert row["age_s"] is not None and row["age_s"] >= 0

    res = runner.invoke(app, ["vm", "up", "gpu1", "--size", "Standard_D2s_v5", "--region", "westeurope",
                              "--ssh-key", str(ssh_key), "--no-wait"])
    assert res.exit_code == ExitCode.USAGE and "already has a VM named gpu1" in res.output

    res = runner.invoke(app, ["vm", "down", "gpu1"])  # not a terminal: refuses without --yes
    assert res.exit_code == ExitCode.USAGE and "--yes" in res.output
    res = runner.invoke(app, ["vm", "down", "gpu1", "--yes"])
    assert res.exit_code == 0, res.output
    assert azure.groups() == [] and azure.of_kind("vm") == []
    assert aliases.lookup("gpu1") is None and aliases.host_key_of("gpu1") is None
    assert [r.method for r in azure.arm_requests() if r.path.endswith("/launcher-vm-gpu1")][-1] == "DELETE"
    assert runner.invoke(app, ["vm", "down", "gpu1", "--yes"]).exit_code == ExitCode.NOT_FOUND
    assert azure.violations == []


def test_spot_ssh_from_and_no_schedule(azure: AzureDouble, ssh_key: Path) -> None:
    azure.expect_ssh_from = "203.0.113.0/24"
    res = _up("cheap", ssh_key, "--spot", "--ssh-from", "203.0.113.9/24", "--auto-shutdown", "off",
              "--image", "Canonical:ubuntu-24_04-lts:server:latest", "--user", "alice")
    assert res.exit_code == 0, res.output
    assert azure.violations == []
    vm = azure.of_kind("vm")[0]["body"]["properties"]
    assert (vm["priority"], vm["evictionPolicy"], vm["billingProfile"]["maxPrice"]) == ("Spot", "Deallocate", -1)
    assert vm["osProfile"]["adminUsername"] == "alice"
    assert vm["storageProfile"]["imageReference"]["publisher"] == "Canonical"
    assert azure.puts("schedule") == [] and not any(r.path == "/myip" for r in azure.requests)


def test_dry_run_creates_nothing(double: AzureDouble, ssh_key: Path) -> None:
    res = runner.invoke(app, ["vm", "up", "gpu1", "--size", "Standard_NC4as_T4_v3", "--region", "westeurope",
                              "--ssh-key", str(ssh_key), "--dry-run"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "would create" in out and "launcher-vm-gpu1" in out and "shutdown-computevm-gpu1" in out
    assert "nothing created" in out
    assert double.requests == [] and aliases.lookup("gpu1") is None


QUOTA = ("Operation could not be completed as it results in exceeding approved standardNCASv3_T4Family Cores "
         "quota. Additional details - Deployment Model: Resource Manager, Location: westeurope, Current Limit: 0, "
         "Current Usage: 0, Additional Required: 4, (Minimum) New Limit Required: 4. Submit a request for Quota "
         "increase at https://aka.ms/ProdportalCRP/#blade/... by specifying parameters listed in the 'Details' "
         "section for deployment to succeed.")
SKU = ("The requested size for resource '/subscriptions/.../virtualMachines/gpu1' is currently not available in "
       "location 'westeurope' zones '' for subscription '...'. Please try another size or deploy to a different "
       "location or zones. See https://aka.ms/azureskunotavailable for details.")


@pytest.mark.parametrize(("kind", "status", "code", "message", "phase", "exit_code", "says"), [
    ("vm", 409, "OperationNotAllowed", QUOTA, "sync", ExitCode.CLOUD_QUOTA,
     ("Cores quota", "Current Limit: 0", "az vm list-usage --location westeurope")),
    ("vm", 409, "QuotaExceeded", "Quota exceeded for lowPriorityCores.", "sync", ExitCode.CLOUD_QUOTA,
     ("quota", "--size")),
    ("vm", 200, "SkuNotAvailable", SKU, "async", ExitCode.NOT_OFFERED,
     ("Standard_NC4as_T4_v3 is not offered in westeurope", "az vm list-skus")),
    ("nic", 401, "ExpiredAuthenticationToken", "The access token expiry UTC time is earlier than current UTC time.",
     "sync", ExitCode.AUTH_FAILED, ("refused the credentials", "az login")),
])
def test_a_failure_half_way_leaves_nothing(azure: AzureDouble, ssh_key: Path, kind: str, status: int, code: str,
                                           message: str, phase: str, exit_code: ExitCode,
                                           says: tuple[str, ...]) -> None:
    azure.inject(kind, code, message, status=status, phase=phase)
    res = _up("gpu1", ssh_key)
    assert res.exit_code == exit_code, res.output
    line = json.loads(res.stdout)["summary"]
    assert "\n" not in line and "Traceback" not in res.output
    for text in (*says, "nothing left behind: resource group launcher-vm-gpu1 deleted"):
        assert text in line, line
    assert azure.groups() == [] and azure.resources == {}
    assert aliases.lookup("gpu1") is None and not aliases.known_hosts_path().exists()
    assert azure.violations == []


@pytest.mark.usefixtures("azure_sdk")
@pytest.mark.slow
def test_no_credentials_is_its_own_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ssh_key: Path) -> None:
    for var in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH",
                "AZURE_USERNAME", "AZURE_FEDERATED_TOKEN_FILE", "IDENTITY_ENDPOINT", "MSI_ENDPOINT",
                "AZURE_TOKEN_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no az login, no shared token cache
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no az, azd, pwsh
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", "http://127.0.0.1:9")  # no managed identity here
    monkeypatch.setenv("AZURE_SUBSCRIPTION_ID", "22222222-0000-0000-0000-00000000cccc")
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "lh"))
    res = _up("gpu1", ssh_key)
    assert res.exit_code == ExitCode.NO_CLOUD_CREDENTIALS, res.output
    assert "no Azure credentials found" in res.output and "az login" in res.output
    assert "Traceback" not in res.output and len(json.loads(res.stdout)["summary"].splitlines()) == 1
    assert runner.invoke(app, ["vm", "ls"]).exit_code == ExitCode.NO_CLOUD_CREDENTIALS


def test_a_wrong_secret_is_refused_before_anything_is_made(azure: AzureDouble, ssh_key: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "wrong")
    res = _up("gpu1", ssh_key)
    assert res.exit_code == ExitCode.AUTH_FAILED, res.output
    assert "Invalid client secret" in res.output and azure.arm_requests() == []


@pytest.mark.usefixtures("double")
def test_no_subscription_says_how_to_give_one(ssh_key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID")
    res = runner.invoke(app, ["vm", "ls"])
    assert res.exit_code == ExitCode.USAGE and "AZURE_SUBSCRIPTION_ID" in res.output


@pytest.mark.usefixtures("double")
def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "azure.mgmt.compute", None)  # as if launcher[azure] were not installed
    res = runner.invoke(app, ["vm", "ls"])
    assert res.exit_code == ExitCode.MISSING_EXTRA, res.output
    assert "pip install 'launcher[azure]'" in res.output and "Traceback" not in res.output


def test_refused_at_the_first_step_deletes_nothing(azure: AzureDouble, ssh_key: Path) -> None:
    azure.inject("group", "RequestDisallowedByPolicy", "Resource 'launcher-vm-gpu1' was disallowed by policy.",
                 status=403)
    res = _up("gpu1", ssh_key)
    assert res.exit_code == ExitCode.AUTH_FAILED, res.output
    assert "nothing was created" in json.loads(res.stdout)["summary"]
    assert [r for r in azure.arm_requests() if r.method == "DELETE"] == [] and azure.groups() == []


def test_a_group_launcher_did_not_make_is_left_alone(azure: AzureDouble, ssh_key: Path) -> None:
    rid = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/launcher-vm-gpu1"
    azure.resources[rid.lower()] = {"id": rid, "name": "launcher-vm-gpu1", "type": "Microsoft.Resources/resourceGroups",
                                    "location": "westeurope", "tags": {"team": "ml"},
                                    "properties": {"provisioningState": "Succeeded"}}
    res = _up("gpu1", ssh_key)
    assert res.exit_code == ExitCode.USAGE and "already exists" in res.output
    res = runner.invoke(app, ["vm", "down", "gpu1", "--yes"])
    assert res.exit_code == ExitCode.USAGE and "not tagged as launcher's" in res.output
    assert azure.groups() == ["launcher-vm-gpu1"] and azure.puts("nsg") == []
    res = runner.invoke(app, ["vm", "ls", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["data"]["vms"] == []


def test_without_the_callers_address_nothing_is_made(azure: AzureDouble, ssh_key: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAUNCHER_MY_ADDRESS_URL", "https://127.0.0.1:9/ip")  # nothing listens there
    res = _up("gpu1", ssh_key)
    assert res.exit_code == ExitCode.HOST_UNREACHABLE, res.output
    assert "--ssh-from" in json.loads(res.stdout)["summary"]
    assert azure.puts("group") == [] and azure.groups() == []
