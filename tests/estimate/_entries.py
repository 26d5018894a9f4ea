"""Small entry points for the estimator tests (tiny models so the suite stays fast)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from collocate.workloads.models import build_mlp, build_transformer


def tiny_mlp(batch_size: int) -> tuple[Any, ...]:
    return build_mlp(batch_size, in_features=32, width=64, depth=2, classes=8)


def tiny_mlp_adam(batch_size: int) -> tuple[Any, ...]:
    model, batch, _ = tiny_mlp(batch_size)
    return model, batch, torch.optim.Adam(model.parameters())


def linear_only(batch_size: int) -> tuple[Any, ...]:
    """One 256x256 bias-free layer, plain SGD: parameters are exactly 256 KiB."""
    model = nn.Linear(256, 256, bias=False)
    x = torch.randn(batch_size, 256)
    return model, (x, torch.randn(batch_size, 256)), torch.optim.SGD(model.parameters(), lr=0.1)


def tiny_transformer(batch_size: int, checkpointing: bool = False) -> tuple[Any, ...]:
    return build_transformer(batch_size, size="tiny", seq=64, vocab=512, checkpointing=checkpointing)


def tiny_transformer_ckpt(batch_size: int) -> tuple[Any, ...]:
    return tiny_transformer(batch_size, checkpointing=True)


class ItemInForward(nn.Module):
    """Data-dependent control flow: fake tensors cannot answer ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 2.0 if x.abs().sum().item() > 0 else 1.0
        return self.fc(x) * scale


def item_model(batch_size: int) -> tuple[Any, ...]:
    model = ItemInForward()
    return (model, (torch.randn(batch_size, 32), torch.randint(0, 8, (batch_size,))),
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


class BatchDependent(ItemInForward):
    """Allocation sequence depends on the batch size, so cpu-run cannot extrapolate."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        for _ in range(x.shape[0]):
            out = out + 1
        return out


def batch_dependent(batch_size: int) -> tuple[Any, ...]:
    model = BatchDependent()
    return (model, (torch.randn(batch_size, 32), torch.randint(0, 8, (batch_size,))),
            torch.optim.SGD(model.parameters(), lr=0.1))


class AlwaysFails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this model cannot run anywhere")


def always_fails(batch_size: int) -> tuple[Any, ...]:
    model = AlwaysFails()
    return model, (torch.randn(batch_size, 4), None), torch.optim.SGD(model.parameters(), lr=0.1)


def item_at_construction(batch_size: int) -> tuple[Any, ...]:
    """Builds fine on real tensors but not under fake mode (``.item()`` while building)."""
    width = 16 + int(torch.ones(1).sum().item())
    model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 8))
    return (model, (torch.randn(batch_size, 32), torch.randint(0, 8, (batch_size,))),
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


def returns_dict(batch_size: int) -> dict[str, int]:
    return {"model": 1}


def returns_two(batch_size: int) -> tuple[Any, ...]:
    return nn.Linear(2, 2), torch.randn(batch_size, 2)


def returns_not_module(batch_size: int) -> tuple[Any, ...]:
    return "model", torch.randn(batch_size, 2), None


def returns_bad_optimizer(batch_size: int) -> tuple[Any, ...]:
    return nn.Linear(2, 2), torch.randn(batch_size, 2), "adam"


def returns_no_optimizer(batch_size: int) -> tuple[Any, ...]:
    return nn.Linear(2, 2), (torch.randn(batch_size, 2), torch.randn(batch_size, 2)), None


def raises_inside(batch_size: int) -> tuple[Any, ...]:
    raise ValueError("dataset path /nonexistent not found")


def no_batch_size() -> tuple[Any, ...]:
    return tiny_mlp(4)


NOT_CALLABLE = 42
