"""The local host: the same interface as SSH, with subprocesses and local paths."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from launcher.hosts import open_host
from launcher.hosts.local import LocalHost


def test_local_host_runs_streams_and_lists(tmp_path: Path) -> None:
    h = open_host(None, workspace_root=tmp_path)
    assert isinstance(h, LocalHost) and h.describe() == {"name": "local", "kind": "local"}
    assert h.runs_root() == str(tmp_path / ".launcher" / "host-runs")
    assert h.run_dir("r1") == str(tmp_path / ".launcher" / "host-runs" / "r1")
    assert h.run(["printf", "%s", "a b $HOME"]).out == "a b $HOME"
    p = h.start(["cat"])
    p.stdin.write(b"streamed")
    p.stdin.close()
    assert p.stdout.read() == b"streamed" and p.wait() == 0
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "f").write_bytes(b"abc")
    (tmp_path / "d" / "link").symlink_to("/etc/passwd")
    entries = {e.path: e for e in h.list_dir(str(tmp_path / "d"))}
    assert entries["sub"].kind == "dir" and entries["link"].kind == "symlink"
    assert entries["link"].target == "/etc/passwd"
    assert entries["sub/f"].sha256 == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    assert h.free_bytes(str(tmp_path)) > 0
    h.put_file(tmp_path / "d" / "sub" / "f", str(tmp_path / "e" / "g"))
    assert (tmp_path / "e" / "g").read_bytes() == b"abc"
    assert list(h.iter_lines(["sh", "-c", "echo one; echo two >&2"])) == ["one\n", "two\n"]


def test_a_missing_program_answers_like_a_remote_shell(tmp_path: Path) -> None:
    import pytest

    from launcher.errors import ExitCode, HostNotReady, NotFound
    from launcher.hosts.engine import Engine

    h = LocalHost(tmp_path)
    done = h.run(["launcher-no-such-program"], check=False)
    assert done.returncode == 127 and "command not found" in done.err
    with pytest.raises(NotFound):
        h.run(["launcher-no-such-program"])

    class NoDocker(LocalHost):
        def run(self, argv, **kw):  # type: ignore[no-untyped-def, override]
            return super().run(["launcher-no-such-program", *argv[1:]], **kw)

    with pytest.raises(HostNotReady) as err:
        Engine(NoDocker(tmp_path)).require()
    assert err.value.exit_code == ExitCode.HOST_NOT_READY and "provision" in err.value.one_line()


def test_host_scripts_run_without_site_packages(tmp_path: Path) -> None:
    """A host script (stdlib only) starts its interpreter isolated and without site: a fraction of the start-up."""
    host = LocalHost(tmp_path)
    flags = host.check([host.python, "-c", "import sys; print(sys.flags.isolated, sys.flags.no_site)"])
    assert flags.split() == ["1", "1"]
    assert host.check(["echo", "-c", "x"]) == "-c x\n"  # other argv as given
    proc = host.start([host.python, "-c", "import sys; print(sys.flags.no_site)"])
    proc.stdin.close()
    assert proc.stdout.read().strip() == b"1"
    proc.wait()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    assert [e.path for e in host.list_dir(str(tmp_path / "d"))] == ["f"]


def test_the_local_host_lists_in_process_what_the_host_script_lists(tmp_path: Path) -> None:
    from launcher.hosts.base import Host

    root = tmp_path / "out"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"alpha")
    (root / "sub" / "b.bin").write_bytes(bytes(range(256)) * 5000)
    (root / "sub" / "deeper" / "empty").write_bytes(b"")
    (root / "link").symlink_to("a.txt")
    host = LocalHost(tmp_path)
    for hashes in (True, False):
        in_process = host.list_dir(str(root), hashes=hashes)
        by_script = Host.list_dir(host, str(root), hashes=hashes)  # python -c listdir.py, as on any host
        assert in_process == by_script
        assert {e.kind for e in in_process} == {"file", "dir", "symlink"}
    assert host.list_dir(str(tmp_path / "missing")) == Host.list_dir(host, str(tmp_path / "missing")) == []


def test_the_local_host_does_in_process_what_the_shell_commands_do(tmp_path: Path) -> None:
    """makedirs, free_bytes, exists and owner answer here as `mkdir -p`, `df -Pk`, `test -e` and `id` do."""
    import pytest

    from launcher.errors import CommandFailed
    from launcher.hosts.base import Host

    host = LocalHost(tmp_path)
    host.makedirs(str(tmp_path / "a" / "b"))
    Host.makedirs(host, str(tmp_path / "c" / "d"))
    host.makedirs(str(tmp_path / "a" / "b"))  # already there: as mkdir -p, nothing to say
    assert (tmp_path / "a" / "b").is_dir() and (tmp_path / "c" / "d").is_dir()
    (tmp_path / "file").write_text("x")
    for makedirs in (host.makedirs, lambda p: Host.makedirs(host, p)):
        with pytest.raises(CommandFailed, match=r"^mkdir failed: mkdir: "):
            makedirs(str(tmp_path / "file" / "sub"))
    # df's blocks are whole KiB; other processes write meanwhile: the two agree within a few MiB
    assert abs(host.free_bytes(str(tmp_path)) - Host.free_bytes(host, str(tmp_path))) < 64 << 20
    assert host.free_bytes(str(tmp_path)) % 1024 == 0
    for free_bytes in (host.free_bytes, lambda p: Host.free_bytes(host, p)):
        with pytest.raises(CommandFailed, match=r"^df failed: df: "):
            free_bytes(str(tmp_path / "missing"))
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for path in ("a", "file", "missing", "dangling"):
        assert host.exists(str(tmp_path / path)) == Host.exists(host, str(tmp_path / path))
    assert host.owner() == Host.owner(host) and host.owner() is not None


@pytest.mark.docker  # this machine's Docker client and engine are among the facts compared
def test_the_local_fact_sheet_reads_as_the_host_script_does(tmp_path: Path) -> None:
    """The local host's facts read in this process (hosts/localfacts.py) and by facts.sh (as on any host)."""
    from launcher.hosts import localfacts
    from launcher.hosts.provision import gather_facts, parse_facts

    host = LocalHost(tmp_path)
    in_process, by_script = localfacts.sheet(), host.fact_sheet()
    assert by_script.returncode == 0
    here, there = parse_facts(in_process), parse_facts(by_script.out)
    free_here, free_there = here.pop("disk_free_bytes"), there.pop("disk_free_bytes")
    assert here == there
    assert free_here is not None and free_there is not None and abs(free_here - free_there) < 64 << 20
    assert [line.split("=", 1)[0] for line in in_process.splitlines()] == \
        [line.split("=", 1)[0] for line in by_script.out.splitlines()]  # the same keys, in the same order
    assert here["docker"]["installed"] and here["cpu_cores"]  # this machine runs the engine the tests use
    gathered = gather_facts(host)
    assert gathered.pop("host") == {"name": "local", "kind": "local"} and gathered["os"] == here["os"]


def test_the_local_fact_sheet_without_docker_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.hosts import localfacts
    from launcher.hosts.provision import parse_facts

    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "uname", "id", "sed", "head", "getconf", "awk", "df", "cat"):
        if (found := shutil.which(tool)) is not None:
            (bare / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bare))
    host = LocalHost(tmp_path)
    here, there = parse_facts(localfacts.sheet()), parse_facts(host.fact_sheet().out)
    here.pop("disk_free_bytes")
    there.pop("disk_free_bytes")
    assert here == there and here["docker"] == {"installed": False, "usable": False, "client": "",
                                                "server_version": None, "runtimes": [], "nvidia_runtime": False}
