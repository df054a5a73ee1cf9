"""The records verify declares (launcher.verify.*: TypedDicts) describe the JSON it writes: every key
declared, every required key there, every value of its declared type, through the whole document."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, NotRequired, Union, get_args, get_origin, get_type_hints, is_typeddict

import numpy as np
import pytest
from runfactory import flip_bit, make_workspace, pair

from launcher.verify.impact import ProbeImpact, Tolerances, probe_impact
from launcher.verify.opdiff import OPS, OpDifference, compare_traces
from launcher.verify.verdicts import VerdictRecord, verify_checksums
from launcher.workspace import Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.at(make_workspace(tmp_path / "ws"), tmp_path / "cache")


def conforms(value: Any, tp: Any, where: str = "$") -> list[str]:
    """Where ``value`` departs from the type ``tp`` (a TypedDict, list, dict, union, scalar); [] when nowhere."""
    if tp is Any or tp is object:
        return []
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        arms = [arm for arm in get_args(tp) if (arm is type(None)) == (value is None)] or list(get_args(tp))
        if len(arms) == 1:  # X | None: say where in X
            return conforms(value, arms[0], where)
        found = [conforms(value, arm, where) for arm in arms]
        return [] if any(not f for f in found) else [f"{where}: {value!r} is none of {tp}"]
    if tp is type(None):
        return [] if value is None else [f"{where}: {value!r} is not None"]
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__} is not a {tp.__name__}"]
        hints = get_type_hints(tp, include_extras=True)
        out = [f"{where}: key {k!r} is not declared in {tp.__name__}" for k in value if k not in hints]
        for key, hint in hints.items():
            optional = get_origin(hint) is NotRequired
            if key not in value:
                if not optional and tp.__total__:
                    out.append(f"{where}: {tp.__name__} lacks {key!r}")
                continue
            out += conforms(value[key], get_args(hint)[0] if optional else hint, f"{where}.{key}")
        return out
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not a list"]
        return [e for i, v in enumerate(value) for e in conforms(v, get_args(tp)[0], f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not a dict"]
        return [e for k, v in value.items() for e in conforms(v, get_args(tp)[1], f"{where}[{k!r}]")]
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    return [] if ok else [f"{where}: {value!r} is not {tp}"]


def test_conforms_finds_departures() -> None:
    class Rec(typing.TypedDict):
        a: int
        b: NotRequired[list[str] | None]

    assert conforms({"a": 1}, Rec) == [] and conforms({"a": 1, "b": ["x"]}, Rec) == []
    assert conforms({"a": "1", "b": [2], "c": 0}, Rec) == [
        "$: key 'c' is not declared in Rec", "$.a: '1' is not <class 'int'>", "$.b[0]: 2 is not <class 'str'>"]
    assert conforms({}, Rec) == ["$: Rec lacks 'a'"]


def test_the_verdict_of_identical_runs_is_its_record(ws: Workspace) -> None:
    pair(ws.runs)
    assert conforms(verify_checksums(ws).to_dict(), VerdictRecord) == []


def test_the_verdict_with_explanations_is_its_record(ws: Workspace) -> None:
    _, b = pair(ws.runs, seed=43)
    flip_bit(b, "dense", 1, element=3, bit=0, retrain=True)
    data = verify_checksums(ws).to_dict()
    assert data["explanations"], "a run differs, so it is explained"
    assert conforms(data, VerdictRecord) == []


def test_the_verdict_of_one_run_alone_is_its_record(ws: Workspace) -> None:
    a, _ = pair(ws.runs)
    report = verify_checksums(ws, [a.name])
    assert report.mode == "alone"
    assert conforms(report.to_dict(), VerdictRecord) == []


def _probes(probs: list[list[float]], maps: np.ndarray) -> dict[str, np.ndarray]:
    p = np.asarray(probs, dtype=np.float32)
    return {"indices": np.arange(len(p)) * 2, "probabilities": p, "predicted": p.argmax(axis=1),
            "labels": np.array([0, 1, 0][:len(p)]), "heatmaps": maps.astype(np.float32)}


def test_a_probe_impact_is_its_record() -> None:
    maps = np.random.default_rng(0).random((3, 4, 4))
    ref = _probes([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]], maps)
    run = _probes([[0.1, 0.9], [0.2, 0.8], [0.6, 0.4]], maps[::-1])
    other_probes = {**run, "indices": ref["indices"] + 1}
    for impact in (probe_impact(ref, run), probe_impact(ref, dict(ref)), probe_impact(ref, other_probes),
                   probe_impact(ref, run, Tolerances(heatmap=1.0))):
        assert conforms(impact, ProbeImpact) == [], impact


def _trace(out: Path, digests: list[str]) -> Path:
    (out / OPS).parent.mkdir(parents=True)
    names = ["fc1", "fc1", "fc1.weight"]
    rows = [{"step": 3, "order": i, "kind": kind, "name": name, "digest": d, "shape": [2], "dtype": "<f4"}
            for i, (kind, name, d) in enumerate(zip(("input", "output", "grad"), names, digests, strict=True))]
    (out / OPS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_an_op_trace_diff_is_its_record(tmp_path: Path) -> None:
    a = _trace(tmp_path / "a", ["i", "o", "g"])
    for name, digests in (("same", ["i", "o", "g"]), ("output", ["i", "x", "g"]), ("grad", ["i", "o", "x"])):
        d = compare_traces(a, _trace(tmp_path / name, digests))
        assert d["found"] is (name != "same") and conforms(d, OpDifference) == [], d
