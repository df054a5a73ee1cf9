"""One engine: engine.py is the only module that speaks to Docker (imports docker-py or builds a
docker command line); what it offers over a fake host; the host scripts are clean under shellcheck."""

from __future__ import annotations

import ast
import io
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import launcher
from launcher.hosts import engine
from launcher.hosts.base import Host, HostProcess
from launcher.hosts.containerspec import ContainerSpec, Mount
from launcher.hosts.scripts import text as host_script
from launcher.proc import Completed

PACKAGE = Path(launcher.__file__).parent
ENGINE = PACKAGE / "hosts" / "engine.py"
DOCKER_API = PACKAGE / "hosts" / "dockerapi.py"


class FakeProcess:
    def __init__(self, out: bytes, rc: int = 0, err: str = "") -> None:
        self._in, self._out, self._rc, self._err = io.BytesIO(), io.BytesIO(out), rc, err
        self._in.close = lambda: None  # type: ignore[method-assign]  # keep what was written readable
        self.killed = False

    @property
    def stdin(self) -> io.BytesIO:
        return self._in

    @property
    def stdout(self) -> io.BytesIO:
        return self._out

    def wait(self, timeout: float | None = None) -> int:
        return self._rc

    def stderr_text(self) -> str:
        return self._err

    def kill(self) -> None:
        self.killed = True


class StartHost(Host):
    """Records each started argv and answers with one FakeProcess."""

    kind = "ssh"

    def __init__(self, process: FakeProcess) -> None:
        self.name = "fake"
        self.process = process
        self.started: list[list[str]] = []
        self.ran: list[list[str]] = []

    def run(self, argv: Sequence[str], *, input: bytes | None = None, check: bool = True,
            timeout: float | None = None) -> Completed:
        self.ran.append(list(argv))
        return Completed(tuple(argv), 0, b"launcher-python 3.11\n", b"")

    def start(self, argv: Sequence[str], *, bulk: bool = False, merge_stderr: bool = False) -> HostProcess:
        self.started.append(list(argv))
        return self.process

    def put_file(self, local: Path, remote: str) -> None:
        raise NotImplementedError

    def get_file(self, remote: str, local: Path) -> None:
        raise NotImplementedError

    def home(self) -> str:
        return "/home/fake"

    def runs_root(self) -> str:
        return "/home/fake/.launcher/runs"


def test_import_tar_streams_the_tarball_and_answers_the_id(tmp_path: Path) -> None:
    tarball = tmp_path / "rootfs.tar"
    tarball.write_bytes(b"x" * 3_000_000)
    host = StartHost(FakeProcess(b"sha256:abc\n"))
    done = engine.Engine(host).import_tar(tarball, "127.0.0.1:5000/base:bookworm", changes=['CMD ["python3"]'])
    assert host.started == [["docker", "import", "--change", 'CMD ["python3"]', "-", "127.0.0.1:5000/base:bookworm"]]
    assert host.process.stdin.getvalue() == tarball.read_bytes()
    assert done.returncode == 0 and done.out.strip() == "sha256:abc"


def test_import_tar_failure_is_its_exit_code_and_words(tmp_path: Path) -> None:
    tarball = tmp_path / "rootfs.tar"
    tarball.write_bytes(b"")
    done = engine.Engine(StartHost(FakeProcess(b"", 1, "no space left\n"))).import_tar(tarball, "t:1")
    assert done.returncode == 1 and done.last_error_line() == "no space left"


def test_run_to_end_is_a_named_rm_container() -> None:
    host = StartHost(FakeProcess(b""))
    engine.Engine(host).run_to_end(ContainerSpec("img", ("python3", "-c", "pass"), network="none"))
    argv = host.ran[0]
    assert argv[:4] == ["docker", "run", "--rm", "--name"] and argv[4].startswith("launcher-tool-")
    assert argv[5:] == ["--network", "none", "img", "python3", "-c", "pass"]


def test_a_spec_renders_every_field_once_and_reads_back_the_same() -> None:
    spec = ContainerSpec("sha256:img", ("python", "-m", "x", "--flag", "-e"), name="launcher-r1", labels={"l": "v"},
                         env={"B": "2", "A": "x=y"}, env_from_caller=("SECRET",), env_file="/r/secret.env",
                         mounts=(Mount("/h/out", "/launcher/out"), Mount("/h/data", "/launcher/data", True)),
                         network="launcher-net", hostname="node0", platform="linux/amd64", user="1000:1000",
                         workdir="/launcher/out", entrypoint="python", gpus="all", detach=True)
    argv = engine.render(spec)
    assert argv[:3] == ["docker", "run", "-d"] and argv[-6:] == ["sha256:img", "python", "-m", "x", "--flag", "-e"]
    assert argv.index("A=x=y") < argv.index("B=2")  # sorted: the same spec always gives the same line
    assert engine.spec_from_argv(argv) == spec
    assert ContainerSpec.from_record(spec.to_record()) == spec
    assert engine.render_shell(spec).splitlines()[0] == "docker run -d \\"


@given(st.builds(
    ContainerSpec, image=st.sampled_from(["img", "sha256:" + "a" * 64, "127.0.0.1:5000/x@sha256:" + "b" * 64]),
    command=st.lists(st.text(min_size=1), max_size=4).map(tuple),
    name=st.none() | st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True),
    env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), st.text(), max_size=4),
    mounts=st.lists(st.builds(Mount, st.from_regex(r"/[a-z0-9/._-]{0,12}", fullmatch=True),
                              st.from_regex(r"/[a-z0-9/._-]{0,12}", fullmatch=True), st.booleans()),
                    max_size=3).map(tuple),
    network=st.none() | st.sampled_from(["none", "bridge", "launcher-x"]), detach=st.booleans(),
    remove=st.booleans(), stdin=st.booleans(), gpus=st.none() | st.just("all")))
@settings(max_examples=200, derandomize=True, database=None)
def test_any_spec_reads_back_from_its_command_line(spec: ContainerSpec) -> None:
    """What an older launcher's launch record kept (the rendered command line) gives back the spec it came from."""
    assert engine.spec_from_argv(engine.render(spec)) == spec


def test_installed_follows_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not engine.installed()
    (tmp_path / "docker").write_text("#!/bin/sh\n")
    (tmp_path / "docker").chmod(0o755)
    assert engine.installed()


# ------------------------------------------------------------ the rule, checked on the package

RAY_JOB = PACKAGE / "hosts" / "scripts" / "ray_job.py"  # runs on a Ray node, as slurm_task.sh runs on a Slurm node


def _python_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p not in (ENGINE, DOCKER_API, RAY_JOB))


def test_only_engine_imports_docker() -> None:
    offenders = []
    for path in sorted(p for p in PACKAGE.rglob("*.py") if p != DOCKER_API):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "docker" or n.startswith("docker.") for n in names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], "only launcher/hosts/dockerapi.py may import docker"


# Options only `docker run` (and `docker create`) has: a module that writes one composes a container's command line.
# (`--env` is launcher's own option too, so `-e`/`--env` are left to the argv checks above.)
RUN_ONLY_FLAGS = {"--rm", "--network", "--net", "--entrypoint", "--gpus", "--env-file", "--label", "--hostname",
                  "--volume", "--mount", "--security-opt", "--cap-add", "--cap-drop", "--cgroupns", "--privileged",
                  "--publish", "--detach", "--interactive", "--workdir", "--restart", "--shm-size", "--ipc",
                  "--ulimit", "--device", "--runtime", "--add-host", "--pid", "--tmpfs"}


def container_flags(source: str, rel: str) -> list[str]:
    """Where a module (other than the engine) writes a container's option or builds docker argv itself: a docker
    run-only option as a string (not in a message or docstring), or a call of the engine's `command`."""
    tree = ast.parse(source, rel)
    skip = _error_calls(tree) | _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            flag = node.value.split("=", 1)[0]
            if flag in RUN_ONLY_FLAGS:
                found.append(f"{rel}:{node.lineno}: the docker run option {flag}")
        if isinstance(node, ast.ImportFrom) and node.module == "launcher.hosts.engine" \
                and any(a.name == "command" for a in node.names):
            found.append(f"{rel}:{node.lineno}: imports the engine's command()")
        if isinstance(node, ast.Attribute) and node.attr == "command" and isinstance(node.value, ast.Name) \
                and node.value.id in ("engine", "docker_engine"):
            found.append(f"{rel}:{node.lineno}: calls engine.command()")
    return sorted(found, key=lambda hit: int(hit.split(":")[1]))


def test_no_module_but_engine_writes_a_container_option() -> None:
    found = [hit for path in _python_files() if path.name != "containerspec.py"
             for hit in container_flags(path.read_text(), path.relative_to(PACKAGE).as_posix())]
    assert found == [], "build a ContainerSpec (launcher.hosts.containerspec) and let the Engine run it"


def test_the_option_check_finds_what_it_looks_for() -> None:
    sample = ('from launcher.hosts import engine\n'
              'argv = ["--network", "none", "img"]\n'
              'x = engine.command("ps")\n'
              'raise ValueError("pass --network none")\n'
              'opt = "--gpus=all"\n'
              'ok = ["ssh", "-e", "none"]\n')
    assert [h.split(": ", 1)[0] for h in container_flags(sample, "m.py")] == ["m.py:2", "m.py:3", "m.py:5"]


SUBCOMMANDS = ("run", "load", "save", "pull", "push", "image", "images", "info", "import", "rm", "rmi", "stop",
               "inspect", "tag", "ps", "logs", "build", "version", "exec", "container", "system", "volume",
               "network", "start", "kill", "cp", "create", "commit", "export", "login", "history", "wait")
# A docker command as shell text: `docker SUBCOMMAND` where a command starts.
DOCKER_COMMAND = re.compile(r"(?:^|[;&|({]\s*|\bthen\s+|\bdo\s+|\$\(\s*|\bsudo\s+)docker\s+(?:"
                            + "|".join(SUBCOMMANDS) + r")\b")
# Shell text allowed outside the engine and the script files, by file and a piece of it (none now).
ALLOWED_TEXT: set[tuple[str, str]] = set()


def _error_calls(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are arguments of an exception's constructor or a cut=/hint=."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        args = [*node.args] if name[:1].isupper() else []
        args += [k.value for k in node.keywords if k.arg in ("cut", "hint", "why", "summary", "help")]
        for arg in args:
            inside.update(id(n) for n in ast.walk(arg))
    return inside


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            out.add(id(first.value))
    return out


def docker_command_text(source: str, rel: str) -> list[str]:
    """Where the module (source, at rel in the package) builds a docker command line: an argv literal
    ["docker", SUBCOMMAND, ...], or shell text running `docker ...`, other than a message to the user
    (in backticks, an error's words, a docstring)."""
    tree = ast.parse(source, rel)
    skip = _error_calls(tree) | _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            words = [e.value for e in node.elts[:2] if isinstance(e, ast.Constant)]
            if words[:1] == ["docker"] and (len(node.elts) == 1 or (words[1:] and words[1] in SUBCOMMANDS)):
                found.append(f"{rel}:{node.lineno}: an argv starting with docker")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = re.sub(r"`[^`]*`", "", node.value)  # a command the user is told to type
            if DOCKER_COMMAND.search(text) and not any(rel == f and piece in text for f, piece in ALLOWED_TEXT):
                found.append(f"{rel}:{node.lineno}: {node.value[:60]!r}")
    return sorted(found, key=lambda hit: int(hit.split(":")[1]))


def test_no_module_but_engine_builds_a_docker_command() -> None:
    found = [hit for path in _python_files()
             for hit in docker_command_text(path.read_text(), path.relative_to(PACKAGE).as_posix())]
    assert found == [], "run Docker through launcher.hosts.engine.Engine, or from a script in hosts/scripts"


def test_the_check_finds_what_it_looks_for() -> None:
    sample = ('import subprocess\n'
              'subprocess.run(["docker", "ps"])\n'
              'SCRIPT = "set -e; docker load -q < x"\n'
              'raise ValueError(f"docker load of {1} failed", "run `docker image prune`")\n'
              'HINT = "remove it with `docker rmi IMAGE`"\n'
              'RUNTIMES = ("docker", "pyxis")\n'
              'LINE = f"x=$(docker image inspect {1})"\n')
    assert [h.split(": ", 1)[0] for h in docker_command_text(sample, "m.py")] == ["m.py:2", "m.py:3", "m.py:7"]


def test_load_staged_runs_the_stage_script_with_its_values_as_arguments() -> None:
    host = StartHost(FakeProcess(b""))
    engine.Engine(host).load_staged("/st", ["000.empty"], '[{"x": 1}]', ["000.empty", "001.tar.gz"], b"{}")
    assert host.ran == [["sh", "-c", host_script("stage_load.sh"), "sh", "/st", "000.empty", '[{"x": 1}]',
                         "000.empty 001.tar.gz"]]
