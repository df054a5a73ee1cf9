"""Run inside a variant's image by launcher (sent as text to the image's own python): install the
project's wheels offline into a folder and send that folder back as a tar on stdout.

The wheels and their hashed requirements file are mounted read-only at WHEELS; the container has no
network. pip installs with --no-index --require-hashes --no-deps --no-compile --target, so only the
locked files land, and no byte-code (which would carry build times). The tar's first member is
ANSWER: {"ok", "output" (pip's, when it failed), "purelib" (the image's site-packages), "python"}.
Only the standard library of the image's Python is used; nothing of launcher is imported.
"""

import io
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tarfile

WHEELS = "/launcher-wheels"
ANSWER = ".launcher-answer.json"
TARGET = "/tmp/launcher-project/site-packages"


def main() -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
                "PYTHONDONTWRITEBYTECODE": "1"})
    os.makedirs(TARGET)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", WHEELS,
                           "--require-hashes", "--no-deps", "--no-compile", "--no-cache-dir",
                           "--root-user-action=ignore", "--target", TARGET, "-r", f"{WHEELS}/requirements.lock"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    answer = {"ok": done.returncode == 0, "output": done.stdout.decode("utf-8", "replace")[-8000:],
              "purelib": sysconfig.get_paths()["purelib"], "python": platform.python_version()}
    data = json.dumps(answer).encode()
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        info = tarfile.TarInfo(ANSWER)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        if answer["ok"]:
            tar.add(TARGET, arcname="site-packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
