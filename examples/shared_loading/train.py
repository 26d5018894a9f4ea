"""A plain training script with its own DataLoader (the starting point)."""

from __future__ import annotations

import argparse

import torch
from data import make_loader
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    loader = make_loader(batch_size=64)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(16 * 16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        loader_epoch = getattr(loader, "set_epoch", None)
        if loader_epoch:
            loader_epoch(epoch)
        correct = seen = 0
        for images, labels in loader:
            loss = nn.functional.cross_entropy(logits := model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
        print(f"lr={args.lr} epoch {epoch}: {seen} samples, train accuracy {correct / seen:.3f}", flush=True)


if __name__ == "__main__":
    main()
