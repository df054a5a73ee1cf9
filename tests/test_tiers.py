"""The tiers of the suite (tests/tiers.py): markers read from the fixtures a test uses, the fast tier
that runs without Docker, SSH or a framework, and the time summed by tier. Each case runs pytest on a
small suite of its own, with a `docker` and an `ssh` on PATH that would succeed and a `torch` beside
the tests, so only the guard can make the unmarked tests fail."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import tiers

HERE = Path(__file__).resolve().parent

CONFTEST = '''
import pytest

pytest_plugins = ["tiers"]


@pytest.fixture(scope="session")
def engine():
    return "the engine"


@pytest.fixture
def workspace_on_the_engine(engine):  # infrastructure reached through another fixture
    return engine
'''

TESTS = '''
import subprocess
import sys

import pytest


def test_plain():
    assert sum([1, 2]) == 3


def test_docker_unmarked():
    subprocess.run(["docker", "run", "--rm", "busybox", "true"], check=True)


def test_ssh_unmarked():
    subprocess.run(["ssh", "somehost", "true"], check=True)


def test_framework_unmarked():
    import torch
    assert torch.trained


def test_framework_in_a_subprocess_unmarked():
    subprocess.run([sys.executable, "-c", "import torch"], check=True)


@pytest.mark.slow
def test_framework_marked_slow():
    import torch
    assert torch.trained


@pytest.mark.docker
def test_docker_marked():
    subprocess.run(["docker", "run", "--rm", "busybox", "true"], check=True)


def test_docker_through_a_fixture(workspace_on_the_engine):
    subprocess.run(["docker", "run", "--rm", "busybox", "true"], check=True)
'''

INI = "[pytest]\naddopts = --strict-markers -p no:cacheprovider\nmarkers =\n" + "".join(
    f"    {m}: {m}\n" for m in tiers.COST_MARKERS)


def run_suite(tmp_path: Path, *args: str) -> tuple[dict[str, str], str]:
    """The small suite run by pytest in a subprocess: each test's outcome (passed, failed, or absent when
    deselected) and pytest's output."""
    suite = tmp_path / "suite"
    (suite / "torch").mkdir(parents=True, exist_ok=True)
    (suite / "torch/__init__.py").write_text("trained = True\n")
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_small.py").write_text(TESTS)
    (suite / "pytest.ini").write_text(INI)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("docker", "ssh"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    xml = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.xml"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(HERE)}
    env.pop("LAUNCHER_TIER_REPORT", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", str(suite / "pytest.ini"), "--rootdir", str(suite),
                           f"--junitxml={xml}", *args, str(suite)], cwd=suite, env=env, capture_output=True,
                          text=True, timeout=120)
    outcomes = {}
    if xml.exists():
        for case in ET.parse(xml).iter("testcase"):
            failed = case.find("failure") is not None or case.find("error") is not None
            outcomes[case.attrib["name"]] = "failed" if failed else "passed"
    return outcomes, done.stdout + done.stderr


def test_the_fast_tier_fails_a_test_that_reaches_docker_ssh_or_a_framework_unmarked(tmp_path: Path) -> None:
    outcomes, out = run_suite(tmp_path, "--tier", "fast")
    assert outcomes == {"test_plain": "passed", "test_docker_unmarked": "failed", "test_ssh_unmarked": "failed",
                        "test_framework_unmarked": "failed", "test_framework_in_a_subprocess_unmarked": "failed"}, out
    assert "3 deselected" in out  # marked slow, marked docker, docker through a fixture
    assert "a fast-tier test used torch (imported in pytest's process)" in out
    assert "a fast-tier test used torch (in a subprocess" in out
    assert "No such file or directory: 'docker'" in out and "No such file or directory: 'ssh'" in out


def test_every_run_guards_the_unmarked_and_sums_time_by_tier(tmp_path: Path) -> None:
    outcomes, out = run_suite(tmp_path)
    assert outcomes["test_docker_marked"] == outcomes["test_docker_through_a_fixture"] == "passed", out
    assert outcomes["test_framework_marked_slow"] == "passed", out
    assert outcomes["test_docker_unmarked"] == outcomes["test_framework_unmarked"] == "failed", out
    summary = out[out.index("time by tier"):]
    assert [line.split()[:2] for line in summary.splitlines()[1:4]] == [["fast", "5"], ["local", "3"], ["all", "8"]]


def test_a_fixture_gives_its_markers_to_the_tests_that_use_it_through_others(tmp_path: Path) -> None:
    _, out = run_suite(tmp_path, "--collect-only", "-q", "-m", "docker and not slow")
    assert sorted(line for line in out.splitlines() if "::" in line) == [
        "test_small.py::test_docker_marked", "test_small.py::test_docker_through_a_fixture"]
    _, out = run_suite(tmp_path, "--collect-only", "-q", "--tier", "local")
    assert "8/8 tests collected" in out or "8 tests collected" in out, out


def session_fixtures(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and ast.unparse(deco.func) == "pytest.fixture" and any(
                        k.arg == "scope" and ast.literal_eval(k.value) in ("session", "module")
                        for k in deco.keywords):
                    names.add(node.name)
    return names


def test_every_session_fixture_of_the_conftest_files_is_classified() -> None:
    """A new session fixture (most likely infrastructure, started once) must say what it needs, and a
    renamed one must not leave its tests unmarked."""
    defined = set().union(*(session_fixtures(p) for p in HERE.glob("conftest*.py")))
    unclassified = defined - set(tiers.FIXTURE_MARKERS) - tiers.HARMLESS_FIXTURES
    assert not unclassified, f"name {sorted(unclassified)} in tests/tiers.py: FIXTURE_MARKERS (with the markers of " \
                             "what it starts or needs) or HARMLESS_FIXTURES"
    assert set(tiers.FIXTURE_MARKERS) - defined == set(), "tests/tiers.py names a fixture no conftest defines"


@pytest.mark.parametrize(("markers", "tier"), [
    ((), "fast"), (("network",), "local"), (("slow",), "local"), (("tfimage", "slow"), "local"),
    (("testhost", "docker"), "hosts"), (("cluster", "testhost"), "cluster")])
def test_a_tier_is_the_most_expensive_thing_a_test_needs(markers: tuple[str, ...], tier: str) -> None:
    assert tiers.tier_of(markers) == tier


def test_a_lane_runs_its_tests_without_the_fast_tier(tmp_path: Path) -> None:
    """What scripts/test.sh runs beside each other after the fast tier: lane "local" has the local tests of
    files not listed for the other lane; lane "hosts" the test hosts' and the listed files'."""
    outcomes, out = run_suite(tmp_path, "--lane", "local")
    assert outcomes == {"test_framework_marked_slow": "passed", "test_docker_marked": "passed",
                        "test_docker_through_a_fixture": "passed"}, out
    outcomes, out = run_suite(tmp_path, "--lane", "hosts")
    assert outcomes == {} and "8 deselected" in out, out


@pytest.mark.parametrize(("tier", "lane"), [("fast", None), ("local", "local"), ("hosts", "hosts"),
                                            ("cluster", "hosts")])
def test_the_test_hosts_and_the_cluster_share_a_lane(tier: str, lane: str | None) -> None:
    item = type("Item", (), {"path": HERE / "test_nothing_listed.py"})()
    assert tiers.lane_of(item, tier) == lane  # type: ignore[arg-type]


def test_the_lane_list_names_local_tier_test_files_that_exist() -> None:
    files = {p.name for p in HERE.glob("test_*.py")}
    assert tiers.HOSTS_LANE_LOCAL <= files, sorted(tiers.HOSTS_LANE_LOCAL - files)
