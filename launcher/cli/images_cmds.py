"""Commands registered on the root app (filled in per capability)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
