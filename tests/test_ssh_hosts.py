"""SSH against the real test host: host keys, auth errors, config aliases, commands and files."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from testhost import TestHost

from launcher.errors import AuthFailed, ExitCode, HostKeyRejected, HostUnreachable
from launcher.hosts import open_host
from launcher.hosts.ssh import SSHHost

pytestmark = pytest.mark.testhost
NO_CONFIG = Path("/dev/null")


def connect(th: TestHost, **kw: object) -> SSHHost:
    opts: dict[str, object] = {"identity": th.key, "known_hosts": th.known_hosts, "ssh_config": NO_CONFIG}
    opts.update(kw)
    return SSHHost.connect(th.spec, **opts)  # type: ignore[arg-type]


def test_unknown_host_key_is_refused_with_its_fingerprint(testhost: TestHost, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    with pytest.raises(HostKeyRejected) as err:
        connect(testhost, known_hosts=empty)
    assert err.value.exit_code == ExitCode.HOST_KEY_REJECTED
    assert testhost.host_key_fingerprint in err.value.one_line()
    assert "--trust-new-host" in err.value.one_line()
    assert not empty.exists()


def test_trust_new_host_records_the_key_once(testhost: TestHost, tmp_path: Path) -> None:
    kh = tmp_path / "ssh" / "known_hosts"
    with connect(testhost, known_hosts=kh, trust_new_host=True) as h:
        assert h.run(["true"]).returncode == 0
    recorded = kh.read_text()
    assert recorded.startswith(f"{testhost.ip} ssh-")
    fp = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(kh)], capture_output=True, text=True, check=True
    ).stdout
    assert testhost.host_key_fingerprint in fp
    with connect(testhost, known_hosts=kh) as h:  # now known: no trust needed, nothing appended
        assert h.run(["echo", "ok"]).out == "ok\n"
    assert kh.read_text() == recorded


def test_changed_host_key_is_refused_even_with_trust(testhost: TestHost, tmp_path: Path) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{testhost.ip} " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    with pytest.raises(HostKeyRejected) as err:
        connect(testhost, known_hosts=kh, trust_new_host=True)
    line = err.value.one_line()
    assert "CHANGED" in line and testhost.host_key_fingerprint in line
    assert kh.read_text().count("\n") == 1


def test_wrong_key_is_a_clear_auth_error(testhost: TestHost, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    with pytest.raises(AuthFailed) as err:
        connect(testhost, identity=wrong)
    assert err.value.exit_code == ExitCode.AUTH_FAILED
    assert str(wrong) in err.value.one_line() and "--identity" in err.value.one_line()


def test_wrong_port_is_a_refused_connection(testhost: TestHost) -> None:
    with pytest.raises(HostUnreachable) as err:
        connect(testhost, port=2)
    assert err.value.exit_code == ExitCode.CONNECTION_REFUSED
    assert f"{testhost.ip}:2" in err.value.one_line() and "nothing listens on port 2" in err.value.one_line()


def test_a_port_that_speaks_no_ssh_is_unreachable(testhost: TestHost) -> None:
    testhost.exec("sh", "-c", "python3 -m http.server 8022 >/dev/null 2>&1 &")
    with pytest.raises(HostUnreachable):
        connect(testhost, port=8022)


def test_ssh_config_alias_gives_host_user_port_key_and_known_hosts(testhost: TestHost) -> None:
    with open_host(testhost.alias, ssh_config=testhost.ssh_config) as h:
        assert isinstance(h, SSHHost)
        assert h.target.hostname == testhost.ip and h.target.known_hosts == testhost.known_hosts
        assert h.run(["id", "-un"]).out.strip() == "root"


def test_commands_are_quoted_not_interpreted(testhost: TestHost) -> None:
    with connect(testhost) as h:
        weird = "a b; echo INJECTED $(id) `id` 'q' \"d\" *"
        assert h.run(["printf", "%s", weird]).out == weird
        done = h.run(["sh", "-c", "echo out; echo err >&2; exit 7"], check=False)
        assert (done.returncode, done.out, done.err) == (7, "out\n", "err\n")
        got = h.run(["cat"], input=b"x" * 3_000_000).stdout
        assert len(got) == 3_000_000 and got == b"x" * 3_000_000


@pytest.mark.parametrize("openssh", [True, False], ids=["openssh", "paramiko"])
def test_files_and_streams_both_ways(testhost: TestHost, tmp_path: Path, openssh: bool) -> None:
    if openssh and shutil.which("scp") is None:
        pytest.skip("no OpenSSH scp on PATH")
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(256)) * 4096)
    with connect(testhost, use_openssh=openssh) as h:
        assert h.use_openssh is openssh
        h.makedirs("/tmp/xfer dir")
        h.put_file(src, "/tmp/xfer dir/f.bin")
        back = tmp_path / "back.bin"
        h.get_file("/tmp/xfer dir/f.bin", back)
        assert back.read_bytes() == src.read_bytes()
        p = h.start(["sha256sum"], bulk=True)
        p.stdin.write(src.read_bytes())
        p.stdin.close()
        import hashlib

        assert p.stdout.read().decode().split()[0] == hashlib.sha256(src.read_bytes()).hexdigest()
        assert p.wait() == 0
        entries = {e.path: e for e in h.list_dir("/tmp/xfer dir")}
        assert entries["f.bin"].sha256 == "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest()
        assert h.list_dir("/tmp/does-not-exist") == []
        assert h.home() == "/root" and h.runs_root() == "/root/.launcher/runs"


def test_bulk_data_uses_aes_gcm_where_the_cpu_has_aes(testhost: TestHost) -> None:
    from launcher.hosts.ssh import cpu_has_aes

    with connect(testhost, use_openssh=True) as h:
        argv = h.openssh_argv(["true"])
        done = subprocess.run([argv[0], "-v", *argv[1:]], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        negotiated = [ln for ln in done.stderr.splitlines() if "server->client cipher:" in ln]
        assert negotiated, done.stderr
        if cpu_has_aes():
            assert "cipher: aes128-gcm@openssh.com" in negotiated[0]
        else:
            assert "Ciphers=" not in " ".join(argv)
            assert "chacha20-poly1305" in negotiated[0]
