"""OS packages without a container: the [system] table, apt's answers (real output captured once from
the bootstrapped Debian 12 base, tests/fixtures/apt/) parsed and cross-checked into a system lock, the
lock file's bytes, and lock_project keeping an up-to-date lock without resolving again."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from launcher import config
from launcher.errors import BadConfig, BadRecipe, ExitCode, LockFailed, NotFound
from launcher.images import aptlock, aptplan
from launcher.images import pins as images
from launcher.runtime import recipespec as rspec
from launcher.runtime.systemspec import SystemSpecError, check_system, merge_packages, split_package
from launcher.scaffold import init_workspace
from launcher.workspace import Workspace

FIXTURES = Path(__file__).parent / "fixtures" / "apt"
BASE = "127.0.0.1:5000/launcher-base@sha256:" + "c" * 64


def answer(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


# --- the [system] table -------------------------------------------------------------------------------

def test_system_table_checks_debian_names_and_versions() -> None:
    assert check_system({"apt": ["tree", "jq=1.6-2.1+deb12u2", "libc6=1:2.36-9", "g++"]}) == (
        "g++", "jq=1.6-2.1+deb12u2", "libc6=1:2.36-9", "tree")
    assert split_package("jq=1.6-2.1+deb12u2") == ("jq", "1.6-2.1+deb12u2")
    for bad, why in [("Tree", "not a Debian package"), ("x", "not a Debian package"), ("-rf", "not a Debian package"),
                     ("jq:amd64", "architecture qualifier"), ("jq=latest", "not a Debian version"),
                     ("tree; rm -rf /", "not a Debian package")]:
        with pytest.raises(SystemSpecError, match=why):
            check_system({"apt": [bad]})
    with pytest.raises(SystemSpecError, match="unknown key"):
        check_system({"apt": [], "yum": ["tree"]})
    with pytest.raises(SystemSpecError, match="list of Debian package names"):
        check_system({"apt": "tree"})
    with pytest.raises(SystemSpecError, match="pinned twice"):
        merge_packages(["jq=1", "jq=2"])
    assert merge_packages(["tree", "jq", "tree", "jq=1.6"]) == ("jq=1.6", "tree")


def test_recipe_toml_declares_os_packages(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "recipe.toml").write_text('entry = "train.py"\n\n[system]\napt = ["tree", "jq"]\n')
    spec = rspec.load_spec(tmp_path)
    assert spec.apt == ("jq", "tree")
    assert spec.as_dict()["apt"] == ["jq", "tree"]
    (tmp_path / "recipe.toml").write_text('entry = "train.py"\n\n[system]\napt = ["Tree"]\n')
    with pytest.raises(rspec.SpecError, match=r"system\.apt"):
        rspec.load_spec(tmp_path)


def test_declared_reads_launcher_toml_and_recipe_toml(tmp_path: Path) -> None:
    assert aptlock.declared(tmp_path).packages == ()
    (tmp_path / "launcher.toml").write_text('[defaults]\nvariant = "cpu"\n\n[system]\napt = ["tree"]\n')
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "recipe.toml").write_text('entry = "train.py"\n[system]\napt = ["jq"]\n')
    found = aptlock.declared(tmp_path)
    assert found.packages == ("jq", "tree")
    assert [p.name for p in found.files] == ["recipe.toml", "launcher.toml"]
    (tmp_path / "launcher.toml").write_text('[system]\napt = ["jq=1"]\n')
    (tmp_path / "recipe.toml").write_text('entry = "train.py"\n[system]\napt = ["jq=2"]\n')
    with pytest.raises(BadConfig, match="pinned twice"):
        aptlock.declared(tmp_path)
    (tmp_path / "launcher.toml").write_text('[system]\napt = ["NOPE"]\n')
    with pytest.raises(BadConfig, match=r"launcher\.toml"):
        aptlock.declared(tmp_path)
    (tmp_path / "launcher.toml").unlink()
    (tmp_path / "recipe.toml").write_text('entry = "train.py"\n[system]\nap = ["jq"]\n')
    with pytest.raises(BadRecipe, match=r"system\.ap"):
        aptlock.declared(tmp_path)


def test_workspace_launcher_toml_may_hold_a_system_table(tmp_path: Path) -> None:
    init_workspace(tmp_path / "ws")
    ws = Workspace.at(tmp_path / "ws")
    (ws.root / "launcher.toml").write_text('[defaults]\nvariant = "cpu"\n\n[system]\napt = ["tree"]\n')
    assert config.resolve(ws, environ={}).defaults() == {"variant": "cpu"}
    (ws.root / "launcher.toml").write_text('[sytsem]\napt = ["tree"]\n')
    with pytest.raises(BadConfig, match="sytsem"):
        config.resolve(ws, environ={})


# --- apt's answers ------------------------------------------------------------------------------------

def test_plan_of_real_apt_output_lists_every_deb_with_its_index_sha256() -> None:
    base, debs, in_base = aptplan.plan(answer("ok"), ("jq", "python3", "tree"), "[system] apt")
    assert (base.debian, base.codename, base.architecture) == ("12.15", "bookworm", "amd64")
    assert base.links == {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}
    assert base.sources == ("http://deb.debian.org/debian bookworm main amd64",)
    assert [(d.name, d.version) for d in debs] == [("jq", "1.6-2.1+deb12u2"), ("libjq1", "1.6-2.1+deb12u2"),
                                                   ("libonig5", "6.9.8-1"), ("tree", "2.1.0-1")]
    tree = debs[-1]
    assert tree.sha256 == "sha256:4c0dc6088e801285717bae2a98a7672f1e4d2eed4e918355987bc6617a8f490b"
    assert tree.url == "http://deb.debian.org/debian/pool/main/t/tree/tree_2.1.0-1_amd64.deb"
    assert (tree.size, tree.architecture, tree.base_version) == (52464, "amd64", None)
    assert debs[0].filename == "jq_1.6-2.1+deb12u2_amd64.deb"
    assert in_base == ["python3=3.11.2-1+b1"]


@pytest.mark.parametrize(("fixture", "requested", "expected"), [
    ("missing", ("nosuchpkg",), r"OS package nosuchpkg cannot be resolved: there is no such package in the base's "
                                r"Debian 12\.15 \(bookworm, amd64\) sources"),
    ("version", ("tree=9.9",), r"OS package tree=9\.9 cannot be resolved: .* have no version 9\.9"),
    ("virtual", ("awk",), r"OS package awk cannot be resolved: it is a virtual .*provided by: original-awk, mawk, "
                          r"gawk"),
    ("conflict", ("exim4-daemon-light", "postfix"), r"cannot be resolved together .*exim4-config : Conflicts: postfix"),
    ("offline", ("tree",), r"apt-get update inside the base image could not reach its sources .*"
                           r"Temporary failure resolving 'deb\.debian\.org'"),
])
def test_a_package_apt_cannot_resolve_is_one_line_naming_it(fixture: str, requested: tuple[str, ...],
                                                            expected: str) -> None:
    with pytest.raises(LockFailed) as info:
        aptplan.plan(answer(fixture), requested, "[system] apt of /p/launcher.toml")
    line = info.value.one_line()
    assert info.value.exit_code == ExitCode.LOCK_FAILED
    assert "\n" not in line and "\x1b" not in line
    assert re.search(expected, line), line


def test_a_download_that_disagrees_with_the_index_is_refused() -> None:
    bad = answer("ok")
    bad["uris"] = bad["uris"].replace("MD5Sum:a12f30705b94d891f14bd5199fe6f4f2", "MD5Sum:" + "0" * 32)
    with pytest.raises(LockFailed, match=r"tree 2\.1\.0-1 disagrees with the archive's Packages index: MD5Sum"):
        aptplan.plan(bad, ("tree",), "here")
    bad = answer("ok")
    bad["show"] = bad["show"].replace("Size: 52464", "Size: 52465")
    with pytest.raises(LockFailed, match="size 52465 in the index, 52464 to download"):
        aptplan.plan(bad, ("tree",), "here")
    bad = answer("ok")
    bad["show"] = bad["show"].replace("SHA256: 4c0dc6", "SHA256: zz0dc6")
    with pytest.raises(LockFailed, match="no SHA256"):
        aptplan.plan(bad, ("tree",), "here")


def test_an_upgrade_of_a_base_package_is_recorded_and_a_removal_refused() -> None:
    up = answer("ok")  # as apt prints a package the base has in an older version
    up["simulate"] = up["simulate"].replace("Inst tree (2.1.0-1", "Inst tree [2.0.9-1] (2.1.0-1")
    debs = aptplan.plan(up, ("tree",), "here")[1]
    assert [d.base_version for d in debs if d.name == "tree"] == ["2.0.9-1"]
    rm = copy.deepcopy(answer("ok"))
    rm["simulate"] += "Remv mawk [1.3.4.20200120-3.1]\n"
    with pytest.raises(LockFailed, match="would remove mawk from the base image"):
        aptplan.plan(rm, ("tree",), "here")


def test_an_epoch_is_written_as_apt_names_the_file() -> None:
    deb = aptplan.DebPackage("gawk", "1:5.2.1-2", "amd64", "http://x/gawk_5.2.1-2_amd64.deb", 1, "sha256:" + "a" * 64)
    assert deb.filename == "gawk_1%3a5.2.1-2_amd64.deb"


# --- system.lock --------------------------------------------------------------------------------------

def sample_lock(requested: tuple[str, ...] = ("jq", "tree")) -> aptlock.SystemLock:
    base, debs, in_base = aptplan.plan(answer("ok"), requested, "here")
    return aptlock.SystemLock(BASE, base.debian, base.codename, base.architecture, requested, tuple(debs),
                              tuple(in_base), base.sources, base.links)


def test_system_lock_round_trips_byte_for_byte(tmp_path: Path) -> None:
    lock = sample_lock()
    path = tmp_path / "system.lock"
    assert aptlock.write(lock, path) is True
    text = path.read_text()
    assert text.startswith("# launcher system lock")
    assert f"# resolved inside the base image {BASE}" in text and "# Debian 12.15 (bookworm, amd64)" in text
    assert 'sha256 = "sha256:4c0dc6088e801285717bae2a98a7672f1e4d2eed4e918355987bc6617a8f490b"' in text
    again = aptlock.read(path)
    assert again == lock
    assert aptlock.write(again, path) is False  # the same lock: not rewritten
    assert again.records()[-1] == {"name": "tree", "version": "2.1.0-1", "architecture": "amd64",
                                   "sha256": "sha256:4c0dc6088e801285717bae2a98a7672f1e4d2eed4e918355987bc6617a8f490b"}
    assert aptlock.lock_sha256(path).startswith("sha256:")
    assert again.base_digest == "sha256:" + "c" * 64


def test_a_damaged_system_lock_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "system.lock"
    text = sample_lock().text()
    path.write_text(text.replace('sha256 = "sha256:4c0d', 'sha256 = "md5:4c0d'))
    with pytest.raises(LockFailed, match=r"not a valid system lock .*'md5:4c0d.*' is not sha256:<64 hex digits>"):
        aptlock.read(path)
    path.write_text(text.replace("lock_version = 1", "lock_version = 9"))
    with pytest.raises(LockFailed, match="lock_version 9"):
        aptlock.read(path)
    with pytest.raises(NotFound):
        aptlock.read(tmp_path / "none.lock")


@pytest.fixture
def project_ws(tmp_path: Path) -> tuple[Workspace, Path]:
    init_workspace(tmp_path / "ws")
    ws = Workspace.at(tmp_path / "ws", tmp_path / "cache")
    pinned = images.ImagesLock()
    for v in ("cpu", "gpu"):
        pinned.pins[v] = images.BasePin(v, BASE, python="3.11", source="bootstrap")
    images.save(ws, pinned)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    (proj / "launcher.toml").write_text('[system]\napt = ["tree", "jq"]\n')
    return ws, proj


def test_lock_project_resolves_once_then_keeps_the_lock(project_ws: tuple[Workspace, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ws, proj = project_ws
    calls: list[tuple[str, ...]] = []

    def fake_resolve(ws: Workspace, variant: str, packages: tuple[str, ...], reporter: Any = None,
                     *, where: str = "") -> aptlock.SystemLock:
        calls.append(packages)
        assert "launcher.toml" in where
        return sample_lock(packages)

    monkeypatch.setattr(aptlock, "resolve", fake_resolve)
    first = aptlock.lock_project(ws, proj, "cpu", fetch=False)
    assert first is not None and first.changed and calls == [("jq", "tree")]
    assert first.sha256 == aptlock.lock_sha256(proj / "system.lock")
    second = aptlock.lock_project(ws, proj, "cpu", fetch=False)
    assert second is not None and not second.changed and len(calls) == 1  # nothing changed: no container
    aptlock.lock_project(ws, proj, "cpu", fetch=False, upgrade=True)
    assert len(calls) == 2
    assert aptlock.current(ws, proj, "cpu") == second.lock
    (proj / "launcher.toml").write_text('[system]\napt = ["tree"]\n')
    with pytest.raises(LockFailed, match="out of date: it locks jq tree"):
        aptlock.current(ws, proj, "cpu")
    (proj / "launcher.toml").write_text("[system]\napt = []\n")
    assert aptlock.lock_project(ws, proj, "cpu", fetch=False) is None
    assert not (proj / "system.lock").exists()  # launcher's own file, nothing declares it any more
    assert aptlock.current(ws, proj, "cpu") is None


def test_current_names_a_missing_lock_and_another_base(project_ws: tuple[Workspace, Path]) -> None:
    ws, proj = project_ws
    with pytest.raises(NotFound, match=r"declares OS packages \(jq tree\) but .*system.lock is missing"):
        aptlock.current(ws, proj, "cpu")
    other = sample_lock()
    aptlock.write(aptlock.SystemLock(**{**other.__dict__, "base": "other@sha256:" + "d" * 64}), proj / "system.lock")
    with pytest.raises(LockFailed, match="was resolved for the base other@"):
        aptlock.current(ws, proj, "cpu")


# --- launcher lock PROJECT ----------------------------------------------------------------------------

def test_lock_project_command_picks_the_projects_variant(project_ws: tuple[Workspace, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from launcher.cli import app

    ws, proj = project_ws
    seen: list[tuple[Path, str]] = []

    def fake_lock_project(ws: Workspace, folder: Path, variant: str, reporter: Any = None,
                          **kw: Any) -> aptlock.SystemLockResult:
        seen.append((folder, variant))
        lock = sample_lock()
        aptlock.write(lock, folder / "system.lock")
        return aptlock.SystemLockResult(folder, folder / "system.lock", True, lock,
                                        aptlock.lock_sha256(folder / "system.lock"))

    monkeypatch.setattr(aptlock, "lock_project", fake_lock_project)
    runner = CliRunner()
    res = runner.invoke(app, ["-w", str(ws.root), "--json", "lock", str(proj / "train.py")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)["data"]
    assert seen == [(proj.resolve(), "cpu")]  # a script names its folder; the default variant
    assert data["variant"] == "cpu"
    assert [p["name"] for p in data["system"]["packages"]] == ["jq", "libjq1", "libonig5", "tree"]
    (proj / "recipe.toml").write_text('entry = "train.py"\nvariant = "gpu"\n')
    assert runner.invoke(app, ["-w", str(ws.root), "lock", str(proj)]).exit_code == 0
    assert seen[-1][1] == "gpu"  # the recipe's variant
    assert runner.invoke(app, ["-w", str(ws.root), "lock", str(proj), "--variant", "cpu"]).exit_code == 0
    assert seen[-1][1] == "cpu"  # --variant wins
    res = runner.invoke(app, ["-w", str(ws.root), "lock", str(proj / "nope")])
    assert res.exit_code == ExitCode.USAGE and "does not exist" in res.output


def test_lock_project_command_with_nothing_declared(project_ws: tuple[Workspace, Path]) -> None:
    from typer.testing import CliRunner

    from launcher.cli import app

    ws, proj = project_ws
    (proj / "launcher.toml").unlink()
    res = CliRunner().invoke(app, ["-w", str(ws.root), "lock", str(proj)])
    assert res.exit_code == 0, res.output
    assert "no OS packages declared" in res.output
