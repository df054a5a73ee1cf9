"""The operations a Host owns: its area beside the runs, atomic writes, and byte streams whose cuts
map to TransferCut in one place. LocalHost for real in temporary folders; the shell form of
write_atomic (what an SSH host runs) on this machine too; the SSH test host at the end."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from launcher.errors import ExitCode, TransferCut
from launcher.hosts.base import Host
from launcher.hosts.local import LocalHost


def test_the_area_is_beside_the_runs_root(tmp_path: Path) -> None:
    h = LocalHost(tmp_path)
    assert h.runs_root() == str(tmp_path / ".launcher" / "host-runs")
    assert h.area() == str(tmp_path / ".launcher")
    assert h.area("data") == str(tmp_path / ".launcher" / "data")
    assert h.area("slurm", "jobs", "41") == str(tmp_path / ".launcher" / "slurm" / "jobs" / "41")
    assert not (tmp_path / ".launcher").exists()  # naming a path creates nothing
    with h.exclusive("one"):
        assert (tmp_path / ".launcher" / "locks" / "one").is_file()


@pytest.mark.parametrize("form", ["python", "shell"])
def test_write_atomic_makes_the_folder_replaces_whole_and_leaves_no_part(tmp_path: Path, form: str) -> None:
    h = LocalHost(tmp_path)
    write = h.write_atomic if form == "python" else lambda *a, **kw: Host.write_atomic(h, *a, **kw)
    target = tmp_path / "a b" / "c" / "settings.json"
    write(str(target), b"one\n")
    assert target.read_bytes() == b"one\n"
    write(str(target), b"")
    assert target.read_bytes() == b""
    write(str(target), bytes(range(256)) * 1000)
    assert target.read_bytes() == bytes(range(256)) * 1000
    assert sorted(p.name for p in target.parent.iterdir()) == ["settings.json"]
    umask = os.umask(0o022)
    try:
        write(str(target), b"x")
        write(str(tmp_path / "secret.env"), b"TOKEN=x\n", private=True)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "secret.env").stat().st_mode) == 0o600


def test_write_atomic_in_shell_leaves_the_old_file_when_it_cannot_finish(tmp_path: Path) -> None:
    h = LocalHost(tmp_path)
    target = tmp_path / "d" / "f"
    h.write_atomic(str(target), b"old")
    (tmp_path / "d" / "f.part").mkdir()  # the temporary name cannot be written
    with pytest.raises(Exception, match="failed"):
        Host.write_atomic(h, str(target), b"new")
    assert target.read_bytes() == b"old"


def test_a_received_stream_arrives_and_the_command_is_waited_for(tmp_path: Path) -> None:
    h = LocalHost(tmp_path)
    out = tmp_path / "got.bin"
    with h.receive_stream(["sh", "-c", 'cat > "$1"', "sh", str(out)], cut="sending x was cut", hint="again") as p:
        for _ in range(8):
            p.stdin.write(b"y" * (1 << 20))
        p.stdin.close()
        assert p.wait() == 0
    assert out.stat().st_size == 8 << 20


def test_a_cut_stream_is_transfer_cut_with_what_the_command_said(tmp_path: Path) -> None:
    h = LocalHost(tmp_path)
    sent = 0
    with pytest.raises(TransferCut) as cut:
        with h.receive_stream(["sh", "-c", "echo disk on fire >&2; exit 3"],
                              cut=lambda: f"sending the image stopped after {sent >> 20} MiB",
                              hint="run again") as p:
            for _ in range(64):  # far more than a pipe holds: the writer meets the closed end
                p.stdin.write(b"z" * (1 << 20))
                p.stdin.flush()
                sent += 1 << 20
    assert cut.value.exit_code == ExitCode.TRANSFER_CUT and cut.value.hint == "run again"
    message = str(cut.value)
    assert message.startswith(f"sending the image stopped after {sent >> 20} MiB: ") and sent < 64 << 20
    assert "disk on fire" in message


def test_a_stream_that_ends_early_is_a_cut_too_and_other_errors_pass_through_killing_the_command(
    tmp_path: Path,
) -> None:
    h = LocalHost(tmp_path)
    with pytest.raises(TransferCut, match=r"^the transfer from local was cut: stream ended inside a file"):
        with h.send_stream(["true"], cut="the transfer from local was cut", hint="pull again"):
            raise EOFError("stream ended inside a file")
    with pytest.raises(ValueError, match="not a stream error"):
        with h.receive_stream(["sleep", "60"], cut="x", hint="y") as p:
            raise ValueError("not a stream error")
    assert p.wait(timeout=10) != 0  # killed, not left running


@pytest.mark.testhost
@pytest.mark.parametrize("openssh", [True, False], ids=["openssh", "paramiko"])
def test_an_ssh_host_has_the_same_operations(testhost: object, openssh: bool) -> None:
    from test_ssh_hosts import connect

    if openssh and shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client on PATH")
    with connect(testhost, use_openssh=openssh) as h:  # type: ignore[arg-type]
        assert h.area("data") == "/root/.launcher/data" and h.area() == "/root/.launcher"
        path = f"/tmp/ops-{os.getpid()}-{openssh}/x y/secret.env"
        h.write_atomic(path, b"TOKEN=1\n", private=True)
        assert h.run(["stat", "-c", "%a %s", path]).out.split() == ["600", "8"]
        assert h.run(["ls", "-A", path.rsplit("/", 1)[0]]).out.split() == ["secret.env"]
        with pytest.raises(TransferCut) as cut:
            with h.receive_stream(["sh", "-c", "echo no room here >&2; exit 1"], cut="sending was cut",
                                  hint="again") as p:
                for _ in range(256):
                    p.stdin.write(b"z" * (1 << 20))
                    p.stdin.flush()
        assert str(cut.value).startswith("sending was cut: ")
        h.run(["rm", "-rf", path.split("/x y/")[0]])
