"""Shipping images and pulling outputs over SSH to the real test host."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testhost import TestHost

from launcher.hosts import engine
from launcher.hosts.engine import Engine
from launcher.hosts.ssh import SSHHost
from launcher.transfers import pull, ship

pytestmark = pytest.mark.testhost


@pytest.fixture
def remote(testhost: TestHost) -> Iterator[SSHHost]:
    with SSHHost.connect(
        testhost.spec, identity=testhost.key, known_hosts=testhost.known_hosts, ssh_config=Path("/dev/null")
    ) as h:
        yield h


def build_on_top(base: str, ctx: Path, payload: bytes) -> str:
    ctx.mkdir(parents=True, exist_ok=True)
    (ctx / "payload.bin").write_bytes(payload)
    (ctx / "Dockerfile").write_text(f"FROM {base}\nCOPY payload.bin /payload.bin\n")
    tag = f"launcher-test/ship:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True)
    return tag


def test_ship_skips_present_images_and_sends_only_missing_layers(
    remote: SSHHost, testhost: TestHost, tiny_image: dict[str, Any], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = build_on_top(tiny_image["tag"], tmp_path / "a", uuid.uuid4().bytes * 1000)
    second = build_on_top(tiny_image["tag"], tmp_path / "b", uuid.uuid4().bytes * 1000)
    try:
        one = ship.ship_image(remote, first, cache_dir=cache)
        assert not one.skipped and one.layers_sent >= 1
        assert Engine(remote).has_image(one.image_id)

        again = ship.ship_image(remote, first, cache_dir=cache)
        assert again.skipped and again.bytes_sent == 0

        # the rebuilt image differs in its top layer only: that layer alone travels
        two = ship.ship_image(remote, second, tag="launcher-test/shipped:two", cache_dir=cache)
        n_layers = len(engine.local().inspect_image(second)["RootFS"]["Layers"])
        assert (two.layers_sent, two.layers_skipped) == (1, n_layers - 1)
        assert two.bytes_sent < 64 * 1024
        out = testhost.exec("docker", "run", "--rm", "launcher-test/shipped:two", "sha256sum", "/payload.bin")
        assert out.split()[0] == hashlib.sha256((tmp_path / "b" / "payload.bin").read_bytes()).hexdigest()
    finally:
        subprocess.run(["docker", "rmi", "-f", first, second], capture_output=True, check=False)


def test_three_ships_at_once_send_the_image_once(testhost: TestHost, tiny_image: dict[str, Any],
                                                  tmp_path: Path) -> None:
    """Runs started together to a fresh host: the first ship sends, the others wait for it and skip."""
    import threading

    image = build_on_top(tiny_image["tag"], tmp_path / "c", uuid.uuid4().bytes * 4000)
    results: list[ship.ShipResult] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with SSHHost.connect(testhost.spec, identity=testhost.key, known_hosts=testhost.known_hosts,
                                 ssh_config=Path("/dev/null")) as h:
                results.append(ship.ship_image(h, image, cache_dir=tmp_path / f"cache-{threading.get_ident()}"))
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=one) for _ in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        assert sorted(r.skipped for r in results) == [False, True, True]
        assert sum(r.bytes_sent for r in results) == next(r.bytes_sent for r in results if not r.skipped) > 64000
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True, check=False)


def make_remote_tree(testhost: TestHost, root: str) -> None:
    testhost.exec(
        "sh",
        "-c",
        f"rm -rf {root} && mkdir -p {root}/model/deep {root}/logs && "
        f"head -c 20000000 /dev/urandom > {root}/model/big.bin && "
        f"echo hello > {root}/logs/train.log && : > {root}/empty && "
        f"printf 'x' > '{root}/model/deep/odd name $(x).txt'",
    )


def host_sha256(testhost: TestHost, root: str) -> dict[str, str]:
    out = testhost.exec("sh", "-c", f"cd {root} && find . -type f -print0 | xargs -0 sha256sum")
    return {line[66:].removeprefix("./"): "sha256:" + line[:64] for line in out.splitlines()}


def test_pull_verifies_against_the_hosts_hashes_and_resumes(
    remote: SSHHost, testhost: TestHost, tmp_path: Path
) -> None:
    root = f"/tmp/pull-{uuid.uuid4().hex[:6]}"
    make_remote_tree(testhost, root)
    dest = tmp_path / "runs" / "r" / "outputs"
    first = pull.pull_outputs(remote, root, dest)
    expected = host_sha256(testhost, root)
    assert {k: v["sha256"] for k, v in first.files.items()} == expected
    assert sorted(first.transferred) == sorted(expected) and first.refused == []
    for rel, digest in expected.items():
        assert "sha256:" + hashlib.sha256((dest / rel).read_bytes()).hexdigest() == digest
    assert not list(dest.rglob("*.partial"))

    again = pull.pull_outputs(remote, root, dest)
    assert again.transferred == [] and sorted(again.skipped) == sorted(expected)

    (dest / "logs" / "train.log").write_text("tampered\n")
    testhost.exec("sh", "-c", f"echo more >> {root}/model/big.bin")
    third = pull.pull_outputs(remote, root, dest)
    assert sorted(third.transferred) == ["logs/train.log", "model/big.bin"]
    assert third.files == {k: {"size": v["size"], "sha256": v["sha256"]} for k, v in third.files.items()}
    assert {k: v["sha256"] for k, v in third.files.items()} == host_sha256(testhost, root)


def test_pull_refuses_symlinks_and_escapes(remote: SSHHost, testhost: TestHost, tmp_path: Path) -> None:
    root = f"/tmp/evil-{uuid.uuid4().hex[:6]}"
    testhost.exec(
        "sh",
        "-c",
        f"mkdir -p {root}/sub && echo ok > {root}/ok.txt && "
        f"ln -s /etc/passwd {root}/passwd && ln -s / {root}/sub/up && mkfifo {root}/fifo",
    )
    dest = tmp_path / "runs" / "r" / "outputs"
    result = pull.pull_outputs(remote, root, dest)
    assert sorted(result.files) == ["ok.txt"]
    assert sorted(r.split(" ")[0] for r in result.refused) == ["fifo", "passwd", "sub/up"]
    every = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert every == ["runs", "runs/r", "runs/r/.pulled.json", "runs/r/outputs", "runs/r/outputs/ok.txt"]

    # asked directly for an escaping or linked path, the script on the host refuses to send it
    p = remote.start([remote.python, "-c", pull.PULL_SCRIPT, root], bulk=True)
    p.stdin.write(json.dumps(["../../etc/passwd", "passwd", "sub/up/etc/passwd", "/etc/passwd"]).encode())
    p.stdin.close()
    records = [json.loads(line) for line in p.stdout.read().splitlines()]
    assert p.wait() == 0
    assert [r["path"] for r in records] == ["../../etc/passwd", "passwd", "sub/up/etc/passwd", "/etc/passwd"]
    assert all("error" in r for r in records)


def test_ship_through_a_registry_tunnel_sends_only_new_layers(
    remote: SSHHost, testhost: TestHost, tiny_image: dict[str, Any], tmp_path: Path
) -> None:
    import os
    import signal
    import socket

    from launcher.images import registry

    if shutil.which("docker-registry") is None:
        pytest.skip("Debian's docker-registry is not installed (apt-get install docker-registry)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    started = registry.start_local_registry(tmp_path / "registry", address)
    first = build_on_top(tiny_image["tag"], tmp_path / "a", uuid.uuid4().bytes * 1000)
    second = build_on_top(tiny_image["tag"], tmp_path / "b", uuid.uuid4().bytes * 1000)
    try:
        one = ship.ship_image(remote, first, via=address)
        assert not one.skipped and Engine(remote).has_image(one.image_id)
        two = ship.ship_image(remote, second, via=address, tag="launcher-test/reg:two")
        n_layers = len(engine.local().inspect_image(second)["RootFS"]["Layers"])
        assert (two.layers_sent, two.layers_skipped) == (1, n_layers - 1)
        out = testhost.exec("docker", "run", "--rm", "launcher-test/reg:two", "sha256sum", "/payload.bin")
        assert out.split()[0] == hashlib.sha256((tmp_path / "b" / "payload.bin").read_bytes()).hexdigest()
        assert ship.ship_image(remote, second, via=address).skipped
    finally:
        os.kill(int(started["pid"]), signal.SIGTERM)  # type: ignore[call-overload]
        subprocess.run(["docker", "rmi", "-f", first, second], capture_output=True, check=False)
        pushed = subprocess.run(
            [
                "docker",
                "image",
                "ls",
                "--format",
                "{{.Repository}}:{{.Tag}}",
                f"{address}/{ship.SHIP_REPO}",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if pushed:
            subprocess.run(["docker", "rmi", *pushed], capture_output=True, check=False)


def test_pull_and_ship_work_without_the_openssh_client(
    testhost: TestHost, tiny_image: dict[str, Any], tmp_path: Path
) -> None:
    root = f"/tmp/pull-{uuid.uuid4().hex[:6]}"
    make_remote_tree(testhost, root)
    with SSHHost.connect(
        testhost.spec,
        identity=testhost.key,
        known_hosts=testhost.known_hosts,
        ssh_config=Path("/dev/null"),
        use_openssh=False,
    ) as h:
        assert h.use_openssh is False
        result = pull.pull_outputs(h, root, tmp_path / "runs" / "r" / "outputs")
        assert {k: v["sha256"] for k, v in result.files.items()} == host_sha256(testhost, root)
        image = build_on_top(tiny_image["tag"], tmp_path / "img", uuid.uuid4().bytes * 100)
        try:
            shipped = ship.ship_image(h, image, cache_dir=tmp_path / "cache")
            assert not shipped.skipped and Engine(h).has_image(shipped.image_id)
        finally:
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True, check=False)
