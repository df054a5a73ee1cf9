"""The progress bars a command shows on stderr (cli.common.RichReporter): rich's Progress, imported only
by a command that shows one, since rich.progress costs its import even to a run that never does."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.filesize import decimal
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.progress import Task as RichTask
from rich.text import Text


def progress(console: Console) -> Progress:
    """A reporter's bars: spinner, description, bar, amount and time elapsed."""
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=30), _AmountColumn(),
                    TimeElapsedColumn(), console=console, transient=False)


class _AmountColumn(ProgressColumn):
    """Bytes and speed for byte-counted tasks, M/N for counted ones, nothing when unknown."""

    def render(self, task: RichTask) -> Text:
        unit = task.fields.get("unit", "")
        if unit == "B":
            total = decimal(int(task.total)) if task.total else "?"
            speed = f" {decimal(int(task.speed))}/s" if task.speed else ""
            return Text(f"{decimal(int(task.completed))}/{total}{speed}", style="progress.download")
        if task.total:
            return Text(f"{int(task.completed)}/{int(task.total)}{(' ' + unit) if unit else ''}",
                        style="progress.download")
        return Text("")


class BarTask:
    """A reporter's Task shown as one bar of a rich Progress."""

    def __init__(self, progress: Progress, task_id: Any) -> None:
        self._p, self._id = progress, task_id

    def advance(self, amount: float = 1) -> None:
        self._p.advance(self._id, amount)

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        self._p.update(self._id, completed=completed, total=total, description=description)  # None: unchanged

    def close(self) -> None:
        task = self._p.tasks[self._p.task_ids.index(self._id)]
        if task.total is not None:
            self._p.update(self._id, completed=task.total)
        self._p.stop_task(self._id)
