"""Build complete run directories (runs/<id>/ with outputs/ and a schema-1 manifest) for tests.

The fake "training" is a small numpy computation driven by the seed, so runs with the same
seed are bit-identical, runs with another seed differ from the initial weights on, and an
unseeded dropout perturbs the trained layers (not the initial weights nor the batches), as a
nondeterministic kernel would. Every output is written with the runtime's own functions
(launcher.runtime.fingerprints), so verify reads these runs exactly as it reads pulled ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from launcher.hashing import atomic_write_json, sha256_bytes, sha256_file
from launcher.records.manifest import SCHEMA_VERSION, write_manifest
from launcher.runtime import fingerprints as fp
from launcher.verify.modeldiff import load_canonical

LAYERS: list[tuple[str, list[tuple[int, ...]]]] = [
    ("conv2d", [(3, 3, 1, 4), (4,)]),
    ("dense", [(36, 16), (16,)]),
    ("dense_1", [(16, 10), (10,)]),
]

# Shaped like launcher.hosts.provision's facts and the runtime's _launcher/runtime.json.
DEFAULT_FACTS: dict[str, Any] = {
    "os": "Debian GNU/Linux 12 (bookworm)", "os_id": "debian", "kernel": "6.1.0-26-amd64", "arch": "x86_64",
    "user": "root", "is_root": True, "cpu_model": "Intel(R) Xeon(R) CPU @ 2.20GHz", "cpu_cores": 2,
    "ram_bytes": 25_000_000_000, "disk_free_bytes": 40_000_000_000,
    "docker": {"installed": True, "usable": True, "server_version": "20.10.24"},
    "nvidia": {"smi": False, "gpus": [], "driver": None, "container_toolkit": False},
}
DEFAULT_FRAMEWORK: dict[str, Any] = {"name": "tensorflow", "version": "2.21.0", "keras": "3.12.0",
                                     "cuda": None, "cudnn": None, "devices": ["CPU:/physical_device:CPU:0"]}


@dataclass
class FakeRun:
    run_id: str
    group: str = "g1"
    replicate: int = 0
    recipe: str = "mnist_convnet"
    seed: int = 42
    epochs: int = 3
    batches_per_epoch: int = 5
    unseeded_dropout: bool = False
    dropout_entropy: int | None = None  # what an unseeded generator would have drawn
    data_version: int = 0
    code_version: int = 0
    profile: str = "deterministic"
    threads: int = 2
    started_at: str = "2026-11-22T10:00:00Z"
    facts: dict[str, Any] = field(default_factory=lambda: json.loads(json.dumps(DEFAULT_FACTS)))
    framework: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_FRAMEWORK))
    image_id: str = "sha256:" + "1" * 64
    params: dict[str, Any] = field(default_factory=lambda: {"epochs": 3, "batch_size": 32})
    layers: list[tuple[str, list[tuple[int, ...]]]] = field(default_factory=lambda: list(LAYERS))
    extra_files: dict[str, bytes] = field(default_factory=dict)


def _train(run: FakeRun) -> dict[str, Any]:
    rng = np.random.default_rng(run.seed)
    initial = [(name, [rng.standard_normal(s).astype(np.float32) * 0.1 for s in shapes])
               for name, shapes in run.layers]
    data_rng = np.random.default_rng(1000 + run.data_version)
    n_samples = run.batches_per_epoch * 8
    data = data_rng.standard_normal((n_samples, 4)).astype(np.float32)
    weights = [(name, [a.copy() for a in arrays]) for name, arrays in initial]
    batches: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    noise = np.random.default_rng(run.dropout_entropy) if run.unseeded_dropout else None
    for epoch in range(run.epochs):
        order = rng.permutation(n_samples)
        digests = [fp.batch_digest(order[i * 8:(i + 1) * 8]) for i in range(run.batches_per_epoch)]
        batches.append(fp.epoch_record(epoch, digests))
        step = float(data[order].mean()) + 0.001 * run.code_version
        for li, (_, arrays) in enumerate(weights):
            for arr in arrays:
                arr *= np.float32(0.99)
                arr += np.float32(step * 0.01)
                if noise is not None and li >= 1:  # dropout sits before the dense layers
                    arr += (noise.standard_normal(arr.shape) * 1e-6).astype(np.float32)
        total = sum(float(np.abs(a).sum()) for _, arrs in weights for a in arrs)
        metrics.append({"epoch": epoch, "loss": round(1.0 / (1 + epoch) + total * 1e-4, 12),
                        "accuracy": round(min(0.99, 0.5 + 0.1 * epoch + total * 1e-5), 12)})
    return {"initial": initial, "weights": weights, "batches": batches, "metrics": metrics,
            "dataset": data}


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows).encode()


def _json(data: Any) -> bytes:
    return fp.canonical_json(data).encode()


def _determinism_env(run: FakeRun) -> dict[str, str]:
    return {"LAUNCHER_SEED": str(run.seed), "PYTHONHASHSEED": str(run.seed), "LAUNCHER_PROFILE": run.profile,
            "LAUNCHER_THREADS": str(run.threads), "TF_DETERMINISTIC_OPS": "1",
            "OMP_NUM_THREADS": str(run.threads)}


def runtime_doc(run: FakeRun) -> dict[str, Any]:
    return {"profile": run.profile, "seed": run.seed, "threads": run.threads,
            "framework": {**run.framework, "threads": {"intra_op": run.threads, "inter_op": run.threads}},
            "python": {"version": "3.11.2", "implementation": "CPython",
                       "executable": "/opt/venv/bin/python"},
            "platform": {"system": "Linux", "machine": "x86_64", "release": "6.1.0-26-amd64", "cpu_count": 2},
            "env": _determinism_env(run)}


def write_run(runs_dir: Path, run: FakeRun) -> Path:
    """Write runs_dir/<run_id>/ with outputs/ and manifest.json; return the run directory."""
    out = _train(run)
    d = runs_dir / run.run_id
    o = d / "outputs"
    files: dict[str, bytes] = {
        "_launcher/exit.json": _json({"exit_code": 0, "started_at": run.started_at,
                                      "ended_at": run.started_at}),
        "_launcher/runtime.json": _json(runtime_doc(run)),
        "logs/train.log": f"training {run.recipe} seed={run.seed} at {run.started_at}\n".encode(),
        "fingerprints/dataset.json": _json(fp.arrays_fingerprint({"x_train": out["dataset"]})),
        "fingerprints/initial_weights.json": _json(fp.weights_fingerprint(out["initial"])),
        "fingerprints/batches.jsonl": _jsonl(out["batches"]),
        "metrics.jsonl": _jsonl(out["metrics"]),
        "weights/layers.json": _json(fp.layers_document(out["weights"])),
        "model/canonical.npz": fp.canonical_npz_bytes(out["weights"]),
    }
    files.update(run.extra_files)
    for rel, data in files.items():
        p = o / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    atomic_write_json(d / "launch.json", {"run_id": run.run_id, "group": run.group, "replicate": run.replicate,
                                          "recipe": {"name": run.recipe}, "launched_at": run.started_at,
                                          "host": {"name": "local", "kind": "local"}})
    refresh_manifest(d, manifest_data(run))
    return d


def manifest_data(run: FakeRun) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run.run_id, "group": run.group, "replicate": run.replicate,
        "recipe": {"name": run.recipe, "tree_digest": sha256_bytes(f"recipe-{run.code_version}".encode()),
                   "framework": "tensorflow", "entry": "train.py"},
        "params": run.params, "seed": run.seed,
        "determinism": {"profile": run.profile, "threads": run.threads, "env": _determinism_env(run)},
        "image": {"id": run.image_id, "tag": "launcher/ws-cpu:0123456789ab", "variant": "cpu",
                  "base_digest": "sha256:" + "2" * 64, "lock_sha256": "sha256:" + "3" * 64,
                  "git_commit": "0" * 40, "git_dirty": False, "launcher_version": "0.1.0"},
        "host": {"name": "local", "kind": "local", "facts": run.facts},
        "runtime": runtime_doc(run),
        "started_at": run.started_at, "ended_at": run.started_at, "exit_code": 0, "status": "succeeded",
        "artifacts": [],
    }


def refresh_manifest(run_dir: Path, data: dict[str, Any] | None = None) -> None:
    """(Re)write the manifest with the current outputs' hashes, as a pull would."""
    if data is None:
        data = json.loads((run_dir / "manifest.json").read_text())
    rels = sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / "outputs").rglob("*") if p.is_file())
    data["artifacts"] = [{"path": r, "size": (run_dir / r).stat().st_size, "sha256": sha256_file(run_dir / r)}
                         for r in rels]
    write_manifest(run_dir, data)


def edit_manifest(run_dir: Path, **changes: Any) -> None:
    """Overwrite top-level manifest fields without validation (for bad-input tests)."""
    path = run_dir / "manifest.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def flip_bit(run_dir: Path, layer: str, array: int, element: int = 0, bit: int = 0,
             update_manifest: bool = True, retrain: bool = False) -> None:
    """Flip one bit of one weight in outputs/model/canonical.npz, keeping the canonical form.

    retrain: also rewrite weights/layers.json as the runtime would, as if training had ended
    with that weight (a training difference); without it the run contradicts its own digests
    (a file altered after training)."""
    path = run_dir / "outputs" / "model" / "canonical.npz"
    layers: list[tuple[str, list[np.ndarray]]] = []
    for wa in load_canonical(path):
        value = wa.value
        if wa.layer == layer and wa.array == str(array):
            value = value.copy()
            bits = value.reshape(-1).view(f"u{value.dtype.itemsize}")
            bits[element] ^= np.array(1 << bit, dtype=bits.dtype)
        if not layers or layers[-1][0] != wa.layer:
            layers.append((wa.layer, []))
        layers[-1][1].append(value)
    path.write_bytes(fp.canonical_npz_bytes(layers))
    if retrain:
        (run_dir / "outputs" / "weights" / "layers.json").write_bytes(_json(fp.layers_document(layers)))
    if update_manifest:
        refresh_manifest(run_dir)


def pair(runs_dir: Path, *, group: str = "g1", **second: Any) -> tuple[Path, Path]:
    """Two replicate runs of one group; keyword arguments change the second run only."""
    a = write_run(runs_dir, FakeRun(run_id="20261122T100000-mnist_convnet-aaaaaa", group=group, replicate=0))
    spec = FakeRun(run_id="20261122T100500-mnist_convnet-bbbbbb", group=group, replicate=1,
                   started_at="2026-11-22T10:05:00Z")
    for k, v in second.items():
        setattr(spec, k, v)
    b = write_run(runs_dir, spec)
    return a, b


def make_workspace(root: Path) -> Path:
    for d in ("lockfiles", "dockerfiles", "recipes", "runs"):
        (root / d).mkdir(parents=True, exist_ok=True)
    return root


def adopt_outputs(runs_dir: Path, run_id: str, outputs: Path, *, recipe: str, seed: int | None,
                  group: str = "g1", replicate: int = 0, params: dict[str, Any] | None = None,
                  profile: str = "deterministic", threads: int = 2, env: dict[str, str] | None = None,
                  started_at: str = "2026-11-22T10:00:00Z") -> Path:
    """Make runs_dir/<run_id>/ from an outputs folder a real runtime wrote, as a pull would."""
    d = runs_dir / run_id
    d.mkdir(parents=True)
    outputs.rename(d / "outputs")
    spec = FakeRun(run_id=run_id, group=group, replicate=replicate, recipe=recipe,
                   seed=seed if seed is not None else 0, profile=profile, threads=threads,
                   started_at=started_at, params=dict(params or {}))
    data = manifest_data(spec)
    data["seed"] = seed
    data["determinism"]["env"] = dict(env or {})
    data["recipe"]["framework"] = "none"
    runtime = d / "outputs" / "_launcher" / "runtime.json"
    data["runtime"] = json.loads(runtime.read_text()) if runtime.exists() else {}
    refresh_manifest(d, data)
    return d


def keras_bytes(layers: list[tuple[str, list[np.ndarray]]], saved_at: str,
                when: tuple[int, int, int, int, int, int]) -> bytes:
    """A Keras 3 ``.keras`` archive as ``model.save`` writes it (metadata.json with date_saved,
    config.json, model.weights.h5 with layers/<name>/vars/<i>), its zip entries dated ``when``."""
    import io
    import zipfile

    import h5py

    weights = io.BytesIO()
    with h5py.File(weights, "w") as f:
        for name, arrays in layers:
            group = f.create_group(f"layers/{name}/vars")
            for i, value in enumerate(arrays):
                group.create_dataset(str(i), data=value)
        f.create_group("optimizer/vars").create_dataset("0", data=np.int64(3))
    config = {"module": "keras", "class_name": "Sequential",
              "config": {"name": "sequential", "layers": [{"class_name": "Dense", "config": {"name": n}}
                                                          for n, _ in layers]}}
    members = (("metadata.json", {"keras_version": "3.12.0", "date_saved": saved_at}), ("config.json", config))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, doc in members:
            z.writestr(zipfile.ZipInfo(name, date_time=when), json.dumps(doc))
        z.writestr(zipfile.ZipInfo("model.weights.h5", date_time=when), weights.getvalue())
    return out.getvalue()


def keep_only(run_dir: Path, *kept: str) -> None:
    """Delete every output but launcher's records and the named ones (paths under outputs/), as a
    script that saves nothing else would leave its run; then refresh the manifest."""
    outputs = run_dir / "outputs"
    for p in sorted(outputs.rglob("*"), reverse=True):
        rel = p.relative_to(outputs).as_posix()
        if p.is_file() and not rel.startswith(("_launcher/", "logs/train.log")) and rel not in kept:
            p.unlink()
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()
    refresh_manifest(run_dir)
