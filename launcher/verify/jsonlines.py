"""A run's JSON records (metrics.jsonl, fingerprints/*.json and *.jsonl) read for comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.errors import Corrupt


def read_jsonl(path: Path) -> list[dict[str, Any]] | None:
    """The file's JSON-object lines (other lines left out); None without the file. The rows are any
    JSON objects here: each caller checks and types its own (StepRow, EpochBatches, MetricsLine)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise Corrupt(f"{path}: line {n} is not valid JSON ({exc.msg})",
                          "re-pull the run (`launcher pull RUN`)") from exc
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_json(path: Path) -> Any:  # any JSON document; the callers check its shape
    """The file's JSON document; None without the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Corrupt(f"{path} is not valid JSON ({exc})", "re-pull the run (`launcher pull RUN`)") from exc
