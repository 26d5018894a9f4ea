"""The one interface through which the scheduler and daemon get a job's memory.

Why: DESIGN.md asks that the scheduler never care which estimator answered, and that measured
history beat static estimates. A provider answers an ``EstimateRequest`` with an ``Estimate``,
``None`` ("not applicable": no signature, no entry point, no --mem) or an exception.
``ChainProvider`` asks history, then the static estimator, then the user's declared ``--mem``,
and it never raises: when nobody answers it returns ``Estimate.none(...)`` saying the job needs
``--mem`` or a GPU of its own. The daemon therefore cannot crash because an estimate failed.

``HistoryProvider`` takes a plain callable ``signature -> measured peak MiB | None`` so it knows
nothing of the job store (SQLite); ``job_signature`` builds the key both sides should use.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from collocate.common.errors import CollocateError, InputError
from collocate.estimate.base import Estimate

#: Relative uncertainty given to a measured peak from history (run-to-run variation; a prior).
HISTORY_UNCERTAINTY = 0.05
#: Seconds an isolated static estimate may take before the provider gives up.
STATIC_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class EstimateRequest:
    """What is known about a job when it is submitted."""

    signature: str | None = None
    entry_point: str | None = None
    batch_size: int | None = None
    optimizer: str | None = None
    precision: str = "fp32"
    gpu: str | None = None
    declared_mib: float | None = None
    workdir: str | None = None  # where the entry point's module is importable from (submit cwd)
    allocator: str = "default"  # the job's PyTorch allocator mode (from its PYTORCH_CUDA_ALLOC_CONF)


def job_signature(
    entry_point: str, batch_size: int, optimizer: str | None = None, precision: str = "fp32"
) -> str:
    """A stable key for "the same job" in the history: entry point + batch + optimizer + precision."""
    return f"{entry_point}|bs={batch_size}|opt={optimizer or 'entry'}|prec={precision}"


@runtime_checkable
class EstimateProvider(Protocol):
    """Anything that can estimate a job's peak GPU memory."""

    name: str

    def estimate(self, request: EstimateRequest) -> Estimate | None: ...


class HistoryProvider:
    """Measured peaks of earlier runs with the same signature (NVML per-process peak, MiB)."""

    name = "history"

    def __init__(self, lookup: Callable[[str], float | None]) -> None:
        self._lookup = lookup

    def estimate(self, request: EstimateRequest) -> Estimate | None:
        if request.signature is None:
            return None
        mib = self._lookup(request.signature)
        if mib is None:
            return None
        if not (isinstance(mib, int | float) and math.isfinite(mib) and mib > 0):
            raise InputError(f"history holds an invalid peak {mib!r} for {request.signature!r}")
        return Estimate(
            mib=float(mib),
            method="history",
            uncertainty=HISTORY_UNCERTAINTY,
            note=f"measured peak of an earlier run of {request.signature}",
        )


class StaticProvider:
    """The static estimator (trace, then fallbacks).

    ``isolated=True`` (what a daemon should use) runs it in a child process,
    ``python -m collocate.cli estimate ... --format json``, with a timeout, so the user's code
    is never imported into the daemon and a crash or hang there costs only the child.
    """

    name = "static"

    def __init__(
        self,
        *,
        isolated: bool = False,
        timeout_s: float = STATIC_TIMEOUT_S,
        gpu: str | None = None,
    ) -> None:
        self.isolated, self.timeout_s, self.gpu = isolated, timeout_s, gpu

    def estimate(self, request: EstimateRequest) -> Estimate | None:
        if request.entry_point is None or request.batch_size is None:
            return None
        gpu = request.gpu or self.gpu
        if self.isolated:
            return self._in_child(request, gpu)
        from collocate.estimate.api import estimate_memory

        return estimate_memory(
            request.entry_point,
            batch_size=request.batch_size,
            optimizer=request.optimizer,
            precision=request.precision,
            gpu=gpu,
            allocator=request.allocator,
        )

    def _in_child(self, request: EstimateRequest, gpu: str | None) -> Estimate:
        argv = [sys.executable, "-m", "collocate.cli", "estimate", str(request.entry_point),
                "--batch-size", str(request.batch_size), "--precision", request.precision,
                "--allocator", request.allocator, "--format", "json"]
        if request.optimizer:
            argv += ["--optimizer", request.optimizer]
        if gpu:
            argv += ["--gpu", gpu]
        try:
            # ``python -m`` puts the working directory on sys.path, like running from there.
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s,
                                  check=False, cwd=request.workdir)
        except subprocess.TimeoutExpired as exc:
            raise CollocateError(
                f"static estimate took longer than {self.timeout_s:.0f} s",
                hint="pass --mem, or run `collocate estimate` yourself to see why",
            ) from exc
        if proc.returncode != 0:
            msg = proc.stderr.strip().splitlines()
            raise CollocateError(
                f"static estimate failed (exit {proc.returncode}): "
                + (" ".join(msg[-3:]) if msg else "no message"),
                hint="run the same `collocate estimate` command to see the full error",
            )
        return estimate_from_json(proc.stdout)


def estimate_from_json(text: str) -> Estimate:
    """Parse the ``--format json`` output of ``collocate estimate`` back into an ``Estimate``."""
    d = json.loads(text)
    return Estimate(
        mib=float(d["mib"]),
        method=d["method"],
        uncertainty=float(d["uncertainty"]),
        breakdown={k: float(v) for k, v in d.get("breakdown", {}).items()},
        note=d.get("note", ""),
        details=d.get("details", {}),
    )


class DeclaredProvider:
    """The user's own ``--mem`` (MiB), trusted as given."""

    name = "declared"

    def estimate(self, request: EstimateRequest) -> Estimate | None:
        if request.declared_mib is None:
            return None
        if not (math.isfinite(request.declared_mib) and request.declared_mib > 0):
            raise InputError(f"--mem must be a positive number of MiB, got {request.declared_mib}")
        return Estimate(float(request.declared_mib), "declared", 0.0, note="declared with --mem")


class ChainProvider:
    """Ask providers in order; the first ``Estimate`` wins; never raises.

    ``on_error(provider_name, exception)`` is called for every provider that failed, so the
    daemon can log it; failures also appear in the returned estimate's ``note``.
    """

    name = "chain"

    def __init__(
        self,
        providers: Sequence[EstimateProvider],
        *,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.providers = tuple(providers)
        self.on_error = on_error

    def estimate(self, request: EstimateRequest) -> Estimate:
        failures: list[str] = []
        for p in self.providers:
            try:
                est = p.estimate(request)
            except (Exception, SystemExit) as exc:
                failures.append(f"{p.name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
                if self.on_error is not None:
                    try:
                        self.on_error(p.name, exc)
                    except Exception:
                        pass
                continue
            if est is not None:
                if failures:
                    extra = "; ".join(failures)
                    est = Estimate(est.mib, est.method, est.uncertainty, est.breakdown,
                                   f"{est.note}; earlier providers failed: {extra}".lstrip("; "),
                                   est.details)
                return est
        why = "; ".join(failures) if failures else "no entry point, history or --mem"
        return Estimate.none(
            f"no memory estimate ({why}): pass --mem MiB, or the job waits for a GPU of its own"
        )


def default_chain(
    history: Callable[[str], float | None] | None = None,
    *,
    isolated: bool = True,
    gpu: str | None = None,
    on_error: Callable[[str, BaseException], None] | None = None,
) -> ChainProvider:
    """History (when a lookup is given) -> static estimator -> declared ``--mem``."""
    chain: list[EstimateProvider] = []
    if history is not None:
        chain.append(HistoryProvider(history))
    chain += [StaticProvider(isolated=isolated, gpu=gpu), DeclaredProvider()]
    return ChainProvider(chain, on_error=on_error)
