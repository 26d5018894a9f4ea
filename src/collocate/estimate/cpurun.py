"""Fallback 1: real CPU training steps at small batch sizes, extrapolated to the asked batch.

Why: some models do things fake tensors cannot (data-dependent control flow such as
``.item()``, ``nonzero``). Running them for real is exact but a real step at the full batch
could take minutes and gigabytes of host memory, so we run two tiny batches (``b1`` < ``b2``),
check that both produced the same allocation sequence, extrapolate every allocation's size
linearly in the batch size, and replay the extrapolated timeline through the allocator model
like a traced one. If the two timelines differ (batch-dependent control flow) we refuse rather
than guess, and the next fallback answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collocate.common.errors import CollocateError, InputError
from collocate.estimate import gpu_overheads
from collocate.estimate.allocator import Alloc, Event, Free
from collocate.estimate.base import Estimate
from collocate.estimate.entrypoint import load
from collocate.estimate.static import TraceFailed, estimate_from_trace
from collocate.estimate.trace import Trace, finish, make_tracker, training_step

#: Relative uncertainty of the extrapolated reserved peak (a prior, not a measurement).
CPU_RUN_REL_UNCERTAINTY = 0.15
#: Largest batch a calibration run uses; keeps a ResNet-50 step to a few seconds on 2 cores.
MAX_CALIBRATION_BATCH = 4


def trace_real(
    entry: str | Callable[..., Any], batch_size: int, *, optimizer: str | None, precision: str
) -> Trace:
    """Run one real training step on CPU and record its storage timeline."""
    tracker = make_tracker()
    try:
        with tracker:
            work = load(entry, batch_size, optimizer)
            training_step(work, precision, tracker)
    except CollocateError:
        raise
    except Exception as exc:
        raise TraceFailed(
            f"a real CPU training step at batch {batch_size} failed: {type(exc).__name__}: "
            f"{str(exc)[:300]}",
            hint="make the entry point's model run on CPU, or pass --mem",
        ) from exc
    return finish(tracker, work, "real")


def calibration_batches(batch_size: int) -> tuple[int, ...]:
    """Batch sizes to run: the batch itself when it is small, else two small ones."""
    if batch_size <= MAX_CALIBRATION_BATCH:
        return (batch_size,)
    return (MAX_CALIBRATION_BATCH // 2, MAX_CALIBRATION_BATCH)


def extrapolate(a: Trace, b: Trace, ba: int, bb: int, target: int) -> Trace:
    """Linear extrapolation of two aligned timelines (batch ``ba`` and ``bb``) to ``target``."""
    if len(a.events) != len(b.events):
        raise TraceFailed(
            f"cpu-run: the step at batch {ba} made {len(a.events)} allocations/frees but at "
            f"batch {bb} {len(b.events)}; the model's control flow depends on the batch",
            hint="pass --mem, or make the entry point trace under fake tensors",
        )
    scale = (target - ba) / (bb - ba)
    events: list[Event] = []
    sizes: dict[int, int] = {}
    for ea, eb in zip(a.events, b.events, strict=True):
        if type(ea) is not type(eb) or ea.key != eb.key:
            raise TraceFailed(
                "cpu-run: allocation sequences differ between calibration batches",
                hint="pass --mem, or make the entry point trace under fake tensors",
            )
        if isinstance(ea, Alloc) and isinstance(eb, Alloc):
            n = max(1, round(ea.nbytes + (eb.nbytes - ea.nbytes) * scale))
            sizes[ea.key] = n
            events.append(Alloc(ea.key, n))
        else:
            events.append(Free(ea.key))
    conv = max(0, round(a.largest_conv_bytes + (b.largest_conv_bytes - a.largest_conv_bytes) * scale))
    return Trace(
        events=events,
        sizes=sizes,
        markers=dict(b.markers),
        categories=dict(b.categories),
        largest_conv_bytes=conv,
        conv_ops=b.conv_ops,
        construction="real",
    )


def estimate_cpu_run(
    entry: str | Callable[..., Any],
    batch_size: int,
    *,
    optimizer: str | None = None,
    precision: str = "fp32",
    gpu: gpu_overheads.GpuType,
    allocator: str = "default",
) -> Estimate:
    """The ``cpu-run`` estimate: measured small steps, extrapolated, through the allocator."""
    batches = calibration_batches(batch_size)
    traces = [trace_real(entry, n, optimizer=optimizer, precision=precision) for n in batches]
    if len(traces) == 1:
        trace, note = traces[0], f"measured at batch {batch_size} on CPU"
    else:
        trace = extrapolate(traces[0], traces[1], batches[0], batches[1], batch_size)
        note = f"extrapolated from CPU steps at batch {batches[0]} and {batches[1]}"
    if not trace.events:
        raise InputError("cpu-run recorded no allocations", hint="check the entry point")
    return estimate_from_trace(
        trace, gpu, method="cpu-run", rel_uncertainty=CPU_RUN_REL_UNCERTAINTY, note=note,
        allocator=allocator,
    )
