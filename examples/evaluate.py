"""Score checkpoints written by ``train.py`` on fresh synthetic images: what a job submitted with
``--after`` (once training is done) typically runs.

    python examples/evaluate.py runs/*.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # train.py beside this file
from train import SmallCNN, synthetic_batch  # noqa: E402


def accuracy(checkpoint: Path, samples: int = 2000) -> float:
    model = SmallCNN()
    model.load_state_dict(torch.load(checkpoint, map_location="cpu")["model"])
    model.eval()
    x, y = synthetic_batch(samples, torch.Generator().manual_seed(10**6))  # never seen in training
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    args = parser.parse_args()
    for path in args.checkpoints:
        print(f"{path}: accuracy {accuracy(path):.1%}")


if __name__ == "__main__":
    main()
