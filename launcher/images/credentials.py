"""The user's Docker credentials for a registry, found the way the docker CLI finds them.

``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``): a ``credHelpers`` entry for the
registry's key runs ``docker-credential-<name> get``; otherwise ``credsStore`` does; otherwise the
``auths`` entry (``auth``: base64 ``user:password``, or ``username``/``password``, or an
``identitytoken``). Docker Hub's references (``docker.io``, ``index.docker.io``) use the key
``https://index.docker.io/v1/``, any other registry its host[:port]; an ``auths`` key written as a URL
(``https://host/v1/``) matches its host, as docker's file store does.

Secrets never reach a message, a log or a repr: only where they came from (:attr:`Credential.source`).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from launcher import proc
from launcher.errors import NotFound, RegistryAuthFailed, TimedOut

HUB_KEY = "https://index.docker.io/v1/"
HUB_NAMES = ("docker.io", "index.docker.io")
HELPER_PREFIX = "docker-credential-"
# What docker-credential-helpers print (and exit 1 with) when they hold nothing for that server.
_NOT_FOUND = "credentials not found"


@dataclass(frozen=True)
class Credential:
    """A username and password, or an identity token (an OAuth2 refresh token; username empty)."""

    username: str
    secret: str = field(repr=False)
    source: str
    identity_token: bool = False


def config_path() -> Path:
    """$DOCKER_CONFIG/config.json, or ~/.docker/config.json."""
    folder = os.environ.get("DOCKER_CONFIG")
    return Path(folder) / "config.json" if folder else Path.home() / ".docker" / "config.json"


def config_key(registry: str) -> str:
    """The key docker files the credentials of registry under (and hands a credential helper)."""
    return HUB_KEY if registry in HUB_NAMES else registry


def hostname(key: str) -> str:
    """An auths key as a host[:port]: no scheme, nothing from the first slash (docker's ConvertToHostname)."""
    for scheme in ("http://", "https://"):
        key = key.removeprefix(scheme)
    return key.split("/", 1)[0]


def _read_config(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RegistryAuthFailed(f"cannot read the Docker configuration {path}: {type(exc).__name__}",
                                 f"fix or remove {path}, then `docker login` again") from exc
    return data if isinstance(data, dict) else {}


def lookup(registry: str, *, path: Path | None = None) -> Credential | None:
    """The credentials docker would send to registry, or None (anonymous)."""
    cfg_path = path or config_path()
    cfg = _read_config(cfg_path)
    key = config_key(registry)
    helpers = cfg.get("credHelpers")
    helper = helpers.get(key) if isinstance(helpers, dict) else None
    if isinstance(helper, str) and helper:
        return from_helper(helper, key, f"credHelpers in {cfg_path}")
    store = cfg.get("credsStore")
    if isinstance(store, str) and store:
        return from_helper(store, key, f"credsStore in {cfg_path}")
    auths = cfg.get("auths")
    if not isinstance(auths, dict):
        return None
    entry = auths.get(key)
    if entry is None:
        entry = next((v for k, v in auths.items() if hostname(str(k)) == key), None)
    if not isinstance(entry, dict):
        return None
    return _from_auths_entry(entry, f"the auths of {cfg_path}")


def _from_auths_entry(entry: dict[str, object], source: str) -> Credential | None:
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        return Credential("", token, source, identity_token=True)
    user, password = entry.get("username"), entry.get("password")
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, sep, password = base64.b64decode(auth, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise RegistryAuthFailed(f"the credentials in {source} are not base64 user:password",
                                     "run `docker login` for that registry again") from exc
        if not sep:
            raise RegistryAuthFailed(f"the credentials in {source} are not base64 user:password",
                                     "run `docker login` for that registry again")
    if isinstance(user, str) and isinstance(password, str) and user and password:
        return Credential(user, password, source)
    return None


def from_helper(name: str, server: str, named_by: str, *, timeout: float = 60) -> Credential | None:
    """`docker-credential-NAME get`, server on its stdin, its JSON answer ({ServerURL, Username, Secret});
    None when it holds nothing for server. A Username of "<token>" makes Secret an identity token.
    named_by: where the helper is configured ("credHelpers in PATH"), for messages."""
    program = HELPER_PREFIX + name
    source = f"{program} ({named_by})"
    try:
        done = proc.run([program, "get"], input=server.encode(), timeout=timeout, check=False)
    except NotFound as exc:
        raise RegistryAuthFailed(f"the credential helper {program} ({named_by}) for {server} is not installed",
                                 f"install {program} (on PATH), or remove that entry from the Docker configuration "
                                 "and `docker login` again") from exc
    except TimedOut as exc:
        raise RegistryAuthFailed(f"the credential helper {program} did not answer for {server} in {timeout:.0f} s",
                                 f"check that `{program} get` works (it may wait for an unlocked keyring)") from exc
    if done.returncode != 0:
        if _NOT_FOUND in done.out.lower() or _NOT_FOUND in done.err.lower():
            return None
        # what a failing helper prints is an error message, never the secret it could not give
        raise RegistryAuthFailed(f"the credential helper {program} failed for {server}: "
                                 f"{done.last_error_line()[:200]}",
                                 f"check that `echo {server} | {program} get` works, or `docker login` again")
    try:
        answer = json.loads(done.stdout)
        user, secret = str(answer["Username"]), str(answer["Secret"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RegistryAuthFailed(f"the credential helper {program} gave no credentials in JSON for {server}",
                                 f"check that `echo {server} | {program} get` prints "
                                 '{"ServerURL", "Username", "Secret"}') from exc
    if not secret:
        return None
    if user == "<token>":
        return Credential("", secret, source, identity_token=True)
    return Credential(user, secret, source)
