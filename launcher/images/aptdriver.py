"""What `launcher lock` runs inside a container of the pinned base image to resolve a project's OS
packages (sent as text to the base's own python3: standard library only, nothing of launcher there).

The request (the packages, proxy variables) comes on stdin as JSON. The driver reads the base's Debian
release and architecture, runs `apt-get update` against the base's own apt sources, then asks apt what
installing the packages would mean (`apt-get install -s`, `--print-uris`) and what the archive's
Packages index says of each .deb (`apt-cache show NAME=VERSION`: size and SHA256). It answers with one
line, MARKER then JSON, carrying apt's own output: launcher.images.aptlock parses and cross-checks it
on the host, so the parsing is tested without a container. Nothing is installed.
"""

import json
import os
import re
import subprocess
import sys

MARKER = "@@launcher-apt@@"
# "Inst NAME [OLD] (VERSION ORIGINS [ARCH])": just enough to ask the index about each planned .deb.
PLANNED = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) ", re.M)
APT_OPTS = ["-o", "Acquire::Languages=none", "-o", "APT::Color=0", "-o", "Dpkg::Use-Pty=0"]
INSTALL = ["install", "-y", "--no-install-recommends"]
TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def run(argv: "list[str]", env: "dict[str, str]") -> "tuple[int, str]":
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, check=False)
    return done.returncode, done.stdout.decode("utf-8", "replace")


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def answer(data: "dict[str, object]") -> None:
    sys.stdout.write(MARKER + json.dumps(data, sort_keys=True) + "\n")
    sys.stdout.flush()


def main() -> None:
    request = json.loads(sys.stdin.read())
    packages = [str(p) for p in request["packages"]]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C", LANG="C")
    env.update({str(k): str(v) for k, v in dict(request.get("env") or {}).items()})
    out: dict[str, object] = {
        "ok": False, "os_release": read("/etc/os-release"), "debian_version": read("/etc/debian_version").strip(),
        "links": {d: os.readlink("/" + d) for d in TOP_DIRS if os.path.islink("/" + d)},
    }
    out["arch"] = run(["dpkg", "--print-architecture"], env)[1].strip()
    rc, out["update"] = run(["apt-get", "update", *APT_OPTS], env)
    if rc != 0:
        answer({**out, "stage": "update"})
        return
    fmt = "$(SITE) $(RELEASE) $(COMPONENT) $(ARCHITECTURE)"
    out["sources"] = run(["apt-get", "indextargets", "--format", fmt, "Identifier: Packages"], env)[1]
    rc, simulated = run(["apt-get", *APT_OPTS, *INSTALL, "-s", *packages], env)
    out["simulate"] = simulated
    if rc != 0:
        answer({**out, "stage": "simulate"})
        return
    rc, out["uris"] = run(["apt-get", *APT_OPTS, *INSTALL, "--print-uris", "-qq", *packages], env)
    if rc != 0:
        answer({**out, "stage": "uris"})
        return
    planned = [f"{name}={version}" for name, version in PLANNED.findall(simulated)]
    rc, out["show"] = run(["apt-cache", "show", "--no-all-versions", *planned], env) if planned else (0, "")
    if rc != 0:
        answer({**out, "stage": "show"})
        return
    names = [p.split("=", 1)[0] for p in packages]
    out["installed"] = run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n", *names],
                           env)[1]
    answer({**out, "ok": True})


if __name__ == "__main__":
    main()
