"""What a run writes for a later comparison, under the outputs folder.

One :class:`Recorder` per process, configured from the environment the runner gives the child
(``LAUNCHER_OUT``, ``LAUNCHER_DATASET``, ``LAUNCHER_SEED``, ...).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat, cast

from launcher.runtime import checkpoint
from launcher.runtime import fingerprints as fp
from launcher.runtime.outfiles import (
    ARRAYS_JSON,
    BATCHES,
    CANONICAL_MODEL,
    DATASET_JSON,
    INITIAL_WEIGHTS,
    LAYERS_JSON,
    METRICS,
    STEPS,
)

if TYPE_CHECKING:
    from launcher.runtime import optrace, steps
    from launcher.runtime.records import (
        ArraysFingerprint,
        CheckpointState,
        DataFingerprint,
        DatasetRecord,
        EpochBatches,
        MetricsLine,
        NamedArrays,
        ProbeConfig,
    )

# Exit codes the runtime uses for its own failures; they mirror launcher.errors.ExitCode,
# which is not copied into images.
EXIT_USAGE = 2
EXIT_BAD_DATA = 17
EXIT_BAD_RECIPE = 18
EXIT_NOT_RESUMABLE = 45


class BadData(Exception):
    """The data is not what the recipe reads or expects; the message names the file."""


class BadRecipe(Exception):
    """recipe.toml declares something the recipe's model or data cannot give; the message names the key."""


class Recorder:
    def __init__(self, out: Path, expected: DatasetRecord | None = None, seed: int | None = None,
                 probes: ProbeConfig | None = None) -> None:
        self.out = out
        self.expected = expected
        self.seed = seed
        self.probes = probes  # recipe.toml's [probes] (launcher.runtime.probes), or None
        self.fits = 0
        self.initial_recorded = False
        self.metric_epochs = 0
        self._trace: steps.StepTrace | None = None
        self.torch_steps: steps.TorchSteps | None = None  # set when the code imports torch
        self._pytree_steps: steps.PytreeSteps | None = None  # a loop reporting its steps (api.record_step)
        self._optrace_read = False
        self._optrace: optrace.OpTrace | None = None
        self._checkpoints: checkpoint.Checkpoints | None = None

    @classmethod
    def from_env(cls) -> Recorder:
        out = Path(os.environ.get("LAUNCHER_OUT", "out"))
        raw = os.environ.get("LAUNCHER_DATASET")
        seed = os.environ.get("LAUNCHER_SEED")
        probes = os.environ.get("LAUNCHER_PROBES")
        # both written by the runner from the checked recipe (DatasetSpec.as_dict, ProbeSpec.as_dict)
        return cls(out, cast("DatasetRecord", json.loads(raw)) if raw else None, int(seed) if seed else None,
                   cast("ProbeConfig", json.loads(probes)) if probes else None)

    def path(self, rel: str) -> Path:
        return self.out / rel

    @property
    def trace(self) -> steps.StepTrace:
        """The run's step fingerprints (launcher.runtime.steps), set by LAUNCHER_TRACE_EVERY."""
        if self._trace is None:
            from launcher.runtime import steps  # on first use: a run that records no steps does not import it

            self._trace = steps.from_env(self.path(STEPS))
        return self._trace

    @property
    def optrace(self) -> optrace.OpTrace | None:
        """The operation trace of a `launcher diverge` re-execution (LAUNCHER_OPTRACE), else None."""
        if not self._optrace_read:
            from launcher.runtime import optrace as trace  # on first use, as steps

            self._optrace, self._optrace_read = trace.from_env(self.out), True
        return self._optrace

    @property
    def checkpoints(self) -> checkpoint.Checkpoints:
        """The run's checkpoints (launcher.runtime.checkpoint), set by LAUNCHER_CHECKPOINT_EVERY and LAUNCHER_RESUME."""
        if self._checkpoints is None:
            self._checkpoints = checkpoint.Checkpoints.from_env(self.out)
            if self._checkpoints.resume and self.path(INITIAL_WEIGHTS).is_file():
                self.initial_recorded = True  # the first segment recorded the weights before training
        return self._checkpoints

    def resumed_at(self, state: CheckpointState) -> None:
        """Training goes on from a checkpoint: the step trace continues at its step and epoch."""
        trace = self.trace
        trace.step = trace.last = int(state["step"])
        trace.epoch = int(state.get("trace_epoch", state["next_epoch"]))
        self.checkpoints.restored = state

    def steps_boundary(self, epoch: int | None = None) -> None:
        """An epoch of a PyTorch or JAX loop ended (or the script did): a step fingerprint if it moved."""
        if self._pytree_steps is not None:
            self._pytree_steps.boundary(epoch)
        elif self.torch_steps is not None:
            self.torch_steps.boundary(epoch)

    def record_step(self, params: Any, loss: Any, layers: Callable[[Any], fp.Layers],
                    leaves: Callable[[Any], list[tuple[str, str, Any]]]) -> None:
        """A loop's optimizer update, reported by the loop (api.record_step): params after it, read by
        layers and leaves (launcher.runtime.frameworks.fw_jax's)."""
        if self._pytree_steps is None:
            from launcher.runtime import steps

            self.refuse_unresumable()
            self._pytree_steps = steps.PytreeSteps(self.trace, layers, leaves, self.optrace)
        self._pytree_steps.stepped(params, loss)

    def refuse_unresumable(self) -> None:
        """Checkpoints asked for, and training goes on without the checkpoint api: it cannot be resumed."""
        points = self.checkpoints
        if points.active and not points.engaged:
            raise checkpoint.NotResumable(
                "--checkpoint-every needs a loop launcher cannot hook to call its checkpoint api: for JAX, "
                "launcher.runtime.api.jax_resume_point(state) before the epoch loop and api.jax_checkpoint(epoch, "
                "state) at each epoch's end (docs/recipes.md); this one trains without them, so it cannot be resumed "
                "bit for bit")

    # dataset -----------------------------------------------------------------------------------
    def record_dataset_arrays(self, arrays: NamedArrays, *, check: bool = True) -> ArraysFingerprint:
        """Fingerprint the arrays a recipe built; checked against the recipe's expected fingerprint.

        When the run read files (``--data``), those are the dataset: the arrays go to
        ``fingerprints/arrays.json`` beside it.
        """
        doc = fp.arrays_fingerprint(arrays)
        dataset_json = self.path(DATASET_JSON)
        if dataset_json.exists() and json.loads(dataset_json.read_text()).get("kind") == "files":
            fp.write_json(self.path(ARRAYS_JSON), doc)
            return doc
        fp.write_json(dataset_json, doc)
        if check and self.expected is not None:
            problem = expected_mismatch(self.expected, doc, "the arrays")
            if problem:
                raise BadData(problem)
        return doc

    def record_train_data(self, arrays: NamedArrays) -> None:
        """The exact arrays one fit() trains on (after any validation split), before shuffling."""
        name = "train_data.json" if self.fits <= 1 else f"train_data.{self.fits - 1}.json"
        fp.write_json(self.path(f"fingerprints/{name}"), fp.arrays_fingerprint(arrays))
        if not self.path(DATASET_JSON).exists():
            fp.write_json(self.path(DATASET_JSON), fp.arrays_fingerprint(arrays))

    # weights -----------------------------------------------------------------------------------
    def record_initial_weights(self, layers: fp.Layers) -> None:
        if self.initial_recorded:
            return
        fp.write_json(self.path(INITIAL_WEIGHTS), fp.weights_fingerprint(layers))
        self.initial_recorded = True

    def record_final(self, layers: fp.Layers) -> None:
        fp.write_json(self.path(LAYERS_JSON), fp.layers_document(layers))
        fp.write_atomic(self.path(CANONICAL_MODEL), fp.canonical_npz_bytes(layers))

    # epochs ------------------------------------------------------------------------------------
    def record_batches(self, epoch: int, batch_digests: list[str] | None, reason: str = "") -> None:
        if batch_digests is None:
            rec: EpochBatches = {"epoch": epoch, "digest": None, "batches": [], "unrecorded": reason}
        else:
            rec = fp.epoch_record(epoch, batch_digests)
        if self.fits > 1:
            rec["fit"] = self.fits - 1
        fp.append_jsonl(self.path(BATCHES), rec)

    def record_metrics(self, epoch: int, metrics: Mapping[str, SupportsFloat | str]) -> None:
        rec: MetricsLine = {"epoch": epoch}
        for key, value in metrics.items():
            try:
                rec[key] = float(value)
            except (TypeError, ValueError):
                rec[key] = str(value)
        if self.fits > 1:
            rec["fit"] = self.fits - 1
        fp.append_jsonl(self.path(METRICS), rec)
        self.metric_epochs += 1


def expected_mismatch(expected: DatasetRecord, doc: DataFingerprint, where: str) -> str | None:
    """None when the fingerprint matches the recipe's dataset entry, else a line naming what differs."""
    name = expected.get("name", "?")
    entries = doc.get("entries", {})
    for rel, want in sorted((expected.get("files") or {}).items()):
        got = entries.get(rel)
        got_digest = got.get("sha256") if isinstance(got, dict) else got
        if got_digest is None:
            return f"dataset {name!r}: {where} lack {rel}, which recipe.toml expects"
        if got_digest != want:
            return (f"dataset {name!r}: {rel} in {where} has {got_digest}, recipe.toml expects {want} "
                    "(a different version or a corrupt copy of the file)")
    want_all = expected.get("fingerprint")
    if want_all and doc["digest"] != want_all:
        listing = ", ".join(f"{k}" for k in sorted(entries)[:5])
        return (f"dataset {name!r}: fingerprint of {where} is {doc['digest']}, "
                f"recipe.toml expects {want_all} "
                f"(entries: {listing}{', ...' if len(entries) > 5 else ''})")
    return None


_recorder: Recorder | None = None


def recorder() -> Recorder:
    global _recorder
    if _recorder is None:
        _recorder = Recorder.from_env()
    return _recorder
