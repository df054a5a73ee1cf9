"""Splits of a recipe's arrays ({"x_train", "y_train", "x_test", ...})."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def first(arrays: Mapping[str, np.ndarray], split: str, n: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of split ("train", "test", "val"): its first n samples, or all of them when n is 0."""
    x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
    return (x[:n], y[:n]) if n else (x, y)
