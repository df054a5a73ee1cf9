"""hosts/scripts/facts.sh's fact sheet of this machine, read in this process (provision.gather_facts of
the local host).

The script forks some twenty processes one after the other (uname, id, sed, awk, df, docker twice, ...),
which every local run waits for before its container starts. Here the files and the system calls answer
what those processes print, and the questions only a program can answer (Docker's version and info,
sudo, the GPUs) are asked at once. The text is the script's, line for line: provision.parse_facts reads
both alike (tests/test_hosts_local.py compares them).
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence

from launcher import proc
from launcher.errors import NotFound
from launcher.hosts import engine

DOCKER_INFO = "{{.ServerVersion}}|{{json .Runtimes}}|{{.DockerRootDir}}"
GPU_QUERY = ("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
_MODEL = re.compile(r"model name[ \t\v\f\r]*: *")


class _Asked:
    """A program started now and read later; an answer of exit code 127 where it cannot be started."""

    def __init__(self, argv: Sequence[str], *, merge_stderr: bool = False, keep_stdout: bool = True) -> None:
        try:
            self._p: subprocess.Popen[bytes] | None = proc.popen(
                argv, env={"LC_ALL": "C"}, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if keep_stdout else subprocess.DEVNULL,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE)
        except (OSError, NotFound):
            self._p = None

    def answer(self) -> tuple[int, str, str]:
        """Its exit code, stdout and stderr."""
        if self._p is None:
            return 127, "", ""
        out, err = self._p.communicate()
        return self._p.returncode, (out or b"").decode("utf-8", "replace"), (err or b"").decode("utf-8", "replace")


def _substituted(text: str) -> str:
    """What the shell's $(...) makes of a program's output: its trailing newlines dropped."""
    return text.rstrip("\n")


def _last_line(text: str) -> str:
    """`tail -n1`, as $(...) keeps it."""
    text = _substituted(text)
    return text.rsplit("\n", 1)[-1] if text else ""


def _os_release() -> dict[str, str]:
    """What sourcing /etc/os-release sets (the shell's quoting undone); {} when it cannot be read."""
    try:
        with open("/etc/os-release", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if not sep or key.startswith("#") or not key.isidentifier():
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            words = [value]
        out[key] = words[0] if words else ""
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if m := _MODEL.match(line):
                    return _substituted(line[m.end():])
    except OSError:
        pass
    return ""


def _ram_bytes() -> str:
    try:
        with open("/proc/meminfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if fields and fields[0] == "MemTotal:" and len(fields) > 1:
                    return f"{float(fields[1]) * 1024:.0f}"
    except (OSError, ValueError):
        pass
    return ""


def _disk_free_bytes() -> str:
    home = os.environ.get("HOME", "")
    try:
        return str(shutil.disk_usage(home).free // 1024 * 1024) if home else ""
    except OSError:
        return ""


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return ""


def sheet() -> str:
    """facts.sh's output on this machine."""
    sudo = _Asked(["sudo", "-n", "true"], keep_stdout=False) if shutil.which("sudo") else None
    docker = engine.installed()
    version = _Asked(engine.client_version_argv()) if docker else None
    info = _Asked(engine.info_argv(DOCKER_INFO), merge_stderr=True) if docker else None
    gpus = _Asked(GPU_QUERY) if shutil.which("nvidia-smi") else None
    release = _os_release()

    def var(name: str, default: str) -> str:  # ${NAME:-default} once os-release is sourced
        return release.get(name, os.environ.get(name, "")) or default

    uname = os.uname()
    lines = [f"os={var('PRETTY_NAME', 'unknown')}", f"os_id={var('ID', 'unknown')}",
             f"os_version={var('VERSION_ID', '')}", f"os_codename={var('VERSION_CODENAME', '')}",
             f"kernel={uname.release}", f"arch={uname.machine}", f"user={_user()}", f"uid={os.geteuid()}",
             f"cpu_model={_cpu_model()}", f"cpu_cores={os.sysconf('SC_NPROCESSORS_ONLN')}",
             f"ram_bytes={_ram_bytes()}", f"disk_free_bytes={_disk_free_bytes()}",
             f"systemd={int(os.path.isdir('/run/systemd/system'))}",
             f"sudo={int(sudo is not None and sudo.answer()[0] == 0)}"]
    if version is not None and info is not None:
        lines += ["docker_installed=1", f"docker_client={_substituted(version.answer()[1])}"]
        code, out, _ = info.answer()
        out = _substituted(out)
        if code == 0:
            lines += ["docker_usable=1", f"docker_info={out}"]
        else:
            # docker version says why (no daemon, or a socket this user may not open); info's --format hides it
            why = _last_line(_Asked(engine.server_version_argv(), keep_stdout=False).answer()[2])
            lines += ["docker_usable=0", f"docker_error={_last_line(why or out)}"]
    else:
        lines.append("docker_installed=0")
    if gpus is not None:
        lines.append("nvidia_smi=1")
        lines += [f"gpu={line}" for line in gpus.answer()[1].splitlines()]
    else:
        lines.append("nvidia_smi=0")
    lines.append(f"nvidia_ctk={int(shutil.which('nvidia-ctk') is not None)}")
    return "\n".join(lines) + "\n"
