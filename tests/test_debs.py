""".deb files without the archive: fetched from a local HTTP server on loopback into the cache and
verified (a tampered download or cached file is Corrupt, exit 13, and nothing is left looking complete),
reused offline, and unpacked by launcher's own ar + tar reader (merged-/usr links followed, links and
modes kept, entries that would escape refused, maintainer scripts listed, never run)."""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.errors import BuildFailed, Corrupt, ExitCode, HostUnreachable, NotFound, UnsafePath
from launcher.images import aptlock, debs
from launcher.images.aptplan import DebPackage

LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}


def _tar(entries: list[tuple[str, str, bytes | str, int]], mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:  # type: ignore[call-overload]
        for name, kind, content, perm in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uname, info.gname = perm, 1_700_000_000, "root", "root"
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(content)
                tar.addfile(info)
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, str(content)
                tar.addfile(info)
            else:
                data = content if isinstance(content, bytes) else content.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_deb(package: str, data: list[tuple[str, str, bytes | str, int]], scripts: tuple[str, ...] = ()) -> bytes:
    """A real .deb: ar of debian-binary, control.tar.gz and data.tar.xz, as dpkg-deb writes them."""
    control = [("./control", "file", f"Package: {package}\nVersion: 1.0-1\nArchitecture: amd64\n", 0o644)]
    control += [(f"./{s}", "file", "#!/bin/sh\nexit 1\n", 0o755) for s in scripts]
    members = [("debian-binary", b"2.0\n"), ("control.tar.gz", _tar(control, "w:gz")),
               ("data.tar.xz", _tar(data, "w:xz"))]
    out = b"!<arch>\n"
    for name, blob in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(blob):<10}`\n".encode() + blob
        out += b"\n" if len(blob) % 2 else b""
    return out


TOOL = make_deb("tool", [
    ("./", "dir", b"", 0o755), ("./usr/", "dir", b"", 0o755), ("./usr/bin/", "dir", b"", 0o755),
    ("./usr/bin/tool", "file", "#!/bin/sh\necho tool\n", 0o755),
    ("./lib/", "dir", b"", 0o755), ("./lib/x86_64-linux-gnu/", "dir", b"", 0o755),
    ("./lib/x86_64-linux-gnu/libtool.so.1.0", "file", b"\x7fELF lib", 0o644),
    ("./lib/x86_64-linux-gnu/libtool.so.1", "sym", "libtool.so.1.0", 0o777),
    ("./usr/bin/tool-again", "hard", "./usr/bin/tool", 0o755),
    ("./usr/bin/sudoish", "file", b"x", 0o4755),
], scripts=("postinst", "triggers"))


def pkg_of(name: str, blob: bytes, url: str) -> DebPackage:
    return DebPackage(name, "1.0-1", "amd64", url, len(blob), "sha256:" + hashlib.sha256(blob).hexdigest())


def lock_of(*packages: DebPackage) -> aptlock.SystemLock:
    return aptlock.SystemLock("base@sha256:" + "c" * 64, "12.15", "bookworm", "amd64", tuple(p.name for p in packages),
                              packages, base_links=LINKS)


@pytest.fixture
def archive() -> Iterator[tuple[str, dict[str, bytes], list[str]]]:
    """A tiny archive on 127.0.0.1: path -> bytes; the paths it was asked for."""
    files: dict[str, bytes] = {}
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", files, asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)


def test_fetch_downloads_verifies_and_then_needs_no_network(archive: tuple[str, dict[str, bytes], list[str]],
                                                           tmp_path: Path) -> None:
    url, files, asked = archive
    files["/pool/tool_1.0-1_amd64.deb"] = TOOL
    lock = lock_of(pkg_of("tool", TOOL, url + "/pool/tool_1.0-1_amd64.deb"))
    paths = debs.fetch(lock, tmp_path / "cache")
    assert paths == [tmp_path / "cache" / "debs" / f"{hashlib.sha256(TOOL).hexdigest()}.deb"]
    assert paths[0].read_bytes() == TOOL and asked == ["/pool/tool_1.0-1_amd64.deb"]
    files.clear()
    assert debs.fetch(lock, tmp_path / "cache") == paths and len(asked) == 1  # cached: not asked again
    assert sorted(p.name for p in (tmp_path / "cache" / "debs").iterdir()) == [paths[0].name]


def test_a_download_that_is_not_the_locked_file_is_corrupt_and_leaves_nothing(
        archive: tuple[str, dict[str, bytes], list[str]], tmp_path: Path) -> None:
    url, files, _ = archive
    files["/pool/tool.deb"] = TOOL + b"tampered"
    lock = lock_of(pkg_of("tool", TOOL, url + "/pool/tool.deb"))
    with pytest.raises(Corrupt) as info:
        debs.fetch(lock, tmp_path / "cache")
    assert info.value.exit_code == ExitCode.CORRUPT == 13
    assert "system.lock locks tool 1.0-1" in info.value.one_line()
    assert list((tmp_path / "cache" / "debs").iterdir()) == []  # not even a .partial


def test_a_corrupted_cached_deb_is_refused_and_moved_aside(archive: tuple[str, dict[str, bytes], list[str]],
                                                          tmp_path: Path) -> None:
    url, files, _ = archive
    files["/pool/tool.deb"] = TOOL
    lock = lock_of(pkg_of("tool", TOOL, url + "/pool/tool.deb"))
    cached = debs.fetch(lock, tmp_path / "cache")[0]
    cached.write_bytes(TOOL[:-1] + b"X")
    with pytest.raises(Corrupt, match=r"the cached tool_1\.0-1_amd64\.deb .* does not match system\.lock"):
        debs.fetch(lock, tmp_path / "cache")
    assert not cached.exists() and cached.with_name(cached.name + ".corrupt").exists()
    assert debs.fetch(lock, tmp_path / "cache") == [cached] and cached.read_bytes() == TOOL  # fetched afresh


def test_a_version_the_archive_dropped_and_an_unreachable_archive(archive: tuple[str, dict[str, bytes], list[str]],
                                                                  tmp_path: Path) -> None:
    url, _, _ = archive
    with pytest.raises(NotFound) as info:
        debs.fetch(lock_of(pkg_of("tool", TOOL, url + "/pool/gone.deb")), tmp_path / "cache")
    assert "no longer serves tool 1.0-1 (HTTP 404" in info.value.one_line()
    assert "fix: lock the current versions with `launcher lock PROJECT --upgrade`" in info.value.one_line()
    with pytest.raises(HostUnreachable, match=r"cannot download tool 1\.0-1"):
        debs.fetch(lock_of(pkg_of("tool", TOOL, "http://127.0.0.1:9/pool/tool.deb")), tmp_path / "cache")


def test_unpack_follows_merged_usr_and_keeps_links_and_modes(tmp_path: Path) -> None:
    deb = tmp_path / "tool.deb"
    deb.write_bytes(TOOL)
    out = debs.unpack([deb], tmp_path / "root", base_links=LINKS)
    root = tmp_path / "root"
    assert not (root / "lib").exists()  # never a folder where the base has the link lib -> usr/lib
    assert (root / "usr/lib/x86_64-linux-gnu/libtool.so.1.0").read_bytes() == b"\x7fELF lib"
    assert (root / "usr/lib/x86_64-linux-gnu/libtool.so.1").readlink() == Path("libtool.so.1.0")
    assert (root / "usr/bin/tool").stat().st_mode & 0o777 == 0o755
    assert (root / "usr/bin/tool-again").samefile(root / "usr/bin/tool")
    assert (root / "usr/bin/sudoish").stat().st_mode & 0o7777 == 0o4755
    by_path = {e.path: e for e in out.entries}
    assert by_path["usr/lib/x86_64-linux-gnu/libtool.so.1"].kind == "symlink"
    assert by_path["usr/bin/tool-again"].target == "usr/bin/tool"
    assert [e.path for e in out.entries] == sorted(by_path)
    assert out.scripts == {"tool": ("postinst", "triggers")}  # listed, not run (the postinst would exit 1)
    again = debs.unpack([deb], tmp_path / "root2", base_links=LINKS)
    assert again.entries == out.entries


@pytest.mark.parametrize(("entries", "problem"), [
    ([("../escape", "file", b"x", 0o644)], "outside its root"),
    ([("/etc/passwd", "file", b"x", 0o644)], "outside its root"),
    ([("./usr/", "dir", b"", 0o755), ("./usr/evil", "sym", "/etc", 0o777), ("./usr/evil/passwd", "file", b"x", 0o644)],
     "through the symlink usr/evil"),
])
def test_unpack_refuses_entries_that_would_escape(tmp_path: Path, entries: list[tuple[str, str, bytes | str, int]],
                                                  problem: str) -> None:
    deb = tmp_path / "evil.deb"
    deb.write_bytes(make_deb("evil", entries))
    with pytest.raises(UnsafePath, match=problem):
        debs.unpack([deb], tmp_path / "root", base_links=LINKS)
    assert not (tmp_path / "escape").exists()


def test_not_a_deb_is_corrupt(tmp_path: Path) -> None:
    bad = tmp_path / "bad.deb"
    bad.write_bytes(b"PK\x03\x04 not an ar archive")
    with pytest.raises(Corrupt, match=r"not a \.deb"):
        debs.unpack([bad], tmp_path / "root", base_links=LINKS)


def test_a_file_where_another_package_has_a_folder_is_refused(tmp_path: Path) -> None:
    first, second = tmp_path / "a.deb", tmp_path / "b.deb"
    first.write_bytes(make_deb("a", [("./usr/", "dir", b"", 0o755), ("./usr/x/", "dir", b"", 0o755)]))
    second.write_bytes(make_deb("b", [("./usr/", "dir", b"", 0o755), ("./usr/x", "file", b"x", 0o644)]))
    with pytest.raises(BuildFailed, match="where another package has a folder"):
        debs.unpack([first, second], tmp_path / "root", base_links=LINKS)
