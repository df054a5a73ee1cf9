"""Which transport ships an image: the table in transfers/ship.py, tried in order, the first that fits
(no engine: the host's engine is a stand-in that says which layers it has)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from launcher.hosts.local import LocalHost
from launcher.progress import NullReporter
from launcher.transfers import ship, shipstaged
from launcher.transfers.ship import Shipment, choose_transport

DIFFS = ["sha256:" + "1" * 64, "sha256:" + "2" * 64]
BIG = 200 << 20


class Has:
    """The host's engine, as far as choosing goes: the chain IDs of the layers it has."""

    def __init__(self, chains: set[str]) -> None:
        self.chains = chains

    def chain_ids(self) -> set[str]:
        return self.chains


class Remote(LocalHost):
    kind = "ssh"


def shipment(tmp_path: Path, *, host: LocalHost | None = None, has: set[str] | None = None,
             cache: Path | None = None, via: str | None = None, size: int = BIG,
             image_id: str = "sha256:" + "a" * 64) -> Shipment:
    info = {"Id": image_id, "Size": size, "RootFS": {"Layers": DIFFS}}
    return Shipment(host or Remote(tmp_path), Has(has or set()), info, NullReporter(), cache, via)  # type: ignore[arg-type]


def cache_with_image(cache: Path, layer_files: list[int]) -> str:
    """A build layer cache holding an image's config and the layers at those indexes; its image ID."""
    cfg = json.dumps({"rootfs": {"type": "layers", "diff_ids": DIFFS}}).encode()
    image_id = "sha256:" + hashlib.sha256(cfg).hexdigest()
    (cache / "images" / "configs").mkdir(parents=True)
    (cache / "images" / "configs" / f"{image_id[7:]}.json").write_bytes(cfg)
    (cache / "images" / "layers").mkdir()
    for i in layer_files:
        (cache / "images" / "layers" / f"{DIFFS[i][7:]}.tar").write_bytes(b"layer")
    return image_id


def test_the_table_names_each_transport_once_and_ends_with_one_that_always_fits() -> None:
    names = [t.name for t in ship.TRANSPORTS]
    assert names == ["registry", "compressed", "cache", "stream"]
    assert ship.TRANSPORTS[-1].fits(None)  # type: ignore[arg-type]


def test_a_registry_given_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shipstaged.COMPRESS_ENV, "always")
    assert choose_transport(shipment(tmp_path, via="127.0.0.1:5000", cache=tmp_path)).name == "registry"


def test_compression_needs_a_cache_a_remote_host_a_big_ship_and_a_slow_link_or_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shipstaged.COMPRESS_ENV, "always")
    assert choose_transport(shipment(tmp_path, cache=tmp_path)).name == "compressed"
    assert choose_transport(shipment(tmp_path)).name == "stream"  # no cache to keep blobs in
    assert choose_transport(shipment(tmp_path, cache=tmp_path, host=LocalHost(tmp_path))).name == "stream"
    assert choose_transport(shipment(tmp_path, cache=tmp_path, size=1 << 20)).name == "stream"
    # the host has one layer of two: about half the image is needed, still big
    assert choose_transport(shipment(tmp_path, cache=tmp_path, has={DIFFS[0]})).name == "compressed"
    monkeypatch.setenv(shipstaged.COMPRESS_ENV, "never")
    assert choose_transport(shipment(tmp_path, cache=tmp_path)).name == "stream"


def test_the_build_cache_serves_when_it_holds_every_layer_the_host_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shipstaged.COMPRESS_ENV, "never")
    cache = tmp_path / "cache"
    image_id = cache_with_image(cache, [1])  # the base layer is not in the cache
    base_chain = DIFFS[0]  # a first layer's chain ID is its diff ID
    assert choose_transport(shipment(tmp_path, cache=cache, image_id=image_id, has={base_chain})).name == "cache"
    assert choose_transport(shipment(tmp_path, cache=cache, image_id=image_id)).name == "stream"
