from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from launcher.errors import Corrupt
from launcher.runtime.fingerprints import canonical_npz_bytes
from launcher.verify.modeldiff import (
    DIFFERS,
    IDENTICAL,
    MISSING,
    SHAPE,
    diff_arrays,
    diff_models,
    diff_weights,
    load_canonical,
    load_weights,
)


def _layers(seed: int = 0) -> list[tuple[str, list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    return [("conv", [rng.standard_normal((3, 3, 1, 8)).astype(np.float32), np.zeros(8, np.float32)]),
            ("dense", [rng.standard_normal((72, 10)).astype(np.float32),
                       rng.standard_normal(10).astype(np.float32)])]


def test_canonical_bytes_are_stable_and_round_trip(tmp_path: Path) -> None:
    a, b = canonical_npz_bytes(_layers()), canonical_npz_bytes(_layers())
    assert a == b
    with zipfile.ZipFile(io.BytesIO(a)) as zf:
        names = zf.namelist()
        assert names == sorted(names)
        assert names == ["000.conv/0.npy", "000.conv/1.npy", "001.dense/0.npy", "001.dense/1.npy"]
        assert all(i.compress_type == zipfile.ZIP_STORED and i.date_time == (1980, 1, 1, 0, 0, 0)
                   for i in zf.infolist())
    p = tmp_path / "canonical.npz"
    p.write_bytes(a)
    w = load_canonical(p)
    assert [(x.layer, x.array) for x in w] == [("conv", "0"), ("conv", "1"), ("dense", "0"), ("dense", "1")]
    np.testing.assert_array_equal(w.arrays[2].value, _layers()[1][1][0])


def test_more_than_ten_arrays_keep_model_order(tmp_path: Path) -> None:
    layers = [("block", [np.full(2, i, np.float32) for i in range(12)])]
    p = tmp_path / "c.npz"
    p.write_bytes(canonical_npz_bytes(layers))
    assert [x.array for x in load_canonical(p)] == [str(i) for i in range(12)]


def test_one_flipped_bit_is_found_and_named() -> None:
    a = np.linspace(-1, 1, 1000, dtype=np.float32)
    b = a.copy()
    b.view(np.uint32)[417] ^= 1  # the lowest mantissa bit
    d = diff_arrays("dense", "0", a, b)
    assert d.status == DIFFERS and d.differing == 1 and d.total == 1000
    assert 0 < d.max_abs_diff < 1e-6 and 0 < d.max_rel_diff < 1e-6


def test_bitwise_not_numeric_equality() -> None:
    a = np.array([0.0, np.nan], np.float32)
    b = np.array([-0.0, np.nan], np.float32)
    d = diff_arrays("l", "0", a, b)
    assert d.status == DIFFERS and d.differing == 1 and d.max_abs_diff == 0.0
    assert diff_arrays("l", "0", a, a.copy()).status == IDENTICAL


def test_shape_and_missing_arrays() -> None:
    assert diff_arrays("l", "0", np.zeros(3), np.zeros(4)).status == SHAPE
    assert diff_arrays("l", "0", np.zeros(3, np.float32), np.zeros(3, np.float64)).status == SHAPE


def test_diff_weights_names_the_first_differing_layer(tmp_path: Path) -> None:
    ref, other = _layers(), _layers()
    other[1][1][1] = other[1][1][1] + np.float32(0.5)
    pa, pb = tmp_path / "a.npz", tmp_path / "b.npz"
    pa.write_bytes(canonical_npz_bytes(ref))
    pb.write_bytes(canonical_npz_bytes([*other, ("extra", [np.zeros(1, np.float32)])]))
    d = diff_models(pa, pb)
    assert not d.identical
    assert d.first_difference is not None
    assert (d.first_difference.layer, d.first_difference.array) == ("dense", "1")
    statuses = [(a.layer, a.array, a.status) for a in d.arrays]
    assert statuses[-1] == ("extra", "0", MISSING)
    out = d.to_dict()
    assert out["first_difference"] == {"layer": "dense", "array": "1"}
    assert out["arrays_differing"] == 2 and out["elements_differing"] == 10 + 1
    assert abs(out["arrays"][3]["max_abs_diff"] - 0.5) < 1e-6


def test_damaged_canonical_file_is_corrupt(tmp_path: Path) -> None:
    p = tmp_path / "c.npz"
    p.write_bytes(b"not a zip")
    with pytest.raises(Corrupt):
        load_canonical(p)
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("weights.npy", b"x")
    with pytest.raises(Corrupt):
        load_canonical(p)


def test_keras_h5_and_keras_archive(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py", reason="h5py is an optional dependency (launcher[report])")
    p = tmp_path / "model.weights.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("layers/conv/vars/0", data=np.ones((2, 2), np.float32))
        f.create_dataset("layers/conv/vars/1", data=np.zeros(2, np.float32))
        f.create_dataset("layers/dense/vars/0", data=np.ones(3, np.float32))
        f.create_dataset("layers/functional/layers/dense_2/vars/0", data=np.ones(1, np.float32))
    w = load_weights(p)
    assert [(x.layer, x.array) for x in w] == [("conv", "0"), ("conv", "1"), ("dense", "0"),
                                               ("functional/dense_2", "0")]
    k = tmp_path / "model.keras"
    with zipfile.ZipFile(k, "w") as zf:
        zf.writestr("config.json", "{}")
        zf.write(p, "model.weights.h5")
    q = tmp_path / "other.weights.h5"
    with h5py.File(q, "w") as f:
        f.create_dataset("layers/conv/vars/0", data=np.ones((2, 2), np.float32))
        f.create_dataset("layers/conv/vars/1", data=np.zeros(2, np.float32))
        f.create_dataset("layers/dense/vars/0", data=np.array([1, 1, 2], np.float32))
        f.create_dataset("layers/functional/layers/dense_2/vars/0", data=np.ones(1, np.float32))
    d = diff_weights(load_weights(k), load_weights(q))
    assert d.first_difference is not None
    first = d.first_difference
    assert (first.layer, first.array, first.differing) == ("dense", "0", 1)


def test_keras2_h5_follows_layer_order_attributes(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py", reason="h5py is an optional dependency (launcher[report])")

    def save(path: Path, bias: float) -> None:
        with h5py.File(path, "w") as f:
            g = f.create_group("model_weights")
            g.attrs["layer_names"] = [b"input_1", b"conv2d_1", b"dense_1"]
            g.create_group("input_1").attrs["weight_names"] = []
            conv = g.create_group("conv2d_1")
            conv.attrs["weight_names"] = [b"conv2d_1/kernel:0", b"conv2d_1/bias:0"]
            conv.create_dataset("conv2d_1/kernel:0", data=np.ones((3, 3, 1, 2), np.float32))
            conv.create_dataset("conv2d_1/bias:0", data=np.full(2, bias, np.float32))
            dense = g.create_group("dense_1")
            dense.attrs["weight_names"] = [b"dense_1/kernel:0"]
            dense.create_dataset("dense_1/kernel:0", data=np.ones((2, 2), np.float32))
            f.create_dataset("optimizer_weights/iterations:0", data=np.int64(7))

    save(tmp_path / "a.h5", 0.0)
    save(tmp_path / "b.h5", 0.5)
    w = load_weights(tmp_path / "a.h5")
    assert [(x.layer, x.array) for x in w] == [("conv2d_1", "0"), ("conv2d_1", "1"), ("dense_1", "0")]
    d = diff_models(tmp_path / "a.h5", tmp_path / "b.h5")
    assert d.first_difference is not None
    assert (d.first_difference.layer, d.first_difference.array) == ("conv2d_1", "1")


@pytest.mark.slow
def test_torch_state_dict(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is optional; install it to test .pt state dicts")
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    torch.save(m.state_dict(), tmp_path / "a.pt")
    with torch.no_grad():
        m[1].bias[0] += 1
    torch.save(m.state_dict(), tmp_path / "b.pt")
    d = diff_models(tmp_path / "a.pt", tmp_path / "b.pt")
    assert d.first_difference is not None
    assert (d.first_difference.layer, d.first_difference.array) == ("1", "bias")


def test_25m_parameters_many_differing(tmp_path: Path) -> None:
    """Many differing elements over many slices (the slow path; its time: benchmarks/verify.py)."""
    rng = np.random.default_rng(0)
    big = [("dense", [rng.standard_normal((5000, 5000)).astype(np.float32)]),
           ("out", [rng.standard_normal(1000).astype(np.float32)])]
    pa, pb = tmp_path / "a.npz", tmp_path / "b.npz"
    pa.write_bytes(canonical_npz_bytes(big))
    big[0][1][0][::7] += np.float32(1e-3)  # rows 0, 7, 14...: 715 of the 5000 rows differ, all of each
    pb.write_bytes(canonical_npz_bytes(big))
    d = diff_models(pa, pb)
    assert d.first_difference is not None and d.first_difference.layer == "dense"
    assert d.arrays[0].differing == 715 * 5000 and d.arrays[1].status == "identical"
