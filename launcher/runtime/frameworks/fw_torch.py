"""PyTorch: ``torch.manual_seed`` (CPU and every CUDA device), deterministic algorithms and cuDNN
settings, the thread pools; step fingerprints of whatever the code trains (launcher.runtime.steps);
with checkpoints asked for, a refusal at the first optimizer step of code that does not use the
checkpoint api (launcher.runtime.api.resume_point and api.checkpoint); in a rank of several, DDP's
gradients summed over the ranks as one tensor in parameter order (launcher.runtime.reduction.pin_ddp)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from launcher.runtime.distributed import ENV as DISTRIBUTED
from launcher.runtime.frameworks.base import DETERMINISTIC, Framework

if TYPE_CHECKING:
    from launcher.runtime.record import Recorder
    from launcher.runtime.records import Applied


def apply_torch(torch: Any, profile: str, seed: int | None, threads: int | None) -> Applied:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    info: Applied = {"name": "torch", "version": torch.__version__, "cuda": torch.version.cuda,
                            "cudnn": cudnn}
    if seed is not None:
        torch.manual_seed(seed)  # seeds CPU and every CUDA device
        info["seeded"] = ["python", "numpy", "torch"]
    if profile in DETERMINISTIC:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        info["deterministic_algorithms"] = True
    else:
        info["deterministic_algorithms"] = False
    if threads is not None:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # only settable before the first parallel work
            pass
    info["threads"] = {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    info["cudnn_flags"] = {"deterministic": torch.backends.cudnn.deterministic,
                           "benchmark": torch.backends.cudnn.benchmark}
    info["devices"] = ["cpu"] + [f"cuda:{i}:{torch.cuda.get_device_name(i)}"
                                 for i in range(torch.cuda.device_count())]
    return info


def torch_imported(rt: Any, torch: Any) -> None:
    """Step fingerprints of whatever the code trains (launcher.runtime.steps); with checkpoints
    asked for, a refusal at the first optimizer step of code that does not use the checkpoint api."""
    from launcher.runtime import optrace, steps

    try:
        trace = rt.rec.optrace
        ops = optrace.install_torch(torch, trace) if trace is not None else None
        rt.rec.torch_steps = steps.install_torch(torch, rt.rec.trace, ops)
    except Exception as exc:  # recording is a convenience; training goes on as written
        print(f"launcher: training steps will not be fingerprinted: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
    if rt.rec.checkpoints.active:
        _refuse_unresumable_torch(rt.rec)
    if os.environ.get(DISTRIBUTED) and rt.profile in DETERMINISTIC:  # one rank of several
        from launcher.runtime import reduction

        try:
            reduction.pin_ddp(torch)
        except ImportError:  # a torch without torch.distributed
            pass


def _refuse_unresumable_torch(rec: Recorder) -> None:
    """Checkpoints asked for, and a torch optimizer steps before launcher.runtime.api.resume_point was
    called: the script's own loop cannot be checkpointed or resumed by launcher, so it stops there."""
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook
    except ImportError:
        return

    from launcher.runtime import checkpoint

    def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not rec.checkpoints.engaged:
            raise checkpoint.NotResumable(
                "--checkpoint-every needs a PyTorch script to call launcher.runtime.api.resume_point(model, "
                "optimizer, generator) before its epoch loop and api.checkpoint(epoch, ...) at each epoch's end "
                "(docs/recipes.md); this one trains without them, so it cannot be resumed bit for bit")

    register_optimizer_step_pre_hook(before_step)


SCAFFOLD = '''"""{name}: a small PyTorch model.

It reports its fingerprints through launcher.runtime.api (PyTorch has no fit() to hook).
"""

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from launcher.runtime import api

p = api.params()
if p["dataset"] == "files":
    path = api.data_dir() / "data.npz"
    if not path.is_file():
        raise api.BadData(f"{{path}}: not found; expected data.npz with arrays x and y")
    with np.load(path) as f:
        x, y = f["x"].astype("float32"), f["y"].astype("int64")
else:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int64")
    api.record_dataset({{"x": x, "y": y}})
data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y), torch.arange(len(x)))
loader = DataLoader(data, batch_size=p["batch_size"], shuffle=True, generator=api.torch_generator())
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
api.record_initial_weights(api.torch_layers(model))
opt = torch.optim.Adam(model.parameters())
for epoch in range(p["epochs"]):
    batches, total = [], 0.0
    for xb, yb, ids in loader:
        batches.append(ids.numpy())
        opt.zero_grad()
        # one-hot log-likelihood: NLLLoss has no deterministic CUDA implementation
        loss = -(torch.log_softmax(model(xb), 1) * torch.nn.functional.one_hot(yb, 2)).sum(1).mean()
        loss.backward()
        opt.step()
        total += float(loss.detach()) * len(yb)
    api.record_epoch(epoch, batches, {{"loss": total / len(data)}})
api.save_final(api.torch_layers(model))
'''


TORCH = Framework(
    name="torch", label="PyTorch", modules=("torch", "torchvision", "torchaudio", "lightning", "pytorch_lightning"),
    packages=("torch",), variant="torch-cpu", apply=apply_torch,
    # cuBLAS needs a fixed workspace for reproducible GEMMs (CUDA >= 10.2; torch checks it)
    env=lambda threads: {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
    seeders={"torch": (("manual_seed", "torch.manual_seed"), ("random.manual_seed", "torch.manual_seed"),
                       ("cuda.manual_seed", "torch.cuda.manual_seed"),
                       ("cuda.manual_seed_all", "torch.cuda.manual_seed_all"))},
    hooks=(("torch", torch_imported),), scaffold=SCAFFOLD)
