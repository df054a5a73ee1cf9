from __future__ import annotations

import json
from pathlib import Path

import pytest
from runfactory import FakeRun, edit_manifest, manifest_data, write_run

from launcher.errors import Corrupt, ExitCode, NotFound, SchemaTooNew
from launcher.records.manifest import SCHEMA_VERSION, ManifestMissing, load_manifest, write_manifest


def test_load_gives_a_typed_view(tmp_path: Path) -> None:
    d = write_run(tmp_path, FakeRun(run_id="r1", seed=7, replicate=2))
    m = load_manifest(d)
    assert (m.run_id, m.group, m.replicate, m.seed, m.recipe_name) == ("r1", "g1", 2, 7, "mnist_convnet")
    assert m.determinism["profile"] == "deterministic"
    art = m.artifact("outputs/model/canonical.npz")
    assert art is not None and art.sha256.startswith("sha256:")
    assert art.size == m.file(art.path).stat().st_size
    assert m.artifact("outputs/nothing") is None


def test_missing_manifest_is_its_own_not_found(tmp_path: Path) -> None:
    d = write_run(tmp_path, FakeRun(run_id="r1"))
    (d / "manifest.json").unlink()
    with pytest.raises(ManifestMissing) as exc:
        load_manifest(d)
    assert exc.value.exit_code == ExitCode.NOT_FOUND
    assert "not complete" in exc.value.one_line()
    with pytest.raises(NotFound):
        load_manifest(tmp_path / "no-such-run")


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    d = write_run(tmp_path, FakeRun(run_id="r1"))
    edit_manifest(d, schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(SchemaTooNew) as exc:
        load_manifest(d)
    assert exc.value.exit_code == ExitCode.SCHEMA_TOO_NEW


@pytest.mark.parametrize("text", [
    "{not json",
    "[]",
    json.dumps({"schema_version": 1}),
    json.dumps({**manifest_data(FakeRun(run_id="r")), "status": "maybe"}),
    json.dumps({**manifest_data(FakeRun(run_id="r")), "artifacts": [{"path": "../x", "size": 1,
                                                                     "sha256": "sha256:" + "0" * 64}]}),
    json.dumps({**manifest_data(FakeRun(run_id="r")), "artifacts": [{"path": "x", "size": "1",
                                                                     "sha256": "sha256:" + "0" * 64}]}),
    json.dumps({**manifest_data(FakeRun(run_id="r")), "schema_version": 0}),
])
def test_malformed_manifest_is_corrupt(tmp_path: Path, text: str) -> None:
    d = tmp_path / "r"
    d.mkdir()
    (d / "manifest.json").write_text(text)
    with pytest.raises(Corrupt):
        load_manifest(d)


def test_write_manifest_validates_and_is_atomic(tmp_path: Path) -> None:
    d = tmp_path / "r"
    d.mkdir()
    bad = {**manifest_data(FakeRun(run_id="r")), "artifacts": "nope"}
    with pytest.raises(Corrupt):
        write_manifest(d, bad)
    assert not (d / "manifest.json").exists()
    assert list(d.iterdir()) == []  # no temporary left behind
    m = write_manifest(d, manifest_data(FakeRun(run_id="r")))
    assert load_manifest(d).data == m.data
