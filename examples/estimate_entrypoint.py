"""A user entry point for `collocate estimate`, and the same estimate from Python.

The estimator calls ``build(batch_size=N)`` and expects ``(model, batch, optimizer)`` or
``(model, batch, optimizer, loss_fn)``, where ``batch`` is ``(inputs, targets)``. Build the
model exactly as your training script does, but on CPU and with random data of the real shape:
the estimator replaces the tensors by fake ones, so nothing large is allocated.

From the repository root:

    collocate estimate examples.estimate_entrypoint:build --batch-size 64
    collocate estimate examples.estimate_entrypoint:build -b 64 \
        --optimizer adamw --precision bf16 --gpu H100-80GB --format json
    python examples/estimate_entrypoint.py
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class SmallCNN(nn.Module):
    """A CIFAR-sized CNN with a label-smoothed loss, standing in for your model."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, padding=1), nn.BatchNorm2d(256), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(256 * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def build(batch_size: int) -> tuple[Any, ...]:
    model = SmallCNN()
    images = torch.randn(batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (batch_size,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    return model, (images, labels), optimizer, loss_fn


if __name__ == "__main__":
    from collocate.estimate.api import estimate_memory

    est = estimate_memory(build, batch_size=64, precision="bf16", gpu="A100-40GB")
    print(f"{est.mib:.0f} MiB (±{est.uncertainty:.0%}, {est.method})")
    for part, mib in est.breakdown.items():
        print(f"  {part:20s} {mib:10.1f} MiB")
