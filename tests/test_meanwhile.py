"""launcher.proc.Meanwhile: work on a thread of its own, its value or its error handed back, never outliving
the block that started it."""

from __future__ import annotations

import threading
import time

import pytest

from launcher.proc import Meanwhile


def test_the_value_comes_back_and_the_work_ran_on_another_thread() -> None:
    main = threading.get_ident()
    later = Meanwhile(lambda a, b: (a + b, threading.get_ident()), 2, 3)
    value, ident = later.result()
    assert value == 5 and ident != main


def test_the_error_is_raised_by_result() -> None:
    def fail() -> None:
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        Meanwhile(fail).result()


def test_leaving_the_block_waits_for_the_work_and_keeps_the_blocks_own_error() -> None:
    done: list[str] = []

    def slow() -> None:
        time.sleep(0.2)
        done.append("slow")
        raise RuntimeError("never asked for")

    with pytest.raises(ValueError, match="the block's"):
        with Meanwhile(slow):
            raise ValueError("the block's")
    assert done == ["slow"]  # finished before the block was left
