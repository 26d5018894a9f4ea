"""Fallback 2: a formula from parameter counts and batch-1 activation sizes.

Why: the cheapest answer that still sees the model. It needs only one real forward pass at
batch 1 without autograd (so it works when backward or the optimizer cannot be traced, and
costs milliseconds), and it is deliberately generous because it cannot see what backward keeps.

    params + grads + optimizer state (+ one foreach temporary for Adam/AdamW)
    + ACTIVATION_FACTOR * batch * (bytes of all leaf-module outputs at batch 1)
    then * gpu_overheads.reserved_over_allocated(allocator) for the caching allocator, plus workspace
    and context.

The activation factor is an assumption, not a fit: autograd saves roughly each layer's input or
output once (factor 1) and backward briefly holds gradients of the largest activations on top
(+50%). The allocator's share is the one the traced estimator uses as its floor, measured on an
H100 (reserved / allocated peak, median 1.14).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from collocate.common.errors import CollocateError
from collocate.estimate import gpu_overheads
from collocate.estimate.base import Estimate, breakdown_mib
from collocate.estimate.entrypoint import load
from collocate.estimate.static import TraceFailed
from collocate.estimate.trace import as_args, autocast_for

ACTIVATION_FACTOR = 1.5
ANALYTICAL_REL_UNCERTAINTY = 0.35


def leaf_output_bytes(model: Any, inputs: Any, precision: str = "fp32") -> int:
    """Bytes of every leaf module's tensor outputs for one forward pass (no autograd)."""
    import torch
    from torch.utils._pytree import tree_flatten

    total = 0

    def hook(_m: Any, _i: Any, out: Any) -> None:
        nonlocal total
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    was_training = model.training
    try:
        model.eval()  # batch-1 BatchNorm refuses train mode on 1x1 maps; shapes are the same
        args, kwargs = as_args(inputs)
        with torch.no_grad(), autocast_for(precision):
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return total


def optimizer_state_factor(optimizer: Any) -> tuple[float, float]:
    """(persistent state, per-step temporaries) as multiples of the parameter bytes."""
    import torch

    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return 2.0, 1.0
    if isinstance(optimizer, torch.optim.SGD):
        momentum = any(g.get("momentum", 0) for g in optimizer.param_groups)
        return (1.0 if momentum else 0.0), 0.0
    return 2.0, 1.0  # unknown optimizers: assume Adam-like, the conservative side


def estimate_analytical(
    entry: str | Callable[..., Any],
    batch_size: int,
    *,
    optimizer: str | None = None,
    precision: str = "fp32",
    gpu: gpu_overheads.GpuType,
    allocator: str = "default",
) -> Estimate:
    """The ``analytical`` estimate (see the module docstring for the formula)."""
    try:
        work = load(entry, 1, optimizer)
        act1 = leaf_output_bytes(work.model, work.inputs, precision)
    except CollocateError:
        raise
    except Exception as exc:
        raise TraceFailed(
            f"analytical: a batch-1 forward pass on CPU failed: {type(exc).__name__}: {exc}",
            hint="make the model run on CPU, or pass --mem",
        ) from exc
    params = sum(p.numel() * p.element_size() for p in work.model.parameters())
    params += sum(b.numel() * b.element_size() for b in work.model.buffers())
    trainable = sum(p.numel() * p.element_size() for p in work.model.parameters() if p.requires_grad)
    state_f, temp_f = optimizer_state_factor(work.optimizer)
    acts = ACTIVATION_FACTOR * batch_size * act1 + temp_f * trainable
    tensors = params + trainable + state_f * trainable + acts
    overhead = (gpu_overheads.reserved_over_allocated(allocator) - 1) * tensors
    ws = gpu_overheads.CUBLAS_HANDLES_PER_STEP * gpu.cublas_workspace_bytes
    ctx = gpu.context_mib * (1 << 20)
    parts = {
        "parameters": params,
        "gradients": trainable,
        "optimizer_state": state_f * trainable,
        "activations": acts,
        "allocator_overhead": overhead,
        "workspace": ws,
        "context": ctx,
    }
    total = sum(parts.values())
    sigma = math.hypot(ANALYTICAL_REL_UNCERTAINTY * (tensors + overhead),
                       gpu.context_uncertainty_mib * (1 << 20))
    return Estimate(
        mib=round(total / (1 << 20), 1),
        method="analytical",
        uncertainty=round(sigma / total, 3),
        breakdown=breakdown_mib(parts),
        note="formula from parameter count and batch-1 activation sizes",
        details={"gpu": gpu.name, "allocator": allocator, "activation_bytes_batch1": act1},
    )
