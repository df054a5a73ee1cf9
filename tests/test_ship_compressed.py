"""Shipping over slow links: the layers a host lacks go as gzip blobs made once and kept by content,
into a staging folder on the host that a cut ship resumes from (the SSH test host, for real)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from testhost import TestHost

from launcher.errors import Corrupt, TransferCut
from launcher.hosts.ssh import SSHHost
from launcher.images import blobs
from launcher.progress import NullReporter, Task
from launcher.transfers import ship, shipstaged

pytestmark = [pytest.mark.testhost, pytest.mark.docker]
STAGE = "/root/.launcher/ship"


@pytest.fixture(scope="module")
def big_image(tmp_path_factory: pytest.TempPathFactory, base_ref: str) -> Iterator[tuple[str, int]]:
    """An image of its own (on the bootstrapped Debian base) with a compressible 90 MB layer no other test
    image shares (so the test host lacks it), and the image's size uncompressed."""
    ctx = tmp_path_factory.mktemp("bigimage")
    mark = uuid.uuid4().hex
    (ctx / "Dockerfile").write_text(f"FROM {base_ref}\nRUN seq 1 12000000 > /big.txt && echo {mark} >> /big.txt\n")
    tag = f"launcher-test-compress:{mark[:12]}"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True)
    image_id = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], check=True,
                              capture_output=True, text=True).stdout.strip()
    try:
        size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", tag], check=True,
                              capture_output=True, text=True).stdout.strip()
        yield image_id, int(size)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


@pytest.fixture
def remote(testhost: TestHost, big_image: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> Iterator[SSHHost]:
    monkeypatch.setenv(shipstaged.COMPRESS_ENV, "always")
    testhost.exec("sh", "-c", f"docker rmi -f {big_image[0]} >/dev/null 2>&1; rm -rf {STAGE}; true")
    with SSHHost.connect(testhost.spec, identity=testhost.key, known_hosts=testhost.known_hosts,
                         ssh_config=Path("/dev/null")) as h:
        yield h
    testhost.exec("sh", "-c", f"docker rmi -f {big_image[0]} >/dev/null 2>&1; rm -rf {STAGE}; true")


class _SlowLink(NullReporter):
    """A link that slows to 20 MiB/s once 2 MiB have gone: the cut below then lands mid-layer on any machine
    (over loopback SSH a fast one sends the whole layer before a watcher polling the host sees 2 MiB)."""

    def task(self, description: str, total: float | None = None, unit: str = "") -> Task:
        return _Paced() if description.startswith("ship image") else super().task(description, total, unit)


class _Paced:
    def __init__(self) -> None:
        self.done = 0.0

    def advance(self, amount: float = 1) -> None:
        self.done += amount
        if self.done > 2 << 20:
            time.sleep(0.05 * amount / (1 << 20))

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_compressed_ship_sends_the_missing_layer_as_a_blob_made_once(
    remote: SSHHost, testhost: TestHost, big_image: tuple[str, int], tmp_path: Path
) -> None:
    image_id, raw = big_image
    cache = tmp_path / "cache"
    result = ship.ship_image(remote, image_id, cache_dir=cache)
    assert not result.skipped and result.layers_sent in (1, 2)  # (the base layer, unless the host has it)
    assert 0 < result.bytes_sent < raw * 0.5, result  # Debian's files and seq's digits compress well
    assert testhost.exec("docker", "image", "inspect", "-f", "{{.Id}}", image_id).strip() == image_id
    assert testhost.exec("sh", "-c", f"ls -A {STAGE}").strip() == ""  # the staging folder went
    made = sorted((cache / "blobs").glob("*.tar.gz"))
    # a blob for each layer sent (and perhaps for the base too: `docker save` streams every layer, and one is
    # compressed before its digest says whether the host lacks it)
    assert len(made) in (result.layers_sent, 2), made
    stamp = [p.stat().st_mtime_ns for p in made]
    testhost.exec("docker", "rmi", "-f", image_id)
    again = ship.ship_image(remote, image_id, cache_dir=cache)
    assert again.bytes_sent == result.bytes_sent
    assert [p.stat().st_mtime_ns for p in made] == stamp  # the same blobs, not made again


def test_a_cut_ship_resumes_from_what_arrived_and_a_damaged_part_is_refused(
    remote: SSHHost, testhost: TestHost, big_image: tuple[str, int], tmp_path: Path
) -> None:
    image_id, _ = big_image
    cache = tmp_path / "cache"
    diff_ids = [str(d) for d in __import__("launcher.hosts.engine", fromlist=["x"]).local()
                .inspect_image(image_id)["RootFS"]["Layers"]]
    blobs.ensure(image_id, diff_ids, [], list(range(len(diff_ids))), cache)  # made beforehand, as a build would
    sizes = [b.size for b in (blobs.cached(cache, d) for d in diff_ids) if b is not None]
    assert len(sizes) == len(diff_ids)
    # a watcher inside the host cuts the receiving end once 2 MB of the layer have arrived
    stage = f"{STAGE}/{image_id.removeprefix('sha256:')[:32]}"
    watch = (f"while :; do n=$(cat {stage}/*.part 2>/dev/null | wc -c); [ \"$n\" -gt 2097152 ] && break; "
             "sleep 0.005; done; pkill -f 'cat > '")
    watcher = subprocess.Popen(["docker", "exec", testhost.container, "sh", "-c", watch])
    try:
        with pytest.raises(TransferCut) as cut:
            ship.ship_image(remote, image_id, cache_dir=cache, reporter=_SlowLink())
    finally:
        watcher.kill()
    assert cut.value.hint and "run again: the ship resumes from what arrived" in cut.value.hint
    arrived = int(testhost.exec("sh", "-c", f"cat {stage}/* | wc -c").strip())  # whole layers and the cut one
    resumed = ship.ship_image(remote, image_id, cache_dir=cache)
    total = sum(sizes[len(sizes) - resumed.layers_sent:])  # the blobs of the layers the host lacked
    assert 0 < arrived < total
    assert resumed.bytes_sent == total - arrived  # only the rest travelled
    assert testhost.exec("docker", "image", "inspect", "-f", "{{.Id}}", image_id).strip() == image_id

    # a part whose bytes were damaged on the host is caught by its hash, removed, and sent whole next time
    testhost.exec("docker", "rmi", "-f", image_id)
    name = f"{len(diff_ids) - 1:03d}.tar.gz.part"
    testhost.exec("sh", "-c", f"mkdir -p {stage} && head -c 1000 /dev/zero > {stage}/{name}")
    with pytest.raises(Corrupt, match=r"arrived on .* with SHA-256"):
        ship.ship_image(remote, image_id, cache_dir=cache)
    assert name not in testhost.exec("sh", "-c", f"ls {stage}").split()
    whole = ship.ship_image(remote, image_id, cache_dir=cache)
    assert whole.bytes_sent == sizes[-1]  # that layer whole; any layer before it had arrived whole already
