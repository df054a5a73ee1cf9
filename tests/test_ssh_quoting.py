"""Remote command strings and SSH targets, without a network."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from launcher.errors import ExitCode, UsageError
from launcher.hosts.ssh import SSHHost, SSHTarget, known_hosts_name, remote_command, resolve_target

CASES: list[tuple[list[str], str]] = [
    (["docker", "ps"], "docker ps"),
    (["echo", "a b"], "echo 'a b'"),
    (["echo", "$HOME"], "echo '$HOME'"),
    (["sh", "-c", "echo hi; rm -rf /"], "sh -c 'echo hi; rm -rf /'"),
    (["echo", "it's"], "echo 'it'\"'\"'s'"),
    (["echo", ""], "echo ''"),
    (["printf", "%s\n", "x"], "printf '%s\n' x"),
    (["touch", "`reboot`", "$(reboot)", "a|b", "a&&b", "*"], "touch '`reboot`' '$(reboot)' 'a|b' 'a&&b' '*'"),
]


@pytest.mark.parametrize(("argv", "expected"), CASES)
def test_remote_command_quotes_every_argument(argv: list[str], expected: str) -> None:
    assert remote_command(argv) == expected
    assert shlex.split(remote_command(argv)) == argv


def test_remote_command_refuses_an_empty_argv() -> None:
    with pytest.raises(ValueError, match="empty"):
        remote_command([])


def test_docker_run_argv_survives_quoting_unchanged() -> None:
    from launcher.hosts.engine import render
    from launcher.runtime.recipespec import RecipeSpec
    from launcher.specs.container import ContainerJob, container_spec
    from launcher.specs.recipes import Recipe

    recipe = Recipe(RecipeSpec(Path("/r/tiny"), "tiny", "none", "train.py"), "sha256:" + "0" * 64)
    argv = render(container_spec(ContainerJob(
        run_id="20260101T000000-tiny-abcdef",
        image_id="sha256:" + "a" * 64,
        env={"XLA_FLAGS": "--xla_gpu_deterministic_ops=true", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
        host_out="/home/u/.launcher/runs/x/out",
        recipe=recipe,
        params={"msg": "it's a `test` $(x)"},
        data="/data/my set",
        gpu=True,
    )))
    assert shlex.split(remote_command(argv)) == argv
    assert argv[:4] == ["docker", "run", "-d", "--name"]
    assert "/data/my set:/launcher/data:ro" in argv
    assert argv[argv.index("--gpus") + 1] == "all"
    assert argv[argv.index("--params") + 1] == '{"msg":"it\'s a `test` $(x)"}'
    assert argv[argv.index("--recipe") + 1] == "/opt/launcher/recipes/tiny"


def test_spec_forms(tmp_path: Path) -> None:
    none = tmp_path / "none"
    t = resolve_target("alice@gpu.example:2200", ssh_config=none)
    assert (t.user, t.hostname, t.port) == ("alice", "gpu.example", 2200)
    t = resolve_target("ssh://bob@10.1.2.3", ssh_config=none, port=2022)
    assert (t.user, t.hostname, t.port) == ("bob", "10.1.2.3", 2022)
    t = resolve_target("carol@[fe80::1]:22", ssh_config=none)
    assert (t.user, t.hostname, t.port) == ("carol", "fe80::1", 22)
    with pytest.raises(UsageError) as err:
        resolve_target("alice@host:99999", ssh_config=none)
    assert err.value.exit_code == ExitCode.USAGE


def test_ssh_config_alias_user_port_identity_known_hosts(tmp_path: Path) -> None:
    conf = tmp_path / "config"
    conf.write_text(
        "Host gpu1\n  HostName 192.0.2.7\n  User azureuser\n  Port 2222\n"
        f"  IdentityFile {tmp_path}/key\n  UserKnownHostsFile {tmp_path}/kh\n"
    )
    t = resolve_target("gpu1", ssh_config=conf)
    assert t == SSHTarget(
        spec="gpu1",
        hostname="192.0.2.7",
        user="azureuser",
        port=2222,
        identities=(f"{tmp_path}/key",),
        known_hosts=tmp_path / "kh",
        config=conf,
    )
    explicit = resolve_target("root@gpu1", ssh_config=conf, identity=tmp_path / "other", port=22)
    assert (explicit.user, explicit.port, explicit.identities) == ("root", 22, (str(tmp_path / "other"),))


def test_include_and_proxyjump_are_read_as_openssh_reads_them(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-lab.conf").write_text(
        "Host lab-gpu\n  HostName 10.9.0.5\n  User researcher\n  ProxyJump bastion,inner\n")
    (tmp_path / "conf.d" / "00-bastion.conf").write_text("Host bastion\n  HostName 203.0.113.4\n  User jump\n")
    conf = tmp_path / "config"
    conf.write_text(f"Include {tmp_path}/conf.d/*.conf\nHost *\n  Port 2200\n")
    t = resolve_target("lab-gpu", ssh_config=conf)
    assert (t.hostname, t.user, t.port) == ("10.9.0.5", "researcher", 2200)
    assert t.proxy_jump == ("bastion", "inner") and t.config == conf
    hop = resolve_target("bastion", ssh_config=conf)
    assert (hop.hostname, hop.user, hop.proxy_jump) == ("203.0.113.4", "jump", ())
    (tmp_path / "loop").write_text(f"Include {tmp_path}/loop\n")
    with pytest.raises(UsageError, match="includes itself"):
        resolve_target("x", ssh_config=tmp_path / "loop")


def test_known_hosts_names_follow_openssh() -> None:
    assert known_hosts_name("10.0.0.1", 22) == "10.0.0.1"
    assert known_hosts_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"


def test_openssh_options_verify_host_keys_like_paramiko(tmp_path: Path) -> None:
    target = SSHTarget(
        spec="x", hostname="192.0.2.9", user="u", port=2201, identities=("/k",), known_hosts=tmp_path / "kh"
    )
    import paramiko

    host = SSHHost(target, paramiko.SSHClient(), use_openssh=True)  # never connected: options only
    opts = host.openssh_options()
    joined = " ".join(opts)
    assert "StrictHostKeyChecking=yes" in joined and "BatchMode=yes" in joined
    assert f"UserKnownHostsFile={tmp_path / 'kh'}" in opts
    assert opts[opts.index("-p") + 1] == "2201"
    assert opts[opts.index("-i") + 1] == "/k"
    assert host.openssh_options(scp=True)[host.openssh_options(scp=True).index("-P") + 1] == "2201"
    argv = host.openssh_argv(["cat", "a b"])
    assert argv[0] == "ssh" and argv[-1] == "cat 'a b'" and argv[-2] == "--"


def test_fast_ciphers_keep_the_usual_ones_after_aes_gcm(tmp_path: Path) -> None:
    import paramiko

    from launcher.hosts import ssh as ssh_mod

    target = SSHTarget(spec="h", hostname="h", port=22, user="u", known_hosts=tmp_path / "kh")
    host = SSHHost(target, paramiko.SSHClient(), use_openssh=True)
    host.fast_ciphers = True
    opts = host.openssh_options()
    value = opts[opts.index(f"Ciphers={ssh_mod.FAST_CIPHERS}")].split("=", 1)[1].split(",")
    assert value[0] == "aes128-gcm@openssh.com"
    assert {"chacha20-poly1305@openssh.com", "aes128-ctr", "aes256-ctr"} <= set(value)
    host.fast_ciphers = False
    assert not any(o.startswith("Ciphers=") for o in host.openssh_options())
