"""Talking to an OCI/Docker registry: resolving a tag to its manifest digest, moving a manifest and its
blobs byte for byte (a base carried by hand), and a local registry on loopback for teams without access to
a public one. Requests carry the user's Docker credentials (launcher.images.credentials) when the registry
asks for them: its Basic challenge, or a Bearer token from its realm.

Why not the docker CLI for digests: `docker manifest inspect --verbose` prints the digest of a single
manifest, but of a multi-platform list only its members' digests, and its plain output is the list
re-serialized (another sha256 than the registry's unless docker itself wrote it); `docker buildx
imagetools` is not part of Debian's docker.io. Pushes and pulls of images go through the Engine
(`docker push` / `docker pull`), which reads the same credentials itself."""

from __future__ import annotations

import base64
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
from launcher.errors import (
    Corrupt,
    NotFound,
    RegistryAuthFailed,
    RegistryLoginNeeded,
    RegistryUnavailable,
    UsageError,
)
from launcher.hashing import atomic_path
from launcher.images import credentials
from launcher.images.imageref import DIGEST_RE, ImageRef, is_loopback

MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
DEFAULT_LOCAL = "127.0.0.1:5000"


def _ssl_context(ca_bundle: Path | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)


# ---------------------------------------------------------------- the registry's challenge and the user's credentials


@dataclass(frozen=True)
class Challenge:
    """A WWW-Authenticate challenge: its scheme (lower case) and parameters (realm, service, scope...)."""

    scheme: str
    params: dict[str, str]


_PARAM_RE = re.compile(r'([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]+))')


def parse_challenge(header: str) -> Challenge | None:
    """`Bearer realm="https://auth.example/token",service="reg",scope="repository:a/b:pull"` or
    `Basic realm="x"` as a Challenge; None when header names no scheme. A quoted value may hold commas."""
    text = header.strip()
    if not text:
        return None
    scheme, _, rest = text.partition(" ")
    if "=" in scheme:
        return None
    params = {m.group(1).lower(): (re.sub(r"\\(.)", r"\1", m.group(2)) if m.group(2) is not None else m.group(3))
              for m in _PARAM_RE.finditer(rest)}
    return Challenge(scheme.lower(), params)


def login_command(registry: str) -> str:
    """What to type, in backticks, for a message: `docker login` for Docker Hub (docker's default),
    `docker login HOST` for any other registry."""
    return "`docker login`" if registry in credentials.HUB_NAMES else f"`docker login {registry}`"


class Session:
    """Requests to one repository of a registry, answering its challenge (Basic, or a Bearer token from its
    realm) with the user's Docker credentials, looked up once, on the first 401; anonymous without any."""

    def __init__(self, ref: ImageRef, *, ca_bundle: Path | None = None, timeout: float = 120) -> None:
        self.ref = ref
        self.ca_bundle = ca_bundle
        self.timeout = timeout
        self.authorization: str | None = None
        self._answered: Challenge | None = None
        self._credential: credentials.Credential | None = None
        self._looked_up = False

    def credential(self) -> credentials.Credential | None:
        if not self._looked_up:
            self._credential = credentials.lookup(self.ref.registry)
            self._looked_up = True
        return self._credential

    def _context(self, url: str) -> ssl.SSLContext | None:
        return _ssl_context(self.ca_bundle) if url.startswith("https") else None

    def login_needed(self, what: str = "") -> RegistryLoginNeeded:
        return RegistryLoginNeeded(f"registry {self.ref.registry} needs a login{what}",
                                   f"run {login_command(self.ref.registry)}")

    def refused(self, cred: credentials.Credential, what: str = "") -> RegistryAuthFailed:
        return RegistryAuthFailed(f"registry {self.ref.registry} refused the credentials from {cred.source}{what}",
                                  f"run {login_command(self.ref.registry)} again")

    def open(self, method: str, url: str, *, headers: dict[str, str] | None = None,
             body: bytes | IO[bytes] | None = None) -> Any:
        """The response, open; a 401 answered (a fresh challenge at most twice), then HTTPError for the rest."""
        for _attempt in range(3):
            req = urllib.request.Request(url, method=method, headers=dict(headers or {}), data=body)  # noqa: S310
            if self.authorization:  # not sent on along a redirect (a blob's storage behind the registry)
                req.add_unredirected_header("Authorization", self.authorization)
            try:
                return urllib.request.urlopen(req, timeout=self.timeout, context=self._context(url))  # noqa: S310
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    challenge = parse_challenge(exc.headers.get("WWW-Authenticate", ""))
                    if challenge is not None and challenge != self._answered:
                        self.authorize(challenge)
                        if body is not None and not isinstance(body, bytes):
                            body.seek(0)  # a file sent already: send it from its start again
                        continue
                    cred = self.credential()
                    # a token the realm gave can still not reach the repository: private, or not there
                    bearer = self._answered is not None and self._answered.scheme == "bearer"
                    what = f" for {self.ref.repository} (or it has no such repository)" if bearer else ""
                    raise (self.refused(cred, what) if cred else self.login_needed(what)) from exc
                if exc.code == 403:
                    cred = self.credential() if self._looked_up else None
                    raise RegistryAuthFailed(
                        f"registry {self.ref.registry} denied {method} {self.ref.repository} (HTTP 403)"
                        + (f" to the credentials from {cred.source}" if cred else ""),
                        f"check that your login may use {self.ref.repository}, or run "
                        f"{login_command(self.ref.registry)}"
                    ) from exc
                raise
            except (urllib.error.URLError, OSError) as exc:
                raise RegistryUnavailable(f"cannot reach registry {self.ref.registry}: {getattr(exc, 'reason', exc)}",
                                          "check the address and network, or start a local one with "
                                          "`launcher base registry`") from exc
        raise RegistryAuthFailed(f"registry {self.ref.registry} keeps asking for another authentication",
                                 f"run {login_command(self.ref.registry)} again")

    def authorize(self, challenge: Challenge) -> None:
        """Set the Authorization that answers challenge (RegistryLoginNeeded when it needs credentials
        the user has none of, RegistryAuthFailed when they are refused)."""
        cred = self.credential()
        self._answered = challenge
        if challenge.scheme == "basic":
            if cred is None or cred.identity_token:
                raise self.login_needed()
            self.authorization = "Basic " + _basic(cred)
        elif challenge.scheme == "bearer" and challenge.params.get("realm"):
            self.authorization = "Bearer " + self._token(challenge, cred)
        else:
            raise RegistryAuthFailed(f"registry {self.ref.registry} asks for an authentication launcher does not "
                                     f"speak ({challenge.scheme})", "use a registry that takes Basic or Bearer tokens")

    def _token(self, challenge: Challenge, cred: credentials.Credential | None) -> str:
        """A token from the challenge's realm: GET with Basic credentials (anonymous without any), or
        an identity token's OAuth2 refresh grant (POST), as docker does."""
        realm = challenge.params["realm"]
        fields = {k: v for k, v in challenge.params.items() if k in ("service", "scope")}
        if cred is not None and cred.identity_token:
            form = {"grant_type": "refresh_token", "refresh_token": cred.secret, "client_id": "launcher", **fields}
            req = urllib.request.Request(realm, method="POST", data=urllib.parse.urlencode(form).encode(),  # noqa: S310
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        else:
            query = urllib.parse.urlencode(fields)
            req = urllib.request.Request(f"{realm}?{query}" if query else realm)  # noqa: S310
            if cred is not None:
                req.add_unredirected_header("Authorization", "Basic " + _basic(cred))
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context(realm)) as resp:  # noqa: S310
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code in (400, 401, 403):
                raise (self.refused(cred) if cred else self.login_needed()) from exc
            raise RegistryUnavailable(f"the token service of registry {self.ref.registry} answered HTTP {exc.code}",
                                      "try again later or check the registry's status") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise RegistryUnavailable(f"cannot reach the token service of registry {self.ref.registry}: "
                                      f"{getattr(exc, 'reason', exc)}", "check the network") from exc
        except ValueError as exc:
            raise RegistryUnavailable(f"the token service of registry {self.ref.registry} answered no JSON",
                                      "check the registry's status") from exc
        token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
        if not token:
            raise RegistryUnavailable(f"the token service of registry {self.ref.registry} gave no token",
                                      "check the registry's status")
        return str(token)


def _basic(cred: credentials.Credential) -> str:
    return base64.b64encode(f"{cred.username}:{cred.secret}".encode()).decode()


def resolve_digest(ref: str, *, ca_bundle: Path | None = None, timeout: float = 20) -> str:
    """The registry's manifest digest for ref's tag (what `docker pull NAME@DIGEST` needs), asked with the
    user's Docker credentials for that registry when it wants them."""
    parsed = ImageRef.parse(ref)
    target = parsed.digest or parsed.tag or "latest"
    url = f"{parsed.api_base}/v2/{parsed.repository}/manifests/{target}"
    session = Session(parsed, ca_bundle=ca_bundle, timeout=timeout)
    try:
        with session.open("HEAD", url, headers={"Accept": MANIFEST_TYPES}) as resp:
            digest = resp.headers.get("Docker-Content-Digest")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NotFound(f"{ref} does not exist in {parsed.registry} (HTTP 404)",
                           "check the name, tag and digest") from exc
        raise RegistryUnavailable(f"registry {parsed.registry} answered HTTP {exc.code} for {ref}",
                                  "try again later or check the registry's status") from exc
    if not digest or not DIGEST_RE.match(digest):
        raise RegistryUnavailable(f"registry {parsed.registry} gave no digest for {ref}",
                                  "check that it is a Docker Registry v2 / OCI registry")
    return str(digest)


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
          body: bytes | IO[bytes] | None = None, timeout: float = 120, session: Session | None = None) -> Any:
    """One request to ref's registry with the user's credentials for it, the response open. session: one
    kept across requests, so that one challenge is answered once."""
    url = path if path.startswith("http") else f"{ref.api_base}/v2/{ref.repository}/{path}"
    try:
        return (session or Session(ref, timeout=timeout)).open(method, url, headers=headers, body=body)
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and method in ("GET", "HEAD"):
            raise NotFound(f"{ref.registry}/{ref.repository}: {path.rsplit('/', 1)[-1]} is not there (HTTP 404)",
                           "check the image was pushed to that registry") from exc
        raise RegistryUnavailable(f"registry {ref.registry} answered HTTP {exc.code} to {method} {path}",
                                  "check the registry is a Docker Registry v2 that accepts pushes") from exc


def get_manifest(ref: ImageRef, digest: str, *, session: Session | None = None) -> tuple[str, bytes]:
    """(media type, bytes) of the manifest by digest, checked against it."""
    with _call(ref, "GET", f"manifests/{digest}", headers={"Accept": MANIFEST_TYPES}, session=session) as resp:
        body = resp.read()
        media = str(resp.headers.get("Content-Type") or "").split(";")[0].strip()
    if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
        raise Corrupt(f"the registry {ref.registry} served a manifest that is not {digest}",
                      "check the registry; a manifest must match its digest")
    return media or json.loads(body).get("mediaType", ""), body


def get_blob(ref: ImageRef, digest: str, out: Path, *, session: Session | None = None) -> int:
    """Download a blob into out (atomically), checked against its digest; its size."""
    h = hashlib.sha256()
    size = 0
    with _call(ref, "GET", f"blobs/{digest}", session=session) as resp, atomic_path(out) as tmp, open(tmp, "wb") as f:
        for block in iter(lambda: resp.read(1 << 20), b""):
            h.update(block)
            f.write(block)
            size += len(block)
        if "sha256:" + h.hexdigest() != digest:
            raise Corrupt(f"the registry {ref.registry} served a blob that is not {digest}",
                          "check the registry's storage")
    return size


def has_blob(ref: ImageRef, digest: str, *, session: Session | None = None) -> bool:
    try:
        with _call(ref, "HEAD", f"blobs/{digest}", session=session):
            return True
    except NotFound:
        return False


def push_blob(ref: ImageRef, digest: str, path: Path, *, session: Session | None = None) -> None:
    """A monolithic upload (POST, then PUT with the bytes), skipped when the registry has the blob."""
    session = session or Session(ref)
    if has_blob(ref, digest, session=session):
        return
    with _call(ref, "POST", "blobs/uploads/", body=b"", session=session) as resp:
        location = str(resp.headers.get("Location") or "")
    if not location:
        raise RegistryUnavailable(f"registry {ref.registry} gave no upload location", "check the registry")
    if location.startswith("/"):
        location = ref.api_base + location
    target = location + ("&" if "?" in location else "?") + urllib.parse.urlencode({"digest": digest})
    with open(path, "rb") as f, _call(ref, "PUT", target, body=f, session=session, headers={
            "Content-Type": "application/octet-stream", "Content-Length": str(path.stat().st_size)}):
        pass


def put_manifest(ref: ImageRef, media_type: str, body: bytes, *, session: Session | None = None) -> str:
    """Push a manifest by its digest; the digest the registry answers with."""
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    with _call(ref, "PUT", f"manifests/{digest}", body=body, headers={"Content-Type": media_type},
               session=session) as resp:
        return str(resp.headers.get("Docker-Content-Digest") or digest)
