from __future__ import annotations

import importlib.util
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from runfactory import FakeRun, make_workspace, write_run

from launcher.errors import HostUnreachable, NotFound, RunFailed, UsageError
from launcher.hosts.hostspec import HostSpec
from launcher.report.assemble import SCHEMA, write_report
from launcher.workflows.experiment import DIFFERENT_SEEDS, SAME_SEED, experiment, plan, run_parallel
from launcher.workspace import Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")


# ---------------------------------------------------------------- planning and scheduling


def test_plan_groups_and_seeds() -> None:
    jobs = plan("mnist", 3, "both", base_seed=10, stamp="20261122T000000")
    same = [j for j in jobs if j.kind == SAME_SEED]
    diff = [j for j in jobs if j.kind == DIFFERENT_SEEDS]
    assert [j.seed for j in same] == [10, 10, 10] and [j.seed for j in diff] == [10, 11, 12]
    assert {j.group for j in same} == {"mnist-20261122T000000-same-seed"}
    assert {j.group for j in diff} == {"mnist-20261122T000000-different-seeds"}
    assert [j.kind for j in jobs[:2]] == [SAME_SEED, DIFFERENT_SEEDS]  # interleaved
    assert [j.replicate for j in same] == [0, 1, 2]
    assert len(plan("mnist", 2, "same")) == 2 and len(plan("mnist", 2, "different")) == 2
    with pytest.raises(UsageError):
        plan("mnist", 0)
    with pytest.raises(UsageError):
        plan("mnist", 2, "sometimes")


def test_one_run_per_host_at_a_time_and_parallel_across_hosts() -> None:
    active: dict[str, int] = {}
    peak_per_host: dict[str, int] = {}
    peak_total = 0
    lock = threading.Lock()

    def launch(job: int, host: str) -> str:
        nonlocal peak_total
        with lock:
            active[host] = active.get(host, 0) + 1
            peak_per_host[host] = max(peak_per_host.get(host, 0), active[host])
            peak_total = max(peak_total, sum(active.values()))
        time.sleep(0.02)
        with lock:
            active[host] -= 1
        return f"run-{job}"

    outs = run_parallel(list(range(12)), ["a", "b", "c"], launch)
    assert [o.value for o in outs] == [f"run-{i}" for i in range(12)]
    assert all(o.ok for o in outs)
    assert peak_per_host == {"a": 1, "b": 1, "c": 1}
    assert peak_total == 3
    assert {o.host for o in outs} == {"a", "b", "c"}


def test_failures_are_recorded_and_a_dead_host_retires() -> None:
    def launch(job: int, host: str) -> int:
        if host == "dead":
            raise HostUnreachable("cannot reach dead")
        if job == 3:
            raise RunFailed("recipe exited 1")
        time.sleep(0.01)
        return job

    outs = run_parallel(list(range(6)), ["dead", "ok"], launch)
    by_host = [o for o in outs if o.host == "dead"]
    assert len(by_host) == 1 and by_host[0].exit_code == 5  # the dead host took one job, then stopped
    failed = [o for o in outs if o.error and o.host == "ok"]
    assert [o.job for o in failed] == [3] and failed[0].exit_code == 6
    assert sum(o.ok for o in outs) == 4

    outs = run_parallel([1, 2, 3], ["dead"], launch)
    assert outs[0].exit_code == 5 and outs[1].error is not None and outs[1].error.startswith("not started")


def test_experiment_with_a_fake_launcher_then_report(ws: Workspace) -> None:
    calls: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def launch(job: Any, host: HostSpec) -> dict[str, Any]:
        with lock:
            n = len(calls)
            calls.append((job.group, job.seed, host.name))
        run_id = f"20261122T1000{n:02d}-mnist_convnet-{n:06x}"
        # Same-seed replicates differ a little (an unseeded kernel); different seeds differ more.
        write_run(ws.runs, FakeRun(run_id=run_id, group=job.group, replicate=job.replicate, seed=job.seed,
                                   unseeded_dropout=True, dropout_entropy=n,
                                   started_at=f"2026-11-22T10:00:{n:02d}Z"))
        return {"runs": [{"run_id": run_id, "status": "succeeded"}]}

    res = experiment(ws, "mnist_convnet", 4, "both", [HostSpec("10.0.0.1"), HostSpec("10.0.0.2")], launch=launch,
                     stamp="20261122T100000")
    assert res.exit_code == 0 and len(calls) == 8
    assert {h for _, _, h in calls} == {"10.0.0.1", "10.0.0.2"}
    data = res.to_dict()
    assert all(r["ok"] and len(r["run_ids"]) == 1 for r in data["runs"])

    report = write_report(ws, [res.groups[SAME_SEED], res.groups[DIFFERENT_SEEDS]], name="mnist")
    d = ws.reports / "mnist"
    assert report.directory == d
    doc = json.loads((d / "report.json").read_text())
    assert doc["schema"] == SCHEMA and doc["metrics"] == ["accuracy", "loss"]
    kinds = {g["name"]: g["kind"] for g in doc["groups"]}
    assert kinds == {res.groups[SAME_SEED]: "same-seed", res.groups[DIFFERENT_SEEDS]: "different-seeds"}
    same, diff = doc["groups"]
    losses = same["final"]["loss"]["values"]
    assert same["final"]["loss"]["mean"] == pytest.approx(statistics.fmean(losses))
    assert same["final"]["loss"]["stdev"] == pytest.approx(statistics.stdev(losses))
    spread = doc["seed_fixed_spread"]["metrics"]["loss"]
    ratio = same["final"]["loss"]["stdev"] / diff["final"]["loss"]["stdev"]
    assert spread["stdev_ratio"] == pytest.approx(ratio)
    assert 0 < spread["stdev_ratio"] < 1  # fixing the seed removes most, not all, of the spread
    assert spread["variance_ratio"] == pytest.approx(spread["stdev_ratio"] ** 2)
    index = (d / "index.html").read_text()
    assert "report.json" in index and "same-seed" in index and "%" in index
    if importlib.util.find_spec("matplotlib") is None:
        assert doc["plots"] == {} and any("matplotlib is not installed" in n for n in doc["notes"])
    else:
        assert set(doc["plots"]) == {"accuracy", "loss"}
    for fname in doc["plots"].values():
        assert (d / fname).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="{fname}"' in index
    # Seed 004's questions, per group: with the seed fixed only the models differ.
    same_cmp = doc["comparisons"][res.groups[SAME_SEED]]["checks"]
    diff_cmp = doc["comparisons"][res.groups[DIFFERENT_SEEDS]]["checks"]
    assert not same_cmp["models"]["all_same"] and same_cmp["batches"]["all_same"] and same_cmp["data"]["all_same"]
    assert same_cmp["initial_weights"]["all_same"]
    assert not diff_cmp["models"]["all_same"] and not diff_cmp["batches"]["all_same"]
    assert diff_cmp["data"]["all_same"] and not diff_cmp["initial_weights"]["all_same"]
    assert "Batches all the same" in index


def test_report_of_one_group_has_no_spread(ws: Workspace) -> None:
    for i in range(3):
        write_run(ws.runs, FakeRun(run_id=f"r{i}", group="solo", replicate=i, seed=42 + i))
    report = write_report(ws, ["solo"])
    assert report.name == "solo" and report.spread is None
    assert any("same-seed group" in n for n in report.notes)
    assert report.groups[0].kind == "different-seeds"


def test_report_bad_groups(ws: Workspace) -> None:
    with pytest.raises(NotFound):
        write_report(ws, ["nope"])
    with pytest.raises(UsageError):
        write_report(ws, [])


# ---------------------------------------------------------------- the commands


def test_report_and_verify_group_commands(ws: Workspace) -> None:
    from typer.testing import CliRunner

    from launcher.cli import app

    for i in range(3):
        write_run(ws.runs, FakeRun(run_id=f"s{i}", group="same", replicate=i, unseeded_dropout=True,
                                   dropout_entropy=i))
        write_run(ws.runs, FakeRun(run_id=f"d{i}", group="diff", replicate=i, seed=100 + i))
    runner = CliRunner()
    r = runner.invoke(app, ["-w", str(ws.root), "-q", "report", "same", "diff", "--name", "cli"])
    assert r.exit_code == 0, r.stderr
    assert "of the standard deviation remains" in r.stdout
    assert "95% interval" in r.stdout and "runs per group would bring each 95% interval" in r.stdout
    assert "Comparison results for same:" in r.stdout and "Models all the same: False" in r.stdout
    assert (ws.reports / "cli" / "index.html").is_file()
    r = runner.invoke(app, ["-w", str(ws.root), "-q", "--json", "report", "same", "diff", "--name", "cli"])
    assert json.loads(r.stdout)["data"]["schema"] == SCHEMA
    r = runner.invoke(app, ["-w", str(ws.root), "-q", "verify", "checksums", "--group", "diff"])
    assert r.exit_code == 3 and "an input change" in r.stdout
    r = runner.invoke(app, ["-w", str(ws.root), "-q", "verify", "checksums", "--group", "nope"])
    assert r.exit_code == 11 and "no completed runs in group" in r.stderr


def test_experiment_command_rejects_bad_seeds_mode(ws: Workspace) -> None:
    from typer.testing import CliRunner

    from launcher.cli import app

    r = CliRunner().invoke(app, ["-w", str(ws.root), "-q", "experiment", "mnist", "--runs", "2",
                                 "--seeds", "sometimes"])
    said = " ".join(r.stderr.replace("│", " ").split())  # the error box wraps its lines
    assert r.exit_code == 2 and "--seeds" in said and "'same', 'different', 'both'" in said


def test_seed_fixed_spread_is_the_ratio_of_standard_deviations() -> None:
    from launcher.report.assemble import GroupStats, RunSeries, describe, group_kind, percent, seed_fixed_spread

    def group(name: str, seeds: list[int], losses: list[float]) -> GroupStats:
        runs = [RunSeries(f"{name}{i}", name, i, s, "succeeded", [{"epoch": 0, "loss": v}])
                for i, (s, v) in enumerate(zip(seeds, losses, strict=True))]
        g = GroupStats(name, group_kind(runs), runs, "#000")
        g.final = {"loss": describe([r.final["loss"] for r in runs])}
        return g

    same = group("same", [7, 7, 7], [1.0, 2.0, 3.0])
    diff = group("diff", [1, 2, 3], [2.0, 4.0, 6.0])
    assert (same.kind, diff.kind) == ("same-seed", "different-seeds")
    spread = seed_fixed_spread(same, diff, ["loss"])["metrics"]["loss"]
    assert spread["stdev_same_seed"] == 1.0 and spread["stdev_different_seeds"] == 2.0
    assert spread["stdev_ratio"] == 0.5 and spread["variance_ratio"] == 0.25
    # The ResNet study's CIFAR numbers: 74% and 87% of the standard deviation remain.
    assert percent(0.01994929 / 0.02699318) == "73.9%" and percent(0.00301954 / 0.00346379) == "87.2%"
    one = group("one", [1], [5.0])
    assert one.kind == "single-run" and one.final["loss"]["stdev"] is None


def test_experiment_wires_runs_and_hosts(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default launcher: one open host per --host, one run_recipe call per planned run."""
    import shutil

    from launcher.runs import lifecycle as runs

    shutil.copytree(Path(__file__).parent / "fixtures" / "tiny_recipes" / "tiny", ws.recipes / "tiny")
    opened: list[tuple[HostSpec, Path | None]] = []
    closed: list[str] = []
    calls: list[dict[str, Any]] = []
    lock = threading.Lock()

    class FakeHost:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> FakeHost:
            return self

        def __exit__(self, *exc: object) -> None:
            closed.append(self.name)

    def open_host(spec: HostSpec, workspace_root: Path | None = None) -> FakeHost:
        opened.append((spec, workspace_root))
        return FakeHost(spec.name)

    def run_recipe(ws_: Workspace, spec: runs.RunRequest, host: FakeHost, reporter: Any, **kw: Any) -> Any:
        with lock:
            calls.append({"spec": spec, "host": host.name, **kw})
            n = len(calls)
        time.sleep(0.05)  # a run takes a while, so both hosts get work
        return runs.RunOutcome(group=spec.group or "", runs=[{"run_id": f"r{n}", "status": "succeeded"}])

    monkeypatch.setattr(HostSpec, "open", open_host)
    monkeypatch.setattr(runs, "run_recipe", run_recipe)
    hosts = [HostSpec("h1", trust_new_host=True, port=2222), HostSpec("h2", trust_new_host=True, port=2222)]
    res = experiment(ws, "tiny", 2, "both", hosts, base_seed=5, params={"size_kb": 1}, data_from="/some/dataset")
    assert res.exit_code == 0
    assert [s for s, _ in opened] == hosts and sorted(closed) == ["h1", "h2"]
    assert all(root is None for _, root in opened)  # an SSH host has no local workspace root
    assert len(calls) == 4 and {c["host"] for c in calls} == {"h1", "h2"}
    for c in calls:
        assert c["runs"] == 1 and c["seeds"] == [c["spec"].seed]
        assert c["spec"].recipe == "tiny" and c["spec"].params == {"size_kb": 1}
        assert c["spec"].data_from == "/some/dataset"  # each host's run_recipe sends it there
        assert c["host_spec"] in hosts and c["host_spec"].to_record()["port"] == 2222
    same = sorted(c["spec"].seed for c in calls if c["spec"].group.endswith("same-seed"))
    diff = sorted(c["spec"].seed for c in calls if c["spec"].group.endswith("different-seeds"))
    assert same == [5, 5] and diff == [5, 6]
    assert sorted(rid for r in res.to_dict()["runs"] for rid in r["run_ids"]) == ["r1", "r2", "r3", "r4"]
