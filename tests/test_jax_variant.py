"""JAX, the third framework, for real: the jax-cpu image built from the committed lock
(lockfiles/jax-cpu.txt: jax, jaxlib and optax from PyPI), mlp_jax run in it twice with one seed and
verified bit-identical, the PRNG key made from the run's seed listed in runtime.json, and a run with
another seed told apart (the proof is not vacuous)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.images.lock import parse_lock
from launcher.workspace import Workspace

pytestmark = [pytest.mark.tfimage, pytest.mark.network]
SHORT = ["--param", "epochs=2", "--param", "train_samples=512", "--param", "test_samples=128"]


def cli(ws: Workspace, *args: str, code: int = 0) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", *args])
    assert res.exit_code == code, res.output
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def test_the_committed_jax_lock_pins_jax_jaxlib_and_optax(repo_workspace: Workspace) -> None:
    pins = {r.name: r for r in parse_lock(repo_workspace.lock_txt("jax-cpu").read_text())}
    assert {"jax", "jaxlib", "optax", "numpy", "scikit-learn"} <= set(pins)
    assert all(r.hashes for r in pins.values()) and not repo_workspace.needs_gpu("jax-cpu")


@pytest.fixture(scope="module")
def jax_ws(make_workspace: Callable[[Path], Workspace], tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    ws = make_workspace(tmp_path_factory.mktemp("jaxws") / "ws")
    built = cli(ws, "build", "--variant", "jax-cpu")["data"]
    assert built["labels"]["org.launcher.variant"] == "jax-cpu"
    return ws


def test_mlp_jax_twice_with_one_seed_is_bit_identical_and_another_seed_is_not(jax_ws: Workspace) -> None:
    ws = jax_ws
    runs = cli(ws, "run", "mlp_jax", "--runs", "2", "--seed", "3", *SHORT)["data"]["runs"]  # its recipe: jax-cpu
    ids = [r["run_id"] for r in runs]
    for run_id in ids:
        manifest = json.loads((ws.runs / run_id / "manifest.json").read_text())
        assert manifest["status"] == "succeeded" and manifest["image"]["variant"] == "jax-cpu"
        runtime = manifest["runtime"]
        assert runtime["frameworks"] == ["jax"] and runtime["determinism"]["in_force"] is True
        assert runtime["applied"]["jax"]["deterministic_ops"] is True
        assert runtime["seed_calls"] == [{"api": "jax.random.PRNGKey", "seed": 3}]
    verdict = cli(ws, "verify", "checksums", *ids)["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]
    metrics = [json.loads(line) for line in (ws.runs / ids[0] / "outputs/metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["val_accuracy"] > 0.5  # it learned (chance is 0.1)

    other = cli(ws, "run", "mlp_jax", "--seed", "4", *SHORT)["data"]["runs"][0]["run_id"]
    res = CliRunner().invoke(app, ["-w", str(ws.root), "--json", "verify", "checksums", ids[0], other])
    assert res.exit_code != 0
    assert json.loads(res.stdout)["data"]["verdict"] != "identical"


def test_a_recipe_scaffolded_for_jax_runs_in_the_jax_image_as_written(jax_ws: Workspace) -> None:
    cli(jax_ws, "recipes", "new", "tiny_jax", "--framework", "jax")
    assert 'variant = "jax-cpu"' in (jax_ws.recipes / "tiny_jax" / "recipe.toml").read_text()
    run = cli(jax_ws, "run", "tiny_jax", "--seed", "1")["data"]["runs"][0]
    manifest = json.loads((jax_ws.runs / run["run_id"] / "manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["image"]["variant"] == "jax-cpu"
    assert (jax_ws.runs / run["run_id"] / "outputs/model/canonical.npz").is_file()
