"""The canonical reduction's cost: a DDP step over fixed micro-batches at world size 4 (Gloo, CPU processes on this
machine, one thread each), gradients summed by the default reduction (the reference: each rank's micro-batches in
order, then one all-reduce of the whole gradient in parameter order) and by the canonical tree (`launcher run
--reduction canonical`: each micro-batch's gradient kept apart, an all-gather, trees on each rank).

Prints the median step time of each and the ratio canonical / default, with the model size, and checks that the
canonical runs at world sizes 4 and 2 end on the same weights (they must; the default runs need not).

    python benchmarks/canonical_reduction.py [--steps 30] [--hidden 512] [--micro 4] [--global-batch 64]

Needs PyTorch in this environment (the test environment has the CPU wheel).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from typing import Any


def _rank(rank: int, world: int, mode: str, args: argparse.Namespace, queue: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from launcher.runtime import api

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29800 + world), LAUNCHER_REDUCTION=mode,
                      LAUNCHER_SEED="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(256, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(2)
    x = torch.randn(4096, 256, generator=data)
    y = torch.randint(0, 10, (4096,), generator=data)
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        batch = torch.arange(step * args.global_batch, (step + 1) * args.global_batch) % len(x)
        for part in api.micro_batches(ddp, batch, args.micro):
            nn.functional.cross_entropy(ddp(x[part]), y[part]).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    if rank == 0:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        params = sum(p.numel() for p in model.parameters())
        queue.put((statistics.median(times[3:]), digest, params))
    dist.destroy_process_group()


def measure(world: int, mode: str, args: argparse.Namespace) -> tuple[float, str, int]:
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").Queue()
    mp.spawn(_rank, args=(world, mode, args, queue), nprocs=world, join=True)
    result: tuple[float, str, int] = queue.get(timeout=60)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=64)
    args = parser.parse_args()
    default_s, default_digest, params = measure(4, "default", args)
    canonical_s, canonical_digest, _ = measure(4, "canonical", args)
    canonical_two_s, canonical_two_digest, _ = measure(2, "canonical", args)
    print(f"model: {params:,} parameters; global batch {args.global_batch} in micro-batches of {args.micro}; "
          f"median of {args.steps - 3} steps")
    print(f"world 4, default all-reduce:   {default_s * 1000:8.1f} ms/step (reference)")
    print(f"world 4, canonical reduction:  {canonical_s * 1000:8.1f} ms/step   ratio {canonical_s / default_s:.2f}")
    print(f"world 2, canonical reduction:  {canonical_two_s * 1000:8.1f} ms/step")
    print(f"canonical weights, world 4 == world 2: {canonical_digest == canonical_two_digest} "
          f"({canonical_digest[:12]}); default world 4: {default_digest[:12]}")


if __name__ == "__main__":
    main()
