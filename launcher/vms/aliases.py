"""The SSH alias of each VM launcher made: a Host block in the SSH config launcher owns
(~/.launcher/ssh/config, read by hosts/sshconfig.py before ~/.ssh/config) and the VM's host key in
the known_hosts file launcher owns beside it. `--host NAME` then reaches the VM with the key checked."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from launcher.hashing import atomic_write_text
from launcher.hosts.sshconfig import launcher_home, own_ssh_config

_BEGIN = "# launcher vm "  # + NAME: the first line of a VM's block
_HEADER = (
    "# Written by `launcher vm up`, removed by `launcher vm down`: one Host block per VM.\n"
    "# launcher reads this file for --host; for OpenSSH, add `Include {path}` at the top of ~/.ssh/config.\n"
)


def known_hosts_path() -> Path:
    return launcher_home() / "ssh" / "known_hosts"


@contextmanager
def _locked() -> Iterator[None]:
    folder = own_ssh_config().parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _blocks(text: str) -> dict[str, str]:
    """NAME -> its block, from the config launcher wrote."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines(keepends=True):
        if line.startswith(_BEGIN):
            name = line[len(_BEGIN):].split()[0]
            out[name] = line
        elif name is not None:
            if line.strip():
                out[name] += line
            else:
                name = None
    return out


def _write_private(path: Path, text: str) -> None:
    atomic_write_text(path, text)
    os.chmod(path, 0o600)


def block(name: str, address: str, user: str, identity: Path | None) -> str:
    lines = [f"{_BEGIN}{name}", f"Host {name}", f"  HostName {address}", f"  User {user}", "  Port 22"]
    if identity is not None:
        lines += [f"  IdentityFile {identity}", "  IdentitiesOnly yes"]
    lines += [f"  UserKnownHostsFile {known_hosts_path()}", "  StrictHostKeyChecking yes"]
    return "\n".join(lines) + "\n"


def add(name: str, address: str, user: str, identity: Path | None, host_public_key: str) -> None:
    """Write (or replace) NAME's Host block and its host key; any other key recorded for that address
    is dropped (the address is this VM's now)."""
    with _locked():
        config = own_ssh_config()
        blocks = _blocks(config.read_text() if config.is_file() else "")
        blocks[name] = block(name, address, user, identity)
        _write_private(config, _HEADER.format(path=config) + "\n" + "\n".join(blocks[n] for n in sorted(blocks)))
        kh = known_hosts_path()
        lines = [ln for ln in (kh.read_text().splitlines() if kh.is_file() else [])
                 if ln.strip() and not _names_vm(ln, name) and ln.split()[0] != address]
        key_type, key_b64 = host_public_key.split()[:2]
        lines.append(f"{address} {key_type} {key_b64} launcher-vm:{name}")
        _write_private(kh, "\n".join(lines) + "\n")


def _names_vm(line: str, name: str) -> bool:
    words = line.split()
    return len(words) >= 4 and words[3] == f"launcher-vm:{name}"


def remove(name: str) -> bool:
    """Drop NAME's Host block and host key; whether there was one."""
    with _locked():
        config = own_ssh_config()
        blocks = _blocks(config.read_text() if config.is_file() else "")
        had = blocks.pop(name, None) is not None
        if config.is_file():
            _write_private(config, _HEADER.format(path=config) + "\n" + "\n".join(blocks[n] for n in sorted(blocks)))
        kh = known_hosts_path()
        if kh.is_file():
            lines = kh.read_text().splitlines()
            kept = [ln for ln in lines if ln.strip() and not _names_vm(ln, name)]
            had = had or len(kept) != len([ln for ln in lines if ln.strip()])
            _write_private(kh, "\n".join(kept) + ("\n" if kept else ""))
        return had


def lookup(name: str) -> dict[str, str] | None:
    """NAME's alias as written: {"address", "user"}; None when launcher has none."""
    config = own_ssh_config()
    text = _blocks(config.read_text() if config.is_file() else "").get(name)
    if text is None:
        return None
    fields = {}
    for line in text.splitlines()[1:]:
        words = line.split(None, 1)
        if len(words) == 2:
            fields[words[0].lower()] = words[1].strip()
    return {"address": fields.get("hostname", ""), "user": fields.get("user", "")}


def host_key_of(name: str) -> str | None:
    """The host key line recorded for NAME (as `type base64`), or None."""
    kh = known_hosts_path()
    for line in kh.read_text().splitlines() if kh.is_file() else []:
        if _names_vm(line, name):
            return " ".join(line.split()[1:3])
    return None
