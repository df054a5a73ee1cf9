"""What a host is (the fact sheet) and what it lacks (the install plan).

Facts come from one read-only shell script run on the host (launcher/hosts/scripts/facts.sh).
The install plan is computed from the facts, so running it again on a ready host plans
nothing: it is idempotent by construction. GPU steps follow NVIDIA's Container Toolkit
instructions for Ubuntu/Debian.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from launcher.errors import HostNotReady
from launcher.hashing import atomic_write_json
from launcher.hosts.base import Host, HostDescription
from launcher.hosts.scripts import text as host_script
from launcher.proc import Completed
from launcher.workspace import Workspace


class GpuFacts(TypedDict):
    """One GPU of a fact sheet (facts.sh's ``gpu=NAME, DRIVER, MEMORY`` line)."""

    name: str
    driver: str
    memory: str


class DockerFacts(TypedDict):
    """The Docker part of a fact sheet: installed, usable by this user, its server and runtimes."""

    installed: bool
    usable: bool
    client: str
    server_version: str | None
    runtimes: list[str]
    root_dir: NotRequired[str]  # only where the daemon answered
    nvidia_runtime: bool
    error: NotRequired[str]  # why the daemon did not answer this user


class NvidiaFacts(TypedDict):
    """The NVIDIA part of a fact sheet: nvidia-smi, its GPUs and driver, the Container Toolkit."""

    smi: bool
    gpus: list[GpuFacts]
    driver: str | None
    container_toolkit: bool


class NoFacts(TypedDict):
    """The fact sheet of a host or node that wrote none: {}."""


class HostFacts(TypedDict):
    """A host's fact sheet (``parse_facts`` of facts.sh's output): the workspace's
    ``hosts/<name>.json``, a manifest's ``host.facts`` and a Slurm node's ``node_facts``."""

    os: str | None
    os_id: str | None
    os_version: str | None
    os_codename: str | None
    kernel: str | None
    arch: str | None
    user: str | None
    is_root: bool
    systemd: bool
    sudo: bool
    cpu_model: str | None
    cpu_cores: int | None
    ram_bytes: int | None
    disk_free_bytes: int | None
    docker: DockerFacts
    nvidia: NvidiaFacts
    host: NotRequired[HostDescription]  # the host it was read on (gather_facts; not a Slurm node's)


def _facts_lines(text: str) -> tuple[dict[str, str], list[GpuFacts]]:
    """facts.sh's key=value lines, and its gpu= lines (one per GPU)."""
    raw: dict[str, str] = {}
    gpus: list[GpuFacts] = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "gpu":
            parts = [p.strip() for p in value.split(",")]
            gpus.append({"name": parts[0], "driver": parts[1] if len(parts) > 1 else "",
                         "memory": parts[2] if len(parts) > 2 else ""})
        else:
            raw[key] = value.strip()
    return raw, gpus


def _docker_facts(raw: Mapping[str, str]) -> DockerFacts:
    installed, usable, client = raw.get("docker_installed") == "1", raw.get("docker_usable") == "1", raw.get(
        "docker_client", "")
    docker: DockerFacts
    if "docker_info" in raw:
        version, _, rest = raw["docker_info"].partition("|")
        runtimes_json, _, root = rest.rpartition("|")
        try:
            runtimes = sorted(json.loads(runtimes_json or "{}"))
        except ValueError:
            runtimes = []
        docker = {"installed": installed, "usable": usable, "client": client, "server_version": version,
                  "runtimes": runtimes, "root_dir": root, "nvidia_runtime": "nvidia" in runtimes}
    else:
        docker = {"installed": installed, "usable": usable, "client": client, "server_version": None,
                  "runtimes": [], "nvidia_runtime": False}
    if "docker_error" in raw:
        docker["error"] = raw["docker_error"]
    return docker


def parse_facts(text: str) -> HostFacts:
    """The fact sheet from facts.sh's output."""
    raw, gpus = _facts_lines(text)

    def num(key: str) -> int | None:
        v = raw.get(key, "")
        return int(v) if v.isdigit() else None

    return {
        "os": raw.get("os"),
        "os_id": raw.get("os_id"),
        "os_version": raw.get("os_version"),
        "os_codename": raw.get("os_codename"),
        "kernel": raw.get("kernel"),
        "arch": raw.get("arch"),
        "user": raw.get("user"),
        "is_root": raw.get("uid") == "0",
        "systemd": raw.get("systemd") == "1",
        "sudo": raw.get("sudo") == "1",
        "cpu_model": raw.get("cpu_model") or None,
        "cpu_cores": num("cpu_cores"),
        "ram_bytes": num("ram_bytes"),
        "disk_free_bytes": num("disk_free_bytes"),
        "docker": _docker_facts(raw),
        "nvidia": {
            "smi": raw.get("nvidia_smi") == "1",
            "gpus": gpus,
            "driver": gpus[0]["driver"] if gpus else None,
            "container_toolkit": raw.get("nvidia_ctk") == "1",
        },
    }


def gather_facts(host: Host) -> HostFacts:
    if host.kind == "local":  # this machine: facts.sh's lines read in this process, its slow questions at once
        from launcher.hosts import localfacts

        done = Completed(("facts.sh",), 0, localfacts.sheet().encode(), b"")
    else:
        done = host.fact_sheet()
    if not done.out.strip():
        raise HostNotReady(
            f"could not read facts from {host.name}: {done.last_error_line()}",
            "check that the host runs a POSIX shell",
        )
    facts = parse_facts(done.out)
    facts["host"] = host.describe()
    return facts


def save_facts(ws: Workspace, host: Host, facts: HostFacts) -> None:
    atomic_write_json(ws.host_facts(host.name), facts)


def facts_for_run(ws: Workspace, host: Host) -> HostFacts:
    """Fresh facts for the manifest, also kept as the host's fact sheet."""
    facts = gather_facts(host)
    save_facts(ws, host, facts)
    return facts


@dataclass(frozen=True)
class Step:
    why: str
    command: str  # run with `sh -c` on the host; shown as is by --dry-run

    def to_dict(self) -> StepRecord:
        return {"why": self.why, "command": self.command}


class StepRecord(TypedDict):
    """A planned install step as provision's JSON output lists it."""

    why: str
    command: str


class ExecutedStep(StepRecord):
    """An install step that ran (provision --install): its exit code, and apt's or the command's error."""

    exit_code: int
    error: str | None


class ProvisionReport(TypedDict):
    """provision's JSON output (``Provisioned.to_dict``): the facts, the plan, what ran."""

    facts: HostFacts
    plan: list[StepRecord]
    executed: list[ExecutedStep]
    dry_run: bool


class ProvisionListing(ProvisionReport):
    """`provision`'s Result data: the report, with the host, whether it is ready and where its facts went."""

    host: str
    ready: bool
    facts_file: str


NVIDIA_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
NVIDIA_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
DOCKERD_LOG = "/var/log/dockerd.log"
DOCKERD_WAIT_S = 60


def docker_down(docker: DockerFacts) -> bool:
    """Docker is installed but no daemon answers (not merely a socket this user may not open)."""
    error = str(docker.get("error") or "").lower()
    return bool(docker.get("installed")) and not docker.get("usable") and "cannot connect to the docker daemon" in error


def start_docker(facts: HostFacts, *, restart: bool = False) -> list[Step]:
    """Start (or restart) the Docker daemon: through systemd where it runs the services; elsewhere (a
    container, WSL, an init without units) dockerd in its own session in the background, logging to
    DOCKERD_LOG, then wait until `docker info` answers. Such a daemon does not come back after a
    reboot: provision --install starts it again (an installed Docker that does not answer is planned)."""
    sudo = "" if facts.get("is_root") else "sudo "
    if facts.get("systemd"):
        if restart:
            return [Step("restart Docker to load the runtime", f"{sudo}systemctl restart docker")]
        return [Step("start Docker now and at boot", f"{sudo}systemctl enable --now docker")]

    def dockerd(action: str) -> str:  # hosts/scripts/dockerd.sh, its values as arguments
        return f"{sudo}sh -c {shlex.quote(host_script('dockerd.sh'))} sh {action} {DOCKERD_LOG} {DOCKERD_WAIT_S}"

    steps = []
    if restart:
        steps.append(Step("stop Docker to load the runtime (no systemd here)", dockerd("stop")))
    return [
        *steps,
        Step("start Docker in the background (no systemd here: not at boot; provision --install starts it again)",
             dockerd("start")),
        Step(f"wait until Docker answers (at most {DOCKERD_WAIT_S} s)", dockerd("wait")),
    ]


def install_plan(facts: HostFacts, *, gpu: bool = False) -> list[Step]:
    """The commands that bring the host to: Docker usable by the user (and, with gpu, the NVIDIA runtime)."""
    os_id = str(facts.get("os_id") or "")
    if os_id not in ("ubuntu", "debian"):
        raise HostNotReady(
            f"automatic install supports Ubuntu and Debian, not {facts.get('os') or os_id}",
            "install Docker (and the NVIDIA Container Toolkit) by hand, then rerun provision",
        )
    return _docker_steps(facts) + (_gpu_steps(facts) if gpu else [])


def _docker_steps(facts: HostFacts) -> list[Step]:
    """Docker installed (or started, where it is installed but no daemon answers) and usable without sudo."""
    sudo = "" if facts.get("is_root") else "sudo "
    user = facts.get("user") or "$USER"
    docker = facts["docker"]
    steps: list[Step] = []
    if not docker.get("installed"):
        steps += [
            Step("refresh the package lists", f"{sudo}apt-get update"),
            Step(
                "install the Docker engine",
                f"{sudo}env DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io",
            ),
            *start_docker(facts),
        ]
    elif docker_down(docker):
        steps += start_docker(facts)
    if not facts.get("is_root") and not docker.get("usable"):
        steps.append(
            Step(
                f"let {user} use Docker without sudo (takes effect on the next login)",
                f"{sudo}usermod -aG docker {user}",
            )
        )
    return steps


def _gpu_steps(facts: HostFacts) -> list[Step]:
    """The NVIDIA driver, the Container Toolkit and its runtime registered with Docker, each where missing."""
    sudo = "" if facts.get("is_root") else "sudo "
    nvidia = facts["nvidia"]
    steps: list[Step] = []
    if not nvidia.get("smi"):
        steps += [
            Step(
                "install the NVIDIA driver recommended for this GPU",
                f"{sudo}apt-get install -y ubuntu-drivers-common && {sudo}ubuntu-drivers install",
            ),
        ]
    if not nvidia.get("container_toolkit"):
        steps += [
            Step(
                "add NVIDIA's package signing key",
                "curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey | "
                f"{sudo}gpg --dearmor --yes -o {NVIDIA_KEYRING}",
            ),
            Step(
                "add the NVIDIA Container Toolkit repository",
                "curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/"
                "nvidia-container-toolkit.list | sed 's#deb https://#deb "
                f"[signed-by={NVIDIA_KEYRING}] https://#g' | {sudo}tee {NVIDIA_LIST} >/dev/null",
            ),
            Step("refresh the package lists", f"{sudo}apt-get update"),
            Step(
                "install the NVIDIA Container Toolkit",
                f"{sudo}env DEBIAN_FRONTEND=noninteractive apt-get install -y nvidia-container-toolkit",
            ),
        ]
    if not facts["docker"].get("nvidia_runtime"):
        steps += [
            Step(
                "register the NVIDIA runtime with Docker",
                f"{sudo}nvidia-ctk runtime configure --runtime=docker",
            ),
            *start_docker(facts, restart=True),
        ]
    return steps


@dataclass
class Provisioned:
    facts: HostFacts
    plan: list[Step]
    executed: list[ExecutedStep]
    dry_run: bool

    @property
    def ready(self) -> bool:
        return not self.plan or (bool(self.executed) and all(e["exit_code"] == 0 for e in self.executed))

    def to_dict(self) -> ProvisionReport:
        return {
            "facts": self.facts,
            "plan": [s.to_dict() for s in self.plan],
            "executed": self.executed,
            "dry_run": self.dry_run,
        }


def _step_error(done: Completed) -> str:
    """apt's first error names the cause (an unreachable mirror, a package it cannot find); its last is
    generic ("Unable to fetch some archives"). Other commands: their last line."""
    for line in done.err.splitlines():
        if line.startswith("E: "):
            return line.strip()
    return done.last_error_line()


def provision(
    ws: Workspace, host: Host, *, gpu: bool = False, install: bool = False, dry_run: bool = False
) -> Provisioned:
    """Read the facts, plan what is missing, run the plan when asked (never with dry_run)."""
    facts = gather_facts(host)
    if install or dry_run:
        plan = install_plan(facts, gpu=gpu)
    else:
        try:
            plan = install_plan(facts, gpu=gpu)
        except HostNotReady:
            plan = []
    executed: list[ExecutedStep] = []
    if install and not dry_run:
        for step in plan:
            done = host.run(["sh", "-c", step.command], check=False, timeout=1800)
            error = _step_error(done) if done.returncode else None
            executed.append({"why": step.why, "command": step.command, "exit_code": done.returncode, "error": error})
            if done.returncode != 0:
                save_facts(ws, host, facts)
                raise HostNotReady(
                    f"install step failed on {host.name}: {step.command}: {error}",
                    "fix the cause on the host and run provision --install again",
                )
        if plan:
            facts = gather_facts(host)
    save_facts(ws, host, facts)
    return Provisioned(facts=facts, plan=plan, executed=executed, dry_run=dry_run)
