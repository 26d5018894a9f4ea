"""Attention and dropout are traced with the memory of the GPU's fused kernels.

On CPU, ``F.scaled_dot_product_attention`` with dropout (or a mask that needs a gradient) runs the
math path, which keeps B x H x L x S tensors for backward; CUDA's flash and memory-efficient
kernels keep only the output and a B x H x L log-sum-exp. CPU dropout keeps a float noise
tensor where CUDA keeps a bool mask. These tests pin that the trace follows the GPU, including
where the GPU itself runs the math path.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from collocate.estimate.fused import gpu_backend
from collocate.estimate.gpu_overheads import gpu_type
from collocate.estimate.static import estimate_from_trace, trace_fake

B, H, S = 4, 4, 256
SCORES = B * H * S * S * 4  # one float32 B x H x S x S tensor: 4 MiB


class Attention(nn.Module):
    """One self-attention layer calling SDPA the way Hugging Face models do in training."""

    def __init__(self, head_dim: int, dropout: float, mask: str, ckpt: bool = False) -> None:
        super().__init__()
        self.head_dim, self.dropout, self.ckpt = head_dim, dropout, ckpt
        self.qkv = nn.Linear(16, 3 * H * head_dim)
        self.out = nn.Linear(H * head_dim, 16)
        self.mask: Any = None
        if mask == "bool":  # a fixed causal mask, S x S
            self.mask = torch.ones(S, S, dtype=torch.bool).tril()
        elif mask == "learned":  # an additive bias with a gradient, 1 x H x S x S (T5's kind)
            self.mask = nn.Parameter(torch.zeros(1, H, S, S))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ckpt:  # recomputed in backward, where autograd drops function modes
            return checkpoint(self.attend, x, use_reentrant=False)
        return self.attend(x)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(B, S, 3, H, self.head_dim).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(
            q, k, v, attn_mask=self.mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out(att.transpose(1, 2).reshape(B, S, -1))


def attention_entry(
    batch_size: int, *, head_dim: int = 16, dropout: float = 0.1, mask: str = "", ckpt: bool = False
) -> tuple[Any, ...]:
    model = Attention(head_dim, dropout, mask, ckpt)
    x = torch.randn(batch_size, S, 16)
    return model, (x, torch.randn(batch_size, S, 16)), torch.optim.SGD(model.parameters(), lr=0.1)


def peak_bytes(precision: str = "fp32", gpu_kernels: bool = True, entry: Any = None,
               **kw: Any) -> float:
    trace = trace_fake(functools.partial(entry or attention_entry, **kw), B, precision=precision,
                       gpu_kernels=gpu_kernels)
    est = estimate_from_trace(trace, gpu_type("H100-80GB"))
    return est.details["peak_allocated_mib"] * (1 << 20)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_dropout_inside_attention_holds_no_score_matrix(precision: str) -> None:
    without = peak_bytes(precision, dropout=0.0)
    with_dropout = peak_bytes(precision, dropout=0.1)
    assert with_dropout - without < 0.25 * SCORES
    # what the CPU's math path would have counted: scores, softmax, dropout mask, ...
    assert peak_bytes(precision, gpu_kernels=False, dropout=0.1) - without > 2 * SCORES


def test_boolean_mask_with_dropout_holds_no_score_matrix() -> None:
    without = peak_bytes(dropout=0.0)
    masked = peak_bytes(dropout=0.1, mask="bool")
    # only the S x S float bias made from the boolean mask is new (256 KiB), nothing per batch
    assert masked - without < 0.25 * SCORES


def test_learned_bias_adds_only_its_gradient() -> None:
    # The memory-efficient kernel's backward returns the bias gradient broadcast to
    # B x H x S x S (one SCORES, transient) before autograd sums it to the parameter's shape;
    # the bias, its gradient and that are all the GPU holds (the CPU's math path: over 4 SCORES).
    without = peak_bytes(dropout=0.0)
    assert peak_bytes(dropout=0.1, mask="learned") - without < 2 * SCORES


def test_checkpointed_attention_is_recomputed_the_same_way() -> None:
    sdpa = F.scaled_dot_product_attention
    without = peak_bytes(dropout=0.0, ckpt=True)
    assert peak_bytes(dropout=0.1, ckpt=True) - without < 0.25 * SCORES
    assert F.scaled_dot_product_attention is sdpa  # put back after the trace


def test_head_dim_the_gpu_kernels_refuse_runs_the_math_path() -> None:
    # float32 head dim 6 is not a multiple of 4, so the GPU runs the math path: scores and their
    # softmax (kept for backward) even without dropout, where the CPU would run its flash kernel.
    fused = peak_bytes(head_dim=8, dropout=0.0)
    math = peak_bytes(head_dim=6, dropout=0.0)
    assert math - fused > 2 * SCORES
    # dropout adds CUDA's bool mask (a quarter of SCORES), not the CPU's float32 noise
    assert peak_bytes(head_dim=6, dropout=0.1) - math < 0.5 * SCORES


ROWS, WIDTH = 1024, 1024  # one float32 activation of the MLP below: 4 MiB


def mlp_entry(batch_size: int, *, dropout: float) -> tuple[Any, ...]:
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Dropout(dropout), nn.Linear(WIDTH, 8))
    x = torch.randn(ROWS, WIDTH)
    return model, (x, torch.randn(ROWS, 8)), torch.optim.SGD(model.parameters(), lr=0.1)


def test_dropout_keeps_a_bool_mask() -> None:
    # Backward needs the mask and the dropped output instead of the hidden output: one mask more,
    # 1 byte per element on CUDA (native_dropout), 4 on CPU (a float32 noise tensor).
    without = peak_bytes(entry=mlp_entry, dropout=0.0)
    mask = ROWS * WIDTH
    assert 0.9 * mask <= peak_bytes(entry=mlp_entry, dropout=0.5) - without <= 1.1 * mask
    assert peak_bytes(entry=mlp_entry, gpu_kernels=False, dropout=0.5) - without >= 3.9 * mask


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize(
    ("dtype", "shape", "mask", "causal", "want"),
    [
        (torch.float32, (2, 4, 64, 64), None, False, "efficient"),
        (torch.bfloat16, (2, 4, 64, 64), None, True, "flash"),
        (torch.float16, (2, 4, 64, 64), _meta(64, 64), False, "efficient"),
        (torch.float16, (2, 4, 64, 320), None, False, "efficient"),  # flash: head dim <= 256
        (torch.float64, (2, 4, 64, 64), None, False, "math"),
        (torch.float32, (8, 64, 64), None, False, "math"),  # 3-D inputs
        (torch.bfloat16, (2, 4, 64, 12), _meta(64, 64), False, "math"),  # 12 % 8 != 0
        (torch.float32, (2, 4, 64, 64), _meta(64, 64).t(), False, "math"),  # mask stride(-1) 64
    ],
)
def test_backend_choice_follows_cuda_dispatch(
    dtype: torch.dtype, shape: tuple[int, ...], mask: Any, causal: bool, want: str
) -> None:
    q = _meta(*shape, dtype=dtype)
    assert gpu_backend(q, q, q, mask, causal) == want
