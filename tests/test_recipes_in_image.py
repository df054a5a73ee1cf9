"""Every seed recipe trains for real in the shared TensorFlow CPU image, on its built-in data,
for a few steps, started as a run starts it (the container contract in docs/design.md).

Same seed and the default profile: byte-identical artifacts, canonical model included.
Another seed: other weights. The `off` profile with unseeded dropout: other weights run to run.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher.determinism import profile_env
from launcher.runtime import fingerprints as fp

pytestmark = [pytest.mark.docker, pytest.mark.tfimage]

# The files that must be byte-identical between two runs; logs and exit.json carry times, and
# model.keras carries zip dates and a save date (the reason canonical.npz exists).
COMPARED = ("_launcher/runtime.json", "fingerprints/dataset.json", "fingerprints/train_data.json",
            "fingerprints/initial_weights.json", "fingerprints/batches.jsonl", "metrics.jsonl",
            "weights/layers.json", "model/canonical.npz", "model/model.weights.h5")

TRAIN_DATA = "fingerprints/train_data.json"  # the arrays fit() trains on, when it is given arrays

# (params for a few steps, the trainable-parameter line the recipe must print)
RECIPES: dict[str, tuple[dict[str, Any], str]] = {
    # seed 003 gives no count; 320 + 18,496 + 1,179,776 + 1,290 for its layers at 28x28
    "mnist_convnet": ({"epochs": 2, "train_samples": 384, "test_samples": 64}, "trainable params: 1,199,882"),
    "catsdogs_convnet": ({"epochs": 1, "train_samples": 32}, "trainable params: 991,041"),  # seed 002
    "mini_xception": ({"epochs": 1, "train_samples": 16, "batch_size": 16}, "trainable params: 718,849"),
    # the smallest ResNet v2 (one block per stage): the same code paths, a third of the time
    "cifar_resnet": ({"epochs": 1, "train_samples": 64, "test_samples": 32, "depth": 11},
                     "ResNet11v2: trainable params:"),
    # seed 000's experiment: its dropout seed forgotten, which the default profile's global seed covers
    "pets_unet": ({"epochs": 1, "train_samples": 16, "batch_size": 8, "dropout_seed": "none"},
                  "unet_mobilenetv2: trainable params:"),
}


def docker_run(image: str, out: Path, *, recipe: str | None = None, script: Path | None = None,
               params: dict[str, Any] | None = None, env: dict[str, str] | None = None,
               data: Path | None = None) -> tuple[int, str]:
    """One run as launcher starts it: determinism env, outputs mounted, the runtime as the command."""
    out.mkdir(parents=True)
    argv = ["docker", "run", "--rm", "--label", "org.launcher.test=recipes-in-image"]
    for key, value in (env or {}).items():
        argv += ["-e", f"{key}={value}"]
    argv += ["-v", f"{out}:/launcher/out"]
    if data is not None:
        argv += ["-v", f"{data}:/launcher/data:ro"]
    if script is not None:
        argv += ["-v", f"{script.parent}:/launcher/code:ro"]
    argv += [image, "python", "-m", "launcher.runtime", "run"]
    if script is not None and script.is_dir():  # a recipe folder of the user's own
        argv += ["--recipe", f"/launcher/code/{script.name}"]
    elif script is not None:
        argv += ["--script", f"/launcher/code/{script.name}"]
    else:
        argv += ["--recipe", f"/opt/launcher/recipes/{recipe}"]
    argv += ["--out", "/launcher/out", "--params", json.dumps(params or {})]
    if data is not None:
        argv += ["--data", "/launcher/data"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    log_file = out / "logs/train.log"
    log = log_file.read_text() if log_file.is_file() else res.stdout + res.stderr
    return res.returncode, log


def docker_runs(image: str, jobs: dict[Path, dict[str, Any]]) -> dict[Path, tuple[int, str]]:
    """Several independent runs, two at a time: most of a run is TensorFlow starting and building the
    model, one core each (the bits do not depend on it: the thread counts are the profile's)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = {out: pool.submit(docker_run, image, out, **kwargs) for out, kwargs in jobs.items()}
        return {out: future.result() for out, future in done.items()}


def read(out: Path, rel: str) -> bytes:
    return (out / rel).read_bytes()


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recipe_trains_bit_identically_with_the_same_seed_and_differently_with_another(
        recipe: str, cpu_image: dict[str, Any], tmp_path: Path) -> None:
    params, count_line = RECIPES[recipe]
    a, b, c = (tmp_path / name for name in "abc")
    done = docker_runs(cpu_image["id"], {out: {"recipe": recipe, "params": params,
                                               "env": profile_env("deterministic", seed)}
                                         for out, seed in ((a, 1), (b, 1), (c, 2))})
    for rc, log in done.values():
        assert rc == 0, log[-4000:]
        assert count_line in log, f"{recipe} printed no '{count_line}'"
    for rel in COMPARED:
        if rel == TRAIN_DATA and not (a / rel).exists():  # fit() got a tf.data pipeline, not arrays
            assert not (b / rel).exists()
            continue
        assert read(a, rel) == read(b, rel), f"{recipe}: {rel} differs between two runs with seed 1"
    assert (a / "model/model.keras").is_file()
    assert json.loads(read(a, "_launcher/exit.json"))["exit_code"] == 0
    assert read(a, "fingerprints/dataset.json") == read(c, "fingerprints/dataset.json")
    for rel in ("weights/layers.json", "model/canonical.npz", "fingerprints/batches.jsonl"):
        assert read(a, rel) != read(c, rel), f"{recipe}: {rel} is the same with seeds 1 and 2"
    runtime = json.loads(read(a, "_launcher/runtime.json"))
    assert runtime["framework"]["name"] == "tensorflow"
    assert runtime["framework"]["op_determinism"] == "fwr13y.d9m.tensorflow.enable_determinism"
    assert runtime["framework"]["threads"] == {"intra_op": 2, "inter_op": 2}
    assert "cuda" in runtime["framework"] and runtime["framework"]["devices"]
    with np.load(a / "model/canonical.npz") as npz:
        layers = json.loads(read(a, "weights/layers.json"))["layers"]
        assert len(npz.files) == sum(len(entry["arrays"]) for entry in layers)


def test_off_profile_with_unseeded_dropout_differs_run_to_run(cpu_image: dict[str, Any], tmp_path: Path) -> None:
    """Seed 000's experiment: its U-Net with the dropout seed forgotten. Under `off` nothing else is
    seeded either, so even the initial weights differ. (Under the default profile the runtime's global
    seed covers the forgotten dropout seed and the runs agree: pets_unet's case of the recipe test above.)"""
    params = {**RECIPES["pets_unet"][0], "train_samples": 8, "img_size": 64}
    done = docker_runs(cpu_image["id"], {tmp_path / name: {"recipe": "pets_unet", "params": params,
                                                           "env": profile_env("off")} for name in ("off1", "off2")})
    for out, (rc, log) in done.items():
        assert rc == 0, f"{out.name}: {log[-4000:]}"
    off1, off2 = tmp_path / "off1", tmp_path / "off2"
    assert read(off1, "model/canonical.npz") != read(off2, "model/canonical.npz")
    assert read(off1, "fingerprints/initial_weights.json") != read(off2, "fingerprints/initial_weights.json")
    assert json.loads(read(off1, "_launcher/runtime.json"))["framework"]["op_determinism"] is None


SPY = '''"""A plain script: the batches the model really trained on, seen from inside train_step."""
import hashlib
import json
import numpy as np
import tensorflow as tf
from launcher.runtime import api

keras = tf.keras
seen = []

class Spy(keras.Model):
    def train_step(self, data):
        h = hashlib.sha256()
        for t in data:
            a = np.asarray(t)
            h.update(f"{a.dtype.str}|{list(a.shape)}|".encode())
            h.update(a.tobytes())
        x, y = data
        seen.append({"ids": [int(v) for v in np.asarray(x)[:, 0]], "digest": "sha256:" + h.hexdigest()})
        return super().train_step(data)

n = 50
x = np.stack([np.arange(n), np.linspace(-1, 1, n)], axis=1).astype("float64")
y = (x[:, 1] > 0).astype("int64")
inputs = keras.Input((2,))
outputs = keras.layers.Dense(2, activation="softmax")(keras.layers.Dropout(0.3)(inputs))
model = Spy(inputs, outputs)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", run_eagerly=True)
model.fit(x, y, batch_size=8, epochs=3, validation_split=0.2, verbose=0)
first = len(seen)
model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
(api.out_dir() / "seen.json").write_text(json.dumps({"fit1": seen[:first], "fit2": seen[first:]}))
'''


def test_recorded_batch_order_is_the_order_the_model_trained_on(cpu_image: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    """In-memory arrays go to fit() unchanged: Keras shuffles them itself, and the runtime records the
    contents of each batch as Keras' pipeline yields it (what train_step receives)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "spy.py").write_text(SPY)
    rc, log = docker_run(cpu_image["id"], tmp_path / "out", script=code / "spy.py",
                         env=profile_env("deterministic", 4))
    assert rc == 0, log[-4000:]
    out = tmp_path / "out"
    seen = json.loads((out / "seen.json").read_text())
    epochs = [json.loads(line) for line in (out / "fingerprints/batches.jsonl").read_text().splitlines()]
    fit1 = [e for e in epochs if "fit" not in e]
    fit2 = [e for e in epochs if e.get("fit") == 1]
    assert len(fit1) == 3 and len(fit2) == 1
    per_epoch = [seen["fit1"][i * 5:(i + 1) * 5] for i in range(3)]  # 40 training samples in batches of 8
    for record, batches in zip(fit1, per_epoch, strict=True):
        assert record["batches"] == [b["digest"] for b in batches]
        assert sorted(i for b in batches for i in b["ids"]) == list(range(40))  # validation_split kept the last 10
    assert [b["ids"] for b in per_epoch[0]] != [list(range(i, i + 8)) for i in range(0, 40, 8)]  # shuffled
    assert [b["ids"] for b in seen["fit2"]] == [list(range(0, 16)), list(range(16, 32)), list(range(32, 48)), [48, 49]]
    assert fit2[0]["batches"] == [b["digest"] for b in seen["fit2"]]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "val_loss" in metrics[0] and metrics[-1]["fit"] == 1
    data = json.loads((out / "fingerprints/train_data.json").read_text())
    assert data["entries"]["x"]["shape"] == [40, 2] and data["entries"]["x"]["dtype"] == "<f8"
    assert json.loads((out / "fingerprints/dataset.json").read_text())["kind"] == "arrays"


SPY_DATASET = '''"""A tf.data pipeline: the runtime digests batch contents as they reach the model."""
import hashlib
import json
import numpy as np
import tensorflow as tf
from launcher.runtime import api

keras = tf.keras
seen = []

class Spy(keras.Model):
    def train_step(self, data):
        h = hashlib.sha256()
        for t in data:
            a = np.asarray(t)
            h.update(f"{a.dtype.str}|{list(a.shape)}|".encode())
            h.update(a.tobytes())
        seen.append("sha256:" + h.hexdigest())
        return super().train_step(data)

n = 50
x = np.stack([np.arange(n), np.linspace(-1, 1, n)], axis=1).astype("float32")
y = (x[:, 1] > 0).astype("int64")
ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(50, seed=3).batch(8).prefetch(2)
inputs = keras.Input((2,))
model = Spy(inputs, keras.layers.Dense(2, activation="softmax")(inputs))
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", run_eagerly=True)
model.fit(ds, epochs=3, verbose=0)
(api.out_dir() / "seen.json").write_text(json.dumps(seen))
'''


def test_a_tf_data_pipeline_is_recorded_by_batch_contents(cpu_image: dict[str, Any], tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "spy_dataset.py").write_text(SPY_DATASET)
    rc, log = docker_run(cpu_image["id"], tmp_path / "out", script=code / "spy_dataset.py",
                         env=profile_env("deterministic", 4))
    assert rc == 0, log[-4000:]
    seen = json.loads((tmp_path / "out/seen.json").read_text())
    epochs = [json.loads(line) for line in (tmp_path / "out/fingerprints/batches.jsonl").read_text().splitlines()]
    assert [len(e["batches"]) for e in epochs] == [7, 7, 7]
    assert [b for e in epochs for b in e["batches"]] == seen
    assert epochs[0]["batches"] != epochs[1]["batches"]  # the pipeline reshuffles every epoch


def test_a_scaffolded_recipe_folder_of_ones_own_runs_the_same_way(cpu_image: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    from launcher.specs.recipes import scaffold_recipe
    from launcher.workspace import Workspace

    for d in ("lockfiles", "dockerfiles", "recipes"):
        (tmp_path / "ws" / d).mkdir(parents=True)
    recipe = scaffold_recipe(Workspace.at(tmp_path / "ws"), "mine")
    done = docker_runs(cpu_image["id"], {tmp_path / name: {"script": recipe.path, "params": {"epochs": 2},
                                                           "env": profile_env("deterministic", 9)} for name in "ab"})
    for rc, log in done.values():
        assert rc == 0, log[-4000:]
    for rel in COMPARED:
        assert read(tmp_path / "a", rel) == read(tmp_path / "b", rel), rel
    assert len(read(tmp_path / "a", "metrics.jsonl").splitlines()) == 2


SELF_SEEDED = '''"""A script that seeds itself, run under `off`: it must repeat as it would without launcher."""
import numpy as np
import tensorflow as tf

keras = tf.keras
keras.utils.set_random_seed(5)
x = np.random.rand(64, 4).astype("float32")
y = (x.sum(1) > 2).astype("int64")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.2), keras.layers.Dense(2, activation="softmax")])
model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
model.fit(x, y, epochs=2, batch_size=16, verbose=0)
'''


def test_off_leaves_a_self_seeded_script_repeatable(cpu_image: dict[str, Any], tmp_path: Path) -> None:
    """Under `off` nothing is seeded by launcher: Keras shuffles from the script's own seed, as without launcher."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "self_seeded.py").write_text(SELF_SEEDED)
    done = docker_runs(cpu_image["id"], {tmp_path / name: {"script": code / "self_seeded.py", "env": profile_env("off")}
                                         for name in "ab"})
    for rc, log in done.values():
        assert rc == 0, log[-4000:]
    # the batch order and the initial weights come from the script's own seed; the final weights
    # would also need op determinism, which `off` leaves out
    for rel in ("fingerprints/batches.jsonl", "fingerprints/initial_weights.json"):
        assert read(tmp_path / "a", rel) == read(tmp_path / "b", rel), rel


def _bad_folders(root: Path) -> dict[str, tuple[str, dict[str, Any], Path, str]]:
    """recipe, params, data folder, words the error must contain."""
    cases: dict[str, tuple[str, dict[str, Any], Path, str]] = {}
    mnist = root / "mnist"
    mnist.mkdir(parents=True)
    np.savez(mnist / "mnist.npz", x_train=np.zeros((2, 28, 28), "uint8"))
    cases["mnist"] = ("mnist_convnet", {"dataset": "mnist"}, mnist,
                      "mnist.npz in /launcher/data has sha256:")
    cifar = root / "cifar"
    cifar.mkdir()
    (cifar / "readme.html").write_text("not the batches")
    cases["cifar"] = ("cifar_resnet", {"dataset": "cifar10"}, cifar, "/launcher/data/data_batch_1: not found")
    evil = root / "evil"
    evil.mkdir()
    for name in ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"):
        (evil / name).write_bytes(pickle.dumps({b"data": subprocess.Popen, b"labels": []}))
    cases["evil"] = ("cifar_resnet", {"dataset": "cifar10"}, evil, "refusing to load subprocess.Popen")
    cats = root / "cats"
    (cats / "training").mkdir(parents=True)
    cases["cats"] = ("catsdogs_convnet", {"dataset": "files"}, cats, "/launcher/data/train: not found")
    pets = root / "pets"
    (pets / "images").mkdir(parents=True)
    (pets / "annotations/trimaps").mkdir(parents=True)
    pet = next(f"Abyssinian_{i}" for i in range(1, 100)
               if int(hashlib.md5(f"Abyssinian_{i}".encode()).hexdigest(), 16) % 10 < 7)
    (pets / "images" / f"{pet}.jpg").write_bytes(b"\xff\xd8")
    cases["pets"] = ("pets_unet", {"dataset": "files"}, pets, f"annotations/trimaps/{pet}.png: missing")
    return cases


def test_wrong_data_folders_fail_with_the_file_named(cpu_image: dict[str, Any], tmp_path: Path) -> None:
    cases = _bad_folders(tmp_path / "data")
    done = docker_runs(cpu_image["id"], {tmp_path / "out" / name: {"recipe": recipe, "params": params, "data": data,
                                                                   "env": profile_env("deterministic", 1)}
                                         for name, (recipe, params, data, _) in cases.items()})
    for name, (_, _, _, words) in cases.items():
        rc, log = done[tmp_path / "out" / name]
        assert rc == 17, f"{name}: exit {rc}\n{log[-2000:]}"
        assert words in log, f"{name}: {words!r} not in\n{log[-2000:]}"


def _real_format_folder(kind: str, root: Path) -> tuple[str, dict[str, Any]]:
    """Tiny folders in the published layouts, written with Pillow and pickle; (recipe, params)."""
    from PIL import Image

    rng = np.random.default_rng(7)

    def jpeg(path: Path, size: int = 64) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, size=(size, size, 3), dtype=np.uint8)).save(path, "JPEG")

    if kind == "dogs-vs-cats":
        for split, count in (("train", 3), ("validation", 2)):
            for cls in ("cat", "dog"):
                for i in range(count):
                    jpeg(root / split / cls / f"{cls}.{i}.jpg", 200)
        return "catsdogs_convnet", {"dataset": "files", "epochs": 1, "batch_size": 4}
    if kind == "oxford-iiit-pet":
        names = [f"Beagle_{i}" for i in range(1, 60)]
        chosen = [n for n in names if int(hashlib.md5(n.encode()).hexdigest(), 16) % 10 < 7][:4]
        chosen += [n for n in names if int(hashlib.md5(n.encode()).hexdigest(), 16) % 10 == 7][:2]
        chosen += [n for n in names if int(hashlib.md5(n.encode()).hexdigest(), 16) % 10 == 9][:1]
        (root / "annotations/trimaps").mkdir(parents=True)
        for name in chosen:
            jpeg(root / "images" / f"{name}.jpg", 80)
            trimap = rng.integers(1, 4, size=(80, 80), dtype=np.uint8)
            Image.fromarray(trimap, mode="L").save(root / "annotations/trimaps" / f"{name}.png")
        return "pets_unet", {"dataset": "files", "epochs": 1, "batch_size": 4, "img_size": 64}
    batches = root / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    for name in ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"):
        data = rng.integers(0, 255, size=(4, 3072), dtype=np.uint8)
        (batches / name).write_bytes(pickle.dumps({b"data": data, b"labels": [0, 1, 2, 3]}, protocol=2))
    return "cifar_resnet", {"dataset": "cifar10", "epochs": 1, "batch_size": 8}


@pytest.mark.parametrize("kind", ["dogs-vs-cats", "oxford-iiit-pet", "cifar-10"])
def test_real_format_folders_load_and_train(kind: str, cpu_image: dict[str, Any], tmp_path: Path) -> None:
    recipe, params = _real_format_folder(kind, tmp_path / "data")
    rc, log = docker_run(cpu_image["id"], tmp_path / "out", recipe=recipe, params=params, data=tmp_path / "data",
                         env=profile_env("deterministic", 1))
    assert rc == 0, log[-4000:]
    dataset = json.loads(read(tmp_path / "out", "fingerprints/dataset.json"))
    assert dataset["kind"] == "files" and dataset["digest"] == fp.files_fingerprint(tmp_path / "data")["digest"]
    # the arrays fit() was given, or (a tf.data pipeline) the arrays the recipe decoded from the files
    name = TRAIN_DATA if (tmp_path / "out" / TRAIN_DATA).exists() else "fingerprints/arrays.json"
    arrays = json.loads(read(tmp_path / "out", name))
    assert next(iter(arrays["entries"].values()))["shape"][0] > 0
    assert (tmp_path / "out/model/canonical.npz").is_file()
