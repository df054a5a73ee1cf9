"""The recipe's interpreter: `python -m launcher.runtime.child ENTRY [ARGS...]`.

Applies the determinism profile and the recording hooks (:mod:`launcher.runtime.hooks`)
before a line of the recipe runs, then runs the entry as ``__main__``.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from launcher.runtime import distributed, hooks
from launcher.runtime.checkpoint import NotResumable
from launcher.runtime.record import (
    EXIT_BAD_DATA,
    EXIT_BAD_RECIPE,
    EXIT_NOT_RESUMABLE,
    BadData,
    BadRecipe,
    recorder,
)


def main(argv: list[str]) -> int:
    rank = distributed.this_rank()
    if rank is None:
        return run(argv)
    distributed.enter_rank(rank)  # before the hooks: its records go to its own folder
    code = 1
    try:
        code = run(argv)
        if rank == 0 and os.environ.get("LAUNCHER_REDUCTION") == "canonical" and \
                "launcher.runtime.reduction" not in sys.modules:
            print("launcher: --reduction canonical had no effect: the script did not step through "
                  "launcher.runtime.api.micro_batches, so DDP's own all-reduce summed its gradients", flush=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        distributed.leave_rank(rank, code)
    return code


def run(argv: list[str]) -> int:
    entry = Path(argv[0]).resolve()
    hooks.install()
    sys.argv = [str(entry), *argv[1:]]
    sys.path.insert(0, str(entry.parent))
    try:
        try:
            runpy.run_path(str(entry), run_name="__main__")
        finally:
            _last_step()
    except BadData as exc:
        print(f"launcher: bad data: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_DATA
    except BadRecipe as exc:
        print(f"launcher: bad recipe: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_RECIPE
    except NotResumable as exc:
        print(f"launcher: cannot checkpoint or resume bit for bit: {exc}", file=sys.stderr, flush=True)
        return EXIT_NOT_RESUMABLE
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr, flush=True)
        return 1
    return 0


def _last_step() -> None:
    """The weights where the script stopped, if it trained with torch since the last fingerprint."""
    try:
        recorder().steps_boundary()
    except Exception as exc:  # a record must not turn a finished run into a failed one
        print(f"launcher: the last step fingerprint was not written: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
