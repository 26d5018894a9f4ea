"""The two published baselines, reproduced the way CARMA used them, for comparison only.

* **Horus** (Yeung et al.), as implemented in CARMA's ``ehsan-horus_estimator.py``:
  ``bytes = 4 * (activations * batch + params + batch * params)``, where ``activations`` is the
  per-sample element count of all layer outputs (torchsummary's output shapes) and ``params``
  the parameter count. The ``batch * params`` term is why it explodes on large models.
* **FakeTensor peak**, as CARMA's workload scripts measured it: a dispatch mode counting the
  live fake-tensor bytes through forward and backward of the first iteration, reporting the
  peak (no optimizer state, no allocator rounding or caching, no CUDA context), with the CPU's
  attention and dropout kernels (no ``fused.gpu_kernels``).

Neither is used for scheduling; ``benchmarks/gpu/estimator_report.py`` compares them with ours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collocate.common.errors import CollocateError
from collocate.estimate.allocator import Alloc
from collocate.estimate.base import MIB, Estimate
from collocate.estimate.entrypoint import call, resolve, validate
from collocate.estimate.static import TraceFailed
from collocate.estimate.trace import Trace, as_args


def horus_mib(activations_per_sample: float, params: float, batch_size: int) -> float:
    """The Horus formula as CARMA implemented it, in MiB (pure)."""
    return 4.0 * (activations_per_sample * batch_size + params + batch_size * params) / MIB


def _leaf_output_elements(model: Any, inputs: Any) -> int:
    import torch
    from torch.utils._pytree import tree_flatten

    total = 0

    def hook(_m: Any, _i: Any, out: Any) -> None:
        nonlocal total
        total += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        args, kwargs = as_args(inputs)
        with torch.no_grad():
            model.eval()
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return total


def estimate_horus(entry: str | Callable[..., Any], batch_size: int) -> Estimate:
    """Horus baseline: one batch-1 forward pass on CPU for the layer output sizes."""
    try:
        work = validate(call(resolve(entry), 1))  # the formula ignores the optimizer
        acts = _leaf_output_elements(work.model, work.inputs)
    except CollocateError:
        raise
    except Exception as exc:
        raise TraceFailed(f"horus: batch-1 forward failed: {exc}", hint="pass --mem") from exc
    params = sum(p.numel() for p in work.model.parameters())
    mib = horus_mib(acts, params, batch_size)
    return Estimate(
        mib=round(mib, 3),
        method="horus",
        uncertainty=0.0,
        note="baseline (Horus formula as in CARMA); not used for scheduling",
        details={"activations_per_sample": acts, "params": params},
    )


def faketensor_peak_bytes(trace: Trace) -> int:
    """Peak live requested bytes over forward and backward, without optimizer state.

    This is the plain FakeTensor number: no allocator rounding or caching, no optimizer state
    (CARMA profiled the first iteration, before the optimizer's state exists), no context.
    """
    start, stop = trace.markers["forward"], trace.markers["step"]
    live: dict[int, int] = {}
    current = peak = 0
    for i, ev in enumerate(trace.events[:stop]):
        if isinstance(ev, Alloc):
            if trace.categories.get(ev.key) == "optimizer_state" or ev.key in live:
                continue
            live[ev.key] = ev.nbytes
            current += ev.nbytes
        else:
            current -= live.pop(ev.key, 0)
        if i >= start:
            peak = max(peak, current)
    return peak


def estimate_faketensor(
    entry: str | Callable[..., Any] | None = None,
    batch_size: int | None = None,
    *,
    trace: Trace | None = None,
    precision: str = "fp32",
) -> Estimate:
    """FakeTensor baseline; reuses ``trace`` when the traced estimator already made one."""
    if trace is None:
        from collocate.estimate.static import trace_fake

        if entry is None or batch_size is None:
            raise ValueError("pass a trace, or an entry point and a batch size")
        trace = trace_fake(entry, batch_size, precision=precision, gpu_kernels=False)
    mib = faketensor_peak_bytes(trace) / MIB
    return Estimate(
        mib=round(max(mib, 0.001), 3),
        method="faketensor",
        uncertainty=0.0,
        note="baseline (peak live fake-tensor bytes, forward+backward, as in CARMA); not for scheduling",
    )
