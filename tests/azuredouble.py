"""A local double of the Azure REST API that the real Azure SDK for Python talks to: HTTPS on 127.0.0.1
with its own CA, the Microsoft Entra token endpoint (client-credentials flow) and the Resource Manager
endpoints launcher uses (resource groups, NSGs, virtual networks, public IPs, NICs, VMs, DevTestLab
schedules), with long-running operations polled as ARM does (Azure-AsyncOperation for PUT, Location for
DELETE). Every request is recorded and checked against the REST contract and launcher's own (the SSH rule
restricted to the caller, the SSH key, password login disabled, the tags, the shutdown schedule); a
request that breaks it is answered 400 and listed in `violations`. Failures can be injected (quota, size
not offered, 401), and a hook "boots" the VM (tests point its public IP at an SSH test host).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import re
import ssl
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

TENANT = "00000000-0000-0000-0000-00000000aaaa"
CLIENT_ID = "11111111-0000-0000-0000-00000000bbbb"
SECRET = "launcher-test-secret"
SUBSCRIPTION = "22222222-0000-0000-0000-00000000cccc"
CALLER = "198.51.100.7"  # what /myip answers: the caller's public address as the double sees it

TYPES = {  # short name -> ARM type (lower case)
    "group": "microsoft.resources/resourcegroups",
    "nsg": "microsoft.network/networksecuritygroups",
    "vnet": "microsoft.network/virtualnetworks",
    "pip": "microsoft.network/publicipaddresses",
    "nic": "microsoft.network/networkinterfaces",
    "vm": "microsoft.compute/virtualmachines",
    "schedule": "microsoft.devtestlab/schedules",
}
SCHEDULE_APIS = {"2016-05-15", "2018-09-15"}
_API = re.compile(r"^\d{4}-\d{2}-\d{2}(-preview)?$")


def make_ca(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "launcher azure double CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    ca_pem, cert_pem, key_pem = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return ca_pem, cert_pem, key_pem


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int = 0


@dataclass
class Failure:
    kind: str  # a key of TYPES
    status: int
    code: str
    message: str
    phase: str = "sync"  # sync: the PUT is refused; async: the operation fails while it is polled
    times: int = 1


@dataclass
class _Op:
    resource_id: str | None
    kind: str  # "put" | "delete"
    polls: int = 0
    error: dict[str, str] | None = None
    group: str | None = None


class AzureDouble:
    """Start with `start()`; `env()` is what a process needs to use it (credentials, endpoints, CA)."""

    def __init__(self, folder: Path, *, caller: str = CALLER) -> None:
        self.folder = folder
        self.caller = caller
        self.expect_ssh_from = caller + "/32"  # the only source the NSG may let SSH in from
        self.ca, self._cert, self._key = make_ca(folder / "tls")
        self.requests: list[Request] = []
        self.violations: list[str] = []
        self.failures: list[Failure] = []
        self.resources: dict[str, dict[str, Any]] = {}  # lower-case id -> resource as stored
        self.tokens: set[str] = set()
        self.on_vm_created: Callable[[dict[str, Any]], str | None] | None = None
        self._ops: dict[str, _Op] = {}
        self._lock = threading.RLock()
        self._ip_counter = 10
        self._server: ThreadingHTTPServer | None = None

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> AzureDouble:
        double = self

        class Handler(_Handler):
            owner = double

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self._cert, self._key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def env(self) -> dict[str, str]:
        return {
            "AZURE_CLIENT_ID": CLIENT_ID, "AZURE_TENANT_ID": TENANT, "AZURE_CLIENT_SECRET": SECRET,
            "AZURE_AUTHORITY_HOST": self.url, "AZURE_SUBSCRIPTION_ID": SUBSCRIPTION,
            "LAUNCHER_AZURE_ENDPOINT": self.url, "LAUNCHER_MY_ADDRESS_URL": self.url + "/myip",
            "REQUESTS_CA_BUNDLE": str(self.ca), "SSL_CERT_FILE": str(self.ca),
            # managed identity, should the chain get that far: a closed port on loopback, never 169.254.169.254
            "AZURE_POD_IDENTITY_AUTHORITY_HOST": "http://127.0.0.1:9",
        }

    # --- what tests ask ---------------------------------------------------------------------------

    def inject(self, kind: str, code: str, message: str, *, status: int = 409, phase: str = "sync",
               times: int = 1) -> None:
        self.failures.append(Failure(kind, status, code, message, phase, times))

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(r["name"] for r in self.resources.values() if r["type"].lower() == TYPES["group"])

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.resources.values() if r["type"].lower() == TYPES[kind]]

    def arm_requests(self) -> list[Request]:
        return [r for r in self.requests if r.path.lower().startswith("/subscriptions/")]

    def puts(self, kind: str) -> list[Request]:
        return [r for r in self.arm_requests() if r.method == "PUT" and _type_of(r.path) == TYPES[kind]]

    # --- the API ----------------------------------------------------------------------------------

    def _take_failure(self, kind: str, phase: str) -> Failure | None:
        with self._lock:
            for f in self.failures:
                if f.kind == kind and f.phase == phase and f.times > 0:
                    f.times -= 1
                    return f
        return None

    def handle(self, method: str, path: str, query: dict[str, str], headers: Any, body: bytes) -> tuple[
            int, dict[str, str], Any]:
        parsed: Any = None
        if body and "json" in str(headers.get("Content-Type", "")):
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        elif body:
            parsed = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        req = Request(method, path, query, parsed)
        with self._lock:
            self.requests.append(req)
        status, hdrs, out = self._route(method, path, query, headers, parsed)
        req.status = status
        return status, hdrs, out

    def _route(self, method: str, path: str, query: dict[str, str], headers: Any, body: Any) -> tuple[
            int, dict[str, str], Any]:
        low = path.lower()
        if low == "/myip":
            return 200, {"Content-Type": "text/plain"}, self.caller
        m = re.match(r"^/([^/]+)/v2\.0/\.well-known/openid-configuration$", path)
        if m:
            base = f"{self.url}/{m.group(1)}"
            return 200, {}, {"token_endpoint": f"{base}/oauth2/v2.0/token",
                             "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                             "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
                             "issuer": f"{base}/v2.0", "tenant_region_scope": "EU"}
        m = re.match(r"^/([^/]+)/oauth2/v2\.0/token$", path)
        if m and method == "POST":
            return self._token(m.group(1), body or {})
        if not low.startswith("/subscriptions/"):
            return self._no_route(method, path)
        auth = str(headers.get("Authorization", ""))
        if not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
            return 401, {"WWW-Authenticate": 'Bearer error="invalid_token"'}, _err(
                "AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing or invalid.")
        api = query.get("api-version", "")
        if not _API.match(api):
            return 400, {}, _err("MissingApiVersionParameter",
                                 "The api-version query parameter (?api-version=) is required for all requests.")
        parts = path.strip("/").split("/")
        if parts[1].lower() != SUBSCRIPTION:
            return 404, {}, _err("SubscriptionNotFound", f"The subscription '{parts[1]}' could not be found.")
        # long-running operation status
        if len(parts) >= 4 and parts[2].lower() == "operationresults":
            return self._poll_location(parts[3])
        if len(parts) == 8 and parts[2].lower() == "providers" and parts[6].lower() == "operations":
            return self._poll_async(parts[7])
        if len(parts) == 3 and parts[2].lower() == "resourcegroups" and method == "GET":
            return self._list_groups(query.get("$filter", ""))
        if len(parts) >= 4 and parts[2].lower() == "resourcegroups":
            group = parts[3]
            if len(parts) == 4:
                return self._group(method, group, body)
            if len(parts) >= 8 and parts[4].lower() == "providers":
                rid = "/" + "/".join(parts[:8])
                if len(parts) == 9 and parts[8].lower() == "instanceview" and method == "GET":
                    return self._instance_view(rid)
                if len(parts) == 8:
                    return self._resource(method, rid, group, f"{parts[5]}/{parts[6]}", parts[7], api, query, body)
        return self._no_route(method, path)

    def _no_route(self, method: str, path: str) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            self.violations.append(f"no such endpoint: {method} {path}")
        return 404, {}, _err("NotFound", f"no route {method} {path}")

    def _token(self, tenant: str, form: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        if tenant != TENANT or form.get("client_id") != CLIENT_ID or form.get("grant_type") != "client_credentials":
            return 400, {}, {"error": "invalid_request", "error_description": "AADSTS90002: unknown tenant or client"}
        if form.get("client_secret") != SECRET:
            return 401, {}, {"error": "invalid_client",
                             "error_description": "AADSTS7000215: Invalid client secret provided."}
        token = uuid.uuid4().hex
        with self._lock:
            self.tokens.add(token)
        return 200, {}, {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}

    def _group(self, method: str, name: str, body: Any) -> tuple[int, dict[str, str], Any]:
        rid = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{name}"
        with self._lock:
            existing = self.resources.get(rid.lower())
            if method == "HEAD":
                return (204 if existing else 404), {}, None
            if method == "GET":
                return (200, {}, existing) if existing else (404, {}, _err(
                    "ResourceGroupNotFound", f"Resource group '{name}' could not be found."))
            if method == "PUT":
                fail = self._take_failure("group", "sync")
                if fail:
                    return fail.status, {}, _err(fail.code, fail.message)
                problems = self._check_tags(body, name)
                if not isinstance(body, dict) or not body.get("location"):
                    problems.append("resource group: location is required")
                if problems:
                    return self._refuse(problems)
                res = {"id": rid, "name": name, "type": "Microsoft.Resources/resourceGroups",
                       "location": body["location"], "tags": body.get("tags") or {},
                       "properties": {"provisioningState": "Succeeded"}}
                self.resources[rid.lower()] = res
                return (200 if existing else 201), {}, res
            if method == "DELETE":
                if not existing:
                    return 404, {}, _err("ResourceGroupNotFound", f"Resource group '{name}' could not be found.")
                existing["properties"]["provisioningState"] = "Deleting"
                op = uuid.uuid4().hex
                self._ops[op] = _Op(None, "delete", group=rid.lower())
                loc = f"{self.url}/subscriptions/{SUBSCRIPTION}/operationresults/{op}?api-version=2025-04-01"
                return 202, {"Location": loc, "Retry-After": "1"}, None
        return self._no_route(method, f"resource group {name}")

    def _list_groups(self, flt: str) -> tuple[int, dict[str, str], Any]:
        m = re.match(r"^tagName eq '([^']*)'(?: and tagValue eq '([^']*)')?$", flt.strip()) if flt else None
        if flt and not m:
            return 400, {}, _err("InvalidFilterInQueryString", f"Invalid $filter '{flt}'.")
        with self._lock:
            out = []
            for r in self.resources.values():
                if r["type"].lower() != TYPES["group"]:
                    continue
                tags = r.get("tags") or {}
                if m and (m.group(1) not in tags or (m.group(2) is not None and tags[m.group(1)] != m.group(2))):
                    continue
                out.append(r)
        return 200, {}, {"value": out}

    def _poll_location(self, op_id: str) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            op = self._ops.get(op_id)
            if op is None:
                return 404, {}, _err("NotFound", "no such operation")
            op.polls += 1
            if op.polls < 2:
                loc = f"{self.url}/subscriptions/{SUBSCRIPTION}/operationresults/{op_id}?api-version=2025-04-01"
                return 202, {"Location": loc, "Retry-After": "1"}, None
            if op.group:
                for key in [k for k in self.resources if k == op.group or k.startswith(op.group + "/")]:
                    del self.resources[key]
            return 200, {}, None

    def _poll_async(self, op_id: str) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            op = self._ops.get(op_id)
            if op is None:
                return 404, {}, _err("NotFound", "no such operation")
            op.polls += 1
            res = self.resources.get(op.resource_id or "")
            if op.polls < 2 and res is not None and res["type"].lower() == TYPES["vm"]:  # a VM takes a while
                return 200, {"Retry-After": "1"}, {"status": "InProgress", "name": op_id}
        if op.error:
            with self._lock:
                if res is not None:
                    res["properties"]["provisioningState"] = "Failed"
            return 200, {}, {"status": "Failed", "name": op_id, "error": op.error}
        if res is not None and res["properties"].get("provisioningState") != "Succeeded":
            self._succeed(res)
        return 200, {}, {"status": "Succeeded", "name": op_id}

    def _succeed(self, res: dict[str, Any]) -> None:
        kind = res["type"].lower()
        if kind == TYPES["vm"] and self.on_vm_created is not None:
            address = self.on_vm_created(res)  # outside the lock: a test host may take seconds to boot
            if address:
                with self._lock:
                    for pip in self._pips_of_vm(res):
                        pip["properties"]["ipAddress"] = address
        with self._lock:
            res["properties"]["provisioningState"] = "Succeeded"

    def _pips_of_vm(self, vm: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for ref in vm["properties"]["networkProfile"]["networkInterfaces"]:
            nic = self.resources.get(ref["id"].lower())
            for conf in (nic or {}).get("properties", {}).get("ipConfigurations", []):
                pip_id = conf.get("properties", {}).get("publicIPAddress", {}).get("id", "")
                if pip_id.lower() in self.resources:
                    out.append(self.resources[pip_id.lower()])
        return out

    def _instance_view(self, rid: str) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            res = self.resources.get(rid.lower())
        if res is None:
            return 404, {}, _err("ResourceNotFound", f"The Resource '{rid}' was not found.")
        return 200, {}, _instance_view(res)

    def _resource(self, method: str, rid: str, group: str, rtype: str, name: str, api: str,
                  query: dict[str, str], body: Any) -> tuple[int, dict[str, str], Any]:
        kind = rtype.lower()
        short = next((k for k, v in TYPES.items() if v == kind), None)
        group_id = f"/subscriptions/{SUBSCRIPTION}/resourcegroups/{group}".lower()
        with self._lock:
            grp = self.resources.get(group_id)
            existing = self.resources.get(rid.lower())
        if short is None:
            return 400, {}, _err("NoRegisteredProviderFound", f"No registered resource provider found for {rtype}.")
        if short == "schedule" and api not in SCHEDULE_APIS:
            return 400, {}, _err("NoRegisteredProviderFound",
                                 f"No registered resource provider found for location and API version '{api}' "
                                 f"for type 'schedules'. The supported api-versions are '{sorted(SCHEDULE_APIS)}'.")
        if grp is None:
            return 404, {}, _err("ResourceGroupNotFound", f"Resource group '{group}' could not be found.")
        if method == "GET":
            if existing is None:
                return 404, {}, _err("ResourceNotFound", f"The Resource '{rtype}/{name}' under resource group "
                                                         f"'{group}' was not found.")
            out = json.loads(json.dumps(existing))
            if short == "vm" and "instanceView" in query.get("$expand", ""):
                out["properties"]["instanceView"] = _instance_view(existing)
            return 200, {}, out
        if method != "PUT":
            return self._no_route(method, rid)
        fail = self._take_failure(short, "sync")
        if fail:
            return fail.status, {}, _err(fail.code, fail.message)
        problems = self._check(short, group, grp, name, body)
        if problems:
            return self._refuse(problems)
        res = {"id": _canonical_id(rid, rtype), "name": name, "type": rtype, "location": body["location"],
               "tags": body.get("tags") or {}, "properties": json.loads(json.dumps(body.get("properties") or {}))}
        if "sku" in body:
            res["sku"] = body["sku"]
        res["properties"]["provisioningState"] = "Creating" if existing is None else "Updating"
        if short == "vnet":
            for sub in res["properties"].get("subnets", []):
                sub["id"] = f"{res['id']}/subnets/{sub['name']}"
                sub.setdefault("properties", {})["provisioningState"] = "Succeeded"
        if short == "pip":
            self._ip_counter += 1
            res["properties"]["ipAddress"] = f"20.61.0.{self._ip_counter}"
        if short == "vm":
            res["properties"]["osProfile"].pop("customData", None)  # never returned by Azure
            res["properties"]["vmId"] = str(uuid.uuid4())
            res["body"] = body  # what was sent, custom data included, for the boot hook
        with self._lock:
            self.resources[rid.lower()] = res
        op = uuid.uuid4().hex
        async_fail = self._take_failure(short, "async")
        self._ops[op] = _Op(rid.lower(), "put", error={"code": async_fail.code, "message": async_fail.message}
                            if async_fail else None)
        ns = rtype.split("/")[0]
        headers = {"Azure-AsyncOperation": f"{self.url}/subscriptions/{SUBSCRIPTION}/providers/{ns}/locations/"
                   f"{body['location']}/operations/{op}?api-version={api}", "Retry-After": "1"}
        shown = {k: v for k, v in res.items() if k != "body"}
        return (201 if existing is None else 200), headers, shown

    def _refuse(self, problems: list[str]) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            self.violations.extend(problems)
        return 400, {}, _err("InvalidRequestContent", "; ".join(problems))

    # --- the contract ----------------------------------------------------------------------------

    def _check_tags(self, body: Any, group: str) -> list[str]:
        tags = (body or {}).get("tags") or {}
        problems = []
        if tags.get("launcher") != "vm":
            problems.append(f"{group}: tag launcher=vm missing")
        if not tags.get("launcher-vm") or group.lower() != f"launcher-vm-{tags.get('launcher-vm')}".lower():
            problems.append(f"{group}: tag launcher-vm does not name the VM of this group")
        if not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", str(tags.get("launcher-created", ""))):
            problems.append(f"{group}: tag launcher-created missing or not UTC ISO 8601")
        return problems

    def _exists(self, rid: str | None) -> bool:
        if not rid:
            return False
        low = rid.lower()
        if "/subnets/" in low:
            vnet = self.resources.get(low.split("/subnets/")[0])
            return bool(vnet) and any(s.get("id", "").lower() == low for s in vnet["properties"].get("subnets", []))
        return low in self.resources

    def _check(self, kind: str, group: str, grp: dict[str, Any], name: str, body: Any) -> list[str]:
        if not isinstance(body, dict):
            return [f"{kind} {name}: the body is not a JSON object"]
        where = f"{kind} {name}"
        p: list[str] = []
        props = body.get("properties") or {}
        if body.get("location") != grp["location"]:
            p.append(f"{where}: location {body.get('location')!r} is not the group's {grp['location']!r}")
        p += self._check_tags(body, group)
        if kind == "nsg":
            rules = props.get("securityRules") or []
            inbound = [r for r in rules if (r.get("properties") or {}).get("direction") == "Inbound"
                       and (r.get("properties") or {}).get("access") == "Allow"]
            if not inbound:
                p.append(f"{where}: no inbound allow rule for SSH")
            for r in rules:
                rp = r.get("properties") or {}
                for f in ("protocol", "access", "direction", "priority"):
                    if f not in rp:
                        p.append(f"{where}: rule {r.get('name')}: {f} is required")
                if not 100 <= int(rp.get("priority", 0)) <= 4096:
                    p.append(f"{where}: rule {r.get('name')}: priority must be 100..4096")
            for r in inbound:
                rp = r.get("properties") or {}
                sources = rp.get("sourceAddressPrefixes") or [rp.get("sourceAddressPrefix")]
                ports = rp.get("destinationPortRanges") or [rp.get("destinationPortRange")]
                if ports != ["22"] or rp.get("protocol") != "Tcp":
                    p.append(f"{where}: inbound rule {r.get('name')} allows more than TCP 22: {ports}")
                if sources != [self.expect_ssh_from]:
                    p.append(f"{where}: SSH allowed from {sources}, not only from {self.expect_ssh_from}")
        elif kind == "vnet":
            if not (props.get("addressSpace") or {}).get("addressPrefixes"):
                p.append(f"{where}: addressSpace.addressPrefixes is required")
            for s in props.get("subnets") or []:
                sp = s.get("properties") or {}
                if not s.get("name") or not (sp.get("addressPrefix") or sp.get("addressPrefixes")):
                    p.append(f"{where}: a subnet needs a name and an addressPrefix")
                nsg = (sp.get("networkSecurityGroup") or {}).get("id")
                if not self._exists(nsg):
                    p.append(f"{where}: subnet {s.get('name')}: network security group {nsg} does not exist")
        elif kind == "pip":
            if (body.get("sku") or {}).get("name") != "Standard":
                p.append(f"{where}: sku.name must be Standard")
            if props.get("publicIPAllocationMethod") != "Static":
                p.append(f"{where}: publicIPAllocationMethod must be Static")
        elif kind == "nic":
            confs = props.get("ipConfigurations") or []
            if not confs:
                p.append(f"{where}: ipConfigurations is required")
            for c in confs:
                cp = c.get("properties") or {}
                if not self._exists((cp.get("subnet") or {}).get("id")):
                    p.append(f"{where}: subnet {(cp.get('subnet') or {}).get('id')} does not exist")
                if not self._exists((cp.get("publicIPAddress") or {}).get("id")):
                    p.append(f"{where}: public IP {(cp.get('publicIPAddress') or {}).get('id')} does not exist")
        elif kind == "vm":
            p += self._check_vm(where, props)
        elif kind == "schedule":
            if name.lower() != f"shutdown-computevm-{group.lower().removeprefix('launcher-vm-')}":
                p.append(f"{where}: a VM's shutdown schedule is named shutdown-computevm-VMNAME")
            if props.get("status") != "Enabled" or props.get("taskType") != "ComputeVmShutdownTask":
                p.append(f"{where}: status Enabled and taskType ComputeVmShutdownTask are required")
            if not re.match(r"^([01]\d|2[0-3])[0-5]\d$", str((props.get("dailyRecurrence") or {}).get("time", ""))):
                p.append(f"{where}: dailyRecurrence.time must be HHMM")
            if not props.get("timeZoneId"):
                p.append(f"{where}: timeZoneId is required")
            if not self._exists(props.get("targetResourceId")):
                p.append(f"{where}: targetResourceId {props.get('targetResourceId')} is not an existing VM")
        return p

    def _check_vm(self, where: str, props: dict[str, Any]) -> list[str]:
        p = []
        if not (props.get("hardwareProfile") or {}).get("vmSize"):
            p.append(f"{where}: hardwareProfile.vmSize is required")
        image = (props.get("storageProfile") or {}).get("imageReference") or {}
        if not all(image.get(k) for k in ("publisher", "offer", "sku", "version")):
            p.append(f"{where}: storageProfile.imageReference needs publisher, offer, sku and version")
        osp = props.get("osProfile") or {}
        user = osp.get("adminUsername")
        if not user or not osp.get("computerName"):
            p.append(f"{where}: osProfile.adminUsername and computerName are required")
        if "adminPassword" in osp:
            p.append(f"{where}: a password was sent; launcher VMs log in by key only")
        lin = osp.get("linuxConfiguration") or {}
        if lin.get("disablePasswordAuthentication") is not True:
            p.append(f"{where}: linuxConfiguration.disablePasswordAuthentication must be true")
        keys = (lin.get("ssh") or {}).get("publicKeys") or []
        if not keys or keys[0].get("path") != f"/home/{user}/.ssh/authorized_keys" or not str(
                keys[0].get("keyData", "")).startswith(("ssh-", "ecdsa-")):
            p.append(f"{where}: ssh.publicKeys needs the user's key at /home/{user}/.ssh/authorized_keys")
        try:
            data = base64.b64decode(osp.get("customData", ""), validate=True).decode()
            if not data.startswith("#cloud-config\n"):
                p.append(f"{where}: customData is not a cloud-config")
        except ValueError:
            p.append(f"{where}: customData is not base64")
        nics = (props.get("networkProfile") or {}).get("networkInterfaces") or []
        if not nics or not all(self._exists(n.get("id")) for n in nics):
            p.append(f"{where}: networkProfile.networkInterfaces must name existing NICs")
        if props.get("priority") == "Spot":
            if props.get("evictionPolicy") not in ("Deallocate", "Delete"):
                p.append(f"{where}: a Spot VM needs evictionPolicy Deallocate or Delete")
            if "maxPrice" not in (props.get("billingProfile") or {}):
                p.append(f"{where}: a Spot VM needs billingProfile.maxPrice")
        return p


def cloud_config(vm: dict[str, Any]) -> dict[str, Any]:
    """The cloud-config launcher sent in a VM's custom data (JSON after the #cloud-config line)."""
    data = base64.b64decode(vm["body"]["properties"]["osProfile"]["customData"]).decode()
    header, _, rest = data.partition("\n")
    assert header == "#cloud-config"
    return dict(json.loads(rest))


def _instance_view(res: dict[str, Any]) -> dict[str, Any]:
    state = res["properties"].get("provisioningState", "Succeeded")
    statuses = [{"code": f"ProvisioningState/{state.lower()}", "level": "Info"}]
    if state == "Succeeded":
        statuses.append({"code": "PowerState/running", "level": "Info", "displayStatus": "VM running"})
    return {"statuses": statuses}


def _canonical_id(rid: str, rtype: str) -> str:
    parts = rid.strip("/").split("/")
    parts[2], parts[4] = "resourceGroups", "providers"
    parts[5], parts[6] = rtype.split("/")
    return "/" + "/".join(parts)


def _type_of(path: str) -> str:
    parts = path.strip("/").split("/")
    if len(parts) == 4 and parts[2].lower() == "resourcegroups":
        return TYPES["group"]
    if len(parts) >= 8:
        return f"{parts[5]}/{parts[6]}".lower()
    return ""


def _err(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


class _Handler(BaseHTTPRequestHandler):
    owner: AzureDouble
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        split = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            status, headers, out = self.owner.handle(self.command, split.path, query, self.headers, body)
        except Exception as exc:  # a bug in the double: say so to the client instead of hanging it
            status, headers, out = 500, {}, _err("DoubleError", f"{type(exc).__name__}: {exc}")
        if isinstance(out, str):
            data = out.encode()
            ctype = headers.pop("Content-Type", "text/plain")
        else:
            data = json.dumps(out).encode() if out is not None else b""
            ctype = "application/json; charset=utf-8"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if data or self.command != "HEAD":
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-ms-request-id", uuid.uuid4().hex)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _serve



def boot_on_testhost(host: Any, vm: dict[str, Any]) -> str:
    """Do to an SSH test host (tests/testhost.py) what Azure's provisioning and cloud-init do to a new VM,
    from what launcher sent: the admin user with the SSH key of osProfile; then cloud-init's ssh module
    (ssh_deletekeys, ssh_keys, ssh_genkeytypes: only launcher's host key remains), ssh_pwauth, write_files,
    sshd reloaded with the new key, and runcmd run for real. Returns the address the public IP gets."""
    import shlex

    osp = vm["body"]["properties"]["osProfile"]
    user = osp["adminUsername"]
    key = osp["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"]
    cfg = cloud_config(vm)

    def put(path: str, text: str, mode: str) -> str:
        data = base64.b64encode(text.encode()).decode()
        return (f"mkdir -p {shlex.quote(str(Path(path).parent))} && printf %s {data} | base64 -d > "
                f"{shlex.quote(path)} && chmod {mode} {shlex.quote(path)}")

    lines = ["set -e",
             f"id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/sh -p '*' {user}",
             put(f"/home/{user}/.ssh/authorized_keys", key + "\n", "600"),
             f"chown -R {user}:{user} /home/{user}/.ssh && chmod 700 /home/{user}/.ssh"]
    if cfg.get("ssh_deletekeys"):
        lines.append("rm -f /etc/ssh/ssh_host_*")
    for kt in ("rsa", "ecdsa", "ed25519"):
        if f"{kt}_private" in cfg.get("ssh_keys", {}):
            lines.append(put(f"/etc/ssh/ssh_host_{kt}_key", cfg["ssh_keys"][f"{kt}_private"], "600"))
            lines.append(put(f"/etc/ssh/ssh_host_{kt}_key.pub", cfg["ssh_keys"][f"{kt}_public"] + "\n", "644"))
    if cfg.get("ssh_genkeytypes", ["rsa", "ecdsa", "ed25519"]):
        lines.append("ssh-keygen -A")
    if cfg.get("ssh_pwauth") is False:
        lines.append(put("/etc/ssh/sshd_config.d/50-cloud-init.conf", "PasswordAuthentication no\n", "644"))
    for f in cfg.get("write_files", []):
        lines.append(put(f["path"], f["content"], f.get("permissions", "0644")))
    lines.append("kill -HUP $(cat /run/sshd.pid)")
    host.exec("sh", "-c", "\n".join(lines))
    for cmd in cfg.get("runcmd", []):  # cloud-init's final stage
        host.exec(*cmd) if isinstance(cmd, list) else host.exec("sh", "-c", cmd)
    return str(host.ip)
