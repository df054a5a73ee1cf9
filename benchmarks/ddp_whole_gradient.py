"""What launcher's per-parameter all-reduce costs, and what it buys: a plain DDP loop at world size 4 (Gloo, CPU
processes on this machine, one thread each), its gradients summed by DDP's own bucket all-reduce (the reference)
and by launcher's hook (launcher.runtime.reduction.pin_ddp: the buckets held until the step's last, then one
all-reduce of the whole gradient laid out in parameter order).

For each, the run is also done as a resumed run would do it: the DDP module made again half-way (a new process's
DDP, whose first step lays its buckets out by parameter order again), and its final weights compared with the run
made in one go. Prints the median step time of each way, the ratio launcher's / bucket, and whether each way's
restarted run ends on the same weights as its uninterrupted one (launcher's must; DDP's need not at world size 4).

    python benchmarks/ddp_whole_gradient.py [--steps 30] [--layers 8] [--hidden 256]

Needs PyTorch in this environment (the test environment has the CPU wheel).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import statistics
import time
from typing import Any


def _rank(rank: int, port: int, pinned: bool, restart_at: int | None, args: argparse.Namespace, queue: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from launcher.runtime import reduction

    world = 4
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if pinned:
        reduction.pin_ddp(torch)
    torch.manual_seed(1)
    layers: list[nn.Module] = [nn.Linear(64, args.hidden), nn.ReLU()]
    for _ in range(args.layers - 2):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.hidden, 10))
    data = torch.Generator().manual_seed(2)
    x = torch.randn(2048, 64, generator=data)
    y = torch.randint(0, 10, (2048,), generator=data)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    times = []
    for step in range(args.steps):
        if step == restart_at:  # as a resumed process would: the same weights, a DDP module made again
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        start = time.perf_counter()
        opt.zero_grad()
        batch = torch.arange(step * 64, (step + 1) * 64) % len(x)
        mine = batch[rank::world]
        nn.functional.cross_entropy(ddp(x[mine]), y[mine]).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    if rank == 0:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        params = sum(p.numel() for p in model.parameters())
        queue.put((statistics.median(times[3:]), digest, params, len(list(model.parameters()))))
    dist.destroy_process_group()


def measure(pinned: bool, restart_at: int | None, args: argparse.Namespace) -> tuple[float, str, int, int]:
    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free port for each run's rendezvous: one after another, a fixed one may linger
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    queue = mp.get_context("spawn").Queue()
    mp.spawn(_rank, args=(port, pinned, restart_at, args, queue), nprocs=4, join=True)
    result: tuple[float, str, int, int] = queue.get(timeout=60)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    half = args.steps // 2
    bucket_s, bucket_digest, params, tensors = measure(False, None, args)
    _, bucket_restarted, _, _ = measure(False, half, args)
    pinned_s, pinned_digest, _, _ = measure(True, None, args)
    _, pinned_restarted, _, _ = measure(True, half, args)
    print(f"model: {params:,} parameters in {tensors} tensors; world 4 (Gloo, CPU); median of {args.steps - 3} steps")
    print(f"DDP's bucket all-reduce:         {bucket_s * 1000:8.2f} ms/step (reference)")
    print(f"launcher's whole gradient:       {pinned_s * 1000:8.2f} ms/step   ratio {pinned_s / bucket_s:.2f}")
    print(f"DDP made again at step {half}, same weights at the end as in one go: bucket "
          f"{bucket_restarted == bucket_digest}, whole gradient {pinned_restarted == pinned_digest}")


if __name__ == "__main__":
    main()
