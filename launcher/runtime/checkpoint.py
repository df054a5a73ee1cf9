"""Checkpoints at epoch ends, and resuming from the latest one bit for bit.

``launcher run --checkpoint-every N`` sets ``LAUNCHER_CHECKPOINT_EVERY=N``: after every N-th epoch
the runtime writes ``checkpoints/epoch-NNNN/`` under the outputs folder (NNNN: the epochs done),
then points ``checkpoints/latest.json`` at it and deletes the older one (``LAUNCHER_CHECKPOINT_KEEP=all``,
``launcher run --keep-checkpoints``, keeps every one: `launcher diverge` starts a re-execution from
one). A checkpoint holds:

- ``state.json``: the last epoch done, the optimizer step, the framework, and the size of each file
  the run appends to (metrics, batch and step fingerprints) at that point;
- ``rng.json``: Python's and NumPy's global random states;
- the framework's part: Keras (``keras.npz``): every variable of the model (weights and the
  dropout seed generators' states) and of the optimizer (its step and slots), and Keras' global
  seed generator where one exists; PyTorch (``torch.pt``): the model's and optimizer's state
  dicts, torch's CPU (and CUDA) random states and the DataLoader generator's state.

It is written under a temporary name and renamed, so a run killed while writing leaves the previous
checkpoint whole. ``LAUNCHER_RESUME=1`` (``launcher resume RUN``) starts the same command on the same
outputs folder: the runtime cuts the appended files back to their size at the checkpoint and the
framework part restores the state before the next epoch begins (Keras: fit() starts at the next
epoch; PyTorch: :func:`launcher.runtime.api.resume_point`). What cannot be resumed bitwise is
refused before training begins (:class:`NotResumable`).

A run of several processes checkpoints every rank in its own folder (launcher.runtime.distributed.rank_out) and
keeps the previous checkpoint beside the latest: a rank stopped while the others wrote their next one can lag them
by one checkpoint at most (the next step's collective waits for it), so the newest checkpoint every rank holds is
always there. ``launcher resume`` names it (``LAUNCHER_RESUME_FROM``) and every rank starts from that one.

Nothing in a checkpoint carries a time, so an interrupted and an uninterrupted run write the same
bytes.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from launcher.runtime import fingerprints as fp
from launcher.runtime.outfiles import BATCHES, EXIT_JSON, METRICS, STEPS

if TYPE_CHECKING:
    from launcher.runtime.records import CheckpointFile, CheckpointState, RngState

Resume = tuple[Path, "CheckpointState"]  # a checkpoint's folder and its state.json

ENV_EVERY = "LAUNCHER_CHECKPOINT_EVERY"
ENV_KEEP = "LAUNCHER_CHECKPOINT_KEEP"  # all: every checkpoint kept (launcher diverge starts from one); else the latest
ENV_RESUME = "LAUNCHER_RESUME"
ENV_RESUME_FROM = "LAUNCHER_RESUME_FROM"  # the checkpoint to resume from (every rank's); else the latest
DIR = "checkpoints"
LATEST = f"{DIR}/latest.json"
STATE = "state.json"
RNG = "rng.json"
# the files a run appends to while it trains: cut back to their size at the checkpoint on resume
APPENDED = (METRICS, BATCHES, STEPS)
# what a run writes once training is over: removed on resume, written again at the end
FINAL = ("model", "weights", EXIT_JSON)
NAME = re.compile(r"epoch-\d{4,}")  # a checkpoint's folder name (checkpoint_name)


class NotResumable(Exception):
    """Checkpoints were asked for, but this training cannot be resumed bit for bit; the message says why."""


def parse_every(text: str | None) -> int | None:
    """``N`` (at least 1) -> N; nothing -> None. Raises ValueError for anything else."""
    if text is None or not text.strip():
        return None
    n = int(text)
    if n < 1:
        raise ValueError(f"{text!r} is not an epoch count of at least 1")
    return n


def checkpoint_name(epochs_done: int) -> str:
    return f"epoch-{epochs_done:04d}"


def read_latest(out: Path) -> Resume | None:
    """The latest checkpoint's folder and state, or None when there is none."""
    try:
        name = json.loads((out / LATEST).read_text())["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return read_named(out, name) if isinstance(name, str) else None


def checkpoint_names(out: Path) -> list[str]:
    """The complete checkpoints in out (a folder with its state.json; not one being written), oldest first."""
    try:
        found = [p.name for p in (out / DIR).iterdir() if NAME.fullmatch(p.name) and (p / STATE).is_file()]
    except OSError:
        return []
    return sorted(found)


def read_named(out: Path, name: str) -> Resume | None:
    """The checkpoint called name (as checkpoint_name makes them) and its state, or None."""
    if not NAME.fullmatch(name):
        return None
    folder = out / DIR / name
    try:
        state = json.loads((folder / STATE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not all(isinstance(state.get(k), int) for k in ("epoch", "next_epoch", "step")):
        return None
    return folder, cast("CheckpointState", state)


def prepare_resume(out: Path, name: str | None = None, also: tuple[str, ...] = ()) -> Resume:
    """Put the outputs folder back as it was at checkpoint name (else the latest): the appended files cut back
    to their size then, what the run writes at its end removed (and each path in also), a later checkpoint
    removed and the latest pointer at this one. Raises NotResumable."""
    if name is None:
        found = read_latest(out)
        if found is None:
            raise NotResumable(f"{out} has no checkpoint ({LATEST}): the run stopped before its first one")
    else:
        found = read_named(out, name)
        if found is None:
            raise NotResumable(f"{out} has no checkpoint {name!r} ({DIR}/): the run stopped before it")
    folder, state = found
    exit_json = out / EXIT_JSON
    if exit_json.is_file():
        try:
            if json.loads(exit_json.read_text()).get("exit_code") == 0:
                raise NotResumable(f"the run in {out} finished (exit code 0): there is nothing to resume")
        except ValueError:
            pass
    sizes = state.get("files") or {}
    for rel in APPENDED:
        path = out / rel
        size = sizes.get(rel)
        if size is None:
            path.unlink(missing_ok=True)  # written only after the checkpoint
            continue
        if not path.is_file() or path.stat().st_size < int(size):
            raise NotResumable(f"{rel} is shorter than at checkpoint {folder.name}: the outputs were changed")
        with open(path, "r+b") as f:
            f.truncate(int(size))
    clear_final(out, also)
    for later in checkpoint_names(out):
        if later > folder.name:  # written by a rank that went on while another stopped: written again
            _rmtree(out / DIR / later)
    if name is not None:
        pointer: CheckpointFile = {"name": folder.name}
        fp.write_atomic(out / LATEST, (json.dumps(pointer, sort_keys=True) + "\n").encode())
    return folder, state


def clear_final(out: Path, also: tuple[str, ...] = ()) -> None:
    """What a run writes once training is over, removed from out (and each path in also)."""
    for rel in (*FINAL, *also):
        path = out / rel
        if path.is_dir():
            _rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _rmtree(path: Path, ignore_errors: bool = False) -> None:
    import shutil  # here: shutil imports bz2 and lzma, paid before the recipe's first line at module level

    shutil.rmtree(path, ignore_errors=ignore_errors)


def python_numpy_state() -> RngState:
    version, internal, gauss = random.getstate()
    doc: RngState = {"python": [version, list(internal), gauss]}
    try:
        import numpy as np
    except ImportError:
        return doc
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    doc["numpy"] = [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return doc


def restore_python_numpy(doc: RngState) -> None:
    version, internal, gauss = doc["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in doc:
        import numpy as np

        kind, keys, pos, has_gauss, cached = doc["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


class Checkpoints:
    """The run's checkpoints: whether to write one after an epoch, writing it, and the one resumed from."""

    def __init__(self, out: Path, every: int | None, resume: bool, keep_all: bool = False,
                 keep_previous: bool = False) -> None:
        self.out = out
        self.every = every
        self.resume = resume
        self.keep_all = keep_all
        self.keep_previous = keep_previous  # one rank of several: the checkpoint before the latest kept too
        self.engaged = False  # a framework's checkpointing was set up (fit() on Keras, the api on PyTorch)
        self.restored: CheckpointState | None = None  # the state resumed from, once restored
        self._resume_from: Resume | None = None

    @classmethod
    def from_env(cls, out: Path) -> Checkpoints:
        try:
            every = parse_every(os.environ.get(ENV_EVERY))
        except ValueError:
            every = None  # checked on the host
        from launcher.runtime.distributed import ENV as DISTRIBUTED

        return cls(out, every, os.environ.get(ENV_RESUME) == "1", os.environ.get(ENV_KEEP) == "all",
                   keep_previous=bool(os.environ.get(DISTRIBUTED)))

    @property
    def active(self) -> bool:
        return self.every is not None or self.resume

    def resume_from(self) -> Resume | None:
        """The checkpoint to restore (the runner has put the outputs back to it), or None when not resuming."""
        if not self.resume:
            return None
        if self._resume_from is None:
            name = os.environ.get(ENV_RESUME_FROM)
            found = read_named(self.out, name) if name else read_latest(self.out)
            if found is None:
                raise NotResumable(f"LAUNCHER_RESUME=1 but {self.out} has no checkpoint ({name or LATEST})")
            self._resume_from = found
        return self._resume_from

    def due(self, epoch: int) -> bool:
        """Whether a checkpoint follows epoch (0-based, as Keras numbers them)."""
        return self.every is not None and (epoch + 1) % self.every == 0

    def write(self, epoch: int, step: int, framework: str, save: Callable[[Path], None],
              trace_epoch: int | None = None) -> Path:
        """The checkpoint after epoch (0-based): save(folder) writes the framework's part; trace_epoch: the step
        trace's next epoch-boundary number, where the loop does not number its epochs itself."""
        root = self.out / DIR
        name = checkpoint_name(epoch + 1)
        tmp = root / f".{name}.partial"
        if tmp.exists():
            _rmtree(tmp)
        tmp.mkdir(parents=True)
        save(tmp)
        fp.write_json(tmp / RNG, python_numpy_state())
        sizes = {rel: (self.out / rel).stat().st_size for rel in APPENDED if (self.out / rel).is_file()}
        state: CheckpointState = {"epoch": epoch, "next_epoch": epoch + 1, "step": step, "framework": framework,
                                  "files": sizes}
        if trace_epoch is not None:
            state["trace_epoch"] = trace_epoch
        fp.write_json(tmp / STATE, state)
        final = root / name
        if final.exists():
            _rmtree(final)
        previous = [n for n in checkpoint_names(self.out) if n < name][-1:] if self.keep_previous else []
        os.replace(tmp, final)
        pointer: CheckpointFile = {"name": name}
        fp.write_atomic(self.out / LATEST, (json.dumps(pointer, sort_keys=True) + "\n").encode())
        kept = {name, *previous}
        for old in root.iterdir():
            if old.is_dir() and old.name not in kept and not (self.keep_all and not old.name.startswith(".")):
                _rmtree(old, ignore_errors=True)
        return final
