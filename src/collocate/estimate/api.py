"""Public API: ``estimate_memory`` picks the best method that works and says which answered.

Order: trace on fake tensors (accurate, about a second) -> the fallbacks the caller allows,
in order: ``cpu-run`` (real CPU steps at tiny batches, extrapolated) and ``analytical``
(formula). When every method fails the error lists each failure and the way out (``--mem``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from collocate.common.errors import CollocateError, InputError, UnknownNameError
from collocate.estimate.base import Estimate
from collocate.estimate.entrypoint import (
    OPTIMIZERS,
    PRECISIONS,
    check_batch_size,
    check_choice,
)
from collocate.estimate.gpu_overheads import ALLOCATORS, gpu_type

FALLBACKS = ("cpu-run", "analytical")
DEFAULT_FALLBACKS: tuple[str, ...] = FALLBACKS

EntryPoint = str | Callable[..., Any]


def _check_fallbacks(fallbacks: Sequence[str]) -> tuple[str, ...]:
    for f in fallbacks:
        if f not in FALLBACKS:
            raise UnknownNameError("fallback", f, FALLBACKS)
    return tuple(fallbacks)


def estimate_memory(
    entry_point: EntryPoint,
    *,
    batch_size: int,
    optimizer: str | None = None,
    precision: str = "fp32",
    gpu: str | None = None,
    fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
    allocator: str | None = None,
) -> Estimate:
    """Estimate the peak GPU memory (MiB, as NVML would show for the process) of training.

    ``entry_point`` is ``"pkg.module:function"`` or a callable taking ``batch_size=``;
    ``optimizer`` (sgd/adam/adamw) replaces the one the entry point returns; ``precision`` is
    fp32, fp16 (AMP) or bf16 (AMP); ``gpu`` names a GPU type (see ``gpu_overheads.GPU_TYPES``);
    ``allocator`` is the job's PyTorch allocator mode, ``default`` or ``expandable``
    (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; ``gpu_overheads.allocator_from_conf``
    reads it from an environment). Raises ``CollocateError`` with a hint when no method can answer.
    """
    from collocate.estimate.static import TraceFailed, estimate_from_trace, trace_fake

    batch_size = check_batch_size(batch_size)
    opt = check_choice("optimizer", optimizer, OPTIMIZERS)
    prec = check_choice("precision", precision, PRECISIONS) or "fp32"
    g = gpu_type(gpu)
    alloc = check_choice("allocator", allocator, ALLOCATORS) or "default"
    allowed = _check_fallbacks(fallbacks)
    failures: list[str] = []
    try:
        trace = trace_fake(entry_point, batch_size, optimizer=opt, precision=prec)
        est = estimate_from_trace(trace, g, allocator=alloc)
        if alloc == "default":  # what the job would need with expandable segments (a replay: ms)
            other = estimate_from_trace(trace, g, allocator="expandable")
            est = replace(est, details={**est.details, "expandable_mib": other.mib})
        return est
    except TraceFailed as exc:
        failures.append(f"traced: {exc.args[0]}")
    for name in allowed:
        try:
            return _run_fallback(name, entry_point, batch_size, opt, prec, g, alloc, failures)
        except InputError:
            raise
        except TraceFailed as exc:
            failures.append(f"{name}: {exc.args[0]}")
    raise CollocateError(
        "no estimation method could handle this model:\n    " + "\n    ".join(failures),
        hint="pass --mem MiB with the job (or measure it once alone on a GPU); "
        + ("allowed fallbacks: " + ", ".join(allowed) if allowed else "no fallback was allowed; "
           f"allow one of {', '.join(FALLBACKS)}"),
    )


def _run_fallback(
    name: str, entry: EntryPoint, batch_size: int, opt: str | None, prec: str, g: Any,
    allocator: str, failures: list[str],
) -> Estimate:
    from collocate.estimate.analytical import estimate_analytical
    from collocate.estimate.cpurun import estimate_cpu_run

    fn = estimate_cpu_run if name == "cpu-run" else estimate_analytical
    est = fn(entry, batch_size, optimizer=opt, precision=prec, gpu=g, allocator=allocator)
    why = "; ".join(failures)
    note = f"{est.note}; fell back because {why}" if est.note else f"fell back because {why}"
    return Estimate(est.mib, est.method, est.uncertainty, est.breakdown, note, est.details)


def estimate_baselines(
    entry_point: EntryPoint, *, batch_size: int, precision: str = "fp32"
) -> dict[str, Estimate | str]:
    """The Horus and FakeTensor baselines; a failing one maps to its error text."""
    from collocate.estimate.baselines import estimate_faketensor, estimate_horus

    batch_size = check_batch_size(batch_size)
    prec = check_choice("precision", precision, PRECISIONS) or "fp32"
    out: dict[str, Estimate | str] = {}
    for name, fn in (
        ("horus", lambda: estimate_horus(entry_point, batch_size)),
        ("faketensor", lambda: estimate_faketensor(entry_point, batch_size, precision=prec)),
    ):
        try:
            out[name] = fn()
        except CollocateError as exc:
            out[name] = str(exc.args[0])
    return out
