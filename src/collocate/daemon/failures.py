"""Classify how a job's process ended, from its exit status and the tail of its stderr.

Pure and table-tested. Only real out-of-memory messages count as OOM (CARMA treated every
non-zero exit as one, so a job with a bug was retried forever): the patterns below are the
messages PyTorch, cuBLAS/cuDNN, the CUDA runtime, TensorFlow/XLA and JAX print when a GPU
allocation fails.
"""

from __future__ import annotations

import re
import signal

from collocate.core.recovery import Outcome
from collocate.node.runner import TAIL_BYTES  # noqa: F401 - re-exported: the classified tail

OOM_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(rx, re.IGNORECASE))
    for label, rx in (
        ("CUDA out of memory", r"CUDA out of memory"),
        ("torch.OutOfMemoryError", r"(torch\.(cuda\.)?)?OutOfMemoryError"),
        ("CUBLAS_STATUS_ALLOC_FAILED", r"CUBLAS_STATUS_ALLOC_FAILED"),
        ("CUDNN_STATUS_ALLOC_FAILED", r"CUDNN_STATUS_(ALLOC_FAILED|NOT_ENOUGH_WORKSPACE)"),
        ("cudaErrorMemoryAllocation", r"cudaErrorMemoryAllocation"),
        ("CUDA_ERROR_OUT_OF_MEMORY", r"CUDA_ERROR_OUT_OF_MEMORY"),
        ("RESOURCE_EXHAUSTED", r"RESOURCE_EXHAUSTED"),
        ("NCCL out of memory", r"NCCL.*(unhandled cuda error|out of memory)"),
        ("failed to allocate (XLA/JAX)", r"(Failed|Out of memory while trying) to allocate .*(GPU|device)"),
    )
)



def oom_match(stderr_tail: str) -> str | None:
    """The label of the first out-of-memory pattern found in ``stderr_tail``, if any."""
    for label, pattern in OOM_PATTERNS:
        if pattern.search(stderr_tail):
            return label
    return None


def classify(returncode: int | None, stderr_tail: str, *, cancelled: bool = False) -> tuple[Outcome, str]:
    """The outcome of an attempt and a one-line reason a user can read.

    ``returncode`` follows ``subprocess``: negative for a signal, None when unknown (the
    process vanished without an exit record). A job the user cancelled is CANCELLED whatever
    its status; an OOM message wins over the exit status because some frameworks exit 0 or
    abort after printing it.
    """
    if cancelled:
        return Outcome.CANCELLED, "cancelled by the user"
    if returncode is None:
        return Outcome.LOST, "the job's process vanished without an exit record"
    label = oom_match(stderr_tail)
    if label is not None and returncode != 0:
        return Outcome.OOM, f"out of GPU memory ({label}), exit {describe_status(returncode)}"
    if returncode == 0:
        return Outcome.SUCCEEDED, "exited 0"
    line = last_error_line(stderr_tail)
    detail = f": {line}" if line else ""
    return Outcome.FAILED, f"exited with {describe_status(returncode)}{detail}"


def describe_status(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{name} (killed by a signal)"
    return f"status {returncode}"


def last_error_line(stderr_tail: str, limit: int = 200) -> str:
    """The last non-empty stderr line, shortened: usually the exception message."""
    for line in reversed(stderr_tail.splitlines()):
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


_SIZE_UNITS = {"bytes": 1 / (1024 * 1024), "kib": 1 / 1024, "mib": 1.0, "gib": 1024.0, "tib": 1024.0**2}
_TRIED = re.compile(r"Tried to allocate ([\d.]+) ?(bytes|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_HELD = re.compile(r"this process has ([\d.]+) ?(bytes|KiB|MiB|GiB|TiB) memory in use", re.IGNORECASE)


def oom_lower_bound_mib(stderr_tail: str) -> float | None:
    """What PyTorch's OOM message proves the job needed: held + tried-to-allocate, in MiB.

    A job that dies on its first big allocation was never seen holding memory by the monitor;
    PyTorch's message still says how much it asked for, which is a better lower bound for the
    raised requirement than nothing. Uses the last such message in the tail.
    """
    tried = _TRIED.findall(stderr_tail)
    if not tried:
        return None
    value, unit = tried[-1]
    total = float(value) * _SIZE_UNITS[unit.lower()]
    held = _HELD.findall(stderr_tail)
    if held:
        value, unit = held[-1]
        total += float(value) * _SIZE_UNITS[unit.lower()]
    return total
