"""Answers kept for the length of one operation, so that its steps need not ask the same thing twice.

A run's preparation asks git for the work tree of the project folder at several steps, and the local
engine for the image's JSON to check that it is there and again to ship it: each a process, tens of
milliseconds before the container starts. Inside a ``with memo.kept():`` block (a run's preparation,
:func:`launcher.runs.lifecycle.run_recipe`) such an answer is asked once; outside one, every time.
Only answers that nothing but launcher itself changes while the block runs are kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TypeVar, cast

T = TypeVar("T")

_lock = threading.Lock()
_kept: dict[Hashable, object] | None = None  # None: no block open


@contextmanager
def kept() -> Iterator[None]:
    """Keep answers until the block ends (a block inside another keeps them until the outer one ends)."""
    global _kept
    with _lock:
        outer = _kept is not None
        if not outer:
            _kept = {}
    try:
        yield
    finally:
        if not outer:
            with _lock:
                _kept = None


def active() -> bool:
    return _kept is not None


def remembered(key: Hashable, ask: Callable[[], T]) -> T:
    """ask()'s answer, asked once per key in the open block (every time outside one)."""
    store = _kept
    if store is None:
        return ask()
    with _lock:
        if key in store:
            return cast(T, store[key])  # what ask() answered under this key
    answer = ask()
    with _lock:
        store[key] = answer
    return answer


def keep(key: Hashable, answer: object) -> None:
    """Keep answer for one take(key) in the open block (nothing outside one)."""
    store = _kept
    if store is not None:
        with _lock:
            store[key] = answer


def take(key: Hashable) -> object | None:
    """What keep(key, ...) kept, handed over once (a later take asks afresh); None if nothing is."""
    store = _kept
    if store is None:
        return None
    with _lock:
        return store.pop(key, None)
