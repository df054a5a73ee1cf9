"""Progress reporting that the core can call without printing.

The core takes a :class:`Reporter`; the CLI passes one that draws rich progress bars,
tests pass :class:`NullReporter` or :class:`RecordingReporter`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Protocol


class Task(Protocol):
    def advance(self, amount: float = 1) -> None: ...

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None: ...

    def close(self) -> None: ...


class Reporter(Protocol):
    def task(self, description: str, total: float | None = None, unit: str = "") -> Task: ...

    def note(self, message: str) -> None: ...


class _NullTask:
    def advance(self, amount: float = 1) -> None:
        pass

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass


class NullReporter:
    def task(self, description: str, total: float | None = None, unit: str = "") -> Task:
        return _NullTask()

    def note(self, message: str) -> None:
        pass


class RecordingReporter(NullReporter):
    """Keeps the notes and task names, for tests that assert on what was reported."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.tasks: list[str] = []

    def task(self, description: str, total: float | None = None, unit: str = "") -> Task:
        self.tasks.append(description)
        return _NullTask()

    def note(self, message: str) -> None:
        self.notes.append(message)


class CountingReader:
    """A file's read() that reports every block's length, so a stream can drive a progress bar."""

    def __init__(self, raw: IO[bytes], on_bytes: Callable[[int], None]) -> None:
        self.raw, self.on_bytes = raw, on_bytes

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.on_bytes(len(data))
        return data
