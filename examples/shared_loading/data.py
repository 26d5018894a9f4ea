"""The input pipeline both training scripts use: synthetic CIFAR-sized images with augmentation.

``make_loader`` is also the ``module:factory`` the shared producer runs:
``collocate share serve data:make_loader --name cifar-train`` (from this directory).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset


class SyntheticCifar(Dataset):
    """10 classes of noisy coloured 32x32 images; a random crop and flip per access."""

    def __init__(self, n: int = 5000, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.colours = torch.rand(10, 3, 1, 1, generator=g)
        self.seed = seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        y = self.labels[i]
        img = self.colours[y] + 0.3 * torch.randn(3, 40, 40, generator=g)
        top, left = torch.randint(0, 9, (2,)).tolist()
        img = img[:, top:top + 32, left:left + 32]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        return img, y


def make_loader(batch_size: int = 128, workers: int = 2) -> DataLoader:
    return DataLoader(SyntheticCifar(), batch_size=batch_size, shuffle=False, num_workers=workers,
                      persistent_workers=workers > 0)
