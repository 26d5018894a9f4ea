"""The traced estimator: fake-tensor trace -> allocator replay -> GPU overheads -> ``Estimate``.

Why: the live bytes of a step are only part of what a GPU job holds. We add what the CUDA
caching allocator reserves on top (rounding, segments, fragmentation), the cuBLAS workspaces it
also serves, a cuDNN allowance, and the CUDA context, and report each part separately so a
wrong number can be traced to its cause.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

from collocate.common.errors import CollocateError, InputError
from collocate.estimate import fused, gpu_overheads
from collocate.estimate.allocator import Alloc, Event, replay
from collocate.estimate.base import Estimate, breakdown_mib
from collocate.estimate.entrypoint import Workload, load
from collocate.estimate.trace import Trace, finish, make_tracker, training_step

#: Relative uncertainty of the traced reserved peak, before the context/workspace terms.
#: A prior, not a measurement: CPU and CUDA kernels can save different tensors (cuDNN batch
#: norm's reserve space, fused attention's extras) and CPU autocast lists differ from CUDA's.
TRACED_REL_UNCERTAINTY = 0.10

CUBLAS_KEYS = (-1, -2)


class TraceFailed(CollocateError):
    """The model could not be traced under fake tensors; a fallback may still answer."""


def _fake_modules() -> tuple[Any, Any]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map

    return FakeTensorMode, tree_map


def _to_fake(work: Workload, fake_mode: Any, tracker: Any) -> Workload:
    """Move a model built with real tensors onto fake ones, keeping tied weights tied."""
    import torch
    from torch import nn

    _, tree_map = _fake_modules()
    mapping: dict[int, Any] = {}
    for module in work.model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in mapping:
                fake = fake_mode.from_tensor(p.detach())  # outside the mode: p is real
                mapping[id(p)] = nn.Parameter(fake, requires_grad=p.requires_grad)
            module._parameters[name] = mapping[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake_mode.from_tensor(b)
    for group in work.optimizer.param_groups:
        group["params"] = [mapping.get(id(p), p) for p in group["params"]]
    work.optimizer.state.clear()

    def conv(t: Any) -> Any:
        return fake_mode.from_tensor(t) if isinstance(t, torch.Tensor) else t

    work.inputs = tree_map(conv, work.inputs)
    work.targets = conv(work.targets)
    for t in [*work.model.parameters(), *work.model.buffers()]:
        tracker.adopt(t)
    for t in _tensors(work.inputs) + _tensors(work.targets):
        tracker.adopt(t)
    return work


def _tensors(tree: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def trace_fake(
    entry: str | Callable[..., Any],
    batch_size: int,
    *,
    optimizer: str | None = None,
    precision: str = "fp32",
    gpu_kernels: bool = True,
) -> Trace:
    """Trace one training step of the entry point's model on fake CPU tensors.

    The entry point is first called under fake mode (no real memory at all); if it fails there
    it is called for real and its tensors converted. Input errors propagate; anything the model
    does that fake mode cannot run raises ``TraceFailed``. With ``gpu_kernels`` (the default)
    attention and dropout run the GPU's fused kernels (``fused.gpu_kernels``); without it, the
    CPU's kernels, as a plain FakeTensor profile would.
    """
    fake_cls, _ = _fake_modules()
    fake_mode = fake_cls()
    tracker = make_tracker()
    construction = "fake"
    try:
        with fake_mode, tracker:
            work = load(entry, batch_size, optimizer)
    except InputError:
        raise
    except Exception:
        fake_mode = fake_cls()
        tracker = make_tracker()
        construction = "converted"
        work = load(entry, batch_size, optimizer)
        work = _to_fake(work, fake_mode, tracker)
    routing = fused.gpu_kernels() if gpu_kernels else contextlib.nullcontext()
    try:
        with fake_mode, tracker, routing:
            training_step(work, precision, tracker)
    except InputError:
        raise
    except Exception as exc:
        raise TraceFailed(
            f"tracing under fake tensors failed: {type(exc).__name__}: {str(exc)[:300]}",
            hint="a fallback (cpu-run, analytical) can answer; or pass --mem",
        ) from exc
    return finish(tracker, work, construction)


def with_cublas_workspaces(trace: Trace, gpu: gpu_overheads.GpuType) -> list[Event]:
    """The timeline with the two cuBLAS workspaces allocated when the forward pass starts."""
    at = trace.markers.get("forward", 0)
    ws = [Alloc(k, gpu.cublas_workspace_bytes) for k in CUBLAS_KEYS]
    return trace.events[:at] + ws + trace.events[at:]


def live_by_category(events: list[Event], upto: int, categories: dict[int, str]) -> dict[str, int]:
    """Requested bytes alive just after event ``upto``, summed per category."""
    live: dict[int, int] = {}
    for ev in events[: upto + 1]:
        if isinstance(ev, Alloc):
            live[ev.key] = ev.nbytes
        else:
            live.pop(ev.key, None)
    out = {"parameters": 0, "gradients": 0, "optimizer_state": 0, "activations": 0, "cublas": 0}
    for key, n in live.items():
        cat = "cublas" if key in CUBLAS_KEYS else categories.get(key, "activations")
        out[cat] += n
    return out


def estimate_from_trace(
    trace: Trace,
    gpu: gpu_overheads.GpuType,
    *,
    method: str = "traced",
    rel_uncertainty: float = TRACED_REL_UNCERTAINTY,
    note: str = "",
    allocator: str = "default",
) -> Estimate:
    """Replay a trace through the allocator model and add the GPU's overheads.

    ``allocator`` is the job's PyTorch allocator mode (``gpu_overheads.ALLOCATORS``): with
    expandable segments the same tensors reserve up to a third less (module docstring there).
    """
    events = with_cublas_workspaces(trace, gpu)
    result = replay(events, capacity_bytes=gpu.total_mib * (1 << 20),
                    expandable=allocator == "expandable")
    parts = live_by_category(events, result.peak_allocated_index, trace.categories)
    cublas = parts.pop("cublas")
    cudnn = gpu_overheads.cudnn_workspace_bytes(trace.largest_conv_bytes)
    ctx = gpu.context_mib * (1 << 20)
    handed_out = sum(parts.values()) + cublas + cudnn
    overhead = max(result.peak_reserved - result.live_requested_at_peak,
                   (gpu_overheads.reserved_over_allocated(allocator) - 1) * handed_out, 0)
    breakdown = {
        **parts,
        "allocator_overhead": overhead,
        "workspace": cublas + cudnn,
        "context": ctx,
    }
    total = sum(breakdown.values())
    sigma = math.sqrt(
        (rel_uncertainty * result.peak_reserved) ** 2
        + (gpu.context_uncertainty_mib * (1 << 20)) ** 2
        + float(cudnn) ** 2
    )
    notes = [note] if note else []
    if result.oom:
        notes.append(f"exceeds a {gpu.name} ({gpu.total_mib} MiB): the job would run out of memory")
    return Estimate(
        mib=round(total / (1 << 20), 1),
        method=method,
        uncertainty=round(sigma / total, 3),
        breakdown=breakdown_mib(breakdown),
        note="; ".join(notes),
        details={
            "gpu": gpu.name,
            "allocator": allocator,
            "peak_allocated_mib": round(result.peak_allocated / (1 << 20), 1),
            "peak_reserved_mib": round(result.peak_reserved / (1 << 20), 1),
            "segments": result.segments,
            "events": len(events),
            "construction": trace.construction,
        },
    )
