"""The registry client with the user's Docker credentials: config.json's auths, credential helpers
(credHelpers, credsStore), Basic and Bearer challenges, and the errors when a login is missing or refused.

The real part runs Debian's `docker-registry` with htpasswd (bcrypt) auth on a loopback port of its own,
pushes a tiny image into it with `docker login` + `docker push` under a temporary DOCKER_CONFIG, then asks
it through launcher's client. The Bearer token flow runs against a small HTTP registry and token service
in this process (no token server ships offline)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode, RegistryAuthFailed, RegistryLoginNeeded
from launcher.hosts import engine as engine_mod
from launcher.images import basearchive, credentials, registry
from launcher.images.imageref import ImageRef
from launcher.scaffold import init_workspace

USER, PASSWORD = "alice", "correct-horse-battery"
REPO = "launcher-test/creds"
HELPER = "launchertest"


# ---------------------------------------------------------------- no Docker: parsing and key mapping


def test_bearer_challenge_is_parsed_with_commas_inside_quotes() -> None:
    ch = registry.parse_challenge('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
                                  'scope="repository:library/python:pull,push"')
    assert ch == registry.Challenge("bearer", {"realm": "https://auth.docker.io/token",
                                               "service": "registry.docker.io",
                                               "scope": "repository:library/python:pull,push"})


def test_basic_and_odd_challenges() -> None:
    assert registry.parse_challenge('Basic realm="Registry Realm"') == registry.Challenge(
        "basic", {"realm": "Registry Realm"})
    assert registry.parse_challenge("Bearer realm=https://r.example/t, service=reg") == registry.Challenge(
        "bearer", {"realm": "https://r.example/t", "service": "reg"})
    assert registry.parse_challenge('BEARER Realm="x\\"y"') == registry.Challenge("bearer", {"realm": 'x"y'})
    assert registry.parse_challenge("") is None
    assert registry.parse_challenge('realm="x"') is None


def test_docker_hub_names_map_to_the_hub_key_as_docker_maps_them() -> None:
    assert ImageRef.parse("python:3.11").registry == "docker.io"
    hub = ImageRef.parse("index.docker.io/library/python:3.11")
    assert (hub.registry, hub.repository, hub.api_base) == ("docker.io", "library/python",
                                                           "https://registry-1.docker.io")
    assert ImageRef.parse("docker.io/python").repository == "library/python"
    assert ImageRef.parse("index.docker.io/python").short_name == "python"
    assert credentials.config_key("docker.io") == credentials.config_key("index.docker.io") == \
        "https://index.docker.io/v1/"
    # docker keeps registry-1.docker.io as a registry name of its own (not Docker Hub's key)
    assert credentials.config_key("registry-1.docker.io") == "registry-1.docker.io"
    assert credentials.config_key("127.0.0.1:5000") == "127.0.0.1:5000"
    assert registry.login_command("docker.io") == "`docker login`"
    assert registry.login_command("ghcr.io") == "`docker login ghcr.io`"


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_auths_lookup_hub_key_legacy_url_keys_and_identity_tokens(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"auths": {
        "https://index.docker.io/v1/": {"auth": _auth("hubuser", "hubpass")},
        "https://legacy.example.com/v1/": {"auth": _auth("old", "pw:with:colons")},
        "ghcr.io": {"identitytoken": "refresh-me"},
        "plain.example.com": {"username": "u", "password": "p"},
        "empty.example.com": {},
    }}))
    hub = credentials.lookup("docker.io", path=cfg)
    assert hub is not None and (hub.username, hub.secret) == ("hubuser", "hubpass")
    assert credentials.lookup("index.docker.io", path=cfg) == hub
    assert credentials.lookup("registry-1.docker.io", path=cfg) is None
    legacy = credentials.lookup("legacy.example.com", path=cfg)
    assert legacy is not None and (legacy.username, legacy.secret) == ("old", "pw:with:colons")
    token = credentials.lookup("ghcr.io", path=cfg)
    assert token is not None and token.identity_token and token.secret == "refresh-me"
    plain = credentials.lookup("plain.example.com", path=cfg)
    assert plain is not None and plain.username == "u"
    assert credentials.lookup("empty.example.com", path=cfg) is None
    assert credentials.lookup("other.example.com", path=cfg) is None
    assert credentials.lookup("docker.io", path=tmp_path / "none.json") is None
    assert "hubpass" not in repr(hub) and str(cfg) in hub.source


def test_a_docker_config_that_is_not_json_is_named(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text("{not json")
    with pytest.raises(RegistryAuthFailed, match="cannot read the Docker configuration"):
        credentials.lookup("ghcr.io", path=cfg)


def test_config_path_follows_docker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert credentials.config_path() == tmp_path / "config.json"
    monkeypatch.delenv("DOCKER_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert credentials.config_path() == tmp_path / ".docker" / "config.json"


# ---------------------------------------------------------------- a credential helper, as docker runs one

HELPER_SOURCE = '''
import json, os, sys
store = os.environ["LAUNCHER_TEST_HELPER_STORE"]
data = json.load(open(store)) if os.path.exists(store) else {}
action = sys.argv[1]
payload = sys.stdin.read()
if action == "store":
    entry = json.loads(payload)
    data[entry["ServerURL"]] = {"Username": entry["Username"], "Secret": entry["Secret"]}
    json.dump(data, open(store, "w"))
elif action == "get":
    server = payload.strip()
    if server not in data:
        print("credentials not found in native keychain")
        sys.exit(1)
    json.dump({"ServerURL": server, **data[server]}, sys.stdout)
elif action == "erase":
    data.pop(payload.strip(), None)
    json.dump(data, open(store, "w"))
elif action == "list":
    json.dump({k: v["Username"] for k, v in data.items()}, sys.stdout)
else:
    print("unknown action", action, file=sys.stderr)
    sys.exit(2)
'''


@pytest.fixture
def helper_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """docker-credential-launchertest on PATH: the credential-helper protocol over a JSON file."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / f"docker-credential-{HELPER}"
    script.write_text(f"#!{sys.executable}\n{HELPER_SOURCE}")
    script.chmod(0o755)
    store = tmp_path / "helper-store.json"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LAUNCHER_TEST_HELPER_STORE", str(store))
    return script


def _helper_store(script: Path, server: str, user: str, secret: str) -> None:
    entry = json.dumps({"ServerURL": server, "Username": user, "Secret": secret}).encode()
    subprocess.run([str(script), "store"], input=entry, check=True)


def test_helper_answers_tokens_and_not_found(helper_on_path: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"credsStore": HELPER, "credHelpers": {"ghcr.io": HELPER}}))
    assert credentials.lookup("docker.io", path=cfg) is None  # the helper holds nothing for the Hub
    _helper_store(helper_on_path, "https://index.docker.io/v1/", "hubuser", "hubsecret")
    _helper_store(helper_on_path, "ghcr.io", "<token>", "an-identity-token")
    hub = credentials.lookup("docker.io", path=cfg)
    assert hub is not None and (hub.username, hub.secret, hub.identity_token) == ("hubuser", "hubsecret", False)
    assert hub.source == f"docker-credential-{HELPER} (credsStore in {cfg})"
    ghcr = credentials.lookup("ghcr.io", path=cfg)
    assert ghcr is not None and ghcr.identity_token and ghcr.secret == "an-identity-token"
    assert "credHelpers" in ghcr.source


def test_a_missing_or_failing_helper_is_named_with_its_fix(helper_on_path: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"credHelpers": {"ghcr.io": "nosuchhelper"}}))
    with pytest.raises(RegistryAuthFailed) as missing:
        credentials.lookup("ghcr.io", path=cfg)
    assert "docker-credential-nosuchhelper" in missing.value.message and "not installed" in missing.value.message
    assert missing.value.exit_code == ExitCode.AUTH_FAILED
    cfg.write_text(json.dumps({"credHelpers": {"ghcr.io": HELPER}}))
    monkeypatch.setenv("LAUNCHER_TEST_HELPER_STORE", str(tmp_path))  # a folder: the helper fails to read it
    with pytest.raises(RegistryAuthFailed) as failing:
        credentials.lookup("ghcr.io", path=cfg)
    assert f"docker-credential-{HELPER} failed for ghcr.io" in failing.value.message
    assert f"{HELPER} get" in str(failing.value.hint)


# ---------------------------------------------------------------- the Bearer token flow, in this process


class _TokenRegistry(http.server.BaseHTTPRequestHandler):
    """/v2/... wants a Bearer token from /token, which gives one for USER:PASSWORD (Basic) or for the
    refresh token "good-refresh" (POST), and an anonymous one that reaches nothing."""

    seen: list[dict[str, Any]]
    digest = "sha256:" + "12" * 32

    def log_message(self, *args: Any) -> None:
        pass

    def _token_answer(self, who: str | None) -> None:
        if who is None:
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"token": f"token-for-{who}"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/token"):
            auth = self.headers.get("Authorization")
            self.seen.append({"path": self.path, "auth": auth})
            if auth is None:
                return self._token_answer("anonymous")
            return self._token_answer(USER if auth == "Basic " + _auth(USER, PASSWORD) else None)
        self.send_response(404)
        self.end_headers()

    def do_POST(self) -> None:
        form = self.rfile.read(int(self.headers["Content-Length"])).decode()
        self.seen.append({"path": self.path, "form": form})
        self._token_answer("refresh" if "refresh_token=good-refresh" in form else None)

    def do_HEAD(self) -> None:
        if self.headers.get("Authorization") in (f"Bearer token-for-{USER}", "Bearer token-for-refresh"):
            self.send_response(200)
            self.send_header("Docker-Content-Digest", self.digest)
        else:
            host, port = self.server.server_address[:2]
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Bearer realm="http://{host}:{port}/token",'
                                                 f'service="test-registry",scope="repository:{REPO}:pull"')
        self.end_headers()


@pytest.fixture
def token_registry() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    handler = type("Handler", (_TokenRegistry,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _config(folder: Path, monkeypatch: pytest.MonkeyPatch, content: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(content))
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    return folder / "config.json"


def test_bearer_flow_with_basic_credentials_at_the_realm(token_registry: tuple[str, list[dict[str, Any]]],
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addr, seen = token_registry
    _config(tmp_path / "good", monkeypatch, {"auths": {addr: {"auth": _auth(USER, PASSWORD)}}})
    assert registry.resolve_digest(f"{addr}/{REPO}:v1") == _TokenRegistry.digest
    assert seen[-1]["auth"] == "Basic " + _auth(USER, PASSWORD)
    assert "service=test-registry" in seen[-1]["path"] and "scope=repository%3Alauncher-test%2Fcreds%3Apull" in \
        seen[-1]["path"]


def test_bearer_flow_with_an_identity_token(token_registry: tuple[str, list[dict[str, Any]]],
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addr, seen = token_registry
    _config(tmp_path / "token", monkeypatch, {"auths": {addr: {"identitytoken": "good-refresh"}}})
    assert registry.resolve_digest(f"{addr}/{REPO}:v1") == _TokenRegistry.digest
    assert "grant_type=refresh_token" in seen[-1]["form"] and "service=test-registry" in seen[-1]["form"]


def test_bearer_flow_anonymous_and_refused(token_registry: tuple[str, list[dict[str, Any]]],
                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addr, _ = token_registry
    _config(tmp_path / "none", monkeypatch, {})
    with pytest.raises(RegistryLoginNeeded) as anon:
        registry.resolve_digest(f"{addr}/{REPO}:v1")
    assert anon.value.one_line() == (f"registry {addr} needs a login for {REPO} (or it has no such repository); "
                                     f"fix: run `docker login {addr}`")
    cfg = _config(tmp_path / "bad", monkeypatch, {"auths": {addr: {"auth": _auth(USER, "wrong-secret")}}})
    with pytest.raises(RegistryAuthFailed) as bad:
        registry.resolve_digest(f"{addr}/{REPO}:v1")
    assert not isinstance(bad.value, RegistryLoginNeeded)
    assert bad.value.one_line() == (f"registry {addr} refused the credentials from the auths of {cfg}; "
                                    f"fix: run `docker login {addr}` again")
    assert "wrong-secret" not in bad.value.one_line()


class _PushRegistry(_TokenRegistry):
    """Pushes want a token of scope pull,push: a pull token gets a second challenge, as Docker Hub does."""

    stored: dict[str, bytes]

    def _scope(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth.removeprefix(f"Bearer token-for-{USER}-") if auth.startswith("Bearer token-for-") else None

    def _challenge(self, actions: str) -> None:
        host, port = self.server.server_address[:2]
        self.send_response(401)
        self.send_header("WWW-Authenticate", f'Bearer realm="http://{host}:{port}/token",service="test-registry",'
                                             f'scope="repository:{REPO}:{actions}"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path.startswith("/token") and self.headers.get("Authorization") == "Basic " + _auth(USER, PASSWORD):
            scope = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["scope"][0]
            self.seen.append({"scope": scope})
            return self._token_answer(f"{USER}-{scope.rsplit(':', 1)[-1]}")
        return super().do_GET()

    def do_HEAD(self) -> None:
        if self._scope() is None:
            return self._challenge("pull")
        digest = self.path.rsplit("/", 1)[-1]
        self.send_response(200 if digest in self.stored else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        if self._scope() != "pull,push":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            return self._challenge("pull,push")
        self.send_response(202)
        self.send_header("Location", f"/v2/{REPO}/blobs/uploads/u1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self._scope() != "pull,push":
            return self._challenge("pull,push")
        digest = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["digest"][0]
        ok = digest == "sha256:" + hashlib.sha256(body).hexdigest()
        if ok:
            self.stored[digest] = body
        self.send_response(201 if ok else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_push_answers_the_second_challenge_for_push_scope(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    stored: dict[str, bytes] = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             type("Handler", (_PushRegistry,), {"seen": seen, "stored": stored}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        addr = f"127.0.0.1:{server.server_address[1]}"
        _config(tmp_path / "good", monkeypatch, {"auths": {addr: {"auth": _auth(USER, PASSWORD)}}})
        blob = tmp_path / "blob"
        blob.write_bytes(os.urandom(70000))
        digest = "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest()
        ref = ImageRef.parse(f"{addr}/{REPO}:x")
        registry.push_blob(ref, digest, blob)
        assert stored == {digest: blob.read_bytes()}
        assert [s["scope"] for s in seen] == [f"repository:{REPO}:pull", f"repository:{REPO}:pull,push"]
        registry.push_blob(ref, digest, blob)  # there already: nothing sent again
        assert len(seen) == 3 and stored == {digest: blob.read_bytes()}
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- a real registry with htpasswd auth


def _bcrypt(password: str) -> str:
    try:
        import bcrypt  # paramiko's dependency
    except ImportError:
        need(False, "no bcrypt module to write the registry's htpasswd file (pip install bcrypt)")
    return str(bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _docker(*args: str, config: Path, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", *args], input=input, capture_output=True, check=False,
                          env={**os.environ, "DOCKER_CONFIG": str(config)}, timeout=120)


@pytest.fixture(scope="module")
def auth_registry(engine: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """docker-registry with htpasswd auth on a loopback port, holding a tiny image `docker push` put there
    with the credentials `docker login` wrote into a temporary DOCKER_CONFIG."""
    need(shutil.which("docker-registry") is not None, "Debian's docker-registry is not installed "
         "(apt-get install docker-registry, or scripts/setup.sh)")
    root = tmp_path_factory.mktemp("authreg")
    (root / "htpasswd").write_text(f"{USER}:{_bcrypt(PASSWORD)}\n")
    addr = f"127.0.0.1:{_free_port()}"
    (root / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: {addr}\nauth:\n  htpasswd:\n    realm: launcher-test\n    path: {root / 'htpasswd'}\n")
    with open(root / "registry.log", "wb") as log:
        server = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not registry.ping(addr) and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        need(registry.ping(addr), f"the htpasswd registry did not start: {(root / 'registry.log').read_text()[-300:]}")
        good = root / "good"
        good.mkdir()
        login = _docker("login", "-u", USER, "--password-stdin", addr, config=good, input=PASSWORD.encode())
        assert login.returncode == 0, login.stderr.decode()
        tar = io.BytesIO()
        with tarfile.open(fileobj=tar, mode="w") as tf:
            data = f"launcher registry credentials test {addr}\n".encode()
            info = tarfile.TarInfo("hello.txt")
            info.size, info.mtime = len(data), 0
            tf.addfile(info, io.BytesIO(data))
        tag = f"{addr}/{REPO}:one"
        imported = _docker("import", "-", tag, config=good, input=tar.getvalue())
        assert imported.returncode == 0, imported.stderr.decode()
        try:
            pushed = _docker("push", tag, config=good)
            assert pushed.returncode == 0, pushed.stderr.decode()
        finally:
            _docker("rmi", tag, config=good)
        digest = next(w for w in pushed.stdout.decode().split() if w.startswith("sha256:"))
        yield {"addr": addr, "tag": tag, "digest": digest, "good": good, "root": root}
    finally:
        server.terminate()
        server.wait(10)



@pytest.mark.docker
@pytest.mark.registry
def test_resolve_digest_with_the_auths_docker_login_wrote(auth_registry: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(auth_registry["good"]))
    assert registry.resolve_digest(auth_registry["tag"]) == auth_registry["digest"]
    media, body = registry.get_manifest(ImageRef.parse(auth_registry["tag"]), auth_registry["digest"])
    assert "sha256:" + hashlib.sha256(body).hexdigest() == auth_registry["digest"] and "manifest" in media


@pytest.mark.docker
@pytest.mark.registry
def test_without_credentials_one_line_login_error(auth_registry: dict[str, Any], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    addr = auth_registry["addr"]
    _config(tmp_path / "empty", monkeypatch, {})
    with pytest.raises(RegistryLoginNeeded) as exc:
        registry.resolve_digest(auth_registry["tag"])
    assert exc.value.one_line() == f"registry {addr} needs a login; fix: run `docker login {addr}`"
    init_workspace(tmp_path / "ws")
    res = CliRunner().invoke(app, ["-w", str(tmp_path / "ws"), "base", "resolve", auth_registry["tag"]])
    assert res.exit_code == ExitCode.AUTH_FAILED, res.output
    assert f"needs a login; fix: run `docker login {addr}`" in res.output and "Traceback" not in res.output


@pytest.mark.docker
@pytest.mark.registry
def test_wrong_password_is_refused_naming_where_it_came_from(auth_registry: dict[str, Any], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    addr = auth_registry["addr"]
    cfg = _config(tmp_path / "bad", monkeypatch, {"auths": {addr: {"auth": _auth(USER, "not-the-password")}}})
    with pytest.raises(RegistryAuthFailed) as exc:
        registry.resolve_digest(auth_registry["tag"])
    assert not isinstance(exc.value, RegistryLoginNeeded)
    assert exc.value.one_line() == (f"registry {addr} refused the credentials from the auths of {cfg}; "
                                    f"fix: run `docker login {addr}` again")
    assert "not-the-password" not in exc.value.one_line()


@pytest.mark.docker
@pytest.mark.registry
def test_credential_helper_serves_launcher_and_docker_alike(auth_registry: dict[str, Any], helper_on_path: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addr = auth_registry["addr"]
    cfg_dir = tmp_path / "helper"
    _config(cfg_dir, monkeypatch, {"credHelpers": {addr: HELPER}})
    with pytest.raises(RegistryLoginNeeded):  # the helper holds nothing for it yet
        registry.resolve_digest(auth_registry["tag"])
    _helper_store(helper_on_path, addr, USER, PASSWORD)
    assert registry.resolve_digest(auth_registry["tag"]) == auth_registry["digest"]
    # the same helper, as credsStore, is what `docker pull` reads too
    _config(cfg_dir, monkeypatch, {"credsStore": HELPER})
    assert registry.resolve_digest(auth_registry["tag"]) == auth_registry["digest"]
    pulled_ref = f"{addr}/{REPO}@{auth_registry['digest']}"
    pulled = _docker("pull", pulled_ref, config=cfg_dir)
    try:
        assert pulled.returncode == 0, pulled.stderr.decode()
    finally:
        _docker("rmi", pulled_ref, config=cfg_dir)


@pytest.mark.docker
@pytest.mark.registry
def test_a_base_carried_by_hand_moves_byte_for_byte_with_credentials(auth_registry: dict[str, Any], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(auth_registry["good"]))
    digest = auth_registry["digest"]
    layout = tmp_path / "layout"
    assert basearchive.export(f"{auth_registry['tag']}@{digest}", layout) > 0
    _, media, body = basearchive.check(layout)
    copy = ImageRef.parse(f"{auth_registry['addr']}/launcher-test/copy@{digest}")
    session = registry.Session(copy)
    manifest = json.loads(body)
    for desc in [manifest["config"], *manifest["layers"]]:
        registry.push_blob(copy, desc["digest"], layout / "blobs" / "sha256" / desc["digest"][7:], session=session)
    assert registry.put_manifest(copy, media, body, session=session) == digest
    assert registry.resolve_digest(f"{auth_registry['addr']}/launcher-test/copy@{digest}") == digest


def test_registry_of_a_reference_as_docker_reads_it() -> None:
    assert engine_mod.registry_of("python:3.11") == "docker.io"
    assert engine_mod.registry_of("org/img@sha256:" + "ab" * 32) == "docker.io"
    assert engine_mod.registry_of("index.docker.io/library/python") == "docker.io"
    assert engine_mod.registry_of("localhost/img") == "localhost"
    assert engine_mod.registry_of("127.0.0.1:5000/launcher-base:bookworm") == "127.0.0.1:5000"


@pytest.mark.docker
@pytest.mark.registry
def test_engine_pull_and_push_use_the_users_login_and_say_when_it_is_missing(
        auth_registry: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addr, digest = auth_registry["addr"], auth_registry["digest"]
    ref = f"{addr}/{REPO}@{digest}"
    eng = engine_mod.local()
    _config(tmp_path / "empty", monkeypatch, {})
    with pytest.raises(RegistryLoginNeeded) as none:
        eng.pull(ref)
    assert none.value.one_line() == f"registry {addr} needs a login to pull {ref}; fix: run `docker login {addr}`"
    _config(tmp_path / "bad", monkeypatch, {"auths": {addr: {"auth": _auth(USER, "not-the-password")}}})
    with pytest.raises(RegistryAuthFailed) as bad:
        eng.pull(ref)
    assert f"registry {addr} refused `docker pull {ref}`" in bad.value.message
    monkeypatch.setenv("DOCKER_CONFIG", str(auth_registry["good"]))
    try:
        assert eng.pull(ref).returncode == 0
        tag = f"{addr}/launcher-test/pushed:one"
        eng.tag(ref, tag, check=True)
        assert eng.push(tag).returncode == 0
        assert registry.resolve_digest(tag) == digest
        _config(tmp_path / "empty", monkeypatch, {})
        with pytest.raises(RegistryLoginNeeded, match=f"needs a login to push {tag}"):
            eng.push(tag)
    finally:
        eng.rmi(f"{addr}/launcher-test/pushed:one")
        eng.rmi(ref)
