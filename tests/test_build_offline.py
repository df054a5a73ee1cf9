"""Errors a person can read: no terminal escapes in any error launcher makes from captured output, and a
Dockerfile step that needs the network (builds run offline by design) explained in one line with what to
do instead. The last test builds for real: a cpu Dockerfile given `RUN apt-get install -y tree`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher.errors import BuildFailed, ExitCode, LockFailed, plain_text
from launcher.images import lock as lock_mod
from launcher.images import offline
from launcher.proc import CommandFailed, Completed
from launcher.workspace import Workspace

RED = "\x1b[91m"
RESET = "\x1b[0m"


def test_plain_text_drops_escapes_and_controls_but_keeps_text() -> None:
    text = f"{RED}E: Unable to locate package tree\n{RESET}\x1b]8;;http://x\x07link\x1b]8;;\x07 \x1b(Bok\x07\ttab"
    assert plain_text(text) == "E: Unable to locate package tree\nlink ok\ttab"
    assert plain_text("naïve — ü") == "naïve — ü"


def test_every_launcher_error_line_is_escape_free() -> None:
    exc = LockFailed(f"pip said {RED}ERROR: no{RESET}", f"do {RED}this{RESET}")
    exc.message += f" and {RED}more{RESET}"  # messages are extended after construction in places
    assert exc.one_line() == "pip said ERROR: no and more; fix: do this"
    done = Completed(("docker", "build"), 1, b"", f"step 1\n{RED}E: boom{RESET}\n".encode())
    assert done.last_error_line() == "E: boom"
    assert "\x1b" not in CommandFailed(done).one_line()


def test_lock_reasons_from_pip_output_are_escape_free() -> None:
    assert lock_mod._pip_reason(f"{RED}ERROR: No matching distribution found for nope{RESET}\n") == \
        "No matching distribution found for nope"


@pytest.mark.parametrize(("step", "apt", "pip", "needs"), [
    ("RUN apt-get update && apt-get install -y --no-install-recommends tree jq && rm -rf /var/lib/apt/lists/*",
     ["tree", "jq"], [], True),
    ("RUN DEBIAN_FRONTEND=noninteractive apt install -y libsndfile1", ["libsndfile1"], [], True),
    ("RUN pip install scikit-learn==1.7 'pandas>=2'", [], ["scikit-learn==1.7", "pandas>=2"], True),
    ("RUN python3 -m pip install -r /tmp/req.txt torch", [], ["torch"], True),
    ("RUN curl -fsSL https://example.org/x.sh | sh", [], [], True),
    ("RUN git clone https://github.com/x/y /opt/y", [], [], True),
    ("RUN python3 x/pip install --no-index --find-links /tmp/wheels -r /tmp/lock.txt", [], [], False),
    ("RUN /opt/venv/bin/pip install --no-index --find-links /tmp/wheels six", [], [], False),
    ("RUN python3 -m venv /opt/venv && echo ok", [], [], False),
])
def test_which_steps_need_the_network(step: str, apt: list[str], pip: list[str], needs: bool) -> None:
    assert offline.network_needs(step) == (apt, pip, needs)


def test_a_network_step_is_explained_with_the_way_to_add_packages() -> None:
    detail = "The command '/bin/sh -c apt-get install -y tree' returned a non-zero code: 100"
    exc = offline.build_failure("cpu", "RUN apt-get install -y tree", detail,
                                [f"{RED}E: Unable to locate package tree", RESET])
    line = exc.one_line()
    assert isinstance(exc, BuildFailed) and exc.exit_code == ExitCode.BUILD_FAILED
    assert "`RUN apt-get install -y tree` in dockerfiles/cpu.Dockerfile" in line
    assert "offline by design" in line
    assert '[system] apt = ["tree"]' in line and "`launcher lock PATH`" in line
    assert "requirements.in" in line and "lockfiles/cpu.in" in line
    assert "\x1b" not in line


def test_a_step_that_printed_a_resolver_failure_is_offline_too_and_others_are_not() -> None:
    exc = offline.build_failure("gpu", None, "The command '/bin/sh -c ./fetch-model.sh' returned a non-zero code: 6",
                                ["curl: (6) Could not resolve host: huggingface.co"])
    assert "`RUN ./fetch-model.sh`" in exc.one_line() and "offline by design" in exc.one_line()
    other = offline.build_failure("cpu", "RUN false", "The command '/bin/sh -c false' returned a non-zero code: 1",
                                  [f"{RED}boom{RESET}"])
    assert "offline" not in other.one_line()
    assert other.one_line().startswith("image build failed at `RUN false`: The command") and "\x1b" not in \
        other.one_line()


@pytest.mark.docker
@pytest.mark.registry
def test_a_dockerfile_that_installs_with_apt_fails_readably(make_workspace: Callable[..., Workspace],
                                                            tmp_path: Path) -> None:
    ws = make_workspace(tmp_path / "ws", recipes=False)
    ws.lock_txt("cpu").write_text("# nothing to install: the step before the venv fails first\n")
    dockerfile = ws.dockerfile("cpu")
    text = dockerfile.read_text()
    assert "ARG SOURCE_DATE_EPOCH\n" in text
    step = "ARG SOURCE_DATE_EPOCH\nRUN apt-get install -y tree\n"
    dockerfile.write_text(text.replace("ARG SOURCE_DATE_EPOCH\n", step, 1))
    env = {**os.environ, "LAUNCHER_CACHE": str(ws.cache_dir), "TERM": "xterm-256color"}
    done = subprocess.run([sys.executable, "-m", "launcher", "-w", str(ws.root), "build", "--variant", "cpu"],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == ExitCode.BUILD_FAILED, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, done.stderr
    line = errors[0]
    assert "\x1b" not in done.stderr and "Traceback" not in done.stderr
    assert "`RUN apt-get install -y tree`" in line and "offline by design" in line
    assert '[system] apt = ["tree"]' in line and "requirements.in" in line
    assert not ws.build_record("cpu").exists()
