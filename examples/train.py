"""A small, real PyTorch training job for trying collocate: a CNN learns to classify synthetic
images (each class is a fixed random pattern plus noise), on the GPU when there is one, else on
the CPU, in a few seconds. It saves a checkpoint that ``evaluate.py`` scores.

    python examples/train.py --lr 0.05 --seed 0 --steps 200 --out runs/lr0.05-seed0.pt

``build`` is its entry point for the memory estimator (``collocate estimate examples.train:build
--batch-size 64``, or ``collocate submit --estimate examples.train:build --batch-size 64 -- ...``):
the same model, batch and optimizer as the training loop, which calls it too.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

CLASSES, SIZE = 10, 16


class SmallCNN(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(2 * width * 4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def patterns(seed: int = 1234) -> torch.Tensor:
    """One fixed pattern per class: the task every run (and the evaluation) shares."""
    return torch.randn(CLASSES, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


def synthetic_batch(batch_size: int, generator: torch.Generator | None = None,
                    noise: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Images: a class's pattern under heavy noise; targets: the class."""
    y = torch.randint(0, CLASSES, (batch_size,), generator=generator)
    x = patterns()[y] + noise * torch.randn(batch_size, 3, SIZE, SIZE, generator=generator)
    return x, y


def build(batch_size: int, lr: float = 0.05) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], torch.optim.Optimizer]:
    """(model, (inputs, targets), optimizer) of one training step: the estimator's entry point."""
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return model, synthetic_batch(batch_size), optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="checkpoint to write (default: none)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # collocated jobs share the CPU too; one thread each is fastest
    model, _, optimizer = build(args.batch_size, lr=args.lr)
    model.to(device)
    data = torch.Generator().manual_seed(args.seed)
    loss_fn = nn.CrossEntropyLoss()
    start = time.monotonic()
    for step in range(1, args.steps + 1):
        x, y = synthetic_batch(args.batch_size, data)
        loss = loss_fn(model(x.to(device)), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 25 == 0 or step == args.steps:
            print(f"step {step}/{args.steps}  loss {loss.item():.3f}  "
                  f"{step * args.batch_size / (time.monotonic() - start):.0f} samples/s on {device}",
                  flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "lr": args.lr, "seed": args.seed}, args.out)
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
