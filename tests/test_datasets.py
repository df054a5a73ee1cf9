"""--data-from datasets: the digest names exactly the files, and an upload that arrives altered
leaves nothing under the dataset's name (a host that is this machine, seen as a remote one)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from launcher.errors import BadData, Corrupt, DiskFull
from launcher.hosts.base import RemoteEntry
from launcher.hosts.local import LocalHost
from launcher.transfers import datasets


def make(root: Path) -> Path:
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "a.txt").write_text("a\n")
    (root / "d" / "sub" / "b.bin").write_bytes(b"\0" * 1000)
    return root / "d"


def test_digest_follows_content_and_names_not_times(tmp_path: Path) -> None:
    d = make(tmp_path)
    first = datasets.scan(d)
    assert sorted(first.files) == ["a.txt", "sub/b.bin"] and first.bytes == 1002
    os.utime(d / "a.txt", (1, 1))
    assert datasets.scan(d).digest == first.digest
    (d / "a.txt").write_text("A\n")
    assert datasets.scan(d).digest != first.digest
    (d / "a.txt").write_text("a\n")
    (d / "a.txt").rename(d / "c.txt")
    assert datasets.scan(d).digest != first.digest


def test_scan_refuses_what_it_cannot_name(tmp_path: Path) -> None:
    with pytest.raises(BadData, match="does not exist"):
        datasets.scan(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadData, match="not a folder"):
        datasets.scan(tmp_path / "f")
    d = make(tmp_path)
    (d / "link").symlink_to(d / "a.txt")
    with pytest.raises(BadData, match="symlink"):
        datasets.scan(d)
    (d / "link").unlink()
    (d / "dirlink").symlink_to(d / "sub")
    with pytest.raises(BadData, match="symlink"):
        datasets.scan(d)
    (d / "dirlink").unlink()
    os.mkfifo(d / "fifo")
    with pytest.raises(BadData, match="not a regular file"):
        datasets.scan(d)


class SeenAsRemote(LocalHost):
    """This machine, but treated like an SSH host: its home is a temporary folder."""

    kind = "fake-remote"

    def __init__(self, home: Path, alter: bool = False, free: int | None = None) -> None:
        super().__init__(home)
        self._home, self.alter, self.free = str(home), alter, free

    def home(self) -> str:
        return self._home

    def free_bytes(self, path: str) -> int:
        return self.free if self.free is not None else super().free_bytes(path)

    def list_dir(self, remote_dir: str, *, hashes: bool = True) -> list[RemoteEntry]:
        entries = super().list_dir(remote_dir, hashes=hashes)
        if self.alter and hashes:
            entries[-1] = dataclasses.replace(entries[-1], sha256="sha256:" + "0" * 64)
        return entries


def test_place_sends_once_then_reuses(tmp_path: Path) -> None:
    d = make(tmp_path)
    host = SeenAsRemote(tmp_path / "home")
    first = datasets.place(host, d)
    assert first.sent and Path(first.path).name == first.digest[7:]
    assert (Path(first.path) / "sub" / "b.bin").read_bytes() == b"\0" * 1000
    assert datasets.place(host, d).sent is False
    (Path(first.path) / "a.txt").write_text("truncated")  # a copy altered on the host: sizes differ
    again = datasets.place(host, d)
    assert again.sent and (Path(again.path) / "a.txt").read_text() == "a\n"


def test_an_altered_arrival_leaves_nothing_under_the_name(tmp_path: Path) -> None:
    d = make(tmp_path)
    host = SeenAsRemote(tmp_path / "home", alter=True)
    with pytest.raises(Corrupt, match="altered"):
        datasets.place(host, d)
    assert os.listdir(tmp_path / "home" / ".launcher" / "data") == []


def test_a_full_host_is_refused_before_sending(tmp_path: Path) -> None:
    host = SeenAsRemote(tmp_path / "home", free=datasets.HEADROOM_BYTES)
    with pytest.raises(DiskFull, match="MiB free"):
        datasets.place(host, make(tmp_path))
    assert os.listdir(tmp_path / "home" / ".launcher" / "data") == []


def test_the_local_engine_mounts_the_folder_where_it_is(tmp_path: Path) -> None:
    d = make(tmp_path)
    placed = datasets.place(LocalHost(tmp_path), d)
    assert placed.path == str(d.resolve()) and not placed.sent and placed.files == 2


def test_an_unchanged_folder_is_hashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make(tmp_path)
    calls: list[Path] = []
    real = datasets.sha256_file

    def counting(p: Path) -> str:
        calls.append(p)
        return real(p)

    monkeypatch.setattr(datasets, "sha256_file", counting)
    first = datasets.scan(d)
    assert len(calls) == 2
    assert datasets.scan(d) is first and len(calls) == 2
    (d / "a.txt").write_text("b\n")
    assert datasets.scan(d).digest != first.digest and len(calls) == 4
