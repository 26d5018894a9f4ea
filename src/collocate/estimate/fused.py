"""Trace attention and dropout with the memory of the GPU's fused kernels.

Why: PyTorch picks different kernels on CPU and CUDA for the same Python call, and they keep
different tensors for backward.

* ``F.scaled_dot_product_attention``. On CPU it runs a fused (flash) kernel only without
  dropout and without a mask that needs a gradient. With ``dropout_p > 0``, which the BERT,
  GPT-2, RoBERTa and T5 configurations of Hugging Face use in training, it takes the math path,
  which materialises the B x H x L x S scores, their softmax, a dropout mask and the dropped
  probabilities; autograd keeps the last three. For GPT-2 at batch 8 and sequence 1024 that is
  1.1 GiB per layer, 13.5 GiB over 12 layers, and made the traced estimate 1.8x the measured
  peak. On a CUDA GPU the same call runs flash or memory-efficient attention, which keep only
  the output, a B x H x L float32 log-sum-exp and a Philox seed (dropout is regenerated in
  backward): nothing L x S is stored.
* ``F.dropout`` in training. CUDA runs ``native_dropout``, which keeps a bool mask (1 byte per
  element); CPU multiplies by a noise tensor of the input's dtype and keeps that (4 bytes in
  float32).

So while tracing on fake tensors, :func:`gpu_kernels` makes both calls run what CUDA runs. For
attention that is the kernel PyTorch's CUDA dispatcher would pick (``select_sdp_backend`` in
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, sm80 and newer), with the same input
preparation (autocast to half precision, boolean mask to an additive bias, bias padded and
broadcast). The kernels' meta functions run on fake CPU tensors and their autograd nodes save
what the GPU's save. A mask that requires grad (T5's position bias) goes to the memory-efficient
kernel, whose backward returns the bias gradient at B x H x L x S, as on the GPU.

Where the GPU itself runs attention's math path, so does the trace (``_math_sdpa``: PyTorch's
math path with CUDA's dropout), whatever the CPU would have picked: 3-D inputs, float64, a
query, key, value or mask whose last dimension has a stride other than 1 (T5's position bias in
transformers 5.17), query and key head dims that differ, or head dims that are not multiples of
4 (float32) or 8 (half precision). Not modelled: cuDNN attention, preferred for half precision
on sm90 with recent cuDNN (it saves the same output and statistics as flash); the kernels'
internal backward scratch (e.g. flash's float32 dq accumulator, one layer at a time); nested
tensors; real CPU tensors (the ``cpu-run`` fallback keeps the CPU's kernels, an over-estimate
with dropout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: Bias alignment (elements) the memory-efficient kernel needs; SDPA pads the last dim if not.
BIAS_ALIGNMENT = 8


def gpu_backend(q: Any, k: Any, v: Any, attn_mask: Any, is_causal: bool) -> str:
    """``"flash"``, ``"efficient"`` or ``"math"``: the kernel SDPA would run on an sm80+ GPU."""
    import torch

    half = q.dtype in (torch.float16, torch.bfloat16)
    dense = all(t.dim() == 4 and not t.is_nested and t.dtype == q.dtype
                and (t.stride(-1) == 1 or t.size(-1) == 1) for t in (q, k, v))
    if not dense or not (half or q.dtype == torch.float32):
        return "math"
    if attn_mask is not None and attn_mask.stride(-1) != 1:
        return "math"  # both fused kernels need a unit last-dim stride of the mask too
    dq, dk, dv = q.size(-1), k.size(-1), v.size(-1)
    if (half and attn_mask is None and dq == dk == dv <= 256
            and not (is_causal and q.size(-2) != k.size(-2))):
        return "flash"
    align = 8 if half else 4
    if dq == dk and dq % align == 0 and dv % align == 0:
        return "efficient"
    return "math"


def _additive(mask: Any, dtype: Any) -> Any:
    """A boolean mask as the additive float mask SDPA turns it into (True keeps a score)."""
    import torch

    if mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), -float("inf"))


def _as_bias(mask: Any, q: Any, k: Any) -> Any:
    """The additive, aligned, broadcast bias the memory-efficient kernel receives."""
    import torch.nn.functional as F

    mask = _additive(mask, q.dtype)
    aligned = mask.stride(-1) == 1 and all(s % BIAS_ALIGNMENT == 0 for s in mask.stride()[:-1])
    if not aligned:
        n = mask.size(-1)
        mask = F.pad(mask, (0, BIAS_ALIGNMENT - n % BIAS_ALIGNMENT))[..., :n]
    return mask.expand(q.size(0), q.size(1), q.size(2), k.size(2))


def _autocast(*tensors: Any) -> tuple[Any, ...]:
    """CUDA autocast runs SDPA in half precision; the trace's CPU autocast stands in for it."""
    import torch

    if not torch.is_autocast_enabled("cpu"):
        return tensors
    dtype = torch.get_autocast_dtype("cpu")
    return tuple(t.to(dtype) if t is not None and t.dtype == torch.float32 else t for t in tensors)


def _math_sdpa(q: Any, k: Any, v: Any, mask: Any, p: float, causal: bool, scale: Any) -> Any:
    """SDPA's math path as a GPU runs it: the CPU's, but with CUDA's dropout (a bool mask)."""
    import torch

    aten = torch.ops.aten
    s = scale if scale is not None else q.size(-1) ** -0.5
    f = abs(s) ** 0.5
    if causal:
        mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
    attn = (q * (f if s >= 0 else -f)) @ (k.transpose(-2, -1) * f)
    if mask is not None:
        attn.add_(_additive(mask, q.dtype))
    attn = aten._safe_softmax(attn, -1)
    if p > 0:
        attn = aten.native_dropout(attn, p, True)[0]
    return attn @ v


def fused_sdpa(
    query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
) -> Any:
    """SDPA as the GPU would run it, or ``None`` for inputs SDPA rejects (it then raises)."""
    import torch

    aten = torch.ops.aten
    q, k, v, mask = _autocast(query, key, value, attn_mask)
    if (q.is_nested or not (q.dtype == k.dtype == v.dtype) or (mask is not None and is_causal)
            or (mask is not None and mask.dtype not in (torch.bool, q.dtype))
            or not q.dim() == k.dim() == v.dim() >= 3
            or (q.size(-3) != k.size(-3) and not enable_gqa)):
        return None
    backend = gpu_backend(q, k, v, mask, is_causal)
    if backend == "flash":  # takes grouped-query key/value heads as they are
        return aten._scaled_dot_product_flash_attention(
            q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    if q.size(-3) != k.size(-3):  # grouped-query: repeat key/value heads, as the math path does
        k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), dim=-3)
    if backend == "math":
        return _math_sdpa(q, k, v, mask, dropout_p, is_causal, scale)
    bias = None if mask is None else _as_bias(mask, q, k)
    lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, lse, dropout_p, is_causal, scale=scale)[0]


def fused_dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """``F.dropout`` as CUDA runs it (``native_dropout``, bool mask), or ``None`` to leave it."""
    import torch

    if not training or inplace or not 0 < p < 1 or input.numel() == 0:
        return None
    return torch.ops.aten.native_dropout(input, p, True)[0]


@contextlib.contextmanager
def gpu_kernels() -> Iterator[None]:
    """While active, SDPA and dropout on fake tensors run what CUDA runs (see module doc).

    The ``torch.nn.functional`` attributes are replaced for the duration, not intercepted with
    a ``TorchFunctionMode``: autograd runs backward without the caller's function modes, so
    gradient checkpointing's recomputation would take the CPU's path and fail its check that
    recomputation saves what the forward pass saved. The replacements pass real tensors to the
    originals unchanged. Calls that bypass the attributes (a name imported before the trace,
    ``torch._C._nn``, ``torch.dropout``) keep the CPU's kernels. Nested use is a no-op; traces
    in several threads at once are not supported (one trace at a time per process).
    """
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensor

    def route(original: Any, fused: Any, first: str) -> Any:
        def routed(*args: Any, **kwargs: Any) -> Any:
            x = args[0] if args else kwargs.get(first)
            if isinstance(x, FakeTensor):
                out = fused(*args, **kwargs)
                if out is not None:
                    return out
            return original(*args, **kwargs)

        routed.routes_to_gpu_kernels = True  # type: ignore[attr-defined]
        return routed

    if getattr(F.dropout, "routes_to_gpu_kernels", False):  # nested: already in place
        yield
        return
    originals = {"scaled_dot_product_attention": F.scaled_dot_product_attention,
                 "dropout": F.dropout}
    F.scaled_dot_product_attention = route(F.scaled_dot_product_attention, fused_sdpa, "query")
    F.dropout = route(F.dropout, fused_dropout, "input")
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(F, name, fn)
