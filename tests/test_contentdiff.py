"""Content-aware comparison of files written by real libraries on the host (torch, numpy, h5py)
and by hand from their published formats (safetensors, TFRecord), plus CSV and JSON logs."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import need

from launcher.verify.content import compare_files, volatile_field


def _torch() -> object:
    try:
        import torch
    except ImportError:
        need(False, "torch is not installed on this host (dev extra)")
        raise
    return torch


def _checkpoint(torch: object, path: Path, epoch: int = 3, bump: float = 0.0) -> None:
    t = torch  # type: ignore[assignment]
    t.manual_seed(0)  # type: ignore[attr-defined]
    model = t.nn.Sequential(t.nn.Linear(3, 4), t.nn.BatchNorm1d(4), t.nn.Linear(4, 2))  # type: ignore[attr-defined]
    opt = t.optim.Adam(model.parameters())  # type: ignore[attr-defined]
    model(t.randn(5, 3)).sum().backward()  # type: ignore[attr-defined]
    opt.step()
    with t.no_grad():  # type: ignore[attr-defined]
        model[2].weight[1, 0] += bump
    t.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}, path)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_torch_checkpoints_saved_twice_are_identical_in_content(tmp_path: Path) -> None:
    torch = _torch()
    a, b, c, d = (tmp_path / n / "ckpt.pt" for n in "abcd")
    for p in (a, b, c, d):
        p.parent.mkdir()
    _checkpoint(torch, a)
    _checkpoint(torch, b)
    _checkpoint(torch, c, bump=1e-3)
    _checkpoint(torch, d, epoch=4)
    same = compare_files(a, b)
    assert same is not None and same.format == "torch" and same.same
    changed = compare_files(a, c)
    assert changed is not None and not changed.same
    assert changed.first_difference == {"layer": "model.2", "array": "weight"}
    assert "layer model.2 array weight" in (changed.difference or "")
    other = compare_files(a, d)
    assert other is not None and not other.same and other.difference == "epoch: 3 -> 4"


@pytest.mark.slow
def test_torch_state_dict_is_read_without_torch(tmp_path: Path) -> None:
    torch = _torch()
    a, c = tmp_path / "a.pt", tmp_path / "c.pt"
    _checkpoint(torch, a)
    _checkpoint(torch, c, bump=1e-3)
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
            "from pathlib import Path\n"
            "from launcher.verify.content import compare_files\n"
            "from launcher.verify.modeldiff import load_torch\n"
            f"d = compare_files(Path({str(a)!r}), Path({str(c)!r}))\n"
            "print(d.first_difference['layer'], d.first_difference['array'], len(load_torch(Path("
            f"{str(a)!r})).arrays))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # 9 model tensors (batch norm has 5), and Adam's step, exp_avg, exp_avg_sq for each of the 6 parameters
    assert out.split() == ["model.2", "weight", "27"]


def _safetensors(path: Path, tensors: dict[str, np.ndarray], reverse: bool = False) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name in (reversed(list(tensors)) if reverse else tensors):
        arr = tensors[name]
        raw = arr.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_safetensors_parsed_by_hand(tmp_path: Path) -> None:
    w = {"encoder.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "encoder.bias": np.ones(2, np.float32)}
    a, b, c = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c.safetensors"
    _safetensors(a, w)
    _safetensors(b, w, reverse=True)  # other tensor order in the file: other bytes, same content
    changed = dict(w, **{"encoder.bias": np.array([1.0, 1.5], np.float32)})
    _safetensors(c, changed)
    same = compare_files(a, b)
    assert same is not None and same.same and same.volatile
    diff = compare_files(a, c)
    assert diff is not None and not diff.same and diff.first_difference == {"layer": "encoder", "array": "bias"}


def _redate(src: Path, dst: Path, when: tuple[int, int, int, int, int, int]) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            info.date_time = when
            zout.writestr(info, zin.read(info.filename))


def test_npz_and_npy(tmp_path: Path) -> None:
    base = tmp_path / "base.npz"
    np.savez(base, kernel=np.ones((3, 2), np.float32), bias=np.zeros(2, np.float32))
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    _redate(base, a, (2026, 1, 1, 0, 0, 0))
    _redate(base, b, (2026, 1, 2, 0, 0, 0))
    same = compare_files(a, b)
    assert same is not None and same.same and "zip entry dates" in same.volatile
    c = tmp_path / "c.npz"
    np.savez(c, kernel=np.ones((3, 2), np.float32), bias=np.array([0, 1e-7], np.float32))
    diff = compare_files(a, c)
    assert diff is not None and not diff.same and diff.first_difference == {"layer": "bias", "array": "0"}
    np.save(tmp_path / "x.npy", np.arange(4))
    np.save(tmp_path / "y.npy", np.arange(4) * 2)
    npy = compare_files(tmp_path / "x.npy", tmp_path / "y.npy")
    assert npy is not None and not npy.same


def test_hdf5_with_object_times(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")  # a dev extra, installed with launcher[dev]
    paths = [tmp_path / f"{n}.h5" for n in "abc"]
    for i, p in enumerate(paths):
        with h5py.File(p, "w", track_order=True) as f:
            f.attrs["layer_names"] = [b"dense"]
            g = f.create_group("dense")
            g.attrs["weight_names"] = [b"dense/kernel:0"]
            value = np.ones((2, 2), np.float32) + (1e-3 if i == 2 else 0)
            g.create_dataset("dense/kernel:0", data=value, track_times=True)
        if i == 0:
            import time

            time.sleep(1.1)  # HDF5 object times have a one-second resolution
    same = compare_files(paths[0], paths[1])
    assert same is not None and same.same
    assert any("HDF5" in v for v in same.volatile)
    diff = compare_files(paths[0], paths[2])
    assert diff is not None and not diff.same and diff.first_difference == {"layer": "dense", "array": "0"}


def test_csv_and_json_logs(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("epoch,loss,time\n0,0.5,1700000000.1\n1,0.25,1700000001.2\n")
    (tmp_path / "b.csv").write_text("epoch,loss,time\r\n0,0.5,1700000100.3\r\n1,0.25,1700000101.4\r\n")
    (tmp_path / "c.csv").write_text("epoch,loss,time\n0,0.5,1700000000.1\n1,0.26,1700000001.2\n")
    same = compare_files(tmp_path / "a.csv", tmp_path / "b.csv")
    assert same is not None and same.same and same.volatile == ["column time"]
    diff = compare_files(tmp_path / "a.csv", tmp_path / "c.csv")
    assert diff is not None and diff.difference == "row 2 column loss: '0.25' -> '0.26'"
    (tmp_path / "a.json").write_text(json.dumps({"loss": [0.5, 0.25], "saved_at": "10:00"}))
    (tmp_path / "b.json").write_text(json.dumps({"saved_at": "10:05", "loss": [0.5, 0.25]}, indent=2))
    (tmp_path / "c.json").write_text(json.dumps({"loss": [0.5, 0.3], "saved_at": "10:00"}))
    same = compare_files(tmp_path / "a.json", tmp_path / "b.json")
    assert same is not None and same.same and same.volatile == ["field saved_at"]
    diff = compare_files(tmp_path / "a.json", tmp_path / "c.json")
    assert diff is not None and diff.difference == "loss[1]: 0.25 -> 0.3"
    (tmp_path / "a.jsonl").write_text('{"epoch": 0, "loss": 1.0, "time": 1}\n{"epoch": 1, "loss": 0.5, "time": 2}\n')
    (tmp_path / "b.jsonl").write_text('{"epoch": 0, "loss": 1.0, "time": 3}\n{"epoch": 1, "loss": 0.4, "time": 4}\n')
    diff = compare_files(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert diff is not None and diff.difference == "line 2.loss: 0.5 -> 0.4"


def _record(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4  # crcs are not checked


def _event(wall: float, step: int, tag: str, value: float) -> bytes:
    tag_b = tag.encode()
    val = b"\x0a" + bytes([len(tag_b)]) + tag_b + b"\x15" + struct.pack("<f", value)  # tag=1, simple_value=2
    summary = b"\x0a" + bytes([len(val)]) + val
    return b"\x09" + struct.pack("<d", wall) + b"\x10" + bytes([step]) + b"\x2a" + bytes([len(summary)]) + summary


def test_event_files_framing_and_wall_times(tmp_path: Path) -> None:
    a = tmp_path / "events.out.tfevents.1700000000.host-a.11.0.v2"
    b = tmp_path / "events.out.tfevents.1700000099.host-b.12.0.v2"
    c = tmp_path / "events.out.tfevents.1700000199.host-c.13.0.v2"
    a.write_bytes(b"".join(_record(_event(100.0 + s, s, "loss", 1 / (s + 1))) for s in range(3)))
    b.write_bytes(b"".join(_record(_event(200.0 + s, s, "loss", 1 / (s + 1))) for s in range(3)))
    c.write_bytes(b"".join(_record(_event(300.0 + s, s, "loss", 1 / (s + 1) + (s == 1))) for s in range(3)))
    same = compare_files(a, b)
    assert same is not None and same.same and "event wall times" in same.volatile
    diff = compare_files(a, c)
    assert diff is not None and diff.difference == "event 1 (step 1, tag loss) differs"


def test_volatile_field_names() -> None:
    assert all(volatile_field(n) for n in ("time", "date_saved", "epoch_time", "created_at", "Timestamp"))
    assert not any(volatile_field(n) for n in ("loss", "val_accuracy", "epoch", "lr"))


def test_unreadable_file_is_not_compared_with_reason(tmp_path: Path) -> None:
    (tmp_path / "a.keras").write_bytes(b"not a zip")
    (tmp_path / "b.keras").write_bytes(b"not a zip either")
    diff = compare_files(tmp_path / "a.keras", tmp_path / "b.keras")
    assert diff is not None and not diff.same and diff.difference is None  # never a difference in content
    assert "cannot be read as keras" in (diff.unreadable or "") and diff.to_dict()["unreadable"] == diff.unreadable
    assert compare_files(tmp_path / "a.bin", tmp_path / "b.bin") is None
