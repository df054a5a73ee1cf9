"""Docker on a host: the one module of launcher that speaks to Docker.

One class for the local engine and a remote one: an :class:`Engine` runs over a
:class:`~launcher.hosts.base.Host`, builds each `docker` argv here and runs it through that host.
The builder's classic build needs the engine's build API, which the CLI does not offer without
BuildKit: the functions at the end (:func:`build`, :func:`inspect`, ...) reach the local engine
through docker-py, imported there and nowhere else. Scripts that run Docker on a host by
themselves (the Slurm task, the staged load, the node probe, provision's dockerd) are files
under launcher/hosts/scripts.
"""

from __future__ import annotations

import json
import shlex
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, TypedDict, cast

from launcher import memo
from launcher.errors import (
    EngineUnavailable,
    HostNotReady,
    NotFound,
    RegistryAuthFailed,
    RegistryLoginNeeded,
)
from launcher.hosts.base import Host, HostProcess
from launcher.hosts.containerspec import ContainerSpec, Mount
from launcher.hosts.local import LocalHost
from launcher.hosts.scripts import text as host_script
from launcher.proc import Completed

DOCKER = "docker"
_IMAGE_JSON = "local image JSON"  # memo key: holds_image's answer kept for inspect_image
_IMAGE_ASKED = "local image asked"  # memo key: ask_image's answer kept for holds_image


# What docker prints when a registry wants credentials the user has none of (Basic), or refuses those
# given or found missing (a token registry says the same for both). "pull access denied ... may require
# 'docker login'" is left to the caller: Docker Hub says it of a repository that does not exist too.
_NO_CREDENTIALS = ("no basic auth credentials",)
_REFUSED = ("unauthorized: authentication required", "unauthorized: incorrect username or password",
            "denied: requested access to the resource is denied")


# What docker prints when the registry cannot be reached at all (a name that does not resolve, a port nobody
# listens on, no route, a timeout), as opposed to a registry that answers "not found" or "denied".
_UNREACHABLE = ("no such host", "connection refused", "i/o timeout", "network is unreachable", "no route to host",
                "tls handshake timeout", "context deadline exceeded", "temporary failure in name resolution",
                "server misbehaving", "connection reset by peer")


def registry_unreachable(error: str) -> bool:
    """Whether a docker pull or push error says the registry could not be reached (not that it refused)."""
    low = error.lower()
    return any(s in low for s in _UNREACHABLE)


def registry_of(ref: str) -> str:
    """The registry an image reference names, as docker reads it (Docker Hub: docker.io)."""
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return "docker.io" if first == "index.docker.io" else first
    return "docker.io"


def command(*args: str) -> list[str]:
    """A `docker` argv."""
    return [DOCKER, *args]


SERVER_VERSION = "{{.Server.Version}}"


def client_version_argv() -> list[str]:
    """`docker --version`: the client's version (the local fact sheet asks it in its own process)."""
    return command("--version")


def info_argv(fmt: str) -> list[str]:
    """`docker info --format FMT`: the server's facts."""
    return command("info", "--format", fmt)


def server_version_argv() -> list[str]:
    """`docker version` of the server: where it fails, its error says why (info's --format hides it)."""
    return command("version", "--format", SERVER_VERSION)


def render(spec: ContainerSpec) -> list[str]:
    """The `docker run` command line of a container spec: the one place a container's flags are written."""
    return [token for group in _groups(spec) for token in group]


def render_shell(spec: ContainerSpec) -> str:
    """The command line as one shell command, an option per line (what `launcher env` prints)."""
    return " \\\n    ".join(shlex.join(group) for group in _groups(spec))


def _groups(spec: ContainerSpec) -> list[list[str]]:
    """render's tokens in groups: `docker run` and its switches, each option with its value, the image and command."""
    head = command("run") + [flag for flag, on in (("-d", spec.detach), ("--rm", spec.remove), ("-i", spec.stdin))
                             if on]
    options = [[flag, value] for flag, value in (
        ("--name", spec.name), ("--hostname", spec.hostname), ("--network", spec.network),
        ("--platform", spec.platform), ("--user", spec.user), ("-w", spec.workdir), ("--entrypoint", spec.entrypoint))
        if value is not None]
    options += [["--label", f"{key}={value}"] for key, value in sorted(spec.labels.items())]
    options += [["-e", f"{key}={value}"] for key, value in sorted(spec.env.items())]
    options += [["-e", key] for key in spec.env_from_caller]
    options += [["--env-file", spec.env_file]] if spec.env_file is not None else []
    options += [["-v", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")] for m in spec.mounts]
    options += [["--gpus", spec.gpus]] if spec.gpus is not None else []
    return [head, *options, [spec.image, *spec.command]]


# `docker run` options with a value, as render writes them, for reading back a command line an older launcher kept
_VALUED = {"--name": "name", "--hostname": "hostname", "--network": "network", "--platform": "platform",
           "--user": "user", "-w": "workdir", "--entrypoint": "entrypoint", "--env-file": "env_file", "--gpus": "gpus"}


def spec_from_argv(argv: Sequence[str]) -> ContainerSpec:
    """The container spec of a `docker run` command line that render wrote (a launch record of an older launcher
    kept the command line itself); ValueError for anything else."""
    args = [str(a) for a in argv]
    if args[:2] != command("run"):
        raise ValueError(f"not a docker run command line: {args[:3]}")
    fields: dict[str, Any] = {}
    labels: dict[str, str] = {}
    env: dict[str, str] = {}
    from_caller: list[str] = []
    mounts: list[Mount] = []
    i = 2
    while i < len(args) and args[i].startswith("-"):
        flag = args[i]
        if flag in ("-d", "--rm", "-i"):
            fields[{"-d": "detach", "--rm": "remove", "-i": "stdin"}[flag]] = True
            i += 1
            continue
        if i + 1 >= len(args):
            raise ValueError(f"{flag} has no value")
        value = args[i + 1]
        if flag in _VALUED:
            fields[_VALUED[flag]] = value
        elif flag == "--label":
            key, _, val = value.partition("=")
            labels[key] = val
        elif flag == "-e":
            key, eq, val = value.partition("=")
            if eq:
                env[key] = val
            else:
                from_caller.append(key)
        elif flag == "-v":
            source, target, *mode = value.split(":")
            mounts.append(Mount(source, target, mode == ["ro"]))
        else:
            raise ValueError(f"{flag} is not an option launcher writes")
        i += 2
    if i >= len(args):
        raise ValueError("the command line names no image")
    return ContainerSpec(image=args[i], command=tuple(args[i + 1:]), labels=labels, env=env,
                         env_from_caller=tuple(from_caller), mounts=tuple(mounts), **fields)


def installed() -> bool:
    """Whether the docker command is on this machine's PATH."""
    return shutil.which(DOCKER) is not None


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """Docker's layer chain IDs: chain[0] = diff[0], chain[i] = sha256(chain[i-1] + " " + diff[i])."""
    import hashlib

    out: list[str] = []
    for diff in diff_ids:
        out.append(diff if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {diff}".encode()).hexdigest())
    return out


def _security_options(out: str) -> list[str]:
    """`docker info --format '{{json .SecurityOptions}}'`'s answer as a list (the text itself if not one)."""
    try:
        opts = json.loads(out)
    except ValueError:
        return [out]
    return [str(o) for o in opts] if isinstance(opts, list) else [out]


class ContainerState(TypedDict):
    """A container's state as `docker inspect --format '{{json .State}}'` gives it (the fields read)."""

    Status: str  # created, running, exited, dead, ...
    Running: bool
    ExitCode: int
    StartedAt: str
    FinishedAt: str


class Engine:
    """The Docker engine of one host."""

    def __init__(self, host: Host) -> None:
        self.host = host

    @property
    def where(self) -> str:
        return "the local Docker engine" if self.host.kind == "local" else f"Docker on {self.host.name}"

    def _run(self, *args: str, check: bool = False) -> Completed:
        """check: a failure means Docker does not answer (EngineUnavailable here, HostNotReady on a host)."""
        done = self.host.run(command(*args), check=False)
        if check and done.returncode != 0:
            self._unavailable(done)
        return done

    def _unavailable(self, done: Completed) -> NoReturn:
        if self.host.kind == "local":
            raise EngineUnavailable(f"no Docker engine answers ({done.last_error_line()})",
                                    "start it (`dockerd &` or `systemctl start docker`) or set DOCKER_HOST")
        raise HostNotReady(f"Docker on {self.host.name} does not answer: {done.last_error_line()}",
                           f"`launcher provision --host {self.host.name}` says what is missing")

    # ------------------------------------------------------------ engine

    def require(self) -> None:
        """HostNotReady unless the Docker server on the host answers."""
        self._answering(self._run("version", "--format", SERVER_VERSION))

    def require_options(self) -> list[str]:
        """The engine's security options (rootless, userns, ...), as require() checks that it answers: one
        call for both."""
        done = self._answering(self._run("info", "--format", "{{json .SecurityOptions}}"))
        return _security_options(done.out)

    def _answering(self, done: Completed) -> Completed:
        if done.returncode == 127 or "not found" in done.err:
            raise HostNotReady(
                f"Docker is not installed on {self.host.name}",
                f"install it with `launcher provision --host {self.host.name} --install`",
            )
        if done.returncode != 0:
            raise HostNotReady(
                f"Docker on {self.host.name} does not answer: {done.last_error_line()}",
                "start dockerd there, or add the user to the docker group "
                f"(`launcher provision --host {self.host.name}` says which)",
            )
        return done

    def root_dir(self) -> str:
        return self._run("info", "--format", "{{.DockerRootDir}}").out.strip() or "/var/lib/docker"

    def runtimes(self) -> str:
        """`docker info`'s runtimes as JSON text ("" when it cannot be told): a GPU needs "nvidia"."""
        return self._run("info", "--format", "{{json .Runtimes}}").out

    def security_options(self) -> list[str] | None:
        """The engine's security options (rootless, userns, ...); None when it cannot be told."""
        done = self._run("info", "--format", "{{json .SecurityOptions}}")
        return _security_options(done.out) if done.returncode == 0 else None

    # ------------------------------------------------------------ images

    def has_image(self, ref: str) -> bool:
        return self._run("image", "inspect", "--format", "{{.Id}}", ref).returncode == 0

    def holds_image(self, ref: str) -> bool:
        """Whether the engine holds ref, told apart from an engine that does not answer (EngineUnavailable
        here, HostNotReady on a host), which has_image reads as absent. Through the docker CLI: the
        module's image_exists goes through docker-py, whose import costs a quarter of a second."""
        keeping = self.host.kind == "local" and memo.active()  # for inspect_image's next look at ref
        asked = memo.take((_IMAGE_ASKED, ref)) if keeping else None  # ask_image's answer, asked ahead
        done = asked if isinstance(asked, Completed) else self._inspect_json(ref) if keeping else \
            self._run("image", "inspect", "--format", "{{.Id}}", ref)
        if done.returncode == 0:
            if keeping:
                memo.keep((_IMAGE_JSON, ref), json.loads(done.out))
            return True
        if "no such" in done.err.lower():
            return False
        self._unavailable(done)

    def ask_image(self, ref: str) -> None:
        """Ask the local engine about ref now, for holds_image(ref) to read later in the memo.kept() block (a
        run asks while git lists its code); nothing outside one."""
        if self.host.kind == "local" and memo.active():
            memo.keep((_IMAGE_ASKED, ref), self._inspect_json(ref))

    def _inspect_json(self, ref: str) -> Completed:
        return self._run("image", "inspect", "--format", "{{json .}}", ref)

    def inspect_image(self, ref: str) -> dict[str, Any]:  # Docker's image JSON, its schema Docker's
        """Docker's JSON of the image ref; the local engine's answer to holds_image(ref) just before, when
        a memo.kept() block keeps it (a run's check, then its ship, read the image once)."""
        if self.host.kind == "local" and (kept := memo.take((_IMAGE_JSON, ref))) is not None:
            return cast(dict[str, Any], kept)  # holds_image kept what this reads
        done = self._run("image", "inspect", "--format", "{{json .}}", ref)
        if done.returncode != 0:
            if "No such" in done.err or "no such" in done.err:
                raise NotFound(f"image {ref} is not in {self.where}", "build it first with `launcher build`")
            raise EngineUnavailable(f"{self.where} did not answer: {done.last_error_line()}",
                                    "start dockerd or set DOCKER_HOST")
        info: dict[str, Any] = json.loads(done.out)
        return info

    def image_ids(self, *, intermediate: bool = False) -> list[str]:
        """The ID of every image the engine holds (with intermediate: build steps' images too)."""
        flags = ["-a"] if intermediate else []
        return sorted(set(self._run("image", "ls", *flags, "-q", "--no-trunc", check=True).out.split()))

    def labelled_images(self, label: str) -> list[dict[str, Any]]:  # the rows cache.engine_images reads
        """Every image carrying label (untagged and intermediate ones too): id, tags, size in bytes,
        creation time and labels, oldest first."""
        listed = self._run("image", "ls", "-a", "-q", "--no-trunc", "--filter", f"label={label}", check=True)
        ids = set(listed.out.split())
        if not ids:
            return []
        done = self._run("image", "inspect", "--format", "{{json .}}", *sorted(ids))
        rows = []
        for line in done.out.splitlines():  # an image removed meanwhile is simply not listed
            if line.strip().startswith("{"):
                d = json.loads(line)
                rows.append({"id": d["Id"], "tags": d.get("RepoTags") or [], "bytes": int(d.get("Size") or 0),
                             "created": d.get("Created"), "labels": (d.get("Config") or {}).get("Labels") or {}})
        return sorted(rows, key=lambda r: str(r["created"]))

    def chain_ids(self) -> set[str]:
        """The chain ID of every layer of every image the engine holds."""
        ids = self.image_ids()
        if not ids:
            return set()
        out = self._run("image", "inspect", "--format", "{{json .RootFS.Layers}}", *ids, check=True).out
        chains: set[str] = set()
        for line in out.splitlines():
            if line.strip() and line.strip() != "null":
                chains.update(chain_ids(json.loads(line)))
        return chains

    def load(self) -> HostProcess:
        """Start `docker load -q`: write an image archive to its stdin, then wait for it."""
        return self.host.start(command("load", "-q"), bulk=True)

    def load_stream(self, *, cut: str | Callable[[], str], hint: str) -> AbstractContextManager[HostProcess]:
        """`docker load -q` over the host's bulk path, as Host.receive_stream: the block writes an
        image archive into its stdin, then waits for it; a cut stream raises TransferCut."""
        return self.host.receive_stream(command("load", "-q"), cut=cut, hint=hint)

    def save(self, ref: str) -> HostProcess:
        """Start `docker save ref`: read the archive from its stdout, then wait for it."""
        p = self.host.start(command("save", ref), bulk=True)
        p.stdin.close()
        return p

    def load_staged(self, stage: str, empties: Sequence[str], manifest: str, names: Sequence[str],
                    config: bytes, *, timeout: float = 3600) -> Completed:
        """`docker load` of an archive made on the host from its staging folder: the layer files in
        names (gzip blobs, and empty files made for the names in empties), the config (config) and
        manifest.json (hosts/scripts/stage_load.sh)."""
        return self.host.run(["sh", "-c", host_script("stage_load.sh"), "sh", stage, " ".join(empties), manifest,
                              " ".join(names)], input=config, check=False, timeout=timeout)

    def import_tar(self, tarball: Path, tag: str, *, changes: Sequence[str] = ()) -> Completed:
        """`docker import --change C... - tag`, the rootfs tarball written to its stdin; out: the image ID."""
        argv = command("import", *(a for c in changes for a in ("--change", c)), "-", tag)
        p = self.host.start(argv, bulk=True)
        try:
            with open(tarball, "rb") as f:
                shutil.copyfileobj(f, p.stdin, 1 << 20)
            p.stdin.close()
            out = p.stdout.read()
            err = p.stderr_text()
            rc = p.wait()
        except BaseException:
            p.kill()
            raise
        return Completed(tuple(argv), rc, out, err.encode())

    def tag(self, image_id: str, ref: str, *, check: bool = False) -> Completed:
        return self._run("tag", image_id, ref, check=check)

    def rmi(self, ref: str) -> Completed:
        return self._run("rmi", ref)

    def push(self, ref: str) -> Completed:
        """`docker push ref`, with the credentials of the host's user (docker reads ~/.docker/config.json and
        its credential helpers itself); RegistryLoginNeeded / RegistryAuthFailed when the registry wants a
        login the user lacks or refuses the one given, the Completed otherwise."""
        return self._registry_auth(self._run("push", ref), "push", ref)

    def pull(self, ref: str, *, platform: str | None = None) -> Completed:
        """`docker pull ref`, with the credentials of the host's user; errors as push's."""
        return self._registry_auth(self._run("pull", *(["--platform", platform] if platform else []), ref),
                                   "pull", ref)

    def _registry_auth(self, done: Completed, verb: str, ref: str) -> Completed:
        if done.returncode == 0:
            return done
        said = (done.err + "\n" + done.out).lower()
        registry = registry_of(ref)
        login = "docker login" if registry == "docker.io" else f"docker login {registry}"
        on = "" if self.host.kind == "local" else f" on {self.host.name}"
        if any(m in said for m in _NO_CREDENTIALS):
            raise RegistryLoginNeeded(f"registry {registry} needs a login to {verb} {ref}{on}", f"run `{login}`{on}")
        if any(m in said for m in _REFUSED):
            raise RegistryAuthFailed(f"registry {registry} refused `docker {verb} {ref}`{on}: {done.last_error_line()}",
                                     f"run `{login}`{on} (again, if the login there is stale), and check that it "
                                     f"may {verb} that repository")
        return done

    def pull_through_tunnel(self, ref: str, remote_port: int, local_address: str) -> Completed:
        """`docker pull ref` on the host while its 127.0.0.1:remote_port reaches local_address here."""
        return self.host.reverse_tunnel(remote_port, local_address, command("pull", ref))

    # ------------------------------------------------------------ containers

    def run(self, spec: ContainerSpec) -> Completed:
        """Start the container (detached, it returns once the engine has started it)."""
        return self.host.run(render(spec), check=False)

    def run_to_end(self, spec: ContainerSpec, *, input: bytes | None = None,
                   timeout: float | None = None) -> Completed:
        """Run a short-lived tool container in the foreground until it ends, removed after (the lock's pip-tools,
        a probe); past timeout the container is removed and TimedOut raised."""
        name = spec.name or f"launcher-tool-{uuid.uuid4().hex[:12]}"
        spec = replace(spec, name=name, remove=True, detach=False, stdin=spec.stdin or input is not None)
        try:
            return self.host.run(render(spec), input=input, check=False, timeout=timeout)
        except BaseException:
            self._run("rm", "-f", name)
            raise

    def container_state(self, name: str) -> ContainerState | None:
        done = self._run("inspect", "--format", "{{json .State}}", name)
        if done.returncode != 0:
            return None
        state = json.loads(done.out)
        return cast(ContainerState, state) if isinstance(state, dict) else None

    def container_states(self, names: Sequence[str]) -> dict[str, ContainerState]:
        """Several containers' states in one call, by name (a name the engine does not know is left out)."""
        done = self._run("inspect", "--format", "{{.Name}}\t{{json .State}}", *names)
        states: dict[str, ContainerState] = {}
        for line in done.out.splitlines():
            name, sep, raw = line.partition("\t")
            if sep:
                state = json.loads(raw)
                if isinstance(state, dict):
                    states[name.lstrip("/")] = cast(ContainerState, state)
        return states

    def network_create(self, name: str, labels: Mapping[str, str]) -> Completed:
        """A private bridge network its containers reach each other on by name."""
        return self._run("network", "create", *(a for k, v in labels.items() for a in ("--label", f"{k}={v}")), name)

    def network_rm(self, name: str) -> Completed:
        return self._run("network", "rm", name)

    def container_image(self, name: str) -> str | None:
        """The ID of the image the container runs."""
        done = self._run("inspect", "--format", "{{.Image}}", name)
        out = done.out.strip()
        return out if done.returncode == 0 and out.startswith("sha256:") else None

    def logs(self, name: str, *, follow: bool = False) -> Iterator[str]:
        """The container's output lines (stdout and stderr merged), newlines kept."""
        return self.host.iter_lines(command("logs", *(["--follow"] if follow else []), name))

    def wait(self, name: str) -> Completed:
        """`docker wait`: block until the container stops (at once if it has; an error if there is none)."""
        return self._run("wait", name)

    def stop(self, name: str, *, timeout_s: int = 10) -> Completed:
        return self._run("stop", "-t", str(timeout_s), name)

    def rm(self, name: str) -> Completed:
        return self._run("rm", name)

    def ps_by_label(self, label: str, fmt: str) -> list[str]:
        """One line in fmt per container, running or not, that carries label."""
        return self._run("ps", "-a", "--filter", f"label={label}", "--format", fmt).out.splitlines()

    def container_ids(self) -> list[str]:
        return self._run("ps", "-aq", check=True).out.split()

    def mount_sources(self, containers: Sequence[str]) -> set[str]:
        """The host paths the containers mount."""
        if not containers:
            return set()
        fmt = "{{range .Mounts}}{{.Source}}\n{{end}}"
        return set(self._run("inspect", "--format", fmt, *containers).out.split())


def local() -> Engine:
    """The local Docker engine, driven like any host's."""
    return Engine(LocalHost())
