"""A data-parallel step over fixed micro-batches, and the canonical reduction (`launcher run --reduction canonical`):
gradients that do not depend on the world size, the ring or the collective's algorithm.

The script gives each step's global batch (the same sample indices on every rank) to
:func:`launcher.runtime.api.micro_batches`, which cuts it into micro-batches of a fixed size, numbered by their
place in the global batch; rank r computes micro-batches ``r*k`` to ``r*k + k - 1`` (k = micro-batches per rank),
each one's forward and backward on its own, its randomness (dropout) drawn from a generator keyed by the run's seed,
the step and the micro-batch's number, never by the rank. The step's gradient is the mean over the global batch:

- ``default``: each rank sums its micro-batches' gradients in order, DDP's own all-reduce sums the ranks' sums
  (its ring, its algorithm), then the sum is divided by the number of micro-batches;
- ``canonical``: each micro-batch's gradient is kept apart (stashed after its backward), each rank sums its k in a
  binary tree, the ranks' sums are gathered (an all-gather, not an all-reduce: no collective adds anything) and
  summed in a binary tree over the ranks. With k and the world size powers of two, the two trees together are the
  one binary tree over all micro-batches in order, whichever way they are split among ranks: 1 x 4, 2 x 2, 4 x 1
  and a world of 2 against one of 4 (the same global batch) give the same bits.

Under launcher's deterministic profiles, every DDP module of a rank sums its gradients over the ranks as one tensor
laid out in the module's parameter order (:func:`pin_ddp`, a communication hook registered before its first forward
unless the script registered its own; the default reduction of :func:`micro_batches` does the same): the buckets'
gradients are held until the step's last bucket, summed in one all-reduce and copied back. DDP's own hook
all-reduces each bucket's flat buffer, and where a gradient sits in that buffer decides the order in which the
ranks' values are added (the ring's chunks); DDP lays its buckets out by parameter order for the first step and by
gradient-ready order after it, so a run resumed from a checkpoint, whose first step is again the first of its
process, would add one step's gradients in another order than the run never stopped (world sizes above 2; two
summands add the same either way). Laid out by parameter order, every step adds them the same way.

What it cannot cover: model-parallel layers (tensor, pipeline or expert parallelism) reduce inside the model;
optimizer states sharded across ranks (ZeRO, FSDP) reduce-scatter; a micro-batch count that is not a power of two
per rank, or a world size that is not one, has no shared tree (refused).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import Any

ENV = "LAUNCHER_REDUCTION"  # "canonical", else DDP's own all-reduce
MODES = ("default", "canonical")
_STATE = "_launcher_reduction"
_PINNED = "_launcher_pinned"  # a DDP module given launcher's whole-gradient hook (pin_ddp)


class ReductionError(ValueError):
    """A global batch that cannot be cut as asked (the runtime reports it as a bad recipe)."""


def mode() -> str:
    return "canonical" if os.environ.get(ENV) == "canonical" else "default"


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def tree_sum(parts: Sequence[Any]) -> Any:
    """Pairwise sums, level by level, in order: ((a + b) + (c + d)) + ..."""
    level = list(parts)
    while len(level) > 1:
        level = [level[i] + level[i + 1] if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return level[0]


def share(total: int, world: int, rank: int) -> range:
    """The micro-batches rank computes: a contiguous run of total / world of them."""
    if total % world:
        raise ReductionError(f"{total} micro-batches cannot be shared among {world} ranks evenly; give a global "
                             "batch of a multiple of the world size times the micro-batch size")
    k = total // world
    return range(rank * k, rank * k + k)


class _State:
    """A DDP module's micro-batch step: the gradients stashed so far, how many micro-batches the step has."""

    def __init__(self, canonical: bool) -> None:
        self.canonical = canonical
        self.stash: list[dict[Any, Any]] = []
        self.total = 1
        self.steps = 0  # the steps given so far: each micro-batch's randomness is keyed by its step and number
        self.whole: WholeGradient | None = None  # default: the ranks' sums summed as one tensor


class WholeGradient:
    """One DDP module's step: its buckets' gradients held until the last bucket of the step, then summed over the
    ranks as one tensor laid out in the module's parameter order (see the module's doc)."""

    def __init__(self, params: Sequence[Any]) -> None:
        self.order = {id(p): i for i, p in enumerate(params)}
        self.pending: list[tuple[Any, list[tuple[int, Any]], Any]] = []  # (buffer, [(order, gradient view)], future)

    def hook(self, bucket: Any, divisor: int) -> Any:
        """DDP's communication hook for one bucket: a future of its buffer holding the ranks' sum / divisor."""
        import torch
        import torch.distributed as dist

        done: Any = torch.futures.Future()
        grads = [(self.order.get(id(p), len(self.order) + i), g)
                 for i, (p, g) in enumerate(zip(bucket.parameters(), bucket.gradients(), strict=True))]
        self.pending.append((bucket.buffer(), grads, done))
        if not bucket.is_last():
            return done
        pending, self.pending = self.pending, []
        views = sorted((pair for _, grads, _ in pending for pair in grads), key=lambda pair: pair[0])
        flat = torch.cat([g.reshape(-1) for _, g in views])

        def spread(fut: Any) -> Any:
            try:
                fut.value()
                flat.div_(divisor)
                offset = 0
                for _, g in views:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
            except Exception as exc:  # every bucket's future fails with it: DDP raises, nothing waits forever
                for _, _, each in pending:
                    each.set_exception(exc)
                return flat
            for buffer, _, each in pending:
                each.set_result(buffer)
            return flat

        dist.all_reduce(flat, async_op=True).get_future().then(spread)
        return done


def _whole_hook(state: WholeGradient, bucket: Any) -> Any:
    """DDP's communication hook under launcher's profile: the ranks' mean gradient, summed as one tensor."""
    import torch.distributed as dist

    return state.hook(bucket, dist.get_world_size())


def pin_ddp(torch: Any) -> None:
    """Every DistributedDataParallel module of this process sums its gradients over the ranks as one tensor in its
    parameter order (see the module's doc): the hook is registered at its first forward, unless the script
    registered one of its own before."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    forward = DDP.forward
    if getattr(forward, _PINNED, False):
        return

    def pinned_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._comm_hooks and not getattr(self, _PINNED, False):
            setattr(self, _PINNED, True)
            _whole_hook.__annotations__ = {"state": WholeGradient, "bucket": dist.GradBucket,  # type: ignore[attr-defined]
                                           "return": torch.futures.Future[torch.Tensor]}
            self.register_comm_hook(WholeGradient(list(self.module.parameters())), _whole_hook)
        return forward(self, *args, **kwargs)  # type: ignore[no-untyped-call]

    setattr(pinned_forward, _PINNED, True)
    DDP.forward = pinned_forward  # type: ignore[method-assign]


def _hook(state: _State, bucket: Any) -> Any:
    """DDP's communication hook: the step's mean gradient for one bucket."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    if not state.canonical:  # the ranks' sums summed as one tensor, then the mean over the micro-batches
        assert state.whole is not None
        return state.whole.hook(bucket, state.total)
    params = bucket.parameters()
    mine = [torch.cat([stash[p].reshape(-1) for p in params]) for stash in state.stash] + [bucket.buffer()]
    local = tree_sum(mine)
    gathered = [torch.empty_like(local) for _ in range(world)]
    work = dist.all_gather(gathered, local, async_op=True)

    def summed(_: Any) -> Any:
        return tree_sum(gathered).div_(state.total)

    return work.get_future().then(summed)


def micro_batches(model: Any, indices: Any, size: int, *, seed: int | None, first_step: int = 0) -> Iterator[Any]:
    """The rank's micro-batches of a global batch (a 1-D tensor of sample indices), in order; see the module's doc.
    first_step: the steps done before this process's first (a run resumed from a checkpoint)."""
    import torch
    import torch.distributed as dist

    if size < 1 or len(indices) % size:
        raise ReductionError(f"a global batch of {len(indices)} cannot be cut into micro-batches of {size}")
    total = len(indices) // size
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_available() and dist.is_initialized() else (1, 0)
    mine = share(total, world, rank)
    canonical = mode() == "canonical"
    if canonical and not (_power_of_two(len(mine)) and _power_of_two(world)):
        raise ReductionError(f"--reduction canonical needs a power of two of micro-batches per rank and of ranks, not "
                             f"{len(mine)} and {world}; change the global batch or the micro-batch size")
    state: _State | None = getattr(model, _STATE, None)
    if state is None:
        state = _State(canonical)
        state.steps = first_step
        state.whole = WholeGradient(list(model.parameters()))
        if ddp:  # DDP checks the hook's annotations by identity (strings here, from __future__ annotations)
            _hook.__annotations__ = {"state": _State, "bucket": dist.GradBucket,  # type: ignore[attr-defined]
                                     "return": torch.futures.Future[torch.Tensor]}
            model.register_comm_hook(state, _hook)
        setattr(model, _STATE, state)
    state.total, state.stash = total, []
    step, state.steps = state.steps, state.steps + 1
    params = [p for p in model.parameters() if p.requires_grad]
    base = 0 if seed is None else seed
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    devices = [torch.cuda.current_device()] if cuda else []
    for j, i in enumerate(mine):
        last = j == len(mine) - 1
        with (nullcontext() if last or not ddp else model.no_sync()), torch.random.fork_rng(devices=devices):
            torch.manual_seed((base * 1_000_003 + step * 65_537 + i) % (1 << 63))
            yield indices[i * size:(i + 1) * size]
        if canonical and not (last and ddp):  # kept apart for the tree; DDP's hook sees the last in its bucket
            state.stash.append({p: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
                                for p in params})
            for p in params:
                p.grad = None
    if not ddp:  # one process: the mean over the micro-batches, here
        for p in params:
            if canonical:
                p.grad = tree_sum([stash[p] for stash in state.stash]).div_(total)
            elif p.grad is not None:
                p.grad.div_(total)
        state.stash = []
