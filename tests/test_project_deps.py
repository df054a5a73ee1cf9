"""A user's project with its own requirements, for real: packages from PyPI locked by pip-tools inside the
bootstrapped base against the committed cpu lock, their wheels installed offline by the image's pip into the
project layer on the TensorFlow CPU image, a script that imports and uses them run twice and verified
identical; a change to requirements.in rebuilds that layer alone (the cpu image keeps its ID), and the same
lock on the same image gives the same layer and image ID from an empty cache. And companion packages for
real: PyPI's torchvision refused beside the CPU torch at lock time, and the matching rule on real wheels
(PyPI's torch and torchvision pair, PyTorch's CPU torch and PyPI's torchvision do not)."""

from __future__ import annotations

import email.parser
import json
import os
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import ExitCode
from launcher.hashing import sha256_file
from launcher.images import buildrecord, companions, projectlayer, recipelayer
from launcher.images import pins as images
from launcher.images import tree as imagetree
from launcher.images.lock import parse_lock
from launcher.workspace import Workspace

SCRIPT = '''"""Digits with a tiny Keras model; a table by tabulate, a summary packed by msgpack (compiled)."""
import sys

import keras
import msgpack
from sklearn.datasets import load_digits
from tabulate import tabulate

d = load_digits()
x = (d.images / 16.0).astype("float32").reshape(len(d.images), -1)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
hist = model.fit(x, d.target, epochs=2, batch_size=64, verbose=0)
model.save_weights("model.weights.h5")
print(tabulate([(e + 1, round(v, 4)) for e, v in enumerate(hist.history["loss"])], headers=["epoch", "loss"]))
with open("metrics.msgpack", "wb") as f:
    f.write(msgpack.packb(hist.history))
if "--humanize" in sys.argv:
    import humanize

    print("digits:", humanize.intcomma(len(x)))
'''


def cli(ws: Workspace, *args: str, code: int = 0) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == code, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def log_of(ws: Workspace, run: dict[str, Any]) -> str:
    return (ws.runs / run["run_id"] / "outputs" / "logs" / "train.log").read_text()


@pytest.mark.docker
@pytest.mark.tfimage
@pytest.mark.network
def test_a_project_with_its_own_requirements_runs_verifies_and_rebuilds_only_its_layer(
        cpu_image: dict[str, Any], tmp_path: Path) -> None:
    ws = cpu_image["workspace"]
    proj = tmp_path / "myproj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    (proj / "requirements.in").write_text("tabulate\nmsgpack\n")
    variant = buildrecord.read_record(ws, "cpu")
    assert variant is not None
    runs = cli(ws, "run", str(proj / "train.py"), "--runs", "2")["data"]["runs"]
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"]
    lock = proj / "requirements.lock"
    pins = {r.name: r.version for r in parse_lock(lock.read_text())}
    assert set(pins) == {"tabulate", "msgpack"} and "msgpack" not in {r.name for r in parse_lock(
        ws.lock_txt("cpu").read_text())}  # a compiled wheel the cpu image does not have
    image = runs[0]["image"]
    layer = image["project"]
    assert layer["packages"] == [f"msgpack=={pins['msgpack']}", f"tabulate=={pins['tabulate']}"]
    assert layer["requirements_lock_sha256"] == sha256_file(lock) and layer["system_lock_sha256"] is None
    assert layer["variant_image_id"] == variant.image_id and image["id"] != variant.image_id
    assert runs[1]["image"]["id"] == image["id"]
    assert "epoch    loss" in log_of(ws, runs[0])  # tabulate's table, from the layer
    verdict = cli(ws, "verify", "checksums", *(r["run_id"] for r in runs))
    assert verdict["exit_code"] == 0 and verdict["data"]["verdict"] == "identical", verdict["summary"]
    # what a ship sends to a host that has the cpu image: the project layer alone, from the layer cache
    cached = imagetree.cached_image(ws.cache_dir / "images", image["id"])
    assert cached is not None and cached[1][-1] is not None
    assert json.loads(cached[0])["rootfs"]["diff_ids"][-1] == layer["layer"]

    # the same lock on the same image: the same layer and image ID, built twice from empty caches
    base_config = (ws.cache_dir / "images" / "configs" / f"{variant.image_id[7:]}.json").read_bytes()
    ids = set()
    for i in range(2):
        fresh = projectlayer.build_layer(
            lock_path=lock, variant_lock=ws.lock_txt("cpu"), image_id=variant.extra["env_image_id"],
            pin=images.load(ws).get("cpu"), cache_dir=tmp_path / f"cache{i}", epoch=variant.extra["epoch"])
        assert fresh.built and fresh.diff_id == layer["layer"]
        config = projectlayer.compose_config(base_config, fresh, projectlayer.labels_of(fresh),
                                             variant.extra["epoch"])
        ids.add(recipelayer.image_id_of(config))
    assert ids == {image["id"]}

    # a new requirement: the project is locked again and its layer rebuilt; the cpu image stays as it was
    (proj / "requirements.in").write_text("tabulate\nmsgpack\nhumanize\n")
    again = cli(ws, "run", str(proj / "train.py"), "--", "--humanize")["data"]["runs"][0]
    after = again["image"]["project"]
    assert "digits: 1,797" in log_of(ws, again)
    assert [p.split("==")[0] for p in after["packages"]] == ["humanize", "msgpack", "tabulate"]
    assert after["layer"] != layer["layer"] and after["variant_image_id"] == variant.image_id
    now = buildrecord.read_record(ws, "cpu")
    assert now is not None and now.image_id == variant.image_id
    assert now.extra["env_image_id"] == variant.extra["env_image_id"]


WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
PYPI_PAIR = ("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl",
             "torchvision-0.29.1-cp311-cp311-manylinux_2_28_x86_64.whl")


def wheel_folder(var: str, default: str, names: tuple[str, ...], source: str) -> Path:
    folder = Path(os.environ.get(var, default))
    missing = [n for n in names if not (folder / n).is_file()]
    need(not missing, f"no {', '.join(missing)} in {folder} (set {var} to a folder holding them; {source} serves them)")
    return folder


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.network
def test_torchvision_added_to_the_cpu_torch_variant_is_refused_at_lock_time(
        make_workspace: Callable[..., Workspace], tmp_path: Path) -> None:
    wheels = wheel_folder("LAUNCHER_TEST_WHEELS", "/opt/wheels", (WHEEL,), "download.pytorch.org/whl/cpu")
    ws = make_workspace(tmp_path / "ws", recipes=False)
    # the trap of the issue: torchvision added to torch-cpu.in resolves PyPI's (CUDA) build beside torch+cpu
    before = ws.lock_txt("torch-cpu").read_text()
    ws.lock_in("torch-cpu").write_text(ws.lock_in("torch-cpu").read_text() + "torchvision\n")
    res = CliRunner().invoke(app, ["-w", str(ws.root), "lock", "--variant", "torch-cpu", "--find-links", str(wheels)])
    assert res.exit_code == ExitCode.LOCK_FAILED, res.output
    line = " ".join(res.output.split())
    assert "torchvision==0.28.0 (lockfiles/torch-cpu.txt) does not match torch==2.13.0+cpu" in line
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in line and "--find-links DIR" in line
    assert ws.lock_txt("torch-cpu").read_text() == before


def metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """A wheel's name, version and Requires-Dist, read from its METADATA."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(name).decode())
    return msg["Name"].lower(), msg["Version"], msg.get_all("Requires-Dist") or []


def test_the_matching_rule_on_real_wheels() -> None:
    """PyPI pairs torchvision with its own torch build (no label on either, its metadata requiring torch);
    the CPU torch of PyTorch's index carries +cpu, which PyPI's torchvision lacks."""
    pypi = wheel_folder("LAUNCHER_TEST_PYPI_WHEELS", "/opt/pypi-more/files", PYPI_PAIR, "PyPI")
    cpu = wheel_folder("LAUNCHER_TEST_WHEELS", "/opt/wheels", (WHEEL,), "download.pytorch.org/whl/cpu")
    (torch, torch_v, _), (vision, vision_v, requires) = (metadata(pypi / n) for n in PYPI_PAIR)
    assert (torch, vision) == ("torch", "torchvision")
    assert any(re.match(r"torch\b", r) for r in requires)  # built against PyPI's torch: it requires it
    assert companions.mismatches({torch: torch_v, vision: vision_v}) == []
    _, cpu_v, _ = metadata(cpu / WHEEL)
    assert cpu_v == "2.13.0+cpu"
    found = companions.mismatches({"torch": cpu_v, vision: vision_v})
    assert [(m.companion, m.wanted) for m in found] == [("torchvision", "0.29.1+cpu")]
