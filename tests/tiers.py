"""The suite's tiers, read from what each test uses (loaded by conftest.py as a plugin).

A test's markers come from its own marks and from the fixtures it uses, directly or through other
fixtures (FIXTURE_MARKERS), so a new test that asks for `engine`, `cpu_image` or `testhost` is
classified without anybody listing it. Its tier is the most expensive thing it needs:

  fast     none of the markers below: no root, no Docker, no training (`--tier fast`)
  local    Docker, images, training, the package index, or longer than a few seconds, on this machine
  hosts    SSH test host containers
  cluster  a test cluster (Slurm, Ray: several test hosts)

`--tier NAME` runs that tier and those above it in this list (default: all). `--lane local|hosts` runs the
tests of one lane, the fast tier left out: scripts/test.sh runs the fast tier on two workers, then the two
lanes side by side, in two pytest processes. Lane "hosts" has the SSH test hosts and the cluster and the
local-tier files listed in HOSTS_LANE_LOCAL; lane "local" the other local-tier tests. A run is mostly one
core busy and the other waiting on a build, a container or TensorFlow starting, so the lanes overlap;
what both use (the base, the TensorFlow image) is made once, the other lane waiting for it
(conftest.py `made_once`). A fast-tier test runs,
in every run, without Docker or SSH: the infrastructure's commands are taken off PATH and DOCKER_HOST
points nowhere, so a test that starts a container or reaches a host without saying so fails instead of
passing slowly. A fast-tier test that imports TensorFlow, PyTorch or JAX (in pytest's process, or in a
Python subprocess that keeps PYTHONPATH) fails too: it belongs in `slow`. The terminal summary adds
up each test's setup, call and teardown by tier, and lists fast-tier tests that ran longer than a few
seconds (candidates for `slow`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The fixtures that stand for infrastructure, and the markers a test using one gets. Transitive: a
# fixture built on `cpu_image` gives its tests these markers too. Every session fixture of the
# conftest files is named here or in HARMLESS_FIXTURES (tests/test_tiers.py checks).
FIXTURE_MARKERS: dict[str, tuple[str, ...]] = {
    "engine": ("docker",),
    "registry_addr": ("docker", "registry"),
    "base_ref": ("docker", "registry", "image"),  # a base bootstrapped by debootstrap (root)
    "make_workspace": ("docker", "registry", "image"),
    "tf_workspace": ("docker", "registry", "image"),
    "six_lock": ("docker", "registry", "image", "network"),  # resolved against PyPI in the base
    "tiny_image": ("docker", "registry", "image"),
    "cpu_image": ("docker", "registry", "tfimage", "image", "slow"),
    "testhost": ("docker", "testhost", "slow"),
    "slurm_cluster": ("docker", "testhost", "cluster", "slow"),
    "ray_cluster": ("docker", "testhost", "cluster", "slow", "network"),  # Ray installed from PyPI
}
# Session fixtures of the conftest files that need no infrastructure.
HARMLESS_FIXTURES = frozenset({"repo_workspace", "azure_sdk"})
# A marker implies others: the fast tier leaves out every one of these.
IMPLIED: dict[str, tuple[str, ...]] = {
    "registry": ("docker",),
    "image": ("docker",),
    "tfimage": ("docker", "image", "slow"),
    "testhost": ("docker",),
    "cluster": ("docker", "testhost", "slow"),
}
COST_MARKERS = ("docker", "registry", "tfimage", "testhost", "network", "slow", "image", "cluster")
TIERS = ("fast", "local", "hosts", "cluster")
# What a fast-tier test must not reach: taken off PATH while it runs.
INFRA_COMMANDS = frozenset({
    "docker", "dockerd", "containerd", "docker-registry", "skopeo", "debootstrap",
    "ssh", "scp", "sftp", "sshd", "apt-get", "apt", "munged", "slurmctld", "slurmd",
    "sbatch", "srun", "squeue", "scontrol", "scancel", "sacct", "sinfo",
})
FRAMEWORKS = ("tensorflow", "torch", "jax", "keras")
NO_DOCKER_HOST = "unix:///nonexistent/the-fast-tier-has-no-docker-engine.sock"
# The local-tier test files that run in the lane of the test hosts (lane "hosts"); the others in lane "local".
# Chosen to even out the lanes' times on a 2-core machine (scripts/test.sh prints each tier's time).
HOSTS_LANE_LOCAL = frozenset({"test_torch_variant.py", "test_examples_in_image.py", "test_jax_variant.py",
                              "test_multinode.py"})
FAST_SECONDS = 5.0  # longer than this in the fast tier: reported as a candidate for `slow`
SPY = '''\
import atexit, os, sys
def _launcher_tier_spy():
    found = [m for m in {frameworks!r} if sys.modules.get(m) is not None]
    if found:
        with open({log!r}, "a") as f:
            f.write(" ".join(found) + " " + " ".join(sys.argv[:2]) + "\\n")
atexit.register(_launcher_tier_spy)
'''


def markers_of(item: pytest.Item) -> set[str]:
    names = {m.name for m in item.iter_markers()}
    for fixture in getattr(item, "fixturenames", ()):
        names.update(FIXTURE_MARKERS.get(fixture, ()))
    for name in list(names):
        names.update(IMPLIED.get(name, ()))
    return names


def tier_of(markers: Iterable[str]) -> str:
    names = set(markers)
    if "cluster" in names:
        return "cluster"
    if "testhost" in names:
        return "hosts"
    if names & set(COST_MARKERS):
        return "local"
    return "fast"


LANES = ("local", "hosts")


def lane_of(item: pytest.Item, tier: str) -> str | None:
    """The lane of a test that is not in the fast tier (None for the fast tier)."""
    if tier == "fast":
        return None
    if tier in ("hosts", "cluster") or Path(str(item.path)).name in HOSTS_LANE_LOCAL:
        return "hosts"
    return "local"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--tier", choices=(*TIERS[:-1], "full"), default="full",
                     help="run this tier of the suite and the cheaper ones: fast (no root, Docker or "
                          "training), local (no SSH test hosts), hosts (no Slurm cluster), full")
    parser.addoption("--lane", choices=LANES, default=None,
                     help="only the tests of this lane, the fast tier left out (scripts/test.sh runs the two "
                          "lanes side by side)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = config.getoption("tier")
    last = len(TIERS) if chosen == "full" else TIERS.index(chosen) + 1
    lane = config.getoption("lane")
    keep, drop = [], []
    for item in items:
        names = markers_of(item)
        for name in sorted(names - {m.name for m in item.iter_markers()}):
            item.add_marker(name)
        tier = tier_of(names)
        item.user_properties.append(("tier", tier))
        wanted = TIERS.index(tier) < last and (lane is None or lane_of(item, tier) == lane)
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    # cheapest tier first (in collection order within each): a logic error fails in minutes, and the session's
    # fixtures (test hosts, the cluster) are torn down after a test that may reach Docker, not under the guard
    items[:] = sorted(keep, key=lambda item: TIERS.index(dict(item.user_properties)["tier"]))


def _loaded() -> list[str]:
    return [m for m in FRAMEWORKS if sys.modules.get(m) is not None]  # None: an import made to fail


@dataclass(frozen=True)
class GuardState:
    env: dict[str, str | None]
    log_at: int
    had: frozenset[str]


_STATE = pytest.StashKey[GuardState]()


class Guard:
    """What a fast-tier test runs without, and what it is caught using."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root / "frameworks.log"
        self.log.touch()
        spy = root / "spy"
        spy.mkdir()
        (spy / "sitecustomize.py").write_text(SPY.format(frameworks=FRAMEWORKS, log=str(self.log)))
        self.spy = spy
        folders = os.environ.get("PATH", "").split(os.pathsep)
        self.path = os.pathsep.join(self._shadow(d, i) for i, d in enumerate(folders))

    def _shadow(self, folder: str, index: int) -> str:
        """The folder itself, or a copy of it made of links that leaves the infrastructure out."""
        try:
            names = set(os.listdir(folder))
        except OSError:
            return folder
        if not names & INFRA_COMMANDS:
            return folder
        shadow = self.root / f"path{index}"
        shadow.mkdir()
        for name in names - INFRA_COMMANDS:
            (shadow / name).symlink_to(Path(folder) / name)
        return str(shadow)

    def enter(self) -> GuardState:
        state = GuardState({k: os.environ.get(k) for k in ("PATH", "DOCKER_HOST", "PYTHONPATH")},
                           self.log.stat().st_size, frozenset(_loaded()))
        os.environ["PATH"] = self.path
        os.environ["DOCKER_HOST"] = NO_DOCKER_HOST
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.spy), state.env["PYTHONPATH"]) if p)
        return state

    def used_since(self, state: GuardState) -> list[str]:
        """The frameworks imported since enter(): in pytest's process, and in Python subprocesses."""
        used = [f"{m} (imported in pytest's process)" for m in _loaded() if m not in state.had]
        with open(self.log) as f:
            f.seek(state.log_at)
            used += [f"{line.split()[0]} (in a subprocess: {line.strip()})" for line in f if line.strip()]
        return used

    @staticmethod
    def leave(state: GuardState) -> None:
        for key, value in state.env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class TierPlugin:
    def __init__(self) -> None:
        self.guard: Guard | None = None
        self.seconds: dict[str, float] = dict.fromkeys(TIERS, 0.0)
        self.tests: dict[str, set[str]] = {t: set() for t in TIERS}
        self.long_fast: dict[str, float] = {}
        self.started = time.monotonic()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
        if dict(item.user_properties).get("tier") != "fast":
            yield
            return
        if self.guard is None:
            self.guard = Guard(Path(tempfile.mkdtemp(prefix="launcher-tier-guard-")))
        state = item.stash[_STATE] = self.guard.enter()
        try:
            yield
        finally:
            self.guard.leave(state)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any]:
        outcome = yield
        state = item.stash.get(_STATE, None)
        if call.when != "call" or state is None or self.guard is None:
            return
        report: pytest.TestReport = outcome.get_result()
        used = self.guard.used_since(state)
        if used and report.passed:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid}: a fast-tier test used {'; '.join(used)}. Mark it "
                               "`@pytest.mark.slow` (it trains or loads a framework) or give it the fixture of "
                               "the infrastructure it needs (tests/tiers.py)")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = dict(report.user_properties).get("tier")
        if tier not in self.seconds:
            return
        self.seconds[str(tier)] += report.duration
        self.tests[str(tier)].add(report.nodeid)
        if tier == "fast":
            self.long_fast[report.nodeid] = self.long_fast.get(report.nodeid, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        if not any(self.tests.values()):
            return
        tr.section("time by tier")
        for tier in TIERS:
            if self.tests[tier]:
                tr.write_line(f"{tier:8s} {len(self.tests[tier]):5d} tests {self.seconds[tier]:9.1f} s")
        tr.write_line(f"{'all':8s} {sum(len(t) for t in self.tests.values()):5d} tests "
                      f"{sum(self.seconds.values()):9.1f} s (setup + call + teardown; pytest's wall time: "
                      f"{time.monotonic() - self.started:.1f} s)")
        long = sorted(((s, n) for n, s in self.long_fast.items() if s > FAST_SECONDS), reverse=True)
        if long:
            tr.write_line(f"fast-tier tests over {FAST_SECONDS:.0f} s (mark them `slow` if they stay that long):")
            for seconds, nodeid in long:
                tr.write_line(f"  {seconds:6.1f} s  {nodeid}")
        report_file = os.environ.get("LAUNCHER_TIER_REPORT")
        if report_file:
            Path(report_file).write_text(json.dumps({t: {"tests": len(self.tests[t]), "seconds": self.seconds[t]}
                                                     for t in TIERS}))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierPlugin(), "launcher-tiers")


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin("launcher-tiers")
    if isinstance(plugin, TierPlugin) and plugin.guard is not None:
        shutil.rmtree(plugin.guard.root, ignore_errors=True)
