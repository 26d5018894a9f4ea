"""Built-in PyTorch models on synthetic data, as estimator entry points.

Why in the project: tests, examples, the estimator's accuracy script and the GPU benchmark
harness need the same models everywhere, without downloads. Every ``build_<name>(batch_size,
...)`` returns ``(model, (inputs, targets), optimizer[, loss_fn])`` and can be named on the
command line, e.g. ``collocate estimate collocate.workloads.models:build_resnet50 -b 64``.
Keyword options shrink the models for fast CPU tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# ---------------------------------------------------------------- MLP


def mlp(in_features: int = 1024, width: int = 2048, depth: int = 4, classes: int = 10) -> nn.Module:
    """A plain ReLU MLP, like GPUMemNet's "uniform" MLPs."""
    layers: list[nn.Module] = []
    dim = in_features
    for _ in range(depth):
        layers += [nn.Linear(dim, width), nn.ReLU()]
        dim = width
    layers.append(nn.Linear(dim, classes))
    return nn.Sequential(*layers)


def build_mlp(
    batch_size: int, *, in_features: int = 1024, width: int = 2048, depth: int = 4, classes: int = 10
) -> tuple[Any, ...]:
    model = mlp(in_features, width, depth, classes)
    x = torch.randn(batch_size, in_features)
    y = torch.randint(0, classes, (batch_size,))
    return model, (x, y), torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


# ---------------------------------------------------------------- ResNet


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.short(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.short = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.short(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """ResNet (He et al. 2016) with a CIFAR stem (3x3, no pooling) or an ImageNet stem."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: Sequence[int],
        *,
        classes: int = 1000,
        base: int = 64,
        imagenet_stem: bool = True,
    ) -> None:
        super().__init__()
        if imagenet_stem:
            self.stem = nn.Sequential(
                nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base), nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1),
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(3, base, 3, 1, 1, bias=False), nn.BatchNorm2d(base), nn.ReLU(inplace=True)
            )
        stages: list[nn.Module] = []
        cin = base
        for i, n in enumerate(layers):
            width = base * 2**i
            for j in range(n):
                stages.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


RESNETS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, ...]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet26": (Bottleneck, (2, 2, 2, 2)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


def build_resnet(
    batch_size: int,
    *,
    arch: str = "resnet50",
    image_size: int = 224,
    classes: int = 1000,
    base: int = 64,
    cifar: bool = False,
    optimizer: str = "sgd",
) -> tuple[Any, ...]:
    """A ResNet on random images; ``cifar=True`` uses 32x32 inputs, 100 classes, CIFAR stem."""
    block, layers = RESNETS[arch]
    if cifar:
        image_size, classes = 32, 100
    model = ResNet(block, layers, classes=classes, base=base, imagenet_stem=not cifar)
    x = torch.randn(batch_size, 3, image_size, image_size)
    y = torch.randint(0, classes, (batch_size,))
    return model, (x, y), _optim(optimizer, model)


def build_resnet18(batch_size: int) -> tuple[Any, ...]:
    return build_resnet(batch_size, arch="resnet18")


def build_resnet26(batch_size: int) -> tuple[Any, ...]:
    return build_resnet(batch_size, arch="resnet26")


def build_resnet50(batch_size: int) -> tuple[Any, ...]:
    return build_resnet(batch_size, arch="resnet50")


def build_resnet152(batch_size: int) -> tuple[Any, ...]:
    return build_resnet(batch_size, arch="resnet152")


def build_resnet18_cifar(batch_size: int) -> tuple[Any, ...]:
    return build_resnet(batch_size, arch="resnet18", cifar=True)


def build_resnet50_cifar(batch_size: int) -> tuple[Any, ...]:
    return build_resnet(batch_size, arch="resnet50", cifar=True)


# ---------------------------------------------------------------- Transformer


class Block(nn.Module):
    """Pre-norm transformer block with ``F.scaled_dot_product_attention``."""

    def __init__(self, dim: int, heads: int, ff_mult: int = 4, causal: bool = True) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, ff_mult * dim), nn.GELU(), nn.Linear(ff_mult * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=self.causal
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.ff(self.ln2(x))


class TransformerLM(nn.Module):
    """A GPT-style language model; ``checkpointing`` recomputes each block in backward."""

    def __init__(
        self, vocab: int, dim: int, depth: int, heads: int, seq: int, checkpointing: bool = False
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.checkpointing = checkpointing

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.checkpointing else blk(x)
        return self.head(self.ln(x))


TRANSFORMERS: dict[str, dict[str, int]] = {
    "tiny": {"dim": 128, "depth": 2, "heads": 4},
    "small": {"dim": 512, "depth": 6, "heads": 8},
    "base": {"dim": 768, "depth": 12, "heads": 12},
    "large": {"dim": 1024, "depth": 24, "heads": 16},
}


def build_transformer(
    batch_size: int,
    *,
    size: str = "base",
    seq: int = 512,
    vocab: int = 32000,
    checkpointing: bool = False,
    optimizer: str = "adamw",
) -> tuple[Any, ...]:
    """A GPT-style LM on random tokens (next-token cross-entropy over ``vocab``)."""
    model = TransformerLM(vocab, seq=seq, checkpointing=checkpointing, **TRANSFORMERS[size])
    ids = torch.randint(0, vocab, (batch_size, seq))
    return model, (ids, torch.randint(0, vocab, (batch_size, seq))), _optim(optimizer, model)


def build_transformer_small(batch_size: int) -> tuple[Any, ...]:
    return build_transformer(batch_size, size="small")


def build_transformer_base(batch_size: int) -> tuple[Any, ...]:
    return build_transformer(batch_size, size="base")


def build_transformer_base_ckpt(batch_size: int) -> tuple[Any, ...]:
    return build_transformer(batch_size, size="base", checkpointing=True)


# ---------------------------------------------------------------- DLRM-like recommender


class DLRM(nn.Module):
    """Embedding tables + bottom MLP for dense features + dot interactions + top MLP."""

    def __init__(self, tables: int, rows: int, dim: int, dense: int) -> None:
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense, 512), nn.ReLU(), nn.Linear(512, dim), nn.ReLU())
        n = tables + 1
        self.top = nn.Sequential(
            nn.Linear(dim + n * (n - 1) // 2, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
            nn.Linear(256, 1),
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        d = self.bottom(dense)
        feats = torch.stack([d] + [e(sparse[:, i]) for i, e in enumerate(self.emb)], dim=1)
        inter = feats @ feats.transpose(1, 2)
        i, j = torch.triu_indices(feats.shape[1], feats.shape[1], 1)
        return self.top(torch.cat([d, inter[:, i, j]], dim=1)).squeeze(1)


def build_dlrm(
    batch_size: int, *, tables: int = 8, rows: int = 100_000, dim: int = 64, dense: int = 13
) -> tuple[Any, ...]:
    """A DLRM-like click model: embedding-heavy, binary cross-entropy loss."""
    model = DLRM(tables, rows, dim, dense)
    inputs = (torch.randn(batch_size, dense), torch.randint(0, rows, (batch_size, tables)))
    y = torch.randint(0, 2, (batch_size,)).float()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, (inputs, y), opt, nn.BCEWithLogitsLoss()


def _optim(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
