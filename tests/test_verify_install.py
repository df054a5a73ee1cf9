"""launcher as a new user installs it, without extras (`pip install <source>`, the README's non-root
path), compares .keras files by content: two runs whose model.keras hold identical weights but other
zip dates and date_saved verify identical (exit 0), not "not identical" nor "inconclusive".

The runs hold no other training output, so a .keras launcher could not read would make the verdict
inconclusive (exit 37): the exit 0 is the proof that the default install reads it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, need
from runfactory import keep_only, keras_bytes, make_workspace, pair

pytestmark = [pytest.mark.network]  # pip fetches launcher's dependencies where no local copy has them

LAYERS = [("dense", [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.zeros(4, np.float32)]),
          ("dense_1", [np.ones((4, 2), np.float32), np.full(2, 0.5, np.float32)])]


def _install_without_extras(tmp_path: Path) -> Path:
    """A fresh venv with launcher installed from a copy of this source tree, no extras; its bin/."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "launcher", src / "launcher", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=300)
    pip = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          str(src)], capture_output=True, text=True, env=env, timeout=1200, check=False)
    need(pip.returncode == 0, f"pip cannot install launcher into a fresh venv here: {pip.stderr.strip()[-600:]}")
    return venv / "bin"


def test_installed_without_extras_verifies_keras_replicates_identical(tmp_path: Path) -> None:
    root = make_workspace(tmp_path / "ws")
    a, b = pair(root / "runs")
    for d, day in ((a, 1), (b, 2)):
        saved = keras_bytes(LAYERS, f"2026-11-0{day}@10:00:00", (2026, 11, day, 10, 0, 0))
        (d / "outputs/model.keras").write_bytes(saved)
        keep_only(d, "model.keras")
    assert (a / "outputs/model.keras").read_bytes() != (b / "outputs/model.keras").read_bytes()

    bin_dir = _install_without_extras(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    extras = subprocess.run([str(bin_dir / "python"), "-c", "import importlib.util as u; print([m for m in "
                             "('matplotlib', 'torch', 'mlflow', 'pytest') if u.find_spec(m)])"],
                            capture_output=True, text=True, env=env, check=True, cwd=tmp_path)
    assert extras.stdout.strip() == "[]"  # no extra and no dev package came along
    done = subprocess.run([str(bin_dir / "launcher"), "--workspace", str(root), "--json", "verify", "checksums"],
                          capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp_path)
    data = json.loads(done.stdout)["data"]
    assert done.returncode == 0, data.get("summary") or done.stderr[-2000:]
    assert data["verdict"] == "identical" and data["evidence"]["kinds"]["model"]["compared"] == 1
    cell = next(r for r in data["artifacts"] if r["path"] == "outputs/model.keras")["runs"][b.name]
    assert cell["status"] == "identical-content", cell
    volatile = cell["content"]["volatile"]
    assert "zip entry dates" in volatile and "metadata.json field date_saved" in volatile
