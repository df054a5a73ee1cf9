"""Why a Dockerfile step failed, in one readable line. Builds run without network on purpose (the same
locks and Dockerfile must give the same image on any machine), so a step that downloads something
(`RUN apt-get install`, `RUN pip install`, curl, git clone) cannot work there; the error says so and
names what to do instead: OS packages declared in the project (`[system] apt = [...]`, locked and
fetched by launcher.images.aptlock), Python packages in its requirements or the variant's `.in`."""

from __future__ import annotations

import re
import shlex

from launcher.errors import BuildFailed, plain_text

# Commands that fetch from the network unless told otherwise.
_APT = re.compile(r"^(?:apt-get|apt|aptitude)$")
_APT_NET = ("install", "update", "upgrade", "dist-upgrade", "full-upgrade", "download", "source", "build-dep")
_PIP = re.compile(r"^(?:pip|pip3(?:\.\d+)?)$")
_FETCHERS = ("curl", "wget", "conda", "mamba", "micromamba", "npm", "yarn", "apk", "yum", "dnf", "microdnf",
             "uv", "poetry", "pipx")
# What a download without a network prints (apt, pip, curl, wget, git, Python's socket).
_OFFLINE = re.compile(r"Temporary failure (?:resolving|in name resolution)|Could not resolve|Network is unreachable|"
                      r"Failed to establish a new connection|Name or service not known|No address associated|"
                      r"getaddrinfo failed|Unable to locate package|Failed to fetch|unable to access '", re.I)
_STEP_CMD = re.compile(r"The command '(?:/bin/sh -c )?(.*)' returned a non-zero code", re.S)
_PIP_ARG_OPTS = ("-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url",
                 "--extra-index-url", "-f", "--find-links", "--target", "-t", "--prefix", "--root", "--python")


def _commands(step: str) -> list[list[str]]:
    """The simple commands of a RUN step's shell text, as words (quotes honoured; a parse error: no words)."""
    text = re.sub(r"^\s*RUN\s+", "", step, flags=re.I)
    out: list[list[str]] = []
    for part in re.split(r"&&|\|\||;|\||\n", text):
        try:
            words = shlex.split(part)
        except ValueError:
            continue
        while words and (("=" in words[0] and not words[0].startswith("-")) or words[0] in ("sudo", "env", "exec")):
            words.pop(0)  # VAR=value prefixes and wrappers
        if words:
            out.append(words)
    return out


def _operands(words: list[str], takes_value: tuple[str, ...] = ()) -> list[str]:
    names, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w in takes_value:
            skip = True
        elif not w.startswith("-"):
            names.append(w)
    return names


def network_needs(step: str) -> tuple[list[str], list[str], bool]:
    """What a RUN step fetches: (OS packages it installs, Python packages it installs, whether any
    command in it needs the network at all)."""
    apt: list[str] = []
    pip: list[str] = []
    needs = False
    for words in _commands(step):
        tool = words[0].rsplit("/", 1)[-1]
        rest = words[1:]
        if tool.startswith("python") and rest[:2] == ["-m", "pip"]:
            tool, rest = "pip", rest[2:]
        if _APT.match(tool):
            ops = _operands(rest, ("-o", "-t", "--target-release", "-c"))
            if ops and ops[0] in _APT_NET:
                needs = True
                if ops[0] == "install":
                    apt += [o for o in ops[1:] if not o.startswith(("./", "/"))]
        elif _PIP.match(tool):
            ops = _operands(rest, _PIP_ARG_OPTS)
            if ops and ops[0] in ("install", "download") and "--no-index" not in rest:
                needs = True
                pip += ops[1:]
        elif tool in _FETCHERS or (tool == "git" and "clone" in rest):
            needs = True
    return apt, pip, needs


def step_of(detail: str) -> str | None:
    """The shell command the engine's error names ("The command '/bin/sh -c ...' returned ...")."""
    m = _STEP_CMD.search(detail)
    return f"RUN {m.group(1)}" if m else None


def build_failure(variant: str, step: str | None, detail: str, log: list[str]) -> BuildFailed:
    """The error for a failed Dockerfile step: the offline explanation where the step needs the network
    (by its command, or by what it printed), else the engine's message with the step's last output."""
    detail = plain_text(detail).strip()
    step = plain_text(step or step_of(detail) or "").strip()
    tail_lines = [plain_text(ln).strip() for ln in log[-3:]]
    apt, pip, needs = network_needs(step) if step.upper().startswith("RUN") else ([], [], False)
    offline = needs or any(_OFFLINE.search(plain_text(ln)) for ln in log[-30:])
    dockerfile = f"dockerfiles/{variant}.Dockerfile"
    if not offline:
        tail = " | ".join(ln for ln in tail_lines if ln)
        at = f" at `{step[:160]}`" if step else ""
        return BuildFailed(f"image build failed{at}: {detail}" + (f" (last output: {tail[:300]})" if tail else ""),
                           "fix the Dockerfile or the lock; nothing was tagged")
    shown = step[:160] or "a step"
    os_example = ", ".join(f'"{p.split("=", 1)[0]}"' for p in apt) or '"tree"'
    py_example = " ".join(pip) or "NAME"
    return BuildFailed(
        f"the {variant} image build stopped at `{shown}` in {dockerfile}: it needs the network, and launcher "
        "builds images offline by design (the same locks and Dockerfile give the same image on any machine); "
        "nothing was tagged",
        f"remove that step; for an OS package declare it in your project: [system] apt = [{os_example}] in its "
        f"launcher.toml (or the recipe's recipe.toml), then `launcher lock PATH`; for a Python package add "
        f"{py_example} to the project's requirements.in (or to lockfiles/{variant}.in), then `launcher lock`")
