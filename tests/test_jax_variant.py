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


# ---------------------------------------------------------------- steps, diverge and resume for a JAX loop

# 512 samples in batches of 64: 8 optimizer steps an epoch, 2 epochs; a fingerprint every 3 steps and at
# each epoch's end (0, 3, 6, 8, 9, 12, 15, 16), a checkpoint after each epoch, every one kept.
PAIR = ["--seed", "3", "--param", "epochs=2", "--param", "train_samples=512", "--param", "test_samples=64",
        "--trace-every", "3", "--checkpoint-every", "1", "--keep-checkpoints"]


@pytest.fixture(scope="module")
def jax_pair(jax_ws: Workspace) -> list[str]:
    """mlp_jax twice, the second halving its learning rate from step 11 on: they part at step 11."""
    return [cli(jax_ws, "run", "mlp_jax", *PAIR, *extra)["data"]["runs"][0]["run_id"]
            for extra in ([], ["--param", "halve_lr_at=11"])]


@pytest.mark.slow
@pytest.mark.image
def test_a_jax_loop_is_fingerprinted_at_its_steps_and_verify_says_where_runs_part(jax_ws: Workspace,
                                                                                 jax_pair: list[str]) -> None:
    rows = [json.loads(line) for line in (jax_ws.runs / jax_pair[0] / "outputs/fingerprints/steps.jsonl")
            .read_text().splitlines()]
    assert [(r["step"], r.get("epoch")) for r in rows] == [(0, None), (3, None), (6, None), (8, 0), (9, None),
                                                          (12, None), (15, None), (16, 1)]
    assert list(rows[0]["layers"]) == ["['hidden']", "['out']"] and "loss" in rows[1]
    res = CliRunner().invoke(app, ["-w", str(jax_ws.root), "--json", "verify", "checksums", *jax_pair])
    steps = json.loads(res.stdout)["data"]["explanations"][jax_pair[1]]["steps"]
    assert (steps["agree_until"], steps["parts_by"]) == (9, 12), steps


@pytest.mark.slow
@pytest.mark.image
def test_diverge_localises_mlp_jax_runs_to_the_step_and_the_parameter_leaf(jax_ws: Workspace,
                                                                          jax_pair: list[str]) -> None:
    d = cli(jax_ws, "diverge", "--no-causes", *jax_pair)["data"]
    assert d["window"] == [10, 12] and d["outcome"] == "localised"
    assert [(p["checkpoint"], p["step"]) for p in d["started_from"].values()] == [("epoch-0001", 8)] * 2
    assert [(c["steps_checked"], c["repeats"]) for c in d["checks"]] == [([9], True), ([9], True)]
    assert (d["exact"]["agree_until"], d["exact"]["parts_by"]) == (10, 11)
    first = d["first_difference"]
    assert (first["step"], first["kind"], first["name"], first["layer"]) == (11, "updated", "['hidden']['b']",
                                                                             "['hidden']"), first
    assert first["operations_traced"] is False and d["trace"]["framework"] == "jax"
    text = "\n".join(d["lines"])
    assert "exact step: the re-executions' weights agree up to step 10 and differ from step 11 on" in text
    assert "step 11: the weights first differ right after its optimizer update, at ['hidden']['b']" in text


@pytest.mark.slow
@pytest.mark.image
def test_a_killed_jax_run_resumes_to_the_bits_of_an_uninterrupted_one(jax_ws: Workspace) -> None:
    import subprocess
    import time

    run = ["run", "mlp_jax", "--seed", "5", "--checkpoint-every", "1", "--param", "epochs=30",
           "--param", "train_samples=256", "--param", "test_samples=64", "--trace-every", "5"]
    whole = cli(jax_ws, *run)["data"]["runs"][0]
    launch = cli(jax_ws, *run, "--detach")["data"]["runs"][0]
    latest = Path(launch["remote_dir"]) / "out/checkpoints/latest.json"
    deadline = time.monotonic() + 300
    while not latest.is_file():
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.02)
    subprocess.run(["docker", "kill", launch["container"]], check=True, capture_output=True)
    assert not (Path(launch["remote_dir"]) / "out/model/canonical.npz").exists()
    resumed = cli(jax_ws, "resume", launch["run_id"])["data"]["run"]
    assert resumed["status"] == "succeeded" and resumed["segments"][0]["exit_code"] == 137
    log = (jax_ws.runs / launch["run_id"] / "outputs/logs/train.log").read_text()
    assert "launcher: restored checkpoint epoch-" in log
    for rel in ("model/canonical.npz", "metrics.jsonl", "fingerprints/batches.jsonl", "fingerprints/steps.jsonl"):
        a, b = (jax_ws.runs / r["run_id"] / "outputs" / rel for r in (whole, resumed))
        assert a.read_bytes() == b.read_bytes(), rel
    assert cli(jax_ws, "verify", "checksums", whole["run_id"], resumed["run_id"])["data"]["verdict"] == "identical"


@pytest.mark.slow
@pytest.mark.image
def test_xla_cpu_threads_are_bound_by_the_runs_thread_count(jax_ws: Workspace, tmp_path: Path) -> None:
    """The process is bound to --threads CPUs before JAX's backend starts; XLA sizes its pools from them."""
    script = tmp_path / "threads" / "main.py"
    script.parent.mkdir()
    script.write_text("import os\nimport jax\nimport jax.numpy as jnp\n"
                      "x = jnp.ones((512, 512))\n(x @ x).block_until_ready()\n"
                      "print('cpus', len(os.sched_getaffinity(0)), 'threads', len(os.listdir('/proc/self/task')))\n")
    seen = {}
    for threads in ("1", "2"):
        run = cli(jax_ws, "run", str(script), "--threads", threads)["data"]["runs"][0]
        out = jax_ws.runs / run["run_id"] / "outputs"
        applied = json.loads((out / "_launcher/runtime.json").read_text())["applied"]["jax"]
        assert applied["threads"] == {"intra_op": int(threads), "inter_op": int(threads)}
        line = next(x for x in (out / "logs/train.log").read_text().splitlines() if x.startswith("cpus "))
        seen[threads] = [int(v) for v in line.split()[1::2]]
    assert seen["1"][0] == 1 and seen["2"][0] == 2
    assert seen["1"][1] < seen["2"][1], seen  # fewer threads in the process on one CPU than on two


def test_jax_over_two_processes_verifies_identical_on_one_node_and_on_two(jax_ws: Workspace, tmp_path: Path) -> None:
    """JAX's multi-process runtime, for real: a script that calls jax.distributed.initialize() as on a cluster
    (tests/fixtures/jax_procs/train.py), as 1 node x 2 processes twice and 2 nodes x 1 (two containers on a private
    network), CPU collectives over Gloo; verified identical."""
    import shutil

    project = tmp_path / "jaxprocs"
    project.mkdir()
    shutil.copy(Path(__file__).parent / "fixtures/jax_procs/train.py", project / "train.py")
    script = str(project / "train.py")
    one_node = cli(jax_ws, "run", script, "--variant", "jax-cpu", "--procs-per-node", "2",
                   "--runs", "2")["data"]["runs"]
    (two_nodes,) = cli(jax_ws, "run", script, "--variant", "jax-cpu", "--nodes", "2")["data"]["runs"]
    runs = [*one_node, two_nodes]
    for run in runs:
        assert run["status"] == "succeeded" and run["topology"]["launcher"].startswith("jax.distributed")
        assert [e["exit_code"] for e in run["topology"]["ended"]] == [0, 0]
        assert run["runtime"]["applied"]["jax"]["distributed"] == {"processes": 2, "process_id": 0}
        assert "process 0 of 2: loss" in (jax_ws.runs / run["run_id"] / "outputs/logs/train.log").read_text()
    verdict = cli(jax_ws, "verify", "checksums", *(r["run_id"] for r in runs))["data"]
    assert verdict["verdict"] == "identical", verdict["summary"]
    assert "outputs/params.npz" in {a["path"] for a in verdict["artifacts"] if a["checked"]}
