"""Talking to an OCI/Docker registry: resolving a tag to its manifest digest, and a
local registry on loopback for teams without access to a public one."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from launcher import proc
from launcher.errors import Corrupt, NotFound, RegistryUnavailable, UsageError
from launcher.hashing import atomic_path

MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
DEFAULT_LOCAL = "127.0.0.1:5000"


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference: [registry/]repository[:tag][@digest]."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        text = ref.strip()
        if not text or any(c.isspace() for c in text):
            raise UsageError(f"not an image reference: {ref!r}", "use NAME[:TAG][@sha256:DIGEST]")
        name, _, digest = text.partition("@")
        if digest and not DIGEST_RE.match(digest):
            raise UsageError(f"malformed digest in {ref!r}", "a digest is sha256: followed by 64 hex digits")
        tag = None
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            name, tag = name.rsplit(":", 1)
        parts = name.split("/", 1)
        if len(parts) == 2 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
            registry, repo = parts
        else:
            registry, repo = "docker.io", name
            if "/" not in repo:
                repo = f"library/{repo}"
        return cls(registry, repo, tag, digest or None)

    @property
    def short_name(self) -> str:
        if self.registry == "docker.io":
            return self.repository.removeprefix("library/")
        return f"{self.registry}/{self.repository}"

    def pinned(self, digest: str) -> str:
        tag = f":{self.tag}" if self.tag else ""
        return f"{self.short_name}{tag}@{digest}"

    @property
    def api_base(self) -> str:
        host = "registry-1.docker.io" if self.registry == "docker.io" else self.registry
        scheme = "http" if is_loopback(host) else "https"
        return f"{scheme}://{host}"


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in ("localhost", "::1", "[::1]") or name.startswith("127.")


def _ssl_context(ca_bundle: Path | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)


def _bearer_token(challenge: str, ca_bundle: Path | None, timeout: float) -> str | None:
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = fields.pop("realm", None)
    if not realm:
        return None
    query = "&".join(f"{k}={v}" for k, v in fields.items())
    with urllib.request.urlopen(f"{realm}?{query}", timeout=timeout,  # noqa: S310
                                context=_ssl_context(ca_bundle)) as resp:
        body = json.loads(resp.read())
    token = body.get("token") or body.get("access_token")
    return str(token) if token else None


def resolve_digest(ref: str, *, ca_bundle: Path | None = None, timeout: float = 20) -> str:
    """The registry's manifest digest for ref's tag (what `docker pull NAME@DIGEST` needs)."""
    parsed = ImageRef.parse(ref)
    target = parsed.digest or parsed.tag or "latest"
    url = f"{parsed.api_base}/v2/{parsed.repository}/manifests/{target}"
    headers = {"Accept": MANIFEST_TYPES}
    for _attempt in range(2):
        req = urllib.request.Request(url, method="HEAD", headers=headers)  # noqa: S310
        try:
            ctx = _ssl_context(ca_bundle) if url.startswith("https") else None
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:  # noqa: S310
                digest = resp.headers.get("Docker-Content-Digest")
                if not digest or not DIGEST_RE.match(digest):
                    raise RegistryUnavailable(f"registry {parsed.registry} gave no digest for {ref}",
                                              "check that it is a Docker Registry v2 / OCI registry")
                return str(digest)
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and "Authorization" not in headers:
                token = _bearer_token(exc.headers.get("WWW-Authenticate", ""), ca_bundle, timeout)
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                    continue
            if exc.code in (401, 403, 404):
                raise NotFound(f"{ref} does not exist in {parsed.registry} (HTTP {exc.code})",
                               "check the name, tag and digest; a private image needs `docker login`") from exc
            raise RegistryUnavailable(f"registry {parsed.registry} answered HTTP {exc.code} for {ref}",
                                      "try again later or check the registry's status") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailable(f"cannot reach registry {parsed.registry}: {reason}",
                                      "check the address and network, or start a local one with "
                                      "`launcher base bootstrap --start-registry`") from exc
    raise RegistryUnavailable(f"registry {parsed.registry} refused the credentials for {ref}", "run `docker login`")


def ping(address: str, timeout: float = 2) -> bool:
    scheme = "http" if is_loopback(address) else "https"
    try:
        with urllib.request.urlopen(f"{scheme}://{address}/v2/", timeout=timeout) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except (urllib.error.URLError, OSError):
        return False


def start_local_registry(storage: Path, address: str = DEFAULT_LOCAL, wait: float = 20) -> dict[str, object]:
    """Start Debian's `docker-registry` on a loopback address, storing blobs under storage."""
    if not is_loopback(address):
        raise UsageError(f"a local registry listens on loopback only, not {address}", "use 127.0.0.1:PORT")
    if ping(address):
        return {"address": address, "started": False}
    storage.mkdir(parents=True, exist_ok=True)
    config = storage / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: "
        f"{storage / 'data'}\n  delete:\n    enabled: true\nhttp:\n  addr: {address}\n"
    )
    log = open(storage / "registry.log", "ab")
    try:
        p = proc.popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL)
    except NotFound as exc:
        raise RegistryUnavailable("the `docker-registry` program is not installed",
                                  "apt-get install docker-registry (Debian/Ubuntu), or pass --registry ADDR") from exc
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if ping(address):
            (storage / "registry.pid").write_text(str(p.pid))
            return {"address": address, "started": True, "pid": p.pid}
        if p.poll() is not None:
            break
        time.sleep(0.2)
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
    raise RegistryUnavailable(f"the local registry did not start on {address}",
                              f"see {storage / 'registry.log'}; is the port in use?")


# ---------------------------------------------------------------- blobs and manifests, for a base carried by hand


def _call(ref: ImageRef, method: str, path: str, *, headers: dict[str, str] | None = None,
          body: bytes | IO[bytes] | None = None, timeout: float = 120) -> Any:
    """One request to ref's registry (a bearer token fetched once on a 401), the response open."""
    url = path if path.startswith("http") else f"{ref.api_base}/v2/{ref.repository}/{path}"
    sent = dict(headers or {})
    for _attempt in range(2):
        req = urllib.request.Request(url, method=method, headers=sent, data=body)  # noqa: S310
        try:
            return urllib.request.urlopen(req, timeout=timeout,  # noqa: S310
                                          context=_ssl_context(None) if url.startswith("https") else None)
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and "Authorization" not in sent:
                token = _bearer_token(exc.headers.get("WWW-Authenticate", ""), None, timeout)
                if token:
                    sent["Authorization"] = f"Bearer {token}"
                    continue
            if exc.code == 404 and method in ("GET", "HEAD"):
                raise NotFound(f"{ref.registry}/{ref.repository}: {path.rsplit('/', 1)[-1]} is not there (HTTP 404)",
                               "check the image was pushed to that registry") from exc
            raise RegistryUnavailable(f"registry {ref.registry} answered HTTP {exc.code} to {method} {path}",
                                      "check the registry is a Docker Registry v2 that accepts pushes") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise RegistryUnavailable(f"cannot reach registry {ref.registry}: {getattr(exc, 'reason', exc)}",
                                      "check the address, or start a local one with `launcher base registry`") \
                from exc
    raise RegistryUnavailable(f"registry {ref.registry} refused the credentials", "run `docker login`")


def get_manifest(ref: ImageRef, digest: str) -> tuple[str, bytes]:
    """(media type, bytes) of the manifest by digest, checked against it."""
    with _call(ref, "GET", f"manifests/{digest}", headers={"Accept": MANIFEST_TYPES}) as resp:
        body = resp.read()
        media = str(resp.headers.get("Content-Type") or "").split(";")[0].strip()
    if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
        raise Corrupt(f"the registry {ref.registry} served a manifest that is not {digest}",
                      "check the registry; a manifest must match its digest")
    return media or json.loads(body).get("mediaType", ""), body


def get_blob(ref: ImageRef, digest: str, out: Path) -> int:
    """Download a blob into out (atomically), checked against its digest; its size."""
    h = hashlib.sha256()
    size = 0
    with _call(ref, "GET", f"blobs/{digest}") as resp, atomic_path(out) as tmp, open(tmp, "wb") as f:
        for block in iter(lambda: resp.read(1 << 20), b""):
            h.update(block)
            f.write(block)
            size += len(block)
        if "sha256:" + h.hexdigest() != digest:
            raise Corrupt(f"the registry {ref.registry} served a blob that is not {digest}",
                          "check the registry's storage")
    return size


def has_blob(ref: ImageRef, digest: str) -> bool:
    try:
        with _call(ref, "HEAD", f"blobs/{digest}"):
            return True
    except NotFound:
        return False


def push_blob(ref: ImageRef, digest: str, path: Path) -> None:
    """A monolithic upload (POST, then PUT with the bytes), skipped when the registry has the blob."""
    if has_blob(ref, digest):
        return
    with _call(ref, "POST", "blobs/uploads/", body=b"") as resp:
        location = str(resp.headers.get("Location") or "")
    if not location:
        raise RegistryUnavailable(f"registry {ref.registry} gave no upload location", "check the registry")
    if location.startswith("/"):
        location = ref.api_base + location
    target = location + ("&" if "?" in location else "?") + urllib.parse.urlencode({"digest": digest})
    with open(path, "rb") as f, _call(ref, "PUT", target, body=f, headers={
            "Content-Type": "application/octet-stream", "Content-Length": str(path.stat().st_size)}):
        pass


def put_manifest(ref: ImageRef, media_type: str, body: bytes) -> str:
    """Push a manifest by its digest; the digest the registry answers with."""
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    with _call(ref, "PUT", f"manifests/{digest}", body=body, headers={"Content-Type": media_type}) as resp:
        return str(resp.headers.get("Docker-Content-Digest") or digest)
