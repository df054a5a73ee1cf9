"""The edges of the Azure SDK that launcher.vms.azure stands on: loading the SDK (an extra), the
credential chain, checked with a token, and the SDK's errors as LauncherErrors."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from launcher.errors import (
    AuthFailed,
    CloudFailed,
    CloudQuota,
    HostUnreachable,
    LauncherError,
    MissingExtra,
    NoCloudCredentials,
    NotOffered,
)
from launcher.vms.vmspec import VmSpec

ARM_SCOPE = "https://management.azure.com/.default"
_PUBLIC_AUTHORITIES = ("login.microsoftonline.com", "login.chinacloudapi.cn", "login.microsoftonline.us")


def require_sdk() -> None:
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


def error_of(exc: Exception) -> tuple[str, str]:
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
    code, message = error_of(exc)
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
    require_sdk()
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
