"""`python -m launcher.runtime run` on the host with numpy-only recipes: the container contract
(logs, exit.json, exit code) and the clear errors for bad recipes, params and data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launcher.determinism import profile_env
from launcher.runtime import fingerprints as fp

REPO = Path(__file__).resolve().parents[1]
RECIPE = '''"""numpy-only: a linear model trained by SGD, reporting through the api like a torch recipe."""
import numpy as np
from launcher.runtime import api

p = api.params()
if p["dataset"] == "files":
    with np.load(api.data_dir() / "data.npz") as f:
        x, y = f["x"], f["y"]
else:
    x = np.linspace(-1, 1, 64).reshape(32, 2)
    y = x @ np.array([2.0, -1.0])
    api.record_dataset({"x": x, "y": y})
w = np.random.normal(size=2)  # seeded by the runtime from LAUNCHER_SEED
api.record_initial_weights([("linear", [w])])
for epoch in range(p["epochs"]):
    order = np.random.permutation(len(x))
    batches = [order[i:i + 8] for i in range(0, len(x), 8)]
    for ids in batches:
        grad = 2 * x[ids].T @ (x[ids] @ w - y[ids]) / len(ids)
        w = w - p["lr"] * grad
    api.record_epoch(epoch, batches, {"loss": float(np.mean((x @ w - y) ** 2))})
api.save_final([("linear", [w])])
print("trained", w)
'''


def make_recipe(root: Path, *, fingerprint: str | None = None, files: dict[str, str] | None = None) -> Path:
    folder = root / "linear"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(RECIPE)
    files_line = ""
    if files:
        files_line = "files = { " + ", ".join(f'"{k}" = "{v}"' for k, v in files.items()) + " }\n"
    (folder / "recipe.toml").write_text(
        'name = "linear"\nframework = "none"\nentry = "train.py"\n\n'
        '[params]\ndataset = "builtin"\nepochs = 3\nlr = 0.1\n\n'
        '[[datasets]]\nname = "builtin"\nsource = "builtin"\n'
        + (f'fingerprint = "{fingerprint}"\n' if fingerprint else "")
        + '\n[[datasets]]\nname = "files"\nsource = "files"\nformat = "data.npz with x and y"\n' + files_line)
    return folder


def runtime(out: Path, *args: str, env: dict[str, str] | None = None, python: str = sys.executable,
            cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCHER_", "TF_"))}
    full.update(env or {})
    full["PYTHONPATH"] = str(cwd)
    return subprocess.run([python, "-m", "launcher.runtime", "run", "--out", str(out), *args],
                          env=full, cwd=cwd, capture_output=True, text=True, timeout=120)


def outputs(out: Path) -> dict[str, bytes]:
    skip = {"logs/train.log", "_launcher/exit.json"}
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.relative_to(out).as_posix() not in skip}


def test_a_recipe_writes_every_fingerprint_and_two_seeded_runs_are_identical(tmp_path: Path) -> None:
    folder = make_recipe(tmp_path)
    env = profile_env("deterministic", 11)
    runs = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        res = runtime(out, "--recipe", str(folder), "--params", '{"epochs": 4}', env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        runs.append(out)
    first = outputs(runs[0])
    for rel in ("fingerprints/dataset.json", "fingerprints/initial_weights.json",
                "fingerprints/batches.jsonl", "metrics.jsonl", "weights/layers.json", "model/canonical.npz",
                "_launcher/runtime.json"):
        assert rel in first, rel
    assert first == outputs(runs[1])
    assert len((runs[0] / "metrics.jsonl").read_text().splitlines()) == 4
    epochs = [json.loads(line) for line in (runs[0] / "fingerprints/batches.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1, 2, 3] and all(len(e["batches"]) == 4 for e in epochs)
    assert len({e["digest"] for e in epochs}) == 4  # reshuffled every epoch
    runtime_doc = json.loads(first["_launcher/runtime.json"])
    assert (runtime_doc["profile"], runtime_doc["seed"], runtime_doc["threads"]) == ("deterministic", 11, 2)
    assert runtime_doc["env"]["TF_DETERMINISTIC_OPS"] == "1"
    exit_doc = json.loads((runs[0] / "_launcher/exit.json").read_text())
    assert exit_doc["exit_code"] == 0 and exit_doc["started_at"] <= exit_doc["ended_at"]
    assert "trained" in (runs[0] / "logs/train.log").read_text()


def test_another_seed_changes_weights_and_batches_but_not_the_data(tmp_path: Path) -> None:
    folder = make_recipe(tmp_path)
    for seed in (1, 2):
        res = runtime(tmp_path / f"s{seed}", "--recipe", str(folder), env=profile_env("seeded", seed))
        assert res.returncode == 0
    a, b = outputs(tmp_path / "s1"), outputs(tmp_path / "s2")
    assert a["fingerprints/dataset.json"] == b["fingerprints/dataset.json"]
    for rel in ("fingerprints/initial_weights.json", "fingerprints/batches.jsonl", "model/canonical.npz"):
        assert a[rel] != b[rel], rel


def test_off_profile_is_unseeded(tmp_path: Path) -> None:
    folder = make_recipe(tmp_path)
    for i in range(2):
        assert runtime(tmp_path / f"o{i}", "--recipe", str(folder), env=profile_env("off")).returncode == 0
    assert outputs(tmp_path / "o0")["model/canonical.npz"] != outputs(tmp_path / "o1")["model/canonical.npz"]


def test_the_exit_code_and_output_of_a_plain_script_come_through(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import os, sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n"
                      "print('args', sys.argv[1:])\nprint('hash', hash('launcher'))\n"
                      "print('owner', os.environ.get('LAUNCHER_OWNER'))\nsys.exit(3)\n")
    env = {**profile_env("seeded", 5), "LAUNCHER_OWNER": "1000:1000"}  # whom the outputs go to: not the script's
    res = runtime(tmp_path / "o1", "--script", str(script), "--", "--lr", "0.1", env=env)
    assert res.returncode == 3
    log = (tmp_path / "o1/logs/train.log").read_text()
    assert "to stdout" in log and "to stderr" in log and "args ['--lr', '0.1']" in log
    assert "owner None" in log  # the node's user differs from node to node: the training never sees it
    assert "to stdout" in res.stdout
    assert json.loads((tmp_path / "o1/_launcher/exit.json").read_text())["exit_code"] == 3
    again = runtime(tmp_path / "o2", "--script", str(script), env=env)
    hash_line = next(ln for ln in log.splitlines() if ln.startswith("hash"))
    assert hash_line in (tmp_path / "o2/logs/train.log").read_text()  # PYTHONHASHSEED reached the script
    assert again.returncode == 3


def test_host_profile_option_injects_the_profile(tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    script.write_text("import os\n"
                      "print('OPS', os.environ.get('TF_DETERMINISTIC_OPS'), os.environ['LAUNCHER_SEED'])\n")
    res = runtime(tmp_path / "o", "--script", str(script), "--profile", "strict", "--seed", "8")
    assert res.returncode == 0, res.stdout
    assert "OPS 1 8" in res.stdout
    assert json.loads((tmp_path / "o/_launcher/runtime.json").read_text())["threads"] == 1
    bad = runtime(tmp_path / "o2", "--script", str(script), "--profile", "turbo")
    assert bad.returncode == 2 and "unknown determinism profile 'turbo'" in bad.stdout


@pytest.mark.parametrize(("args", "code", "words"), [
    (["--params", "{nope"], 2, "--params is not JSON"),
    (["--params", "[1]"], 2, "--params must be a JSON object"),
    (["--params", '{"epoch": 3}'], 2, "key 'epoch': unknown param"),
    (["--params", '{"dataset": "digitz"}'], 2,
     "recipe linear: param dataset=digitz selects no dataset of the recipe (allowed: builtin, files); fix: "),
    (["--params", '{"epochs": "abc"}'], 2, "param epochs=abc is not an integer (allowed: any integer)"),
    (["--params", '{"dataset": "files"}'], 17,
     "dataset=files reads files (data.npz with x and y) but no --data"),
])
def test_bad_params_and_missing_data_are_refused_before_the_recipe_runs(
        tmp_path: Path, args: list[str], code: int, words: str) -> None:
    folder = make_recipe(tmp_path)
    res = runtime(tmp_path / "o", "--recipe", str(folder), *args)
    assert res.returncode == code, res.stdout
    assert words in res.stdout
    assert words in (tmp_path / "o/logs/train.log").read_text()
    assert json.loads((tmp_path / "o/_launcher/exit.json").read_text())["exit_code"] == code
    assert not (tmp_path / "o/metrics.jsonl").exists()


def test_data_whose_file_differs_from_the_recipe_is_named(tmp_path: Path) -> None:
    folder = make_recipe(tmp_path, files={"data.npz": "sha256:" + "3" * 64})
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "data.npz", x=np.ones((4, 2)), y=np.ones(4))
    res = runtime(tmp_path / "o", "--recipe", str(folder), "--data", str(data),
                  "--params", '{"dataset": "files"}')
    assert res.returncode == 17
    assert "data.npz" in res.stdout and "recipe.toml expects sha256:" + "3" * 64 in res.stdout
    assert json.loads((tmp_path / "o/fingerprints/dataset.json").read_text())["kind"] == "files"


def test_matching_data_trains_and_is_fingerprinted_as_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "data.npz", x=np.ones((16, 2)), y=np.ones(16))
    folder = make_recipe(tmp_path, files={"data.npz": fp.sha256_file(data / "data.npz")})
    res = runtime(tmp_path / "o", "--recipe", str(folder), "--data", str(data),
                  "--params", '{"dataset": "files"}')
    assert res.returncode == 0, res.stdout
    doc = json.loads((tmp_path / "o/fingerprints/dataset.json").read_text())
    assert doc["kind"] == "files" and list(doc["entries"]) == ["data.npz"]


def test_data_for_a_builtin_dataset_is_refused_not_ignored(tmp_path: Path) -> None:
    folder = make_recipe(tmp_path)
    (tmp_path / "data").mkdir()
    res = runtime(tmp_path / "o", "--recipe", str(folder), "--data", str(tmp_path / "data"))
    assert res.returncode == 2 and "selects built-in data" in res.stdout


def test_a_builtin_dataset_that_changed_is_refused(tmp_path: Path) -> None:
    folder = make_recipe(tmp_path, fingerprint="sha256:" + "4" * 64)
    res = runtime(tmp_path / "o", "--recipe", str(folder))
    assert res.returncode == 17
    assert "dataset 'builtin': fingerprint of the arrays is sha256:" in res.stdout


def test_bad_data_raised_by_a_loader_is_exit_17(tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text("from launcher.runtime import api\n"
                      "raise api.BadData('/data/x.csv: expected 3 columns')\n")
    res = runtime(tmp_path / "o", "--script", str(script))
    assert res.returncode == 17 and "bad data: /data/x.csv: expected 3 columns" in res.stdout


def test_a_broken_recipe_is_exit_18_and_old_outputs_are_not_overwritten(tmp_path: Path) -> None:
    folder = make_recipe(tmp_path)
    (folder / "recipe.toml").write_text('entry = "missing.py"\n')
    res = runtime(tmp_path / "o", "--recipe", str(folder))
    assert res.returncode == 18 and "key 'entry'" in res.stdout
    res = runtime(tmp_path / "o", "--recipe", str(folder))
    assert res.returncode == 2 and "holds a previous run's outputs" in res.stderr


def test_the_runtime_needs_only_the_standard_library_and_its_own_files(tmp_path: Path) -> None:
    """As in an image: launcher/__init__.py and launcher/runtime/ alone, numpy never imported for a
    framework-less script."""
    root = tmp_path / "opt"
    (root / "launcher").mkdir(parents=True)
    shutil.copy(REPO / "launcher/__init__.py", root / "launcher/__init__.py")
    shutil.copytree(REPO / "launcher/runtime", root / "launcher/runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    modules = sorted(p.stem for p in (root / "launcher/runtime").glob("*.py") if p.stem != "__main__")
    code = ("import sys, importlib\n"
            f"for m in {modules!r}: importlib.import_module('launcher.runtime.' + m)\n"
            "heavy = {'numpy', 'tensorflow', 'torch', 'keras', 'typer', 'rich'} & set(sys.modules)\n"
            "assert not heavy, heavy\nprint('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(root)}, cwd=root,
                         capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "ok", res.stderr
    script = tmp_path / "plain.py"
    script.write_text("import sys\nprint('numpy loaded:', 'numpy' in sys.modules)\n")
    res = runtime(tmp_path / "o", "--script", str(script), cwd=root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "numpy loaded: False" in res.stdout


def test_a_script_reads_its_folder_and_its_data_by_relative_path_and_only_what_it_writes_stays(
        tmp_path: Path) -> None:
    """The working directory is the outputs folder, and it shows the script's folder and the data (the
    data's file wins) as read-only links beside what the script writes; the links are gone at the end."""
    code = tmp_path / "proj"
    (code / "data" / "wikitext-2").mkdir(parents=True)
    (code / "data" / "wikitext-2" / "train.txt").write_text("hello\n")
    (code / "traindata.txt").write_text("from the code\n")
    (code / "logs").mkdir()  # launcher's own name in the outputs: not shown
    data = tmp_path / "sent"
    data.mkdir()
    (data / "traindata.txt").write_text("from the data\n")
    script = code / "train.py"
    script.write_text("import os\n"
                      "assert os.path.exists(os.path.join('./data', 'wikitext-2', 'train.txt'))\n"
                      "words = open('./data/wikitext-2/train.txt').read().strip()\n"
                      "print(words, open('traindata.txt').read().strip())\n"
                      "open('model.pt', 'w').write('mine')\n")
    out = tmp_path / "o"
    res = runtime(out, "--script", str(script), "--data", str(data), env=profile_env("seeded", 1))
    assert res.returncode == 0, res.stdout + res.stderr
    log = (out / "logs/train.log").read_text()
    assert "hello from the data" in log
    assert (f"launcher: working directory {out}: the script's folder (2: data/, train.py) and the "
            "data (1: traindata.txt) shown read-only beside what the script writes; only what it writes comes back; "
            "not shown: logs (launcher's own name in the outputs)") in log, log
    assert sorted(p.name for p in out.iterdir()) == ["_launcher", "fingerprints", "logs", "model.pt"]
    assert not any(p.is_symlink() for p in out.rglob("*"))


def test_a_missing_file_and_a_write_into_the_code_are_explained(tmp_path: Path) -> None:
    from launcher.runtime import workdir

    code = tmp_path / "proj"
    (code / "data").mkdir(parents=True)
    script = code / "train.py"
    script.write_text("open('traindata.pt', 'rb')\n")
    out = tmp_path / "o"
    res = runtime(out, "--script", str(script), env=profile_env("seeded", 1))
    assert res.returncode == 1
    assert (f"launcher: traindata.pt is read from the working directory {out}, which shows the script's folder and "
            "the data, and neither holds it: put it beside the script, or send its folder with --data-from DIR "
            "(a file another run wrote: --data-from runs/RUN/outputs)") in res.stdout
    # in a container the code is mounted read-only: a write into its folder fails there, and is explained
    (tmp_path / "o2").mkdir()
    view = workdir.show(tmp_path / "o2", code, None)
    workdir.hide(view)
    tail = "OSError: [Errno 30] Read-only file system: 'data/cache.bin'\n"
    assert workdir.hint_after_failure(tail, view) == (
        f"data/cache.bin: data is {code}/data, shown read-only in the working directory {tmp_path / 'o2'}; write to "
        "a new file or folder there instead (what the script writes comes back)")
    (code / "logs").mkdir()
    (code / "logs" / "seed.txt").write_text("1")
    view = workdir.show(tmp_path / "o2", code, None)
    assert workdir.hint_after_failure("FileNotFoundError: 'logs/seed.txt'", view) == (
        f"logs/seed.txt is {code}/logs/seed.txt, not shown in the working directory {tmp_path / 'o2'} (launcher's own "
        "name in the outputs); pass that path")


def test_a_download_its_container_cannot_reach_is_explained_with_what_it_fetched(tmp_path: Path) -> None:
    """keras.datasets.mnist.load_data() in a container without a route out dies with Keras' own words."""
    from launcher.runtime import workdir

    (tmp_path / "o").mkdir()
    view = workdir.show(tmp_path / "o", None, None)
    keras = ("  File \"/opt/venv/lib/python3.11/site-packages/keras/src/utils/file_utils.py\", line 399, in get_file\n"
             "Exception: URL fetch failure on https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz: "
             "None -- [Errno -2] Name or service not known\n")
    assert workdir.hint_after_failure(keras, view) == (
        "the script tried to download https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz, and its "
        "container could not reach the server (Name or service not known): download it where it can be reached, put "
        "it in a folder, send that with --data-from DIR and have the script read it from there (the folder's entries "
        f"are shown in its working directory {tmp_path / 'o'})")
    requests = ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max "
                "retries exceeded with url: /api/models/gpt2 (Caused by NewConnectionError('<urllib3.connection."
                "HTTPSConnection object>: Failed to establish a new connection: [Errno -3] Temporary failure in name "
                "resolution'))\n")
    hint = workdir.hint_after_failure(requests, view)
    assert hint is not None and hint.startswith("the script tried to reach a server its container cannot reach "
                                                "(Failed to establish a new connection): download what it needs where")
    assert workdir.hint_after_failure("ValueError: bad shape (3, 4)\n", view) is None


def test_links_of_an_earlier_segment_are_replaced_and_the_outputs_own_files_win(tmp_path: Path) -> None:
    from launcher.runtime import workdir

    code, out = tmp_path / "code", tmp_path / "out"
    code.mkdir()
    out.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (code / name).write_text(name)
    (out / "b.txt").write_text("written by the script")  # a resumed run's own output
    (out / "a.txt").symlink_to(code / "a.txt")  # a link the killed first segment left
    (out / "c.txt").symlink_to("/etc/hostname")  # not the runtime's: kept, not shown over
    view = workdir.show(out, code, None)
    assert view.links == {"a.txt": str(code / "a.txt")}
    assert view.not_shown == {"b.txt": "the outputs hold it already", "c.txt": "the outputs hold it already"}
    workdir.hide(view)
    assert sorted(p.name for p in out.iterdir()) == ["b.txt", "c.txt"] and (out / "b.txt").read_text() != "b.txt"


def test_a_script_alone_in_its_folder_gets_no_notice(tmp_path: Path) -> None:
    script = tmp_path / "alone" / "train.py"
    script.parent.mkdir()
    script.write_text("open('missing.txt')\n")
    res = runtime(tmp_path / "o", "--script", str(script), env=profile_env("seeded", 1))
    log = (tmp_path / "o/logs/train.log").read_text()
    assert res.returncode == 1 and "FileNotFoundError" in log
    assert "working directory" not in log.split("FileNotFoundError")[0]


@pytest.mark.parametrize("columns", [None, "120", "0", "wide"])
def test_the_runtimes_help_is_as_wide_as_argparse_makes_it_without_shutil(columns: str | None,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.runtime import runner

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert runner.terminal_columns() == shutil.get_terminal_size().columns
    parser = runner.build_parser()
    assert parser._get_formatter()._width == shutil.get_terminal_size().columns - 2
    code = ("import sys\nbefore = 'shutil' in sys.modules\nfrom launcher.runtime import runner\n"
            "runner.build_parser()\nprint(before or 'shutil' not in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert res.stdout.strip() == "True", res.stderr  # the runner itself did not import it
