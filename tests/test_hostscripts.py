"""The scripts launcher sends to a host as text (launcher/hosts/scripts/) run with the system's
python3 (or sh) on their own, outside launcher's environment, and print what launcher parses."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from importlib import import_module, resources
from pathlib import Path

import pytest

import launcher
from launcher.hosts.base import parse_listing
from launcher.hosts.provision import parse_facts
from launcher.hosts.scripts import text

FOLDER = Path(launcher.__file__).parent / "hosts" / "scripts"
SCRIPTS = sorted(p.name for p in FOLDER.iterdir() if p.is_file() and p.name != "__init__.py"
                 and p.suffix in (".py", ".sh"))
PY_SCRIPTS = [n for n in SCRIPTS if n.endswith(".py")]
SYSTEM_PYTHON = shutil.which("python3") or sys.executable


def run_py(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    # -I: isolated, as on a host where launcher is not installed
    return subprocess.run([SYSTEM_PYTHON, "-I", "-c", text(name), *args], capture_output=True, text=True,
                          cwd="/", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def test_every_script_is_package_data() -> None:
    assert {"listdir.py", "datalist.py", "facts.sh"} <= set(SCRIPTS)
    # a non-editable install takes only .py files and the package-data globs of pyproject.toml
    pyproject = (FOLDER.parents[2] / "pyproject.toml").read_text()
    line = re.search(r'^"launcher\.hosts\.scripts" = \[(.*)\]$', pyproject, re.M)
    assert line, "pyproject.toml has no package-data line for launcher.hosts.scripts"
    patterns = [p.strip().strip('"') for p in line.group(1).split(",")]
    for name in SCRIPTS:
        assert name.endswith(".py") or any(fnmatch(name, p) for p in patterns), f"{name} is not package data"
        assert resources.files("launcher.hosts.scripts").joinpath(name).read_text(encoding="utf-8") == text(name)


# the one exception: it runs on a Ray cluster's head under the Python that has Ray, importing it in its functions only
RAY_SCRIPT = "ray_job.py"


@pytest.mark.parametrize("name", PY_SCRIPTS)
def test_python_script_uses_only_the_standard_library(name: str) -> None:
    tree = ast.parse(text(name))
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for mod in mods:
            if name == RAY_SCRIPT and mod.split(".")[0] == "ray":
                assert id(node) not in top, f"{name} imports {mod} at its top: launcher imports it without Ray"
                continue
            assert mod.split(".")[0] in sys.stdlib_module_names, f"{name} imports {mod}"


@pytest.mark.parametrize("name", PY_SCRIPTS)
def test_python_script_imports_without_running(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = import_module(f"launcher.hosts.scripts.{name.removesuffix('.py')}")
    assert callable(module.main)
    assert capsys.readouterr().out == ""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "out"
    (root / "a" / "deep").mkdir(parents=True)
    (root / "a" / "b.txt").write_bytes(b"hello\n")
    (root / "c.bin").write_bytes(bytes(range(256)) * 5000)  # over one read block
    (root / "empty").mkdir()
    (root / "link").symlink_to("a/b.txt")
    os.mkfifo(root / "pipe")
    return root


def expected_listing(root: Path, hashes: bool) -> str:
    lines = []
    for rel, kind in [("a", "dir"), ("a/b.txt", "file"), ("a/deep", "dir"), ("c.bin", "file"),
                      ("empty", "dir"), ("link", "symlink"), ("pipe", "other")]:
        st = os.lstat(root / rel)
        rec: dict[str, object] = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "kind": kind}
        if kind == "symlink":
            rec["target"] = "a/b.txt"
        if kind == "file" and hashes:
            rec["sha256"] = "sha256:" + hashlib.sha256((root / rel).read_bytes()).hexdigest()
        lines.append(json.dumps(rec) + "\n")
    # os.walk lists a directory's entries before descending into it
    order = ["a", "c.bin", "empty", "link", "pipe", "a/b.txt", "a/deep"]
    by_path = {json.loads(line)["path"]: line for line in lines}
    return "".join(by_path[p] for p in order)


@pytest.mark.parametrize("hashes", [True, False])
def test_listdir_lists_a_folder(tree: Path, hashes: bool) -> None:
    done = run_py("listdir.py", str(tree), "1" if hashes else "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected_listing(tree, hashes)
    entries = {e.path: e for e in parse_listing(done.stdout)}
    assert entries["a/b.txt"].sha256 == ("sha256:" + hashlib.sha256(b"hello\n").hexdigest() if hashes else None)
    assert entries["link"].target == "a/b.txt" and entries["c.bin"].size == 256 * 5000


def test_listdir_of_a_missing_folder_exits_3(tmp_path: Path) -> None:
    done = run_py("listdir.py", str(tmp_path / "nope"), "1")
    assert (done.returncode, done.stdout) == (3, "")


def test_datalist_sizes_each_entry(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "ds1" / "x").mkdir(parents=True)
    (root / "ds1" / "f").write_bytes(b"12345")
    (root / "ds1" / "x" / "g").write_bytes(b"123")
    (root / ".up-1").mkdir()
    (root / "ds 2").mkdir()
    done = run_py("datalist.py", str(root))
    assert done.returncode == 0, done.stderr
    rows = [line.split(" ", 2) for line in done.stdout.splitlines()]
    assert [(size, name) for size, _, name in rows] == [("0", ".up-1"), ("0", "ds 2"), ("8", "ds1")]
    assert all(0 <= int(age) < 600 for _, age, _ in rows)
    assert run_py("datalist.py", str(tmp_path / "nope")).stdout == ""


def test_facts_sheet_runs_with_sh() -> None:
    done = subprocess.run(["sh", "-c", text("facts.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    keys = [line.partition("=")[0] for line in done.stdout.splitlines()]
    assert keys[:15] == ["os", "os_id", "os_version", "os_codename", "kernel", "arch", "user", "uid", "cpu_model",
                         "cpu_cores", "ram_bytes", "disk_free_bytes", "systemd", "sudo", "docker_installed"]
    assert {"nvidia_smi", "nvidia_ctk"} <= set(keys)
    facts = parse_facts(done.stdout)
    assert facts["kernel"] == os.uname().release and facts["arch"] == os.uname().machine
    assert facts["user"] == pwd.getpwuid(os.getuid()).pw_name and facts["is_root"] == (os.getuid() == 0)
    assert facts["cpu_cores"] >= 1 and facts["ram_bytes"] > 0
