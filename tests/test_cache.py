"""`launcher cache`: pruning keeps what the engine still has and what a build may be writing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher import cache
from launcher.hosts import dockerapi
from launcher.images import build
from launcher.workspace import Workspace


def _image(root: Path, layers: dict[str, bytes]) -> str:
    """A cached image as the layer cache holds it: config by ID, layers by diff ID."""
    (root / "images" / "layers").mkdir(parents=True, exist_ok=True)
    (root / "images" / "configs").mkdir(parents=True, exist_ok=True)
    diffs = []
    for data in layers.values():
        d = hashlib.sha256(data).hexdigest()
        (root / "images" / "layers" / f"{d}.tar").write_bytes(data)
        diffs.append("sha256:" + d)
    cfg = json.dumps({"rootfs": {"type": "layers", "diff_ids": diffs}}).encode()
    image_id = hashlib.sha256(cfg).hexdigest()
    (root / "images" / "configs" / f"{image_id}.json").write_bytes(cfg)
    return "sha256:" + image_id


def _age(path: Path, seconds: float) -> None:
    t = path.stat().st_mtime - seconds
    os.utime(path, (t, t))


def test_prune_drops_dead_images_keeps_shared_and_young_layers(tmp_path: Path) -> None:
    live = _image(tmp_path, {"base": b"shared layer", "top": b"live top"})
    dead = _image(tmp_path, {"base": b"shared layer", "top": b"dead top"})
    layers = tmp_path / "images" / "layers"
    young_orphan = layers / ("ab" * 32 + ".tar")
    young_orphan.write_bytes(b"a build writing beside the prune")
    old_orphan = layers / ("cd" * 32 + ".tar")
    old_orphan.write_bytes(b"an interrupted write")
    _age(old_orphan, 2 * cache.ORPHAN_AGE_S)
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "k1.json").write_text(json.dumps({"image_id": dead}))
    (tmp_path / "builds" / "k1.tree.json.gz").write_bytes(b"tree")
    (tmp_path / "builds" / "k2.json").write_text(json.dumps({"image_id": live}))

    dry = cache.prune(tmp_path, engine_has={live}.__contains__, dry_run=True)
    assert dry.removed and all(r.path.exists() for r in dry.removed)

    done = cache.prune(tmp_path, engine_has={live}.__contains__)
    gone = {r.path for r in done.removed}
    assert done.kept_images == [live]
    assert tmp_path / "images" / "configs" / f"{dead[7:]}.json" in gone
    assert layers / f"{hashlib.sha256(b'dead top').hexdigest()}.tar" in gone
    assert (layers / f"{hashlib.sha256(b'shared layer').hexdigest()}.tar").is_file()
    assert (layers / f"{hashlib.sha256(b'live top').hexdigest()}.tar").is_file()
    assert young_orphan.is_file() and not old_orphan.exists()
    assert not (tmp_path / "builds" / "k1.json").exists()
    assert not (tmp_path / "builds" / "k1.tree.json.gz").exists()
    assert (tmp_path / "builds" / "k2.json").is_file()
    assert done.bytes == sum(r.bytes for r in done.removed) > 0
    assert cache.prune(tmp_path, engine_has={live}.__contains__).removed == []


def test_prune_wheels_only_when_asked_and_only_unlocked(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-1-py3-none-any.whl").write_bytes(b"locked")
    (wheels / "b-1-py3-none-any.whl").write_bytes(b"not locked")
    lockfile = tmp_path / "cpu.txt"
    lockfile.write_text(f"a==1 \\\n    --hash=sha256:{hashlib.sha256(b'locked').hexdigest()}\n")
    assert cache.prune(tmp_path, engine_has=lambda _: True).removed == []
    done = cache.prune(tmp_path, engine_has=lambda _: True, wheels_allowed=cache.locked_hashes([lockfile]))
    assert [r.path.name for r in done.removed] == ["b-1-py3-none-any.whl"]
    assert (wheels / "a-1-py3-none-any.whl").is_file()


def test_usage_counts_every_area_and_unknown_ones(tmp_path: Path) -> None:
    _image(tmp_path, {"x": b"12345"})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "f").write_bytes(b"abc")
    areas = {a.name: a for a in cache.usage(tmp_path)}
    assert set(cache.AREAS) <= set(areas) and "other" in areas
    assert areas["images"].files == 2 and areas["other"].bytes == 3
    assert areas["wheels"].files == 0


def test_usage_counts_no_file_through_a_link_and_passes_over_what_it_cannot_read(tmp_path: Path) -> None:
    """A root filesystem being bootstrapped in the cache (a test host's) holds links into /proc: /proc/1/cwd
    cannot be stat'ed even by root here, and a link may point at a big file or folder outside the cache."""
    cache_dir, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * 4096)
    rootfs = cache_dir / "testhost" / "rootfs-1" / "root"
    rootfs.mkdir(parents=True)
    (rootfs / "real").write_bytes(b"abc")
    (rootfs / "cwd").symlink_to("/proc/1/cwd")
    (rootfs / "big").symlink_to(outside / "big")
    (rootfs / "folder").symlink_to(outside)
    os.mkfifo(rootfs / "fifo")
    areas = {a.name: a for a in cache.usage(cache_dir)}
    assert (areas["testhost"].files, areas["testhost"].bytes) == (1, 3)
    done = _cli(cache_dir, "--json", "cache", "ls")
    assert done.returncode == 0, done.stdout + done.stderr


def _cli(cache_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LAUNCHER_CACHE": str(cache_dir)}
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


@pytest.mark.docker
def test_prune_for_real_after_the_engine_drops_a_build(
    make_workspace: Callable[..., Workspace], six_lock: Callable[[Workspace], Workspace], tmp_path: Path
) -> None:
    ws = six_lock(Workspace.at(make_workspace(tmp_path / "ws", recipes=False).root, tmp_path / "cache"))
    (ws.recipes / "hello").mkdir()
    (ws.recipes / "hello" / "train.py").write_text("print('cache prune')\n")
    rec = build.build(ws, "cpu")
    cached = cache.usage(ws.cache_dir)
    assert next(a for a in cached if a.name == "images").files >= 2

    kept = _cli(ws.cache_dir, "--json", "cache", "prune")
    assert kept.returncode == 0, kept.stderr
    data = json.loads(kept.stdout)["data"]
    assert data["removed_files"] == 0 and rec.image_id in data["kept_images"]

    subprocess.run(["docker", "rmi", "-f", rec.image_id], check=True, capture_output=True)
    assert not dockerapi.image_exists(rec.image_id)
    dropped = _cli(ws.cache_dir, "--workspace", str(ws.root), "cache", "prune", "--wheels")
    assert dropped.returncode == 0, dropped.stderr
    assert "removed" in dropped.stdout and "the Docker engine no longer has" in dropped.stdout
    assert not (ws.cache_dir / "images" / "configs" / f"{rec.image_id[7:]}.json").exists()
    # the environment image under it is still in the engine: its record stays, the image's goes
    assert [p.name[:4] for p in (ws.cache_dir / "builds").glob("*.json")] == ["env-"]
    locked = cache.locked_hashes([ws.lock_txt("cpu")])
    left = [w for w in (ws.cache_dir / "wheels").iterdir() if w.is_file()]
    assert left and all(hashlib.sha256(w.read_bytes()).hexdigest() in locked for w in left)

    again = build.build(ws, "cpu")  # what prune removed is made again
    assert again.image_id == rec.image_id and not again.noop
    assert (ws.cache_dir / "images" / "configs" / f"{rec.image_id[7:]}.json").is_file()


def test_prune_without_an_engine_is_one_line(tmp_path: Path) -> None:
    env_host = "unix:///nonexistent/docker.sock"
    p = subprocess.run([sys.executable, "-m", "launcher", "cache", "prune"], capture_output=True, text=True,
                       env={**os.environ, "LAUNCHER_CACHE": str(tmp_path), "DOCKER_HOST": env_host},
                       timeout=120, check=False)
    assert p.returncode == 9, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_prune_keeps_the_blobs_of_layers_an_image_the_engine_has_uses(tmp_path: Path) -> None:
    live = _image(tmp_path, {"base": b"shared layer", "top": b"live top"})
    blobs_dir = tmp_path / "blobs"
    (blobs_dir / "configs").mkdir(parents=True)
    saved_cfg = json.dumps({"rootfs": {"type": "layers", "diff_ids": ["sha256:" + "ee" * 32]}}).encode()
    saved = "sha256:" + hashlib.sha256(saved_cfg).hexdigest()  # an image shipped from `docker save`
    (blobs_dir / "configs" / f"{saved[7:]}.json").write_bytes(saved_cfg)
    names = {"kept": hashlib.sha256(b"live top").hexdigest(), "saved": "ee" * 32, "dead": "ff" * 32}
    for name, diff in names.items():
        (blobs_dir / f"{diff}.tar.gz").write_bytes(name.encode())
        (blobs_dir / f"{diff}.tar.gz.sha256").write_text("0" * 64)
        _age(blobs_dir / f"{diff}.tar.gz", 2 * cache.ORPHAN_AGE_S)
    assert "blobs" in {a.name for a in cache.usage(tmp_path)}
    done = cache.prune(tmp_path, engine_has={live, saved}.__contains__)
    assert {r.path.name for r in done.removed} == {f"{names['dead']}.tar.gz", f"{names['dead']}.tar.gz.sha256"}
    done = cache.prune(tmp_path, engine_has={live}.__contains__)  # the engine dropped the saved image
    assert {r.path.name for r in done.removed} == {f"{saved[7:]}.json", f"{names['saved']}.tar.gz",
                                                   f"{names['saved']}.tar.gz.sha256"}
    assert (blobs_dir / f"{names['kept']}.tar.gz").is_file()
