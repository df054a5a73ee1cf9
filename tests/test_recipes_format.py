"""The recipe format: recipe.toml parsing, the shipped recipes, params, scaffolding, the CLI."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import BadRecipe, ExitCode, NotFound, UsageError
from launcher.runtime import recipeparams as rparams
from launcher.runtime import recipespec as rspec
from launcher.runtime.code import code_digest
from launcher.specs import recipes
from launcher.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
SEED_RECIPES = {"mnist_convnet", "catsdogs_convnet", "mini_xception", "cifar_resnet", "pets_unet",
                "mnist_torch", "mlp_jax"}
GOOD = '''name = "tiny"
framework = "none"
entry = "train.py"
description = "a tiny recipe"

[params]
dataset = "builtin"
epochs = 3
rate = 0.5
augment = true

[[datasets]]
name = "builtin"
source = "builtin"
fingerprint = "sha256:{fp}"

[[datasets]]
name = "files"
source = "files"
files = {{ "data.npz" = "sha256:{fp}" }}
'''.format(fp="ab" * 32)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    for d in ("lockfiles", "dockerfiles", "recipes"):
        (tmp_path / d).mkdir()
    return Workspace.at(tmp_path, tmp_path / "cache")


def write_recipe(ws: Workspace, name: str, toml: str, entry: str | None = "train.py") -> Path:
    folder = ws.recipes / name
    folder.mkdir(parents=True)
    (folder / "recipe.toml").write_text(toml)
    if entry:
        (folder / entry).write_text("print('hi')\n")
    return folder


def test_the_seed_recipes_are_all_there_and_valid() -> None:
    found = {r.name: r for r in recipes.list_recipes(Workspace.at(REPO))}
    assert SEED_RECIPES <= set(found)
    for name in SEED_RECIPES:
        r = found[name]
        assert r.spec.entry_path.is_file()
        assert r.tree_digest.startswith("sha256:")
        assert "epochs" in r.params and "dataset" in r.params
        sources = {d.source for d in r.spec.datasets}
        assert sources == {"builtin", "files"}, f"{name} needs a built-in and a files dataset"
        builtin = [d for d in r.spec.datasets if d.source == "builtin" and d.name == r.params["dataset"]]
        assert builtin, f"{name}: the default dataset must be the built-in one"
        assert builtin[0].fingerprint, f"{name}: the built-in dataset's fingerprint must be pinned"


def test_seed_defaults_follow_the_listings() -> None:
    ws = Workspace.at(REPO)
    mnist = recipes.load_recipe(ws, "mnist_convnet").params
    assert (mnist["batch_size"], mnist["epochs"]) == (128, 12)
    assert recipes.load_recipe(ws, "catsdogs_convnet").params["pdim"] == 180
    assert recipes.load_recipe(ws, "cifar_resnet").params["depth"] == 29
    pets = recipes.load_recipe(ws, "pets_unet").params
    assert (pets["backbone"], pets["batch_size"], pets["epochs"]) == ("mobilenetv2", 60, 12)
    assert pets["backbone_weights"] == ""  # nothing is downloaded by default
    assert recipes.load_recipe(ws, "mnist_torch").framework == "torch"


def test_a_good_recipe_loads_with_its_datasets(ws: Workspace) -> None:
    write_recipe(ws, "tiny", GOOD)
    r = recipes.load_recipe(ws, "tiny")
    assert (r.name, r.framework, r.entry) == ("tiny", "none", "train.py")
    assert r.params == {"dataset": "builtin", "epochs": 3, "rate": 0.5, "augment": True}
    assert [d.name for d in r.spec.datasets] == ["builtin", "files"]
    assert rparams.select_dataset(r.spec, {"dataset": "files"}).files == {"data.npz": "sha256:" + "ab" * 32}
    assert rparams.select_dataset(r.spec, {"dataset": "other"}) is None


@pytest.mark.parametrize(("toml", "key"), [
    ('colour = "red"\n' + GOOD, "colour"),
    (GOOD.replace('entry = "train.py"\n', ""), "entry"),
    (GOOD.replace('framework = "none"', 'framework = "mxnet"'), "framework"),
    (GOOD + '\n[[datasets]]\nname = "x"\nsauce = "y"\n', "datasets[2].sauce"),
    (GOOD + '\n[[datasets]]\nname = "x"\nparam = "nope"\n', "datasets[2].param"),
    (GOOD.replace('fingerprint = "sha256:' + "ab" * 32 + '"', 'fingerprint = "md5:12"'),
     "datasets[0].fingerprint"),
    (GOOD.replace('source = "files"', 'source = "web"'), "datasets[1].source"),
    (GOOD.replace('entry = "train.py"', 'entry = "../train.py"'), "entry"),
    (GOOD.replace('epochs = 3', 'epochs = [3]'), "params.epochs"),
    (GOOD.replace('epochs = 3', 'epochs = { default = 3, step = 1 }'), "params.epochs.step"),
    (GOOD.replace('epochs = 3', 'epochs = { min = 1 }'), "params.epochs.default"),
    (GOOD.replace('epochs = 3', 'epochs = { default = 3, choices = [1, "two"] }'), "params.epochs.choices"),
    (GOOD.replace('epochs = 3', 'epochs = { default = 3, choices = [1, 2] }'), "params.epochs.default"),
    (GOOD.replace('epochs = 3', 'epochs = { default = 3, min = 5 }'), "params.epochs.default"),
    (GOOD.replace('epochs = 3', 'epochs = { default = 3, min = 4, max = 2 }'), "params.epochs.min"),
    (GOOD.replace('augment = true', 'augment = { default = true, min = 0 }'), "params.augment.min"),
    (GOOD.replace('epochs = 3', 'epochs = { default = 3, also = [1] }'), "params.epochs.also"),
    (GOOD.replace('epochs = 3', 'epochs = { default = 3, help = 1 }'), "params.epochs.help"),
    (GOOD.replace('dataset = "builtin"', 'dataset = { default = "builtin", choices = ["builtin"] }'),
     "datasets[1].name"),
    (GOOD.replace('description = "a tiny recipe"', 'variant = "Torch CPU"'), "variant"),
    (GOOD.replace('description = "a tiny recipe"', 'variant = 3'), "variant"),
])
def test_a_bad_key_is_named_with_the_file(ws: Workspace, toml: str, key: str) -> None:
    folder = write_recipe(ws, "bad", toml)
    with pytest.raises(BadRecipe) as info:
        recipes.load_recipe(ws, "bad")
    assert str(folder / "recipe.toml") in info.value.message
    assert f"key {key!r}" in info.value.message
    assert info.value.exit_code == ExitCode.BAD_RECIPE


def test_missing_entry_file_and_broken_toml(ws: Workspace) -> None:
    write_recipe(ws, "noentry", GOOD, entry=None)
    with pytest.raises(BadRecipe, match=r"entry point train\.py does not exist"):
        recipes.load_recipe(ws, "noentry")
    write_recipe(ws, "broken", "name = \n")
    with pytest.raises(BadRecipe, match="not valid TOML"):
        recipes.load_recipe(ws, "broken")


def test_unknown_recipe_lists_the_known_ones(ws: Workspace) -> None:
    write_recipe(ws, "tiny", GOOD)
    with pytest.raises(NotFound, match=r"unknown recipe 'nope' \(known: tiny\)"):
        recipes.load_recipe(ws, "nope")


def test_a_mistyped_script_or_recipe_gets_what_was_meant(ws: Workspace, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    write_recipe(ws, "mnist_convnet", GOOD)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    (project / "evaluate.py").write_text("print(2)\n")
    monkeypatch.chdir(project)
    with pytest.raises(NotFound) as err:
        recipes.load_recipe(ws, "trian.py")
    assert err.value.message == "no script at trian.py (did you mean train.py?)"
    assert err.value.hint == "run `launcher run train.py`"
    with pytest.raises(NotFound) as err:
        recipes.load_recipe(ws, str(project / "evalute.py"))
    assert err.value.message.endswith(f"(did you mean {project / 'evaluate.py'}?)")
    with pytest.raises(NotFound) as err:
        recipes.load_recipe(ws, "train")  # the script without .py
    assert err.value.hint == "run the script: `launcher run train.py`"
    with pytest.raises(NotFound) as err:
        recipes.load_recipe(ws, "tarin")
    assert "(did you mean train.py?)" in err.value.message
    with pytest.raises(NotFound) as err:
        recipes.load_recipe(ws, "mnist_convnt")
    assert "(did you mean mnist_convnet?)" in err.value.message and err.value.hint == "run `launcher run mnist_convnet`"
    with pytest.raises(NotFound) as err:
        recipes.load_recipe(ws, "something_else.py")  # nothing near: no guess
    assert err.value.message == "no script at something_else.py" and err.value.hint == "check the path"


def test_a_folder_path_and_a_plain_script_are_recipes(ws: Workspace, tmp_path: Path) -> None:
    folder = write_recipe(ws, "tiny", GOOD)
    assert recipes.load_recipe(ws, str(folder)).name == "tiny"
    script = tmp_path / "train_mine.py"
    script.write_text("import torch\nprint(torch.__version__)\n")
    r = recipes.load_recipe(ws, str(script))
    assert (r.name, r.framework, r.adhoc, r.params) == ("train_mine", "torch", True, {})
    assert r.tree_digest == code_digest(script)  # the script as a folder holding only it
    with pytest.raises(NotFound):
        recipes.load_recipe(ws, str(tmp_path / "missing.py"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(BadRecipe, match=r"no recipe\.toml") as refused:
        recipes.load_recipe(ws, str(tmp_path / "plain"))
    assert "--entry train.py" in refused.value.one_line()
    (tmp_path / "plain" / "train.py").write_text("print(1)\n")
    by_entry = recipes.load_recipe(ws, str(tmp_path / "plain"), entry="train.py")
    assert (by_entry.adhoc, by_entry.path) == (True, (tmp_path / "plain" / "train.py").resolve())
    with pytest.raises(NotFound, match=r"no script nope\.py"):
        recipes.load_recipe(ws, str(tmp_path / "plain"), entry="nope.py")
    with pytest.raises(UsageError, match="names its entry already"):
        recipes.load_recipe(ws, str(folder), entry="train.py")


def test_tree_digest_follows_the_code_not_the_mtimes(ws: Workspace) -> None:
    folder = write_recipe(ws, "tiny", GOOD)
    before = recipes.load_recipe(ws, "tiny").tree_digest
    (folder / "train.py").touch()
    assert recipes.load_recipe(ws, "tiny").tree_digest == before
    (folder / "train.py").write_text("print('changed')\n")
    assert recipes.load_recipe(ws, "tiny").tree_digest != before


@pytest.mark.parametrize(("text", "expected"), [
    ("epochs=3", ("epochs", 3)),
    ("rate=0.25", ("rate", 0.25)),
    ("augment=false", ("augment", False)),
    ("dataset=files", ("dataset", "files")),
    ("name=", ("name", "")),
    ("expr=a=b", ("expr", "a=b")),
    ("dropout_seed=none", ("dropout_seed", "none")),
])
def test_parse_param(text: str, expected: tuple[str, object]) -> None:
    assert recipes.parse_param(text) == expected


@pytest.mark.parametrize("text", ["epochs", "=3", " =3", "9x=1", ""])
def test_malformed_param_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="bad param") as info:
        recipes.parse_param(text)
    assert "KEY=VALUE" in (info.value.hint or "")


def test_params_take_the_type_of_their_default(ws: Workspace) -> None:
    write_recipe(ws, "tiny", GOOD + '\n[params.note]\ndefault = "x"\n')
    r = recipes.load_recipe(ws, "tiny")
    got = recipes.resolve_params(r, ["epochs=5", "rate=1", "augment=0", "dataset=files", "note=7"])
    assert got == {"epochs": 5, "rate": 1.0, "augment": False, "dataset": "files", "note": "7"}
    assert isinstance(got["rate"], float)
    with pytest.raises(UsageError, match="has no param 'epoch'"):
        recipes.resolve_params(r, ["epoch=5"])
    with pytest.raises(UsageError, match="not an integer"):
        recipes.resolve_params(r, ["epochs=many"])
    with pytest.raises(UsageError, match="not a boolean"):
        recipes.resolve_params(r, ["augment=maybe"])


DECLARED = GOOD.replace('epochs = 3', 'epochs = { default = 3, min = 1, max = 50, help = "passes" }').replace(
    'rate = 0.5', 'rate = { default = 0.5, min = 0.0, max = 1.0 }') + '''
[params.device]
default = "auto"
choices = ["auto", "cpu", "cuda"]

[params.seed_or_none]
default = 7
min = 0
also = ["none"]
'''


def test_declared_params_parse_with_their_choices_and_bounds(ws: Workspace) -> None:
    write_recipe(ws, "tiny", DECLARED.replace('description = "a tiny recipe"', 'variant = "torch-cpu"'))
    r = recipes.load_recipe(ws, "tiny")
    assert r.params == {"dataset": "builtin", "epochs": 3, "rate": 0.5, "augment": True, "device": "auto",
                        "seed_or_none": 7}  # the defaults, as a plain [params] gives them
    assert r.variant == r.spec.variant == "torch-cpu"
    specs = r.spec.param_specs
    assert (specs["epochs"].type, specs["epochs"].min, specs["epochs"].max, specs["epochs"].help) == (
        "int", 1, 50, "passes")
    assert specs["device"].choices == ("auto", "cpu", "cuda") and not specs["device"].from_datasets
    # the param that datasets select takes their names as its choices
    assert specs["dataset"].choices == ("builtin", "files") and specs["dataset"].from_datasets
    assert specs["augment"].allowed() == "true or false"
    assert specs["epochs"].allowed() == "an integer from 1 to 50"
    assert specs["seed_or_none"].allowed() == "an integer >= 0, or none"
    assert specs["rate"].allowed() == "a number from 0.0 to 1.0"
    assert recipes.load_recipe(ws, "tiny").as_dict()["param_specs"]["device"]["allowed"] == "auto, cpu, cuda"
    plain = write_recipe(ws, "plain", GOOD)
    assert recipes.load_recipe(ws, str(plain)).variant is None


def test_a_dataset_param_whose_default_is_no_dataset_keeps_its_default(ws: Workspace) -> None:
    write_recipe(ws, "tiny", GOOD.replace('dataset = "builtin"', 'dataset = "inline"'))
    spec = recipes.load_recipe(ws, "tiny").spec
    assert spec.param_specs["dataset"].choices == ("inline", "builtin", "files")


@pytest.mark.parametrize(("given", "expected"), [
    ({"epochs": "5"}, {"epochs": 5}),
    ({"epochs": 50}, {"epochs": 50}),
    ({"rate": "1"}, {"rate": 1.0}),
    ({"rate": 0}, {"rate": 0.0}),
    ({"augment": "no"}, {"augment": False}),
    ({"augment": 1}, {"augment": True}),
    ({"device": "cuda"}, {"device": "cuda"}),
    ({"dataset": "files"}, {"dataset": "files"}),
    ({"seed_or_none": "none"}, {"seed_or_none": "none"}),
    ({"seed_or_none": "3"}, {"seed_or_none": 3}),
])
def test_allowed_values_pass_with_the_params_type(ws: Workspace, given: dict[str, object],
                                                   expected: dict[str, object]) -> None:
    write_recipe(ws, "tiny", DECLARED)
    r = recipes.load_recipe(ws, "tiny")
    got = recipes.check_values(r, given)
    assert got == expected
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]
    assert rparams.merge_params(r.spec, given) == {**r.params, **expected}  # the runtime agrees


@pytest.mark.parametrize(("given", "words"), [
    ({"dataset": "digitz"}, "param dataset=digitz selects no dataset of the recipe (allowed: builtin, files)"),
    ({"device": "tpu"}, "param device=tpu is not one of the allowed values (allowed: auto, cpu, cuda)"),
    ({"epochs": "abc"}, "param epochs=abc is not an integer (allowed: an integer from 1 to 50)"),
    ({"epochs": "0"}, "param epochs=0 is out of range (allowed: an integer from 1 to 50)"),
    ({"epochs": 2.5}, "param epochs=2.5 is not an integer"),
    ({"epochs": True}, "param epochs=true is not an integer"),
    ({"rate": "1.5"}, "param rate=1.5 is out of range (allowed: a number from 0.0 to 1.0)"),
    ({"rate": "nan"}, "param rate=nan is not a number"),
    ({"augment": "maybe"}, "param augment=maybe is not a boolean (allowed: true or false)"),
    ({"augment": 2}, "param augment=2 is not a boolean"),
    ({"seed_or_none": "never"}, "param seed_or_none=never is not an integer (allowed: an integer >= 0, or none)"),
    ({"device": ""}, "param device='' is not one of the allowed values"),
])
def test_a_value_outside_the_param_is_a_usage_error_naming_the_allowed_ones(
        ws: Workspace, given: dict[str, object], words: str) -> None:
    write_recipe(ws, "tiny", DECLARED)
    r = recipes.load_recipe(ws, "tiny")
    with pytest.raises(UsageError) as info:
        recipes.check_values(r, given)
    line = info.value.one_line()
    assert info.value.exit_code == ExitCode.USAGE
    assert f"recipe tiny: {words}" in line, line
    key = next(iter(given))
    assert f"fix: use an allowed value, e.g. --param {key}=" in line and "launcher recipes show tiny" in line
    with pytest.raises(rspec.ParamError, match="allowed: "):  # the runtime refuses the same value
        rparams.merge_params(r.spec, dict(given))


def test_the_command_line_typing_reaches_a_text_param_as_text(ws: Workspace) -> None:
    # `--param KEY=VALUE` is typed before the recipe is known (parse_params): a text param gets its text back
    write_recipe(ws, "tiny", GOOD + '\n[params.note]\ndefault = "x"\n')
    r = recipes.load_recipe(ws, "tiny")
    from launcher.specs.runspec import check_params, parse_params

    assert check_params(r, parse_params(["note=7", "epochs=4", "rate=1", "augment=true"])) == {
        "note": "7", "epochs": 4, "rate": 1.0, "augment": True}
    with pytest.raises(UsageError, match="selects no dataset"):
        check_params(r, parse_params(["dataset=7"]))


def test_the_seed_recipes_declare_what_their_selecting_params_allow() -> None:
    ws = Workspace.at(REPO)
    allowed = {r.name: {k: p.allowed() for k, p in r.spec.param_specs.items()} for r in recipes.list_recipes(ws)}
    assert allowed["mnist_convnet"]["dataset"] == "digits, mnist"
    assert allowed["mnist_torch"]["dataset"] == "synthetic, digits, mnist"
    assert allowed["mnist_torch"]["device"] == "auto, cpu, cuda"
    assert allowed["pets_unet"]["backbone"] == "mobilenetv2, vgg19"
    assert allowed["pets_unet"]["dropout_seed"] == "an integer >= 0, or none"
    for name, params in allowed.items():
        assert params["epochs"] == "an integer >= 1", name
    pets = recipes.load_recipe(ws, "pets_unet")
    assert recipes.check_values(pets, {"dropout_seed": "none"}) == {"dropout_seed": "none"}  # seed 000's experiment


def test_scaffold_makes_a_recipe_that_loads(ws: Workspace) -> None:
    for framework in ("tensorflow", "torch", "jax"):
        r = recipes.scaffold_recipe(ws, f"new_{framework}", framework)
        assert r.framework == framework
        assert (r.path / "train.py").is_file()
        compile((r.path / "train.py").read_text(), "train.py", "exec")
    with pytest.raises(UsageError, match="already exists"):
        recipes.scaffold_recipe(ws, "new_torch", "torch")
    with pytest.raises(UsageError, match="bad recipe name"):
        recipes.scaffold_recipe(ws, "../escape")
    with pytest.raises(UsageError, match="unknown framework"):
        recipes.scaffold_recipe(ws, "other", "mxnet")


runner = CliRunner()


def test_cli_recipes_list_and_show_json(ws: Workspace) -> None:
    write_recipe(ws, "tiny", GOOD)
    res = runner.invoke(app, ["--workspace", str(ws.root), "--json", "recipes", "list"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)["data"]
    assert [r["name"] for r in data["recipes"]] == ["tiny"]
    res = runner.invoke(app, ["--workspace", str(ws.root), "--json", "recipes", "show", "tiny"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)["data"]
    assert shown["params"]["epochs"] == 3
    assert shown["datasets"][1]["files"] == {"data.npz": "sha256:" + "ab" * 32}
    assert shown["tree_digest"].startswith("sha256:")
    assert shown["param_specs"]["dataset"]["choices"] == ["builtin", "files"]
    assert shown["param_specs"]["epochs"] == {"name": "epochs", "type": "int", "default": 3, "choices": [],
                                              "min": None, "max": None, "also": [], "help": "",
                                              "from_datasets": False, "allowed": "any integer"}
    assert shown["variant"] is None


def test_cli_text_output_and_errors(ws: Workspace) -> None:
    write_recipe(ws, "tiny", GOOD)
    res = runner.invoke(app, ["--workspace", str(ws.root), "recipes", "show", "tiny"])
    assert "epochs = 3" in res.stdout and "dataset=files (files)" in res.stdout
    assert 'dataset = "builtin"  (builtin, files)' in res.stdout
    assert "augment = true  (true or false)" in res.stdout
    res = runner.invoke(app, ["--workspace", str(ws.root), "recipes", "show", "nope"])
    assert res.exit_code == ExitCode.NOT_FOUND
    write_recipe(ws, "broken", GOOD + "colour = 1\n")
    res = runner.invoke(app, ["--workspace", str(ws.root), "recipes", "list"])
    assert res.exit_code == ExitCode.BAD_RECIPE
    assert "colour" in res.output


def test_cli_recipes_new(ws: Workspace) -> None:
    res = runner.invoke(app, ["--workspace", str(ws.root), "recipes", "new", "mine", "--framework", "torch"])
    assert res.exit_code == 0, res.output
    assert (ws.recipes / "mine" / "recipe.toml").is_file()
    res = runner.invoke(app, ["--workspace", str(ws.root), "recipes", "new", "mine"])
    assert res.exit_code == ExitCode.USAGE


def test_the_shipped_recipes_copy_cleanly(tmp_path: Path) -> None:
    # a workspace made from this one carries the recipes with the same tree digests
    dst = tmp_path / "ws"
    for d in ("lockfiles", "dockerfiles"):
        (dst / d).mkdir(parents=True)
    shutil.copytree(REPO / "recipes", dst / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    here = {r.name: r.tree_digest for r in recipes.list_recipes(Workspace.at(REPO))}
    there = {r.name: r.tree_digest for r in recipes.list_recipes(Workspace.at(dst))}
    assert here == there


# The loaders of the real published formats, on small files made here (no TensorFlow needed).

def recipe_module(rel: str) -> Any:
    """A module of a recipe folder, or of the shared library (``_lib/recipelib/...``), with the
    library importable as the runtime makes it."""
    import importlib.util

    if str(REPO / "recipes" / "_lib") not in sys.path:
        sys.path.append(str(REPO / "recipes" / "_lib"))
    spec = importlib.util.spec_from_file_location(rel.replace("/", "_").removesuffix(".py"), REPO / "recipes" / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mnist_npz_loader_reads_keras_layout_and_names_the_file(tmp_path: Path) -> None:
    import numpy as np

    from launcher.runtime.api import BadData

    data = recipe_module("_lib/recipelib/mnist.py")
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((3, 28, 28), "uint8"), y_train=np.zeros(3, "uint8"),
             x_test=np.zeros((2, 28, 28), "uint8"), y_test=np.zeros(2, "uint8"))
    assert data.load_mnist_npz(tmp_path)["x_test"].shape == (2, 28, 28)
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((3, 28, 28), "uint8"))
    with pytest.raises(BadData, match=r"mnist\.npz: lacks y_train, x_test, y_test"):
        data.load_mnist_npz(tmp_path)
    np.savez(tmp_path / "mnist.npz", x_train=np.zeros((3, 32, 32)), y_train=[0], x_test=np.zeros((1, 28, 28)),
             y_test=[0])
    with pytest.raises(BadData, match=r"x_train has shape \(3, 32, 32\)"):
        data.load_mnist_npz(tmp_path)
    (tmp_path / "mnist.npz").write_text("<html>")
    with pytest.raises(BadData, match=r"mnist\.npz: not a numpy \.npz file"):
        data.load_mnist_npz(tmp_path)
    with pytest.raises(BadData, match=r"mnist\.npz: not found"):
        data.load_mnist_npz(tmp_path / "elsewhere")


def test_synthetic_digits_are_the_pinned_dataset() -> None:
    from launcher.runtime import fingerprints as fp

    arrays = recipe_module("_lib/recipelib/mnist.py").synthetic_digits()
    pinned = rparams.select_dataset(recipes.load_recipe(Workspace.at(REPO), "mnist_torch").spec,
                                  {"dataset": "synthetic"})
    assert pinned is not None and fp.arrays_fingerprint(arrays)["digest"] == pinned.fingerprint


def test_cifar_loader_reads_python_batches_and_refuses_other_pickles(tmp_path: Path) -> None:
    import pickle

    import numpy as np

    from launcher.runtime.api import BadData

    cifar = recipe_module("cifar_resnet/cifar10.py")
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    pixels = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    for name in (*cifar.TRAIN_BATCHES, cifar.TEST_BATCH):
        (root / name).write_bytes(pickle.dumps({b"data": pixels, b"labels": [3, 7], b"batch_label": b"x"},
                                               protocol=2))
    arrays = cifar.load_batches(tmp_path)
    assert arrays["x_train"].shape == (10, 32, 32, 3) and arrays["y_test"].tolist() == [3, 7]
    assert arrays["x_train"][0, 0, 1, 0] == pixels[0, 1]  # channel-first rows become HWC
    (root / "data_batch_3").write_bytes(pickle.dumps({b"data": subprocess_popen(), b"labels": []}))
    with pytest.raises(BadData, match=r"data_batch_3: not a CIFAR-10 python batch \(refusing to load"):
        cifar.load_batches(tmp_path)
    (root / "data_batch_3").unlink()
    with pytest.raises(BadData, match=r"data_batch_3: not found"):
        cifar.load_batches(tmp_path)


def subprocess_popen() -> Any:
    import subprocess

    return subprocess.Popen


def test_pets_partition_is_md5_of_the_pet_id_and_loader_names_missing_trimaps(tmp_path: Path) -> None:
    import hashlib

    from launcher.runtime.api import BadData

    pets = recipe_module("pets_unet/pets.py")
    names = [f"Abyssinian_{i}" for i in range(1, 200)]
    for name in names:
        idx = int(hashlib.md5(name.encode()).hexdigest(), 16) % 10
        assert pets.partition_of(name) == ("train" if idx < 7 else ["validation", "calibration", "test"][idx - 7])
    counts = {p: sum(pets.partition_of(n) == p for n in names) for p in ("train", "validation", "calibration", "test")}
    assert counts["train"] > counts["validation"] > 0 and counts["test"] > 0
    with pytest.raises(BadData, match=r"images: not found; the Oxford-IIIT Pet layout"):
        pets.load_pets(tmp_path, 64)
    (tmp_path / "images").mkdir()
    (tmp_path / "annotations/trimaps").mkdir(parents=True)
    train_pet = next(n for n in names if pets.partition_of(n) == "train")
    (tmp_path / "images" / f"{train_pet}.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(BadData, match=rf"trimaps/{train_pet}\.png: missing"):
        pets.load_pets(tmp_path, 64)


def test_dogs_vs_cats_reads_both_layouts_and_names_what_is_missing(tmp_path: Path) -> None:
    from launcher.runtime.api import BadData

    dvc = recipe_module("_lib/recipelib/dogs_vs_cats.py")
    with pytest.raises(BadData, match=r"train: not found"):
        dvc._split_files(tmp_path)
    subset = tmp_path / "subset"
    for split in ("train", "validation"):
        for cls in ("cat", "dog"):
            (subset / split / cls).mkdir(parents=True)
            (subset / split / cls / f"{cls}.1.jpg").write_bytes(b"")
    files = dvc._split_files(subset)
    assert [(p.name, label) for p, label in files["train"]] == [("cat.1.jpg", 0), ("dog.1.jpg", 1)]
    (subset / "validation/dog/dog.1.jpg").unlink()
    with pytest.raises(BadData, match=r"validation/dog: no \.jpg images"):
        dvc._split_files(subset)
    kaggle = tmp_path / "kaggle" / "train"
    kaggle.mkdir(parents=True)
    for cls in ("cat", "dog"):
        for i in range(1500):
            (kaggle / f"{cls}.{i}.jpg").touch()
    files = dvc._split_files(kaggle.parent)
    assert len(files["train"]) == 2000 and len(files["validation"]) == 1000
    assert files["validation"][0][0].name == "cat.1000.jpg"
    (kaggle / "dog.1200.jpg").unlink()
    with pytest.raises(BadData, match=r"dog\.1200\.jpg: missing"):
        dvc._split_files(kaggle.parent)


def test_the_shared_library_is_not_a_recipe_and_no_recipe_keeps_a_copy_of_its_code() -> None:
    lib = REPO / "recipes" / "_lib"
    assert not (lib / rspec.RECIPE_FILE).exists()
    ws = Workspace.at(REPO)
    assert {r.name for r in recipes.list_recipes(ws)} == SEED_RECIPES
    assert "_lib" not in recipes.known_names(ws)
    shared = {p.read_bytes() for p in (lib / "recipelib").glob("*.py") if p.stat().st_size > 200}
    copies = [p for p in (REPO / "recipes").glob("*/*.py") if p.parent != lib and p.read_bytes() in shared]
    assert not copies, f"copies of library modules in recipe folders: {copies}"
