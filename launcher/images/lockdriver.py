"""Run inside the base image by `launcher lock` (sent as text to the image's own python3).

It reads one JSON request on stdin: the lockfiles/ text files, the CA bundle (or none), the
pinned tool versions, pip-compile's arguments, and optionally pip's arguments for a diagnosis
run when the compile fails (pip install --dry-run names both sides of a conflict). It makes a
venv, installs pip-tools into it, runs pip-compile in a copy of lockfiles/ and writes one JSON
answer after MARKER on stdout: the lock's text (or the stage that failed, its output and the
diagnosis). It needs only the standard library of any Python 3 that the base image may have,
and imports nothing of launcher.
"""

import json
import os
import platform
import subprocess
import sys
import tempfile

MARKER = "LAUNCHER-LOCK-RESULT "


def main() -> int:
    req = json.load(sys.stdin)
    work = tempfile.mkdtemp(prefix="launcher-lock-")
    lockdir = os.path.join(work, "lockfiles")
    os.mkdir(lockdir)
    for name, text in req["files"].items():
        with open(os.path.join(lockdir, name), "w") as f:
            f.write(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
                "PIP_NO_INPUT": "1", "HOME": work})
    env.update(req.get("env", {}))
    if req.get("ca"):
        ca = os.path.join(work, "ca.pem")
        with open(ca, "w") as f:
            f.write(req["ca"])
        env["PIP_CERT"] = ca
    answer: dict[str, object] = {"python": platform.python_version(),
                                 "implementation": platform.python_implementation(),
                                 "machine": platform.machine(), "system": platform.system()}

    def step(stage: str, argv: list[str]) -> bool:
        done = subprocess.run(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            answer.update(ok=False, stage=stage, output=done.stdout.decode("utf-8", "replace")[-20000:])
            return False
        return True

    venv = os.path.join(work, "venv")
    py = os.path.join(venv, "bin", "python")
    ok = (step("venv", [sys.executable, "-m", "venv", venv])
          and step("install", [py, "-m", "pip", "install", "--quiet", *req["tools"]])
          and step("compile", [py, "-m", "piptools", "compile", *req["compile"]]))
    if ok:
        with open(os.path.join(work, req["output"])) as f:
            answer.update(ok=True, lock=f.read())
    elif answer.get("stage") == "compile" and req.get("diagnose"):
        # pip-compile names only one side of a conflict; pip's own resolver names both
        done = subprocess.run([py, "-m", "pip", *req["diagnose"]], cwd=work, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
        answer["diagnosis"] = done.stdout.decode("utf-8", "replace")[-20000:]
    sys.stdout.write(MARKER + json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
