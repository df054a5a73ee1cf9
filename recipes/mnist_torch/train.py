"""Seed 003's MNIST convnet in PyTorch (Conv32-Conv64-MaxPool-Dropout0.25-Flatten-Dense128-Dropout0.5-
Dense10, Adadelta with Keras' defaults, batch 128, 12 epochs), for hosts without Docker such as a GPU VM:

    python -m launcher.runtime run --recipe recipes/mnist_torch --out OUT --profile deterministic --seed 1

PyTorch has no fit() to hook, so this recipe reports its own fingerprints through launcher.runtime.api:
initial weights, the sample IDs of every batch (a DataLoader shuffled by a seeded generator),
per-epoch metrics and the final weights; and, with --checkpoint-every N, checkpoints it can be
resumed from bit for bit (api.resume_point and api.checkpoint).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from recipelib.mnist import load_digits_as_mnist, load_mnist_npz, synthetic_digits
from recipelib.splits import first
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from launcher.runtime import api

p = api.params()
device = torch.device("cuda" if p["device"] == "auto" and torch.cuda.is_available() else
                      "cpu" if p["device"] == "auto" else p["device"])
print(f"device: {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))

if p["dataset"] == "mnist":
    arrays = load_mnist_npz(api.data_dir())
else:
    arrays = load_digits_as_mnist() if p["dataset"] == "digits" else synthetic_digits()
    api.record_dataset(arrays)
x_train, y_train = first(arrays, "train", p["train_samples"])
x_test, y_test = first(arrays, "test", p["test_samples"])
print(f"{len(x_train)} train samples, {len(x_test)} test samples")


def tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(x.astype(np.float32) / 255).unsqueeze(1), torch.from_numpy(y.astype(np.int64))


class Net(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(12 * 12 * 64, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return self.fc2(x)


def categorical_crossentropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Keras' loss on one-hot labels, written out: NLLLoss (what cross_entropy uses) is on PyTorch's
    list of CUDA operations without a deterministic implementation."""
    one_hot = F.one_hot(labels, logits.shape[1]).to(logits.dtype)
    return -(F.log_softmax(logits, dim=1) * one_hot).sum(dim=1).mean()


model = Net().to(device)
print(f"trainable params: {sum(t.numel() for t in model.parameters() if t.requires_grad):,}")
api.record_initial_weights(api.torch_layers(model))
xt, yt = tensors(x_train, y_train)
train = TensorDataset(xt, yt, torch.arange(len(xt)))
generator = api.torch_generator()
loader = DataLoader(train, batch_size=int(p["batch_size"]), shuffle=True, generator=generator, num_workers=0)
x_val, y_val = (t.to(device) for t in tensors(x_test, y_test))
optimizer = torch.optim.Adadelta(model.parameters(), lr=float(p["learning_rate"]), rho=0.95, eps=1e-7)
first_epoch = api.resume_point(model, optimizer, generator)  # 0, or the epoch after the checkpoint resumed from

start = time.time()
for epoch in range(first_epoch, int(p["epochs"])):
    model.train()
    batches, losses, correct = [], [], 0
    for xb, yb, ids in loader:
        batches.append(ids.numpy())
        xb, yb = xb.to(device), yb.to(device)
        optimizer.zero_grad()
        logits = model(xb)
        loss = categorical_crossentropy(logits, yb)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach() * len(yb))
        correct += int((logits.argmax(1) == yb).sum())
    model.eval()
    with torch.no_grad():
        logits = model(x_val)
        val_loss = float(categorical_crossentropy(logits, y_val))
        val_acc = float((logits.argmax(1) == y_val).float().mean())
    metrics = {"loss": float(torch.stack(losses).sum()) / len(train), "accuracy": correct / len(train),
               "val_loss": val_loss, "val_accuracy": val_acc}
    api.record_epoch(epoch, batches, metrics)
    print(f"epoch {epoch + 1}/{p['epochs']}: " + " - ".join(f"{k}: {v:.4f}" for k, v in metrics.items()))
    api.checkpoint(epoch, model, optimizer, generator)  # with --checkpoint-every N, after every N-th epoch
if device.type == "cuda":
    torch.cuda.synchronize()
print(f"Elapsed Time: {time.time() - start:.2f}")
api.save_final(api.torch_layers(model))
(api.out_dir() / "model").mkdir(parents=True, exist_ok=True)
torch.save(model.state_dict(), api.out_dir() / "model" / "model.pt")
