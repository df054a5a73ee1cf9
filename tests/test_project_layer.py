"""The project layer without a Docker engine: its canonical tar, its config on top of the run's image, its
cache, and the seam for OS packages (a stand-in for the APT side's aptlock/debs modules). The layer built
for real, twice from scratch, and a run in its image are in test_project_deps.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import types
from pathlib import Path
from typing import Any

import pytest

from launcher.images import projectlayer, wheels
from launcher.images.lock import LockedRequirement
from launcher.images.pins import BasePin
from launcher.images.projectlock import extra_requirements
from launcher.progress import NullReporter
from launcher.runs import project

H = "a" * 64
PIN = BasePin("cpu", "127.0.0.1:5000/base@sha256:" + "b" * 64, python="3.11")


def tree(root: Path, *, mtime: int, umask_exec: bool) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "pkg" / "sub" / "mod.py").write_text("y = 2\n")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/opt/venv/bin/python\n")
    (root / "bin" / "tool").chmod(0o775 if umask_exec else 0o700)
    (root / "pkg" / "link.py").symlink_to("__init__.py")
    for p in root.rglob("*"):
        if not p.is_symlink():
            os.utime(p, (mtime, mtime))
    return root


def tar_bytes(site: Path, **kw: Any) -> bytes:
    buf = io.BytesIO()
    projectlayer.write_tar(buf, 315532800, [(site, projectlayer.SITE)], {"opt/launcher/project/requirements.lock":
                                                                       b"six==1\n"}, **kw)
    return buf.getvalue()


def test_the_layer_tar_is_a_function_of_content_alone(tmp_path: Path) -> None:
    a = tar_bytes(tree(tmp_path / "a", mtime=1_700_000_000, umask_exec=True))
    b = tar_bytes(tree(tmp_path / "b", mtime=1_800_000_000, umask_exec=False))
    assert a == b
    members = tarfile.open(fileobj=io.BytesIO(a)).getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert {m.mtime for m in members} == {315532800} and {(m.uid, m.gid, m.uname) for m in members} == {(0, 0, "")}
    by = {m.name.removeprefix(f"{projectlayer.SITE}/"): m for m in members}
    assert by["bin/tool"].mode == 0o755 and by["pkg/__init__.py"].mode == 0o644
    assert by["pkg/link.py"].issym() and by["pkg/link.py"].linkname == "__init__.py"
    assert by["opt/launcher/project/requirements.lock"].size == 7


def test_os_packages_keep_their_own_modes_and_owners(tmp_path: Path) -> None:
    root = tmp_path / "debs"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "su-ish").write_text("x")
    buf = io.BytesIO()
    projectlayer.write_tar(buf, 0, [(root, "")], {}, modes={"usr/bin/su-ish": (0o4755, 0, 43)})
    by = {m.name: m for m in tarfile.open(fileobj=io.BytesIO(buf.getvalue())).getmembers()}
    assert set(by) == {"usr", "usr/bin", "usr/bin/su-ish"}
    assert (by["usr/bin/su-ish"].mode, by["usr/bin/su-ish"].gid) == (0o4755, 43)


def test_only_what_the_image_lacks_goes_in_the_layer() -> None:
    image = [LockedRequirement("numpy", "2.4.6", (H,)), LockedRequirement("six", "1.17.0", (H,))]
    lock = [LockedRequirement("numpy", "2.4.6", (H,)), LockedRequirement("msgpack", "1.2.4", (H,))]
    assert [r.name for r in extra_requirements(lock, image)] == ["msgpack"]


def layer(diff: str = "sha256:" + "c" * 64) -> projectlayer.ProjectLayer:
    return projectlayer.ProjectLayer(diff, Path("/x.tar"), ("msgpack==1.2.4",), "sha256:" + "d" * 64)


def test_the_config_adds_one_layer_its_labels_and_history() -> None:
    base = json.dumps({"config": {"Labels": {"org.launcher.variant": "cpu"}, "Env": ["PATH=/opt/venv/bin"]},
                       "history": [{"created": "x"}], "rootfs": {"type": "layers", "diff_ids": ["sha256:1"]}}).encode()
    one = projectlayer.compose_config(base, layer(), projectlayer.labels_of(layer()), 0)
    cfg = json.loads(one)
    assert cfg["rootfs"]["diff_ids"] == ["sha256:1", layer().diff_id]
    assert cfg["config"]["Labels"]["org.launcher.project-layer"] == layer().diff_id
    assert cfg["config"]["Labels"]["org.launcher.variant"] == "cpu" and cfg["config"]["Env"] == ["PATH=/opt/venv/bin"]
    assert "project layer, 1 packages" in cfg["history"][-1]["created_by"]
    assert one == projectlayer.compose_config(base, layer(), projectlayer.labels_of(layer()), 0)
    other = projectlayer.compose_config(base, layer("sha256:" + "e" * 64), {}, 0)
    assert hashlib.sha256(one).hexdigest() != hashlib.sha256(other).hexdigest()


def test_the_layer_key_covers_the_lock_the_image_and_the_os_packages() -> None:
    key = projectlayer.layer_key
    keys = {key("sha256:1", "sha256:img", None), key("sha256:2", "sha256:img", None),
            key("sha256:1", "sha256:other", None), key("sha256:1", "sha256:img", "sha256:sys")}
    assert len(keys) == 4


def fake_install(calls: list[str]) -> Any:
    def install(image_id: str, pin: BasePin, stage: Path, into: Path, count: int, reporter: Any) -> str:
        calls.append(image_id)
        assert (stage / "requirements.lock").read_text().startswith("msgpack==1.2.4 --hash=sha256:")
        (into / "msgpack").mkdir()
        (into / "msgpack" / "__init__.py").write_text("version = (1, 2, 4)\n")
        return "/opt/venv/lib/python3.11/site-packages"
    return install


def fake_download(lockfile: Path, pool: Path, **kw: Any) -> wheels.Wheelhouse:
    pool.mkdir(parents=True, exist_ok=True)
    whl = pool / "msgpack-1.2.4-cp311-cp311-manylinux_2_17_x86_64.whl"
    whl.write_bytes(b"wheel")
    return wheels.Wheelhouse({"msgpack": whl}, pool)


def write_locks(tmp_path: Path) -> tuple[Path, Path]:
    lock = tmp_path / "requirements.lock"
    lock.write_text(f"# launcher project lock\nmsgpack==1.2.4 \\\n    --hash=sha256:{H}\nnumpy==2.4.6 \\\n"
                    f"    --hash=sha256:{H}\n")
    variant = tmp_path / "cpu.txt"
    variant.write_text(f"numpy==2.4.6 \\\n    --hash=sha256:{H}\n")
    return lock, variant


def test_a_layer_is_built_once_per_lock_and_image_and_is_the_same_from_any_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(projectlayer, "install", fake_install(calls))
    monkeypatch.setattr(wheels, "download", fake_download)
    lock, variant = write_locks(tmp_path)
    kw: dict[str, Any] = {"lock_path": lock, "variant_lock": variant, "image_id": "sha256:img", "pin": PIN}
    first = projectlayer.build_layer(cache_dir=tmp_path / "cache1", **kw)
    assert first.built and first.packages == ("msgpack==1.2.4",) and len(calls) == 1
    again = projectlayer.build_layer(cache_dir=tmp_path / "cache1", **kw)
    assert not again.built and again.diff_id == first.diff_id and len(calls) == 1
    elsewhere = projectlayer.build_layer(cache_dir=tmp_path / "cache2", **kw)
    assert elsewhere.built and elsewhere.diff_id == first.diff_id
    assert first.path.read_bytes() == elsewhere.path.read_bytes()
    by = {m.name: m for m in tarfile.open(first.path).getmembers()}
    pth = by["opt/venv/lib/python3.11/site-packages/launcher-project.pth"]
    assert tarfile.open(first.path).extractfile(pth).read() == b"/opt/launcher/project/site-packages\n"  # type: ignore[union-attr]
    assert f"{projectlayer.SITE}/msgpack/__init__.py" in by and "opt/launcher/project/requirements.lock" in by


class FakeApt(types.ModuleType):
    """Stands in for launcher.images.aptlock and launcher.images.debs (real ones: tests/test_project_system.py)."""

    def __init__(self, name: str, folder: Path) -> None:
        super().__init__(name)
        self.folder = folder

    def current(self, ws: Any, root: Path, variant: str) -> Any:
        return types.SimpleNamespace(packages=[types.SimpleNamespace(name="tree", version="2.1.0-1")])

    def lock_sha256(self, path: Path) -> str:
        return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()

    def unpack_lock(self, lock: Any, cache_dir: Path, into: Path, reporter: Any) -> Any:
        (into / "usr" / "bin").mkdir(parents=True)
        (into / "usr" / "bin" / "tree").write_text("ELF")
        entry = types.SimpleNamespace(path="usr/bin/tree", mode=0o755, uid=0, gid=0)
        return types.SimpleNamespace(entries=(entry,))


def test_os_packages_reach_the_layer_through_the_apt_seam(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "system.lock").write_text("# launcher system lock\n")
    ws = types.SimpleNamespace(cache_dir=tmp_path / "cache")
    monkeypatch.setattr(project, "aptlock", FakeApt("launcher.images.aptlock", root))
    import launcher.images
    import launcher.images.debs  # project imports it only for a project with system packages

    monkeypatch.setattr(launcher.images, "debs", FakeApt("launcher.images.debs", root))
    with project.system_part(ws, root, "cpu", NullReporter()) as part:  # type: ignore[arg-type]
        assert part is not None and part.packages == ("tree=2.1.0-1",) and part.modes["usr/bin/tree"][0] == 0o755
        built = projectlayer.build_layer(lock_path=None, variant_lock=tmp_path / "none", image_id="sha256:img",
                                         pin=PIN, cache_dir=tmp_path / "cache", system=part)
        unpacked = part.tree
    assert not unpacked.exists()  # the unpacked .debs are temporary
    assert built.system_lock_sha256 == part.lock_sha256 and built.requirements_lock_sha256 is None
    assert "usr/bin/tree" in tarfile.open(built.path).getnames()
