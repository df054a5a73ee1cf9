"""A host reached over SSH.

paramiko carries control (short commands, listings); the system OpenSSH client, with the
same known_hosts file and StrictHostKeyChecking=yes, carries bulk data where it is
installed, because paramiko moves bytes at well under half its speed. Every remote command
string is made by :func:`remote_command` and nowhere else.
"""

from __future__ import annotations

import base64
import os
import select
import shlex
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, cast

import paramiko

from launcher import proc
from launcher.errors import (
    AuthFailed,
    ConnectionRefused,
    HostKeyRejected,
    HostUnreachable,
    LauncherError,
    TimedOut,
    UsageError,
)
from launcher.hosts.base import Host, HostDescription, PopenProcess
from launcher.hosts.sshconfig import SSHTarget, resolve_target
from launcher.proc import CommandFailed, Completed

KEEPALIVE_S = 15
# For bulk data: AES-GCM first where this CPU has AES instructions (it is about twice as fast
# as OpenSSH's default chacha20 there), the usual ciphers after it so any server still agrees.
FAST_CIPHERS = (
    "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
    "aes128-ctr,aes192-ctr,aes256-ctr"
)
DEAD_PEER_S = 60  # unacknowledged data older than this ends the connection (a network black hole)
CONNECT_TIMEOUT_S = 10.0


def remote_command(argv: Sequence[str]) -> str:
    """The one place an argv becomes a string for a remote shell."""
    if not argv:
        raise ValueError("empty command")
    return " ".join(shlex.quote(str(a)) for a in argv)


def fingerprint(key: paramiko.PKey) -> str:
    """The OpenSSH-style SHA256 fingerprint that `ssh-keygen -l` prints."""
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko has no types
    """Unknown key: refuse with its fingerprint, or record it when the user said --trust-new-host."""

    def __init__(self, target: SSHTarget, trust_new_host: bool) -> None:
        self.target, self.trust = target, trust_new_host

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        name = known_hosts_name(self.target.hostname, self.target.port)
        fp = fingerprint(key)
        if not self.trust:
            raise HostKeyRejected(
                f"the host key of {name} is not in {self.target.known_hosts} ({key.get_name()} {fp})",
                "check the fingerprint with the host's owner, then rerun with --trust-new-host to record it",
            )
        path = self.target.known_hosts
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            os.chmod(path, 0o600)
            f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


class _ChannelProcess:
    """A paramiko exec channel with the HostProcess interface."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self._chan = chan
        self._stdin = chan.makefile_stdin("wb")
        self._stdout = chan.makefile("rb")

    @property
    def stdin(self) -> IO[bytes]:
        return cast(IO[bytes], self._stdin)

    @property
    def stdout(self) -> IO[bytes]:
        return cast(IO[bytes], self._stdout)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None and not self._chan.status_event.wait(timeout):
            raise TimeoutError("remote command still running")
        return int(self._chan.recv_exit_status())

    def stderr_text(self) -> str:
        chunks = []
        while self._chan.recv_stderr_ready():
            chunks.append(self._chan.recv_stderr(65536))
        return b"".join(chunks).decode("utf-8", "replace")

    def kill(self) -> None:
        self._chan.close()


def cpu_has_aes() -> bool:
    """Whether this machine's CPU encrypts AES in hardware (x86 `aes` flag, Arm `aes` feature)."""
    import platform

    if platform.system() == "Darwin":
        return True  # Apple silicon and every Intel Mac since 2010
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return "aes" in value.split()
    return False


class SSHHost(Host):
    kind = "ssh"
    stream_errors = (OSError, EOFError, paramiko.SSHException)

    def __init__(
        self, target: SSHTarget, client: paramiko.SSHClient, *, use_openssh: bool | None = None
    ) -> None:
        self.target = target
        self.name = target.spec
        self.keepalive_s = KEEPALIVE_S
        self.fast_ciphers = cpu_has_aes()
        self._client = client
        self._home: str | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self.via: SSHHost | None = None  # the jump host this one is reached through
        self._hops: list[SSHHost] = []  # the jump hosts this one opened (closed with it)
        have = shutil.which("ssh") is not None and shutil.which("scp") is not None
        self.use_openssh = have if use_openssh is None else (use_openssh and have)

    @classmethod
    def connect(
        cls,
        spec: str,
        *,
        trust_new_host: bool = False,
        identity: Path | None = None,
        port: int | None = None,
        ssh_config: Path | None = None,
        known_hosts: Path | None = None,
        use_openssh: bool | None = None,
        keepalive_s: int = KEEPALIVE_S,
        dead_peer_s: int = DEAD_PEER_S,
        via: SSHHost | None = None,
    ) -> SSHHost:
        """Connect, through the ProxyCommand or the ProxyJump hops of the SSH config (each hop held to
        the same host-key rules), or through `via` (the previous hop of a chain)."""
        target = resolve_target(
            spec, port=port, identity=identity, ssh_config=ssh_config, known_hosts=known_hosts
        )
        hops: list[SSHHost] = []
        if via is None and target.proxy_jump and not target.proxy_command:
            for hop in target.proxy_jump:
                try:
                    hops.append(cls.connect(hop, trust_new_host=trust_new_host, ssh_config=target.config,
                                            known_hosts=known_hosts, use_openssh=use_openssh,
                                            keepalive_s=keepalive_s, dead_peer_s=dead_peer_s,
                                            via=hops[-1] if hops else None))
                except BaseException:
                    for h in reversed(hops):
                        h.close()
                    raise
            via = hops[-1]
        try:
            host = cls._connect(target, trust_new_host=trust_new_host, identity=identity,
                                use_openssh=use_openssh, keepalive_s=keepalive_s, dead_peer_s=dead_peer_s,
                                via=via)
        except BaseException:
            for h in reversed(hops):
                h.close()
            raise
        host._hops = hops
        return host

    @classmethod
    def _connect(cls, target: SSHTarget, *, trust_new_host: bool, identity: Path | None, use_openssh: bool | None,
                 keepalive_s: int, dead_peer_s: int, via: SSHHost | None) -> SSHHost:
        if identity is not None and not identity.is_file():
            raise UsageError(
                f"identity file {identity} does not exist", "pass the private key with --identity"
            )
        client = paramiko.SSHClient()
        if target.known_hosts.is_file():
            client.load_system_host_keys(str(target.known_hosts))
        client.set_missing_host_key_policy(_KnownHostsPolicy(target, trust_new_host))
        _open_client(client, target, via)
        _keep_alive(client, keepalive_s, dead_peer_s)
        host = cls(target, client, use_openssh=use_openssh)
        host.keepalive_s = keepalive_s
        host.via = via
        return host

    def forward(self, hostname: str, port: int) -> paramiko.Channel:
        """A channel from this host to hostname:port (this host as a jump host)."""
        try:
            return self._transport().open_channel("direct-tcpip", (hostname, port), ("127.0.0.1", 0),
                                                  timeout=CONNECT_TIMEOUT_S)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(
                f"the jump host {self.target.destination} cannot reach {hostname}:{port}: {exc}",
                "check HostName and Port of the host behind it, and that the jump host allows forwarding "
                "(AllowTcpForwarding)",
            ) from None

    def describe(self) -> HostDescription:
        t = self.target
        return {"name": self.name, "kind": self.kind, "hostname": t.hostname, "user": t.user, "port": t.port}

    def _transport(self) -> paramiko.Transport:
        t = self._client.get_transport()
        if t is None or not t.is_active():
            raise HostUnreachable(
                f"the SSH connection to {self.target.destination} was lost",
                "check the network; the run keeps going on the host: `launcher pull RUN`",
            )
        return t

    def _channel(self, argv: Sequence[str]) -> paramiko.Channel:
        try:
            chan = self._transport().open_session(timeout=CONNECT_TIMEOUT_S)
            chan.exec_command(remote_command(argv))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(
                f"the SSH connection to {self.target.destination} failed: {exc}",
                "check the network; a started run keeps going on the host",
            ) from None
        return chan

    def run(self, argv: Sequence[str], *, input: bytes | None = None, check: bool = True,
            timeout: float | None = None) -> Completed:
        chan = self._channel(argv)
        out: list[bytes] = []
        err: list[bytes] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        sender = None
        try:
            if input:
                # a separate thread, so a command that answers while it reads cannot deadlock us
                sender = threading.Thread(target=self._send_all, args=(chan, input), daemon=True)
                sender.start()
            else:
                chan.shutdown_write()
            while True:
                busy = False
                if chan.recv_ready():
                    out.append(chan.recv(65536))
                    busy = True
                if chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(65536))
                    busy = True
                if busy:
                    continue
                if chan.eof_received:
                    # EOF comes after the last data (the exit status may come before it)
                    while chan.recv_ready():
                        out.append(chan.recv(65536))
                    while chan.recv_stderr_ready():
                        err.append(chan.recv_stderr(65536))
                    break
                if chan.closed or not self._transport().is_active():
                    break
                select.select([chan], [], [], 0.5)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimedOut(f"`{argv[0]}` on {self.name} did not finish within {timeout:.0f} s")
            code = chan.recv_exit_status() if chan.status_event.wait(CONNECT_TIMEOUT_S) else -1
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(
                f"the SSH connection to {self.target.destination} failed: {exc}",
                "check the network; a started run keeps going on the host",
            ) from None
        finally:
            chan.close()
        if code == -1:
            self._transport()
        done = Completed(tuple(argv), code, b"".join(out), b"".join(err))
        if check and code != 0:
            raise CommandFailed(done, f"`{argv[0]}` failed on {self.name}: {done.last_error_line()}")
        return done

    @staticmethod
    def _send_all(chan: paramiko.Channel, data: bytes) -> None:
        try:
            chan.sendall(data)
            chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the command ended or the connection dropped; run() reports that

    def openssh_options(self, *, scp: bool = False) -> list[str]:
        """Options that make the OpenSSH client verify the host exactly as paramiko did."""
        settings = [
            "BatchMode=yes", "StrictHostKeyChecking=yes", f"UserKnownHostsFile={self.target.known_hosts}",
            "GlobalKnownHostsFile=/dev/null", f"ServerAliveInterval={self.keepalive_s}", "ServerAliveCountMax=4",
            f"ConnectTimeout={int(CONNECT_TIMEOUT_S)}", "Compression=no",
            *([f"Ciphers={FAST_CIPHERS}"] if self.fast_ciphers else []), f"User={self.target.user}",
        ]
        opts = ["-F", "/dev/null", *(w for o in settings for w in ("-o", o))]
        opts += ["-P" if scp else "-p", str(self.target.port)]
        for ident in self.target.identities:
            opts += ["-i", ident, "-o", "IdentitiesOnly=yes"]
        if self.via is not None:  # the same hops, each verified by its own options, written out in full
            hop = self.via
            through = ["ssh", *hop.openssh_options(), "-W", f"{self.target.hostname}:{self.target.port}",
                       hop.target.hostname]
            opts += ["-o", "ProxyCommand=" + shlex.join(through).replace("%", "%%")]
        elif self.target.proxy_command:
            opts += ["-o", f"ProxyCommand={self.target.proxy_command}"]
        return opts

    def can_reverse_tunnel(self) -> bool:
        return self.use_openssh

    def reverse_tunnel(self, remote_port: int, local_address: str, argv: Sequence[str]) -> Completed:
        if not self.use_openssh:
            raise NotImplementedError("a reverse tunnel needs the OpenSSH client")
        return proc.run(["ssh", *self.openssh_options(), "-o", "ExitOnForwardFailure=yes", "-e", "none", "-T",
                         "-R", f"127.0.0.1:{remote_port}:{local_address}", self.target.hostname, "--",
                         remote_command(argv)], check=False)

    def openssh_argv(self, argv: Sequence[str]) -> list[str]:
        return [
            "ssh",
            *self.openssh_options(),
            "-e",
            "none",
            "-T",
            self.target.hostname,
            "--",
            remote_command(argv),
        ]

    def start(self, argv: Sequence[str], *, bulk: bool = False, merge_stderr: bool = False) -> Any:
        if bulk and self.use_openssh:
            return PopenProcess(
                proc.popen(
                    self.openssh_argv(argv),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                )
            )
        chan = self._channel(argv)
        if merge_stderr:
            chan.set_combine_stderr(True)
        return _ChannelProcess(chan)

    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self._client.open_sftp()
        return self._sftp

    def _remote(self, path: str) -> str:
        return (
            f"{self.target.hostname}:{path}"
            if ":" not in self.target.hostname
            else f"[{self.target.hostname}]:{path}"
        )

    def put_file(self, local: Path, remote: str) -> None:
        if self.use_openssh:
            proc.run(["scp", "-q", *self.openssh_options(scp=True), "--", str(local), self._remote(remote)])
        else:
            self.sftp().put(str(local), remote)

    def get_file(self, remote: str, local: Path) -> None:
        if self.use_openssh:
            proc.run(["scp", "-q", *self.openssh_options(scp=True), "--", self._remote(remote), str(local)])
        else:
            self.sftp().get(remote, str(local))

    def home(self) -> str:
        if self._home is None:
            self._home = self.run(["printenv", "HOME"]).out.strip() or f"/home/{self.target.user}"
        return self._home

    def runs_root(self) -> str:
        return f"{self.home()}/.launcher/runs"

    def is_alive(self) -> bool:
        t = self._client.get_transport()
        return t is not None and t.is_active()

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
        self._client.close()
        for hop in reversed(self._hops):
            hop.close()


def _open_client(client: paramiko.SSHClient, target: SSHTarget, via: SSHHost | None) -> None:
    """Connect client to target: through via's forwarded channel, the ProxyCommand, or directly.
    A refusal closes the client and is raised as launcher's error for it."""
    sock: Any = None
    if via is not None:
        sock = via.forward(target.hostname, target.port)
    elif target.proxy_command:
        sock = paramiko.ProxyCommand(target.proxy_command)
    try:
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            key_filename=list(target.identities) or None,
            look_for_keys=not target.identities,
            allow_agent=True,
            timeout=CONNECT_TIMEOUT_S,
            banner_timeout=CONNECT_TIMEOUT_S,
            auth_timeout=CONNECT_TIMEOUT_S,
            sock=sock,
        )
    except LauncherError:
        client.close()
        raise
    except (paramiko.BadHostKeyException, paramiko.AuthenticationException, paramiko.PasswordRequiredException,
            OSError, EOFError, paramiko.SSHException) as exc:
        client.close()
        raise _connect_error(exc, target) from None


def _connect_error(exc: Exception, target: SSHTarget) -> LauncherError:
    """What a failed connection to target raised, as launcher's error: a changed host key, a refused
    key, a refused connection or a host that does not answer."""
    where = f"{target.destination}:{target.port}"
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyRejected(
            f"the host key of {known_hosts_name(target.hostname, target.port)} CHANGED: "
            f"{target.known_hosts} has {fingerprint(exc.expected_key)}, the host offers "
            f"{exc.key.get_name()} {fingerprint(exc.key)}",
            "if the host was rebuilt on purpose, remove its old line with "
            f"`ssh-keygen -R {known_hosts_name(target.hostname, target.port)} -f {target.known_hosts}`",
        )
    if isinstance(exc, paramiko.AuthenticationException | paramiko.PasswordRequiredException):
        keys = ", ".join(target.identities) or "the agent and default keys"
        return AuthFailed(
            f"{where} refused the key ({keys}): {exc}",
            "pass the right private key with --identity, or add it to the agent",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError | ConnectionRefusedError):
        return ConnectionRefused(
            f"{where} refused the connection: nothing listens on port {target.port}",
            "check the port (--port, or Port in ~/.ssh/config) and that sshd runs there",
        )
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError | socket.timeout):
        reason = f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
    return HostUnreachable(
        f"cannot reach {where}: {reason}",
        "check the address and port (--port), and that sshd runs there",
    )


def _keep_alive(client: paramiko.SSHClient, keepalive_s: int, dead_peer_s: int) -> None:
    """Keepalives every keepalive_s; keepalives alone never fail a connection whose packets vanish (the
    kernel retries for about 15 minutes): a user timeout turns that into HostUnreachable after dead_peer_s."""
    transport = client.get_transport()
    assert transport is not None
    transport.set_keepalive(keepalive_s)
    sock = transport.sock
    if hasattr(socket, "TCP_USER_TIMEOUT") and isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, dead_peer_s * 1000)


def probe(hostname: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((hostname, port), timeout=timeout):
            return True
    except OSError:
        return False
