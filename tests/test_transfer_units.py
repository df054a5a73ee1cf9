"""Pull protocol, path safety and the image-archive rewriter, on local streams only."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import tarfile
from pathlib import Path

import pytest

from launcher.errors import Corrupt, ExitCode, UnsafePath
from launcher.hosts.base import RemoteEntry
from launcher.hosts.engine import chain_ids
from launcher.records.rundir import PULLED
from launcher.transfers.pull import classify, receive_files, safe_relpath
from launcher.transfers.ship import rewrite_save_stream


def frame(path: str, data: bytes, digest: str | None = None) -> bytes:
    out = (json.dumps({"path": path}) + "\n").encode()
    for i in range(0, len(data), 5):
        block = data[i : i + 5]
        out += struct.pack(">Q", len(block)) + block
    out += struct.pack(">Q", 0)
    digest = digest or "sha256:" + hashlib.sha256(data).hexdigest()
    return out + (json.dumps({"size": len(data), "sha256": digest}) + "\n").encode()


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_receive_writes_verified_files(tmp_path: Path) -> None:
    dest = tmp_path / "runs" / "r" / "outputs"
    stream = io.BytesIO(frame("model/w.bin", b"weights" * 10) + frame("log.txt", b"hello\n"))
    seen: list[tuple[str, int, str]] = []
    errors = receive_files(stream, dest, on_file=lambda *a: seen.append(a))
    assert errors == []
    assert (dest / "model" / "w.bin").read_bytes() == b"weights" * 10
    assert [s[0] for s in seen] == ["model/w.bin", "log.txt"]
    assert seen[1][2] == "sha256:" + hashlib.sha256(b"hello\n").hexdigest()
    assert files_under(tmp_path) == {"runs/r/outputs/model/w.bin", "runs/r/outputs/log.txt"}


@pytest.mark.parametrize("evil", ["../x", "../../etc/passwd", "/etc/passwd", "a/../../x", "./x", "a//b", ""])
def test_receive_refuses_paths_that_escape(tmp_path: Path, evil: str) -> None:
    dest = tmp_path / "runs" / "r" / "outputs"
    dest.mkdir(parents=True)
    with pytest.raises(UnsafePath) as err:
        receive_files(io.BytesIO(frame(evil, b"owned")), dest)
    assert err.value.exit_code == ExitCode.UNSAFE_PATH
    assert files_under(tmp_path) == set()


def test_receive_refuses_to_follow_a_local_symlinked_dir(tmp_path: Path) -> None:
    dest = tmp_path / "runs" / "r" / "outputs"
    dest.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(UnsafePath):
        receive_files(io.BytesIO(frame("sub/x", b"owned")), dest)
    assert list(outside.iterdir()) == []


def test_a_digest_mismatch_leaves_no_file(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    with pytest.raises(Corrupt):
        receive_files(io.BytesIO(frame("a.bin", b"data", digest="sha256:" + "0" * 64)), dest)
    assert files_under(tmp_path) == set()


def test_a_cut_stream_leaves_no_partial_file(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    with pytest.raises(EOFError):
        receive_files(io.BytesIO(frame("a.bin", b"0123456789")[:-30]), dest)
    assert files_under(tmp_path) == set()


def test_classify_refuses_symlinks_specials_and_escapes() -> None:
    entries = [
        RemoteEntry("ok.txt", "file", 3),
        RemoteEntry("d", "dir"),
        RemoteEntry("passwd", "symlink", target="/etc/passwd"),
        RemoteEntry("fifo", "other"),
        RemoteEntry("../x", "file", 1),
    ]
    files, refused = classify(entries)
    assert [f.path for f in files] == ["ok.txt"]
    assert refused == [
        "passwd (a symlink to /etc/passwd)",
        "fifo (not a regular file)",
        "../x (escapes the run directory)",
    ]


def test_the_runtimes_links_to_the_code_and_data_are_not_outputs_and_other_links_still_refused() -> None:
    # launcher.runtime.workdir shows the script's folder and the data in the working directory as links
    entries = [
        RemoteEntry("traindata.pt", "symlink", target="/launcher/data/traindata.pt"),
        RemoteEntry("data", "symlink", target="/launcher/code/data"),
        RemoteEntry("model.pt", "file", 4),
        RemoteEntry("sub/sneaky", "symlink", target="/launcher/code/train.py"),  # only top-level entries are views
        RemoteEntry("escape", "symlink", target="/launcher/code/../../etc/passwd"),
        RemoteEntry("codebase", "symlink", target="/launcher/codebase/x"),
    ]
    files, refused = classify(entries)
    assert [f.path for f in files] == ["model.pt"]
    assert refused == ["sub/sneaky (a symlink to /launcher/code/train.py)",
                       "escape (a symlink to /launcher/code/../../etc/passwd)",
                       "codebase (a symlink to /launcher/codebase/x)"]


def test_safe_relpath_accepts_plain_nested_paths() -> None:
    assert safe_relpath("model/canonical.npz").parts == ("model", "canonical.npz")


def test_chain_ids_follow_docker() -> None:
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    assert chain_ids([a, b]) == [a, "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()]


def _save_archive(layers: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d, content in layers.items():
            info = tarfile.TarInfo(f"{d}/layer.tar")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        manifest = json.dumps([{"Layers": [f"{d}/layer.tar" for d in layers]}]).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    return buf.getvalue()


def test_rewriter_empties_only_the_layers_the_host_has() -> None:
    src = io.BytesIO(_save_archive({"aaa": b"x" * 5000, "bbb": b"y" * 7000}))
    dst = io.BytesIO()
    manifest = rewrite_save_stream(src, dst, lambda d: d == "aaa")
    assert manifest == {"Layers": ["aaa/layer.tar", "bbb/layer.tar"]}
    dst.seek(0)
    with tarfile.open(fileobj=dst) as tar:
        sizes = {m.name: m.size for m in tar.getmembers()}
        assert tar.extractfile("bbb/layer.tar").read() == b"y" * 7000  # type: ignore[union-attr]
    assert sizes["aaa/layer.tar"] == 0 and sizes["bbb/layer.tar"] == 7000


def test_pull_state_is_the_state_file_plus_its_journal_and_a_torn_line_is_ignored(tmp_path: Path) -> None:
    from launcher.transfers.pull import JOURNAL_SUFFIX, read_state
    STATE_FILE = PULLED

    state = tmp_path / STATE_FILE
    state.write_text(json.dumps({"a": {"size": 1, "sha256": "sha256:aa", "mtime_ns": 1}}))
    journal = tmp_path / (STATE_FILE + JOURNAL_SUFFIX)
    journal.write_text('{"path":"b","size":2,"sha256":"sha256:bb","mtime_ns":2}\n'
                       '{"path":"a","size":3,"sha256":"sha256:a3","mtime_ns":3}\n'
                       '{"path":"c","size":4,"sha2')  # a pull cut while writing its last line
    assert read_state(state) == {"a": {"size": 3, "sha256": "sha256:a3", "mtime_ns": 3},
                                 "b": {"size": 2, "sha256": "sha256:bb", "mtime_ns": 2}}
    state.write_text("not json")
    assert set(read_state(state)) == {"a", "b"}
    journal.unlink()
    assert read_state(state) == {}


def test_a_pull_of_many_files_writes_its_state_once_and_a_cut_one_resumes_from_its_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recording a verified file is one appended line, not a rewrite of the state (which made a pull of
    20,000 small files quadratic); the state file is written once, when the pull ends."""
    from launcher.hosts.local import LocalHost
    from launcher.transfers import pull

    src = tmp_path / "src"
    for i in range(300):
        (src / f"d{i // 100}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i // 100}" / f"f{i}.txt").write_text(f"sample {i}\n")
    writes: list[Path] = []
    real = pull.atomic_write_json
    monkeypatch.setattr(pull, "atomic_write_json", lambda p, d: (writes.append(p), real(p, d)))
    host = LocalHost(workspace_root=tmp_path)
    dest = tmp_path / "run" / "outputs"
    res = pull.pull_outputs(host, str(src), dest)
    assert len(res.transferred) == 300 and writes == [tmp_path / "run" / PULLED]
    assert not (tmp_path / "run" / (PULLED + pull.JOURNAL_SUFFIX)).exists()
    # a pull cut after some files: its journal holds them, and the next pull skips them
    (tmp_path / "run" / PULLED).unlink()
    journal = tmp_path / "run" / (PULLED + pull.JOURNAL_SUFFIX)
    state = pull.read_state(tmp_path / "run" / PULLED)
    assert state == {}
    entries = {e.path: e for e in host.list_dir(str(src), hashes=False)}
    with open(journal, "w") as f:
        for rel in sorted(res.files)[:120]:
            f.write(json.dumps({"path": rel, **res.files[rel], "mtime_ns": entries[rel].mtime_ns}) + "\n")
    again = pull.pull_outputs(host, str(src), dest)
    assert len(again.skipped) == 120 and len(again.transferred) == 180
