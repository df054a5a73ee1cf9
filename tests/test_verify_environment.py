"""The environment diff of two manifests (launcher.verify.environment): a param is an input whatever its name."""

from __future__ import annotations

from pathlib import Path

from runfactory import edit_manifest, pair

from launcher.records.manifest import load_manifest
from launcher.verify.environment import environment_diff


def test_a_param_named_like_a_time_is_still_an_input(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    edit_manifest(b, params={"epochs": 3, "batch_size": 32, "halve_lr_at": 11, "started_at": "x"})
    rows = {r["key"]: r["category"] for r in environment_diff(load_manifest(a), load_manifest(b))}
    assert rows == {"params.halve_lr_at": "params", "params.started_at": "params"}
