"""A group of replicates through launcher's own run life on a made-up target (tests/fakeplacement.py):
a failed replicate stops the rest, a script's runs are named by their project, the user's --env reaches
the container and the records (a secret by its hash only), and a self-seeding script is warned about."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakeplacement import FakeArray, FakePlacement, Script, make_project, make_workspace

from launcher.images import build
from launcher.records.manifest import load_manifest
from launcher.runs import collect, lifecycle
from launcher.runs.lifecycle import RunRequest, run_recipe
from launcher.specs.userenv import UserEnv, find_salt, secret_digest, secret_hmac
from launcher.workspace import Workspace


@pytest.fixture(autouse=True)
def _image_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "ensure_current", lambda *a, **kw: None)  # no engine: the build record is the image


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_workspace(tmp_path)


def _run(ws: Workspace, target: FakePlacement, script: Path, **kw: object) -> collect.RunOutcome:
    spec_kw = {k: kw.pop(k) for k in ("env", "secret_env", "args") if k in kw}
    return run_recipe(ws, RunRequest(recipe=str(script), **spec_kw), target, facts={}, poll_s=0, **kw)  # type: ignore[arg-type]


def test_a_failed_replicate_stops_the_rest_and_names_itself(ws: Workspace, tmp_path: Path) -> None:
    target = FakePlacement(ws, Script(exit_codes={1: 3}))
    out = _run(ws, target, make_project(tmp_path), runs=4)
    assert len(target.jobs) == 2  # replicates 2 and 3 never started
    assert [r["status"] for r in out.runs] == ["succeeded", "failed"]
    f = out.failure
    assert f is not None and (f.replicate, f.exit_code, f.not_started) == (1, 3, 2)
    assert f.run_id == out.runs[1]["run_id"]
    assert len(f.log_tail) == 10 and f.log_tail[-1] == "ModuleNotFoundError: No module named 'missing1'"
    assert "replicate #1" in f.line() and f.run_id in f.line() and "exit 3" in f.line()
    assert "2 later replicates not started" in f.line()
    failed = load_manifest(ws.runs / f.run_id)  # the failed run keeps its manifest
    assert failed.status == "failed" and failed.data["exit_code"] == 3
    assert sorted(p.name for p in ws.runs.iterdir()) == sorted(r["run_id"] for r in out.runs)


def test_a_group_that_succeeds_has_no_failure(ws: Workspace, tmp_path: Path) -> None:
    out = _run(ws, FakePlacement(ws), make_project(tmp_path), runs=2)
    assert out.failure is None and [r["status"] for r in out.runs] == ["succeeded", "succeeded"]


def test_on_a_target_that_starts_the_group_at_once_the_others_are_cancelled(ws: Workspace, tmp_path: Path) -> None:
    target = FakeArray(ws, ends=[(0, 0), (2, 1)])  # 0 succeeds, 2 fails while 1 and 3 still run
    out = _run(ws, target, make_project(tmp_path), runs=4)
    status = {r["replicate"]: r["status"] for r in out.runs}
    assert status == {0: "succeeded", 1: "cancelled", 2: "failed", 3: "cancelled"}
    assert target.stopped  # one stop, which stops them all
    f = out.failure
    assert f is not None and f.replicate == 2 and f.exit_code == 1 and f.not_started == 0
    assert sorted(f.cancelled) == sorted(r["run_id"] for r in out.runs if r["status"] == "cancelled")
    assert "2 replicates already going cancelled" in f.line()
    for r in out.runs:  # every replicate has its manifest
        assert load_manifest(ws.runs / r["run_id"]).status == r["status"]


def test_a_script_is_named_by_its_project_and_path(ws: Workspace, tmp_path: Path) -> None:
    a = make_project(tmp_path / "a", "myproj")
    b = make_project(tmp_path / "b", "other")
    ra, rb = _run(ws, FakePlacement(ws), a), _run(ws, FakePlacement(ws), b)
    ma, mb = (load_manifest(ws.runs / o.runs[0]["run_id"]) for o in (ra, rb))
    assert (ma.code_name, mb.code_name) == ("myproj/train.py", "other/train.py")
    assert "-myproj_train.py-" in ma.run_id and "-other_train.py-" in mb.run_id
    assert "-myproj_train.py-g" in ra.group and ra.group != rb.group
    launch = json.loads((ws.runs / ma.run_id / "launch.json").read_text())
    assert launch["recipe"]["identity"] == "myproj/train.py"


def test_a_script_named_like_a_recipe_is_not_the_recipe(ws: Workspace, tmp_path: Path) -> None:
    script = make_project(tmp_path, "examples", "mnist_convnet.py")
    out = _run(ws, FakePlacement(ws), script)
    m = load_manifest(ws.runs / out.runs[0]["run_id"])
    assert m.recipe_name == "mnist_convnet" and m.code_name == "examples/mnist_convnet.py"
    assert "-mnist_convnet-" not in m.run_id and "-examples_mnist_convnet.py-" in m.run_id


def test_a_folder_with_an_entry_is_its_own_project(ws: Workspace, tmp_path: Path) -> None:
    script = make_project(tmp_path / "x" / "proj" / "src", "pkg", "main.py").parent.parent
    out = run_recipe(ws, RunRequest(recipe=str(script), entry="pkg/main.py"), FakePlacement(ws), facts={}, poll_s=0)
    m = load_manifest(ws.runs / out.runs[0]["run_id"])
    assert m.code_name == "src/pkg/main.py"


def test_user_env_reaches_the_container_and_the_records_a_secret_by_hash_only(ws: Workspace,
                                                                              tmp_path: Path) -> None:
    target = FakePlacement(ws)
    env = UserEnv({"WANDB_MODE": "offline"}, {"HF_TOKEN": "hf_s3cr3t value"})
    out = _run(ws, target, make_project(tmp_path), env=dict(env.plain), secret_env=dict(env.secret))
    run_id = out.runs[0]["run_id"]
    argv = target.argvs[0]
    assert "WANDB_MODE=offline" in argv
    assert not any("s3cr3t" in a for a in argv)  # never on the command line
    assert argv[argv.index("--env-file") + 1].endswith(f"/{run_id}/secret.env")
    assert target.env_files[run_id] == "HF_TOKEN=hf_s3cr3t value\n"
    assert not (Path(target.jobs[0].run_dir) / "secret.env").exists()  # gone once the container started
    assert target.jobs[0].user_env_names == ["HF_TOKEN", "WANDB_MODE"]
    # the secret by an HMAC whose salt (the run's own) stays in this machine's cache: no dictionary opens it
    salt = find_salt(ws.cache_dir, run_id)
    assert salt is not None and secret_digest("hf_s3cr3t value")[7:] not in json.dumps(load_manifest(
        ws.runs / run_id).data)
    record = {"HF_TOKEN": {"hmac": secret_hmac("hf_s3cr3t value", salt)}, "WANDB_MODE": {"value": "offline"}}
    assert load_manifest(ws.runs / run_id).data["env"] == record
    for path in (ws.runs / run_id).rglob("*"):
        if path.is_file():
            assert b"s3cr3t" not in path.read_bytes(), path


def test_script_arguments_reach_the_container(ws: Workspace, tmp_path: Path) -> None:
    target = FakePlacement(ws)
    _run(ws, target, make_project(tmp_path), args=["--epochs", "2"])
    assert target.argvs[0][-3:] == ["--", "--epochs", "2"]


def test_different_seeds_on_a_self_seeding_script_are_warned_about(ws: Workspace, tmp_path: Path) -> None:
    calls = [{"api": "numpy.random.seed", "seed": 0}, {"api": "tensorflow.random.set_seed", "seed": 0}]
    out = _run(ws, FakePlacement(ws, Script(seed_calls=calls)), make_project(tmp_path), seeds=[1, 2])
    assert len(out.notes) == 1 and "numpy.random.seed(0)" in out.notes[0] and "2 of 2 runs" in out.notes[0]
    same = _run(ws, FakePlacement(ws, Script(seed_calls=calls)), make_project(tmp_path), runs=2)
    assert same.notes == []  # one seed: nothing was meant to differ


# ---------------------------------------------------------------- experiments


def _failing_at(bad: int, calls: list[object]) -> object:
    """An experiment's launch function whose run number `bad` fails (in the order runs are started)."""
    from launcher.runs.replicates import Failure

    def launch(job: object, host: object) -> collect.RunOutcome:
        calls.append(job)
        n = len(calls) - 1
        run = {"run_id": f"r{n}", "status": "failed" if n == bad else "succeeded", "exit_code": 1 if n == bad else 0}
        failure = Failure(f"r{n}", "g", n, 1, ["Traceback", "ImportError: nope"]) if n == bad else None
        return collect.RunOutcome(group="g", runs=[run], failure=failure)

    return launch


def test_an_experiment_stops_starting_runs_after_one_fails(ws: Workspace) -> None:
    from launcher.errors import ExitCode
    from launcher.workflows.experiment import experiment

    calls: list[object] = []
    res = experiment(ws, "tiny", 3, "both", launch=_failing_at(1, calls))  # type: ignore[arg-type]
    assert len(calls) == 2 and res.exit_code == ExitCode.RUN_FAILED
    assert res.failure is not None and res.failure.run_id == "r1" and res.failure.not_started == 4
    d = res.to_dict()
    assert d["failure"]["log_tail"][-1] == "ImportError: nope"
    skipped = [r for r in d["runs"] if r["host"] is None]
    assert len(skipped) == 4 and all("not started: g replicate #1 (run r1) failed" in r["error"] for r in skipped)


def test_an_experiment_warns_when_different_seeds_are_overridden(ws: Workspace) -> None:
    from launcher.workflows.experiment import PlannedRun, experiment

    def launch(job: PlannedRun, host: object) -> collect.RunOutcome:
        seed = job.seed
        runtime = {"seed_calls": [{"api": "torch.manual_seed", "seed": 1}, {"api": "random.seed", "seed": seed}]}
        return collect.RunOutcome(group="g", runs=[{"run_id": f"r{seed}", "status": "succeeded", "seed": seed,
                                                      "runtime": runtime}])

    res = experiment(ws, "tiny", 2, "different", launch=launch, base_seed=[5, 6])  # type: ignore[arg-type]
    assert len(res.notes) == 1 and "torch.manual_seed(1)" in res.notes[0] and "random.seed" not in res.notes[0]
    assert res.to_dict()["notes"] == res.notes
    same = experiment(ws, "tiny", 2, "same", launch=launch)  # type: ignore[arg-type]
    assert same.notes == []


def test_an_experiment_of_a_script_passes_its_args_and_env_and_names_groups_by_project(
        ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.workflows.experiment import experiment

    seen: list[RunRequest] = []

    def run_recipe(ws_: Workspace, spec: RunRequest, *a: object, **kw: object) -> collect.RunOutcome:
        seen.append(spec)
        return collect.RunOutcome(group=spec.group or "", runs=[{"run_id": "r", "status": "succeeded"}])

    monkeypatch.setattr(lifecycle, "run_recipe", run_recipe)
    script = make_project(tmp_path, "myproj")
    res = experiment(ws, str(script), 1, "both", args=["--lr", "0.1"],
                     user_env=UserEnv({"MODE": "x"}, {"TOKEN": "t"}))
    assert [s.args for s in seen] == [["--lr", "0.1"], ["--lr", "0.1"]]
    assert all(s.env == {"MODE": "x"} and s.secret_env == {"TOKEN": "t"} for s in seen)
    assert res.code_name == "myproj/train.py"
    assert all(g.startswith("myproj_train.py-") for g in res.groups.values())


def test_an_experiment_on_a_cluster_cancels_its_arrays_when_a_run_fails(ws: Workspace, tmp_path: Path) -> None:
    from launcher.workflows.experiment import experiment

    arrays: list[FakeArray] = []

    def placement(host: object, spec: object) -> FakeArray:
        # both groups' arrays are one fake target: replicate 0 (same seed) succeeds, 1 (different seeds) fails
        arrays.append(FakeArray(ws, ends=[(0, 0), (1, 2)]))
        return arrays[0]

    res = experiment(ws, str(make_project(tmp_path)), 2, "both", placement=placement)
    status = sorted((r["group"].rsplit("-", 2)[-2], r["replicate"], r["ok"]) for r in res.to_dict()["runs"])
    assert res.failure is not None and res.failure.exit_code == 2
    assert len(res.failure.cancelled) == 2 and arrays[0].stopped
    assert sum(ok for *_, ok in status) == 1  # only the run that ended before the failure succeeded


def test_the_fact_sheet_and_the_targets_checks_run_meanwhile_and_fail_in_the_old_order(
        ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The facts are read and the target prepared while the image is checked: a facts error still comes
    before the target's, the target's before a run starts, and the facts reach the manifest."""
    from launcher.errors import HostNotReady, NoGpu
    from launcher.hosts import provision

    script = make_project(tmp_path)
    seen: list[str] = []

    def facts_fail(ws_: Workspace, host: object) -> dict[str, object]:
        seen.append("facts")
        raise HostNotReady("no facts", "fix the host")

    class Unready(FakePlacement):
        def prepare(self, gpu: bool) -> None:
            seen.append("prepare")
            raise NoGpu("no GPU", "use a CPU variant")

    monkeypatch.setattr(provision, "facts_for_run", facts_fail)
    with pytest.raises(HostNotReady, match="no facts"):
        run_recipe(ws, RunRequest(recipe=str(script)), Unready(ws), poll_s=0)
    assert sorted(seen) == ["facts", "prepare"]  # both ran, the facts' error counts
    monkeypatch.setattr(provision, "facts_for_run", lambda ws_, host: {"os": "made-up"})
    with pytest.raises(NoGpu):
        run_recipe(ws, RunRequest(recipe=str(script)), Unready(ws), poll_s=0)
    assert not list(ws.runs.glob("*/launch.json"))  # nothing started
    out = run_recipe(ws, RunRequest(recipe=str(script)), FakePlacement(ws), poll_s=0)
    manifest = load_manifest(ws.runs / out.runs[0]["run_id"])
    assert manifest.data["host"]["facts"]["os"] == "made-up"  # type: ignore[typeddict-item]


def test_a_run_started_from_a_checkpoint_finds_it_in_its_outputs_and_resumes(ws: Workspace, tmp_path: Path) -> None:
    """launcher diverge's re-execution from a run's checkpoint (launcher.runs.rewind): the prepared folder is the
    outputs folder before the container starts, which starts with LAUNCHER_RESUME=1; the launch record says
    where it started."""
    folder = tmp_path / "prepared"
    (folder / "checkpoints/epoch-0001").mkdir(parents=True)
    (folder / "checkpoints/epoch-0001/state.json").write_text('{"epoch": 0, "next_epoch": 1, "step": 5}')
    (folder / "checkpoints/latest.json").write_text('{"name": "epoch-0001"}')
    point = {"run": "earlier", "checkpoint": "epoch-0001", "step": 5, "epochs": 1, "steps_total": 15,
             "seconds": 9.0, "seconds_saved": 3.0}
    target = FakePlacement(ws)
    spec = RunRequest(recipe=str(make_project(tmp_path)), start_from={"folder": str(folder), "point": point})  # type: ignore[typeddict-item]
    out = run_recipe(ws, spec, target, facts={}, poll_s=0)
    job = target.jobs[0]
    assert job.env["LAUNCHER_RESUME"] == "1"
    assert json.loads((Path(job.host_out) / "checkpoints/latest.json").read_text()) == {"name": "epoch-0001"}
    launch = json.loads((ws.runs / out.runs[0]["run_id"] / "launch.json").read_text())
    assert launch["start_from"] == point and launch["determinism"]["env"]["LAUNCHER_RESUME"] == "1"
