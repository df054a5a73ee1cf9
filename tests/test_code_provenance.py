"""The manifest names the code that ran: the researcher's edit-run-verify loop on the local engine.

Each test uses the tool as its users do: build, edit a recipe or a script of several files,
run again, verify. The digests the tests compare are computed by the tests themselves, from
the image the container ran (``docker cp`` out of it) or from the files the script saw.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.runtime.code import code_digest

pytestmark = [pytest.mark.docker, pytest.mark.registry]


def cli(ws: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["--workspace", str(ws), "--json", "--quiet", *args])
    try:
        data = json.loads(result.stdout) if result.stdout.strip() else {}
    except ValueError:
        raise AssertionError(f"not JSON (exit {result.exit_code}): {result.stdout!r} {result.stderr!r}") from None
    return result.exit_code, data, result.stderr


def manifests(ws: Path) -> list[dict[str, Any]]:
    """The runs' manifests in the order the runs ended (one after the other here): a run folder's name starts
    with the second it started, and two runs started in one second sort by their random suffix."""
    found = sorted(ws.glob("runs/*/manifest.json"), key=lambda p: p.stat().st_mtime_ns)
    return [json.loads(p.read_text()) for p in found]


def digest_in_image(image_id: str, path: str, into: Path) -> str:
    """The code digest of a folder inside an image, read out of the image itself."""
    ctr = subprocess.run(["docker", "create", image_id], check=True, capture_output=True, text=True).stdout.strip()
    try:
        tar_bytes = subprocess.run(["docker", "cp", f"{ctr}:{path}", "-"], check=True, capture_output=True).stdout
    finally:
        subprocess.run(["docker", "rm", ctr], capture_output=True, check=False)
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        tar.extractall(into, filter="data")
    return code_digest(into / Path(path).name)


def classification(verdict: dict[str, Any], run_id: str) -> dict[str, Any]:
    cls: dict[str, Any] = verdict["data"]["explanations"][run_id]["classification"]
    return cls


def independent_digest(listing: dict[str, str], sizes: dict[str, int]) -> str:
    """The code digest by its definition (sorted "path size sha256" lines), written out here."""
    h = hashlib.sha256()
    for line in sorted(f"{rel} {sizes[rel]} {listing[rel]}" for rel in listing):
        h.update(line.encode() + b"\n")
    return "sha256:" + h.hexdigest()


def test_an_edited_recipe_rebuilds_first_or_is_refused_and_the_manifest_names_the_code_in_the_image(
    tiny_workspace: Path, tmp_path: Path
) -> None:
    train = tiny_workspace / "recipes" / "tiny" / "train.py"
    code, first, _ = cli(tiny_workspace, "run", "tiny", "--seed", "1")
    assert code == 0, first
    before = manifests(tiny_workspace)[0]
    train.write_text(train.read_text().replace("for step in range(3):", "for step in range(4):"))

    code, refused, err = cli(tiny_workspace, "run", "tiny", "--seed", "1", "--no-build")
    assert code == ExitCode.IMAGE_OUT_OF_DATE, (refused, err)
    assert "recipe tiny changed" in err and "launcher build --variant cpu" in err
    assert len(list(tiny_workspace.glob("runs/*"))) == 1  # nothing started, nothing half-written

    code, second, err = cli(tiny_workspace, "run", "tiny", "--seed", "1")
    assert code == 0, second
    after = manifests(tiny_workspace)[1]
    assert after["recipe"]["code_source"] == "image"
    assert after["image"]["id"] != before["image"]["id"]
    for m, where in ((before, "a"), (after, "b")):
        in_image = digest_in_image(m["image"]["id"], "/opt/launcher/recipes/tiny", tmp_path / where)
        assert m["recipe"]["tree_digest"] == in_image
    assert after["recipe"]["tree_digest"] == code_digest(train.parent) != before["recipe"]["tree_digest"]

    code, verdict, _ = cli(tiny_workspace, "verify", "checksums", before["run_id"], after["run_id"], "--across-code")
    assert code == ExitCode.NOT_REPRODUCIBLE
    cls = classification(verdict, after["run_id"])
    assert cls["kind"] == "input-change" and "code" in cls["causes"]
    assert "recipe.tree_digest" in cls["line"]


def test_mounted_recipe_needs_no_rebuild_and_equal_digests_are_the_same_code(tiny_workspace: Path) -> None:
    train = tiny_workspace / "recipes" / "tiny" / "train.py"
    code, _, _ = cli(tiny_workspace, "run", "tiny", "--seed", "3")
    assert code == 0
    record = json.loads((tiny_workspace / ".launcher" / "builds" / "cpu.json").read_text())
    code, _, err = cli(tiny_workspace, "run", "tiny", "--seed", "3", "--mount", "--no-build")
    assert code == 0, err
    baked, mounted = manifests(tiny_workspace)
    assert (baked["recipe"]["code_source"], mounted["recipe"]["code_source"]) == ("image", "mounted")
    assert baked["recipe"]["tree_digest"] == mounted["recipe"]["tree_digest"]
    code, verdict, _ = cli(tiny_workspace, "verify", "checksums", baked["run_id"], mounted["run_id"])
    # the same code: compared, nothing differs (inconclusive only because tiny imports no known framework)
    assert code == ExitCode.INCONCLUSIVE, verdict["summary"]
    assert [x["reason"] for x in verdict["data"]["inconclusive"]] == ["determinism"]

    train.write_text(train.read_text() + "print('an edit the image does not have')\n")
    code, _, err = cli(tiny_workspace, "run", "tiny", "--seed", "3", "--mount", "--no-build")
    assert code == 0, err  # mounted code needs no rebuild, even with --no-build
    edited = manifests(tiny_workspace)[2]
    assert edited["recipe"]["tree_digest"] == code_digest(train.parent) != baked["recipe"]["tree_digest"]
    assert json.loads((tiny_workspace / ".launcher" / "builds" / "cpu.json").read_text()) == record
    # the same results from other code: identical, and the verdict says the code differs
    code, verdict, _ = cli(tiny_workspace, "verify", "checksums", baked["run_id"], edited["run_id"])
    assert code == ExitCode.INCOMPATIBLE, verdict  # other code: compared only when asked
    code, verdict, _ = cli(tiny_workspace, "verify", "checksums", baked["run_id"], edited["run_id"], "--across-code")
    assert code == ExitCode.INCONCLUSIVE and "the code differs" in verdict["summary"], verdict["summary"]
    assert [x["reason"] for x in verdict["data"]["inconclusive"]] == ["determinism"]
    short = edited["recipe"]["tree_digest"].removeprefix("sha256:")[:12]
    assert f"{short} in {edited['run_id']})" in verdict["summary"]  # the one other run, by name


SCRIPT = '''\
import argparse
import hashlib
import json
import os
import sys

from pkg import offset
from util import scale

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--epochs", type=int, default=1)
a = p.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
seen, sizes = {}, {}
for top, dirs, files in os.walk(here):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in files:
        full = os.path.join(top, name)
        rel = os.path.relpath(full, here)
        data = open(full, "rb").read()
        seen[rel], sizes[rel] = hashlib.sha256(data).hexdigest(), len(data)
json.dump({"argv": sys.argv[1:], "lr": a.lr, "epochs": a.epochs, "seen": seen, "sizes": sizes},
          open("seen.json", "w"), sort_keys=True)
with open("result.json", "w") as f:
    json.dump({"value": offset(scale(a.lr)) * a.epochs}, f)
'''


def write_project(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "util.py").write_text("def scale(x):\n    return x * 2\n")
    (root / "pkg" / "__init__.py").write_text("from .helpers import offset\n")
    (root / "pkg" / "helpers.py").write_text("def offset(x):\n    return x + 1\n")
    (root / "train.py").write_text(SCRIPT)
    (root / ".gitignore").write_text("big.bin\n")
    (root / "big.bin").write_bytes(b"\0" * (20 << 20))  # ignored: never sent, never limits
    return root / "train.py"


def test_a_plain_script_runs_as_the_folder_it_is_with_its_own_arguments(tiny_workspace: Path,
                                                                         tmp_path: Path) -> None:
    script = write_project(tmp_path / "project")
    code, out, err = cli(tiny_workspace, "run", str(script), "--", "--lr", "0.01", "--epochs", "5")
    assert code == 0, (out, err)
    m = manifests(tiny_workspace)[0]
    outputs = tiny_workspace / "runs" / m["run_id"] / "outputs"
    seen = json.loads((outputs / "seen.json").read_text())
    assert seen["argv"] == ["--lr", "0.01", "--epochs", "5"] and (seen["lr"], seen["epochs"]) == (0.01, 5)
    assert sorted(seen["seen"]) == [".gitignore", "pkg/__init__.py", "pkg/helpers.py", "train.py", "util.py"]
    assert m["recipe"]["tree_digest"] == independent_digest(seen["seen"], seen["sizes"])
    assert m["recipe"]["args"] == ["--lr", "0.01", "--epochs", "5"]
    assert m["recipe"]["code_source"] == "mounted" and m["recipe"]["entry"] == "train.py"

    # the same code with other arguments: a params change, named as the script's arguments
    code, _, err = cli(tiny_workspace, "run", str(script), "--", "--lr", "0.02", "--epochs", "5")
    assert code == 0, err
    # an edit to the sibling module: a code change
    (script.parent / "util.py").write_text("def scale(x):\n    return x * 3\n")
    code, _, err = cli(tiny_workspace, "run", str(script), "--", "--lr", "0.01", "--epochs", "5")
    assert code == 0, err
    first, other_args, edited = manifests(tiny_workspace)
    assert other_args["recipe"]["tree_digest"] == first["recipe"]["tree_digest"]
    assert edited["recipe"]["tree_digest"] != first["recipe"]["tree_digest"]
    seen_edit = json.loads((tiny_workspace / "runs" / edited["run_id"] / "outputs" / "seen.json").read_text())
    assert edited["recipe"]["tree_digest"] == independent_digest(seen_edit["seen"], seen_edit["sizes"])

    code, verdict, _ = cli(tiny_workspace, "verify", "checksums", first["run_id"], other_args["run_id"])
    assert code == ExitCode.NOT_REPRODUCIBLE
    cls = classification(verdict, other_args["run_id"])
    assert (cls["kind"], cls["causes"]) == ("input-change", ["params"]) and "script arguments" in cls["line"]
    code, verdict, _ = cli(tiny_workspace, "verify", "checksums", first["run_id"], edited["run_id"], "--across-code")
    assert code == ExitCode.NOT_REPRODUCIBLE
    cls = classification(verdict, edited["run_id"])
    assert cls["kind"] == "input-change" and "code" in cls["causes"]


def test_a_folder_without_recipe_toml_runs_with_entry_and_bad_input_is_refused(tiny_workspace: Path,
                                                                              tmp_path: Path) -> None:
    script = write_project(tmp_path / "project")
    folder = script.parent
    code, _, err = cli(tiny_workspace, "run", str(folder))
    assert code == ExitCode.BAD_RECIPE and "--entry train.py" in err
    code, out, err = cli(tiny_workspace, "run", str(folder), "--entry", "train.py", "--", "--epochs", "2")
    assert code == 0, (out, err)
    assert manifests(tiny_workspace)[0]["recipe"]["args"] == ["--epochs", "2"]

    code, _, err = cli(tiny_workspace, "run", str(script), "--param", "lr=0.01")
    assert code == ExitCode.USAGE and "after `--`" in err and "Traceback" not in err
    (folder / ".gitignore").unlink()  # now the 20 MiB file belongs to the code
    code, _, err = cli(tiny_workspace, "run", str(script))
    assert code == ExitCode.USAGE and "big.bin" in err and "--data-from" in err
    code, _, err = cli(tiny_workspace, "run", str(script), "--code", str(tmp_path / "elsewhere"))
    assert code == ExitCode.NOT_FOUND
    assert len(manifests(tiny_workspace)) == 1
    assert len(list(tiny_workspace.glob("runs/*"))) == 1  # refusals leave no run directory


def test_two_projects_train_py_are_two_codes_never_one_group(tiny_workspace: Path, tmp_path: Path) -> None:
    """Every project has a train.py: each runs as its own code (project/path plus digest), in its own
    group; two projects that share a folder name still differ by their code; verify compares them only
    when asked."""
    alpha = write_project(tmp_path / "alpha")
    beta = write_project(tmp_path / "beta")
    (beta.parent / "util.py").write_text("def scale(x):\n    return x * 5\n")
    twin = write_project(tmp_path / "elsewhere" / "alpha")  # the same folder name, other code
    (twin.parent / "util.py").write_text("def scale(x):\n    return x * 7\n")
    started: list[str] = []  # run ids in the order they ran (two runs in one second sort by name)
    for script in (alpha, beta, twin):
        code, out, err = cli(tiny_workspace, "run", str(script), "--runs", "2")
        assert code == 0, (out, err)
        started += [r["run_id"] for r in out["data"]["runs"]]
    runs = manifests(tiny_workspace)
    by_name: dict[str, set[str]] = {}
    for m in runs:
        by_name.setdefault(m["recipe"]["identity"], set()).add(m["group"])
    assert sorted(by_name) == ["alpha/train.py", "beta/train.py"]
    groups = {m["group"] for m in runs}
    assert len(groups) == 3 and len(by_name["alpha/train.py"]) == 2  # the twin is another group
    assert all("alpha_train.py" in m["run_id"] or "beta_train.py" in m["run_id"] for m in runs)

    by_id = {m["run_id"]: m for m in runs}
    first_alpha, first_beta, twin_run = by_id[started[0]], by_id[started[2]], by_id[started[-1]]
    code, verdict, err = cli(tiny_workspace, "verify", "checksums", first_alpha["run_id"], first_beta["run_id"])
    assert code == ExitCode.INCOMPATIBLE and "--across-code" in err, (verdict, err)
    code, verdict, err = cli(tiny_workspace, "verify", "checksums", first_alpha["run_id"], twin_run["run_id"])
    assert code == ExitCode.INCOMPATIBLE, (verdict, err)  # same name, other digest: other code
    code, verdict, _ = cli(tiny_workspace, "verify", "checksums", first_alpha["run_id"], first_beta["run_id"],
                           "--across-code")
    assert code == ExitCode.NOT_REPRODUCIBLE and "the code differs" in verdict["summary"], verdict["summary"]
    assert "may come from the code" in verdict["summary"]
    code, verdict, _ = cli(tiny_workspace, "verify", "checksums")  # the latest group: the twin's two runs
    assert {r["run_id"] for r in verdict["data"]["runs"]} == set(started[-2:])
