"""The runtime's digests and the canonical model file."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from launcher.runtime import fingerprints as fp
from launcher.runtime.record import Recorder, expected_mismatch


def layers(seed: int = 0) -> list[tuple[str, list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    return [("conv2d", [rng.normal(size=(3, 3, 1, 4)).astype("float32"), np.zeros(4, "float32")]),
            ("dense", [rng.normal(size=(4, 2)).astype("float32"), np.ones(2, "float32")]),
            ("bn", [np.arange(12, dtype="int64")])]


def test_canonical_npz_is_byte_stable_and_loads_with_numpy() -> None:
    a = fp.canonical_npz_bytes(layers())
    b = fp.canonical_npz_bytes([(n, [v.copy() for v in vs]) for n, vs in layers()])
    assert a == b
    with np.load(io.BytesIO(a)) as f:
        assert sorted(f.files) == ["000.conv2d/0", "000.conv2d/1", "001.dense/0", "001.dense/1", "002.bn/0"]
        np.testing.assert_array_equal(f["001.dense/0"], layers()[1][1][0])
    with zipfile.ZipFile(io.BytesIO(a)) as zf:
        infos = zf.infolist()
        assert [i.filename for i in infos] == sorted(i.filename for i in infos)
        assert {i.date_time for i in infos} == {fp.ZIP_EPOCH}
        assert {i.compress_type for i in infos} == {zipfile.ZIP_STORED}


def test_canonical_npz_changes_with_one_bit() -> None:
    changed = layers()
    w = changed[1][1][0]
    w.view("uint32")[0, 0] ^= 1
    assert fp.canonical_npz_bytes(changed) != fp.canonical_npz_bytes(layers())
    now, before = fp.weights_fingerprint(changed)["arrays"], fp.weights_fingerprint(layers())["arrays"]
    assert now["conv2d/0"] == before["conv2d/0"]
    assert now["dense/0"] != before["dense/0"]


def test_array_digest_sees_dtype_shape_and_byte_order_but_not_memory_layout() -> None:
    a = np.arange(6, dtype="<f4").reshape(2, 3)
    assert fp.array_digest(a) != fp.array_digest(a.astype("f8"))
    assert fp.array_digest(a) != fp.array_digest(a.reshape(3, 2))
    assert fp.array_digest(a) == fp.array_digest(np.asfortranarray(a))
    assert fp.array_digest(a) == fp.array_digest(a.astype(">f4"))


def test_layers_document_lists_every_array() -> None:
    doc = fp.layers_document(layers())
    assert [entry["name"] for entry in doc["layers"]] == ["conv2d", "dense", "bn"]
    assert doc["layers"][0]["arrays"][0] == {"index": 0, "shape": [3, 3, 1, 4], "dtype": "<f4",
                                             "sha256": fp.array_digest(layers()[0][1][0])}
    assert doc["digest"] == fp.weights_fingerprint(layers())["digest"]


def test_files_fingerprint_ignores_mtimes_and_names_every_file(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"x")
    (tmp_path / "y.txt").write_text("y")
    first = fp.files_fingerprint(tmp_path)
    os.utime(tmp_path / "y.txt", (1, 1))
    assert fp.files_fingerprint(tmp_path) == first
    assert sorted(first["entries"]) == ["a/x.bin", "y.txt"]
    (tmp_path / "y.txt").write_text("z")
    assert fp.files_fingerprint(tmp_path)["digest"] != first["digest"]


def test_batch_digest_is_the_order_of_sample_ids() -> None:
    assert fp.batch_digest([1, 2, 3]) == fp.batch_digest(np.array([1, 2, 3], dtype="int32"))
    assert fp.batch_digest([1, 2, 3]) != fp.batch_digest([3, 2, 1])
    rec = fp.epoch_record(0, [fp.batch_digest([1]), fp.batch_digest([2])])
    assert rec["digest"] != fp.epoch_record(0, [fp.batch_digest([2]), fp.batch_digest([1])])["digest"]


def test_expected_mismatch_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "mnist.npz").write_bytes(b"not really")
    doc = fp.files_fingerprint(tmp_path)
    good = {"name": "mnist", "files": {"mnist.npz": doc["entries"]["mnist.npz"]}}
    assert expected_mismatch(good, doc, str(tmp_path)) is None
    bad = {"name": "mnist", "files": {"mnist.npz": "sha256:" + "0" * 64}}
    problem = expected_mismatch(bad, doc, str(tmp_path))
    assert problem is not None and "mnist.npz" in problem and "sha256:" + "0" * 64 in problem
    missing = {"name": "mnist", "files": {"other.npz": "sha256:" + "0" * 64}}
    assert "lack other.npz" in (expected_mismatch(missing, doc, str(tmp_path)) or "")
    whole = {"name": "mnist", "fingerprint": "sha256:" + "1" * 64}
    assert "fingerprint" in (expected_mismatch(whole, doc, str(tmp_path)) or "")


def test_recorder_checks_arrays_against_the_recipe(tmp_path: Path) -> None:
    from launcher.runtime.record import BadData

    arrays = {"x": np.arange(4), "y": np.zeros(4)}
    digest = fp.arrays_fingerprint(arrays)["digest"]
    Recorder(tmp_path / "ok", {"name": "builtin", "fingerprint": digest}).record_dataset_arrays(arrays)
    with pytest.raises(BadData, match="builtin"):
        Recorder(tmp_path / "bad", {"name": "builtin", "fingerprint": "sha256:" + "2" * 64}) \
            .record_dataset_arrays(arrays)
    assert (tmp_path / "bad" / "fingerprints" / "dataset.json").is_file()  # written, then refused
