"""A plain script that is a folder of code, run over SSH (issue 15, the remote half).

`launcher run proj/train.py --host ... -- ARGS` on the SSH test host with the tiny image: the
script imports a sibling module and a sibling package, sees exactly the arguments after `--`,
and its manifest names the code it saw, checked three ways that do not use the runtime's own
record: the script hashes the files beside it from inside the container, the test hashes the
snapshot on the host (sha256sum over SSH's back door), and the local folder. An edit to the
sibling module is then a code change for verify, other arguments a params change, and unchanged
code is not sent again.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_runs_remote import cli, ssh_args
from testhost import TestHost

from launcher.errors import ExitCode
from launcher.runtime.code import code_digest

pytestmark = pytest.mark.testhost

ARGS = ["--lr", "0.01", "--epochs", "5"]

TRAIN = '''\
"""A plain training script: a sibling module, a sibling package, argparse-style arguments."""
import hashlib
import json
import os
import sys
from pathlib import Path

import util
from pkg import layers

here = Path(__file__).resolve().parent
seen = []  # every file beside the script, as this container sees it
for top, dirs, files in os.walk(here):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in files:
        if name.endswith(".pyc"):
            continue
        path = Path(top) / name
        data = path.read_bytes()
        seen.append([path.relative_to(here).as_posix(), len(data), hashlib.sha256(data).hexdigest()])
with open("seen.json", "w") as f:  # the working directory is the outputs folder
    json.dump({"argv": sys.argv[1:], "script": sys.argv[0], "scale": util.SCALE, "layers": layers.describe(),
               "files": sorted(seen)}, f, sort_keys=True)
print("train: done", util.SCALE)
'''

UTIL = "SCALE = 1.0\n"
UTIL_EDITED = "SCALE = 2.0\n"

LAYERS = '''\
def describe():
    return ["dense", 16]
'''


def make_project(root: Path) -> Path:
    """proj/: train.py, util.py, pkg/__init__.py, pkg/layers.py, and a nonce so that the test host
    has never seen this exact code (the first run must send it)."""
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN)
    (root / "util.py").write_text(UTIL)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "layers.py").write_text(LAYERS)
    (root / "NONCE").write_text(uuid.uuid4().hex + "\n")
    return root / "train.py"


def digest_of(listing: list[tuple[str, int, str]]) -> str:
    """The code digest, written out from its definition (sorted "relpath size sha256hex" lines),
    not with launcher.runtime.code."""
    lines = sorted(f"{rel} {size} {sha}" for rel, size, sha in listing)
    text = "".join(line + "\n" for line in lines)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def host_listing(testhost: TestHost, folder: str) -> list[tuple[str, int, str]]:
    """(relative path, size, sha256) of every file of folder on the test host, read there."""
    out = testhost.exec("sh", "-c", f"cd {folder} && find . -type f -printf '%P\\t%s\\t' -exec sh -c "
                        "'sha256sum \"$1\" | cut -c1-64' _ {} \\;")
    rows = []
    for line in out.splitlines():
        rel, size, sha = line.split("\t")
        rows.append((rel, int(size), sha))
    return rows


def run_script(ws: Path, testhost: TestHost, script: Path, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    code, env, err = cli(ws, "run", str(script), *ssh_args(testhost), "--seed", "3", "--", *args)
    assert code == 0, (env.get("summary"), err)
    manifest = env["data"]["runs"][0]
    assert manifest["status"] == "succeeded", manifest
    launch = json.loads((ws / "runs" / manifest["run_id"] / "launch.json").read_text())
    return manifest, launch


def seen_by(ws: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ws / "runs" / manifest["run_id"] / "outputs" / "seen.json").read_text())
    return data


def verify(ws: Path, *run_ids: str) -> tuple[int, dict[str, Any]]:
    code, env, err = cli(ws, "verify", "checksums", *run_ids)
    assert "data" in env, (code, env, err)
    return code, env["data"]


def test_a_script_folder_runs_over_ssh_with_its_arguments_and_its_digest_is_what_ran(
    testhost: TestHost, tiny_workspace: Path, tmp_path: Path
) -> None:
    script = make_project(tmp_path / "proj")
    proj = script.parent
    local_digest = code_digest(proj)

    first, launch = run_script(tiny_workspace, testhost, script, *ARGS)
    seen = seen_by(tiny_workspace, first)
    # the script got exactly the arguments after `--`, ran from the mounted folder, and imported
    # its sibling module and package from there
    assert seen["argv"] == ARGS
    assert seen["script"] == "/launcher/code/train.py"
    assert seen["scale"] == 1.0 and seen["layers"] == ["dense", 16]
    assert first["recipe"]["args"] == ARGS
    assert first["recipe"]["code_source"] == "mounted" and first["recipe"]["entry"] == "train.py"

    # the manifest's digest is that of the files the container saw (listed by the script itself),
    # of the snapshot on the host, and of the local folder
    in_container = digest_of([(r, s, h) for r, s, h in seen["files"]])
    assert {r for r, _, _ in seen["files"]} == {"train.py", "util.py", "pkg/__init__.py", "pkg/layers.py", "NONCE"}
    on_host = launch["code"]["host_path"]
    assert on_host.startswith("/root/.launcher/code/")
    assert digest_of(host_listing(testhost, on_host)) == in_container
    assert first["recipe"]["tree_digest"] == in_container == local_digest
    assert first["recipe"]["files"] == 5
    assert launch["code"]["sent"] is True  # new code travels once...

    # ...and unchanged code does not travel again; the host's copy is untouched
    mtime = testhost.exec("stat", "-c", "%Y.%Z", on_host).strip()
    again, launch2 = run_script(tiny_workspace, testhost, script, *ARGS)
    assert launch2["code"]["sent"] is False and launch2["code"]["host_path"] == on_host
    assert testhost.exec("stat", "-c", "%Y.%Z", on_host).strip() == mtime
    assert again["recipe"]["tree_digest"] == first["recipe"]["tree_digest"]
    code, report = verify(tiny_workspace, first["run_id"], again["run_id"])
    # nothing differs, but the script saves nothing of training (seen.json) and imports no framework
    assert code == ExitCode.INCONCLUSIVE and report["verdict"] == "inconclusive", report["summary"]
    assert [x["reason"] for x in report["inconclusive"]] == ["no-evidence", "determinism"]

    # a one-line edit of the sibling module: a new digest, sent anew, and a code change for verify
    (proj / "util.py").write_text(UTIL_EDITED)
    edited, launch3 = run_script(tiny_workspace, testhost, script, *ARGS)
    seen3 = seen_by(tiny_workspace, edited)
    assert seen3["scale"] == 2.0
    assert edited["recipe"]["tree_digest"] == digest_of([(r, s, h) for r, s, h in seen3["files"]]) == code_digest(proj)
    assert edited["recipe"]["tree_digest"] != first["recipe"]["tree_digest"]
    assert launch3["code"]["sent"] is True and launch3["code"]["host_path"] != on_host
    code, report = verify(tiny_workspace, first["run_id"], edited["run_id"], "--across-code")
    assert code == ExitCode.NOT_REPRODUCIBLE, report["summary"]
    row = next(r for r in report["runs"] if r["run_id"] == edited["run_id"])
    assert row["classification"] == "input-change", row
    causes = report["explanations"][edited["run_id"]]["classification"]["causes"]
    assert "code" in causes and "params" not in causes, row["line"]

    # other script arguments, same code: a params change naming the script's arguments
    other, _ = run_script(tiny_workspace, testhost, script, "--lr", "0.02", "--epochs", "5")
    assert seen_by(tiny_workspace, other)["argv"] == ["--lr", "0.02", "--epochs", "5"]
    assert other["recipe"]["tree_digest"] == edited["recipe"]["tree_digest"]
    code, report = verify(tiny_workspace, edited["run_id"], other["run_id"])
    assert code == ExitCode.NOT_REPRODUCIBLE, report["summary"]
    row = next(r for r in report["runs"] if r["run_id"] == other["run_id"])
    assert row["classification"] == "input-change" and "script arguments" in row["line"], row
    causes = report["explanations"][other["run_id"]]["classification"]["causes"]
    assert causes == ["params"], row["line"]
