"""Where an SSH destination really is: ~/.ssh/config applied (aliases, User, Port, IdentityFile,
UserKnownHostsFile, ProxyCommand, ProxyJump, Include) and the command-line options on top.

launcher's own SSH config (`own_ssh_config()`: the aliases of the VMs `launcher vm up` made) is read
before ~/.ssh/config, unless --ssh-config names a file."""

from __future__ import annotations

import glob
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from launcher.errors import UsageError


@dataclass(frozen=True)
class SSHTarget:
    """Where to connect, after ~/.ssh/config and the command-line options are applied."""

    spec: str
    hostname: str
    user: str
    port: int
    identities: tuple[str, ...] = ()
    known_hosts: Path = field(default_factory=lambda: Path.home() / ".ssh" / "known_hosts")
    proxy_command: str | None = None
    proxy_jump: tuple[str, ...] = ()  # hops, first to last (ProxyJump a,b: through a, then b)
    config: Path | None = None  # the SSH config the hops are resolved in

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.hostname}"


def _split_spec(spec: str) -> tuple[str | None, str, int | None]:
    text = spec.removeprefix("ssh://")
    user, _, hostport = text.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        inner, _, rest = hostport[1:].partition("]")
        host = inner
        if rest.startswith(":"):
            port = _port(rest[1:], spec)
    elif hostport.count(":") == 1:
        host, _, p = hostport.partition(":")
        port = _port(p, spec)
    if not host:
        raise UsageError(f"no host name in {spec!r}", "write the host as HOST, USER@HOST or USER@HOST:PORT")
    return (user or None), host, port


def _port(text: str, spec: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"bad port in {spec!r}", "a port is a number from 1 to 65535")
    return int(text)


def launcher_home() -> Path:
    """launcher's own files on this machine: $LAUNCHER_HOME, or ~/.launcher."""
    env = os.environ.get("LAUNCHER_HOME")
    return Path(env).expanduser() if env else Path.home() / ".launcher"


def own_ssh_config() -> Path:
    """The SSH config launcher owns (one Host block per VM it made)."""
    return launcher_home() / "ssh" / "config"


def resolve_target(
    spec: str,
    *,
    port: int | None = None,
    identity: Path | None = None,
    ssh_config: Path | None = None,
    known_hosts: Path | None = None,
) -> SSHTarget:
    """Apply ~/.ssh/config (aliases, User, Port, IdentityFile, UserKnownHostsFile, ProxyCommand,
    ProxyJump, Include) to spec."""
    user, alias, spec_port = _split_spec(spec)
    config_path = ssh_config if ssh_config is not None else Path.home() / ".ssh" / "config"
    texts = []
    if ssh_config is None and own_ssh_config().is_file():
        texts.append(config_text(own_ssh_config()))  # launcher's VM aliases: first, so they win
    if config_path.is_file():
        texts.append(config_text(config_path))
    conf: dict[str, Any] = {}  # paramiko's lookup: a str, or a list for identityfile, by option name
    if texts:
        conf = dict(paramiko.SSHConfig.from_text("\n".join(texts)).lookup(alias))
    jump = str(conf.get("proxyjump") or "").strip()
    identities = (
        [str(identity)] if identity else [os.path.expanduser(p) for p in conf.get("identityfile", [])]
    )
    kh = known_hosts
    if kh is None and conf.get("userknownhostsfile"):
        kh = Path(os.path.expanduser(str(conf["userknownhostsfile"]).split()[0]))
    return SSHTarget(
        spec=spec,
        hostname=str(conf.get("hostname", alias)),
        user=user or str(conf.get("user") or os.environ.get("USER") or "root"),
        port=port or spec_port or int(conf.get("port", 22)),
        identities=tuple(identities),
        known_hosts=kh or Path.home() / ".ssh" / "known_hosts",
        proxy_command=conf.get("proxycommand") if str(conf.get("proxycommand", "")).lower() != "none" else None,
        proxy_jump=tuple(h.strip() for h in jump.split(",") if h.strip()) if jump.lower() != "none" else (),
        config=config_path if config_path.is_file() else None,
    )


def config_text(path: Path, depth: int = 0) -> str:
    """The SSH config with its Include lines replaced by the files they name (globs, in sorted order;
    a relative path is under ~/.ssh, as OpenSSH reads it), so that paramiko, which has no Include,
    sees what OpenSSH sees."""
    if depth > 16:
        raise UsageError(f"{path} includes itself over and over", "break the Include loop in your SSH config")
    out: list[str] = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read the SSH config {path}: {exc.strerror or exc}",
                         "fix the path given to --ssh-config or in an Include line") from None
    for line in lines:
        words = line.strip().split(None, 1)
        if len(words) == 2 and words[0].lower() == "include":
            for pattern in shlex.split(words[1]):
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = str(Path.home() / ".ssh" / pattern)
                for name in sorted(glob.glob(pattern)):
                    if Path(name).is_file():
                        out.append(config_text(Path(name), depth + 1))
            continue
        out.append(line)
    return "\n".join(out) + "\n"
