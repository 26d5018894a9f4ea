"""Benchmark workload names → built-in models (``collocate.workloads.models``), with sizes.

Why a table here rather than entry-point strings: the harness needs, per workload, a batch size
that keeps seven copies within an 80 GB GPU, a nominal epoch size (to turn samples/s into the
"time per epoch" the issue asks for) and a tiny variant that trains in milliseconds on a CPU, so
tests and dry runs exercise the same code path as the GPU runs.

The issue's list: a small CNN (ResNet-18/26 at 32×32), a medium CNN (ResNet-50 at 64×64 and
224×224), a large CNN (ResNet-152), a transformer encoder and a DLRM-like recommender.
``workloads.models`` has no bidirectional transformer *encoder* builder (its transformer is a
causal LM), so ``transformer-encoder`` is a thin BERT-base-shaped model here, built from
``models.Block`` with ``causal=False``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collocate.common.errors import UnknownNameError

IMAGENET_TRAIN = 1_281_167  # images in the ImageNet-1k training split
CIFAR_TRAIN = 50_000
TINY_IMAGENET_TRAIN = 100_000


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """One benchmark workload.

    ``epoch_samples`` is a *nominal* epoch (the dataset the shape stands for); the data itself is
    synthetic, so time per epoch is ``epoch_samples / samples_per_s`` without input pipeline.
    ``size`` groups workloads for mixes: small, medium, large.
    """

    name: str
    size: str
    description: str
    epoch_samples: int
    batch_size: int  # on a GPU
    tiny_batch_size: int  # on a CPU
    family: str  # key in data/workload_profiles.toml-style tables
    builder: str  # function in this module
    kwargs: dict[str, Any] = field(default_factory=dict)
    tiny_kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self, batch_size: int, *, tiny: bool) -> tuple[Any, ...]:
        """``(model, (inputs, targets), optimizer[, loss])`` as ``workloads.models`` returns."""
        kwargs = {**self.kwargs, **(self.tiny_kwargs if tiny else {})}
        return BUILDERS[self.builder](batch_size, **kwargs)


def _resnet(batch_size: int, **kwargs: Any) -> tuple[Any, ...]:
    from collocate.workloads.models import build_resnet

    return build_resnet(batch_size, **kwargs)


def _dlrm(batch_size: int, **kwargs: Any) -> tuple[Any, ...]:
    from collocate.workloads.models import build_dlrm

    return build_dlrm(batch_size, **kwargs)


def _encoder(
    batch_size: int, *, dim: int = 768, depth: int = 12, heads: int = 12, seq: int = 128,
    vocab: int = 30522,
) -> tuple[Any, ...]:
    """A BERT-base-shaped encoder trained with a per-token loss on random tokens."""
    import torch
    from torch import nn

    from collocate.workloads.models import Block

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.zeros(seq, dim))
            self.blocks = nn.Sequential(*(Block(dim, heads, causal=False) for _ in range(depth)))
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.ln(self.blocks(self.tok(ids) + self.pos[: ids.shape[1]])))

    model = Encoder()
    ids = torch.randint(0, vocab, (batch_size, seq))
    targets = torch.randint(0, vocab, (batch_size, seq))
    return model, (ids, targets), torch.optim.AdamW(model.parameters(), lr=1e-4)


BUILDERS: dict[str, Callable[..., tuple[Any, ...]]] = {
    "resnet": _resnet, "dlrm": _dlrm, "encoder": _encoder,
}

_TINY_RESNET = {"base": 4, "image_size": 16, "classes": 10, "cifar": False}

WORKLOADS: dict[str, WorkloadSpec] = {
    w.name: w
    for w in (
        WorkloadSpec("resnet18-cifar", "small", "ResNet-18, 32x32 inputs, 100 classes (CIFAR-100)",
                     CIFAR_TRAIN, 128, 4, "resnet18", "resnet",
                     {"arch": "resnet18", "cifar": True}, _TINY_RESNET),
        WorkloadSpec("resnet26-cifar", "small", "ResNet-26 (bottleneck), 32x32 inputs (CIFAR-100)",
                     CIFAR_TRAIN, 128, 4, "resnet26", "resnet",
                     {"arch": "resnet26", "cifar": True}, _TINY_RESNET),
        WorkloadSpec("resnet50-64", "medium", "ResNet-50, 64x64 inputs, 200 classes "
                     "(Tiny-ImageNet)", TINY_IMAGENET_TRAIN, 128, 4, "resnet50", "resnet",
                     {"arch": "resnet50", "image_size": 64, "classes": 200}, _TINY_RESNET),
        WorkloadSpec("resnet50-224", "medium", "ResNet-50, 224x224 inputs (ImageNet)",
                     IMAGENET_TRAIN, 64, 2, "resnet50", "resnet",
                     {"arch": "resnet50", "image_size": 224}, _TINY_RESNET),
        WorkloadSpec("resnet152", "large", "ResNet-152, 224x224 inputs (ImageNet)",
                     IMAGENET_TRAIN, 32, 2, "resnet152", "resnet",
                     {"arch": "resnet152", "image_size": 224}, _TINY_RESNET),
        WorkloadSpec("transformer-encoder", "medium", "BERT-base-shaped encoder, 128 tokens",
                     1_000_000, 32, 2, "bert-base", "encoder", {},
                     {"dim": 32, "depth": 1, "heads": 2, "seq": 16, "vocab": 100}),
        WorkloadSpec("dlrm", "small", "DLRM-like recommender: 8 tables x 100k rows, dim 64",
                     4_000_000, 2048, 32, "dlrm", "dlrm", {},
                     {"tables": 2, "rows": 1000, "dim": 8}),
    )
}

#: The workloads the default plan runs (ResNet-26 stays available to the worker).
DEFAULT_WORKLOADS = (
    "resnet18-cifar", "resnet50-64", "resnet50-224", "resnet152", "transformer-encoder", "dlrm",
)


def workload(name: str) -> WorkloadSpec:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise UnknownNameError("workload", name, list(WORKLOADS)) from None
