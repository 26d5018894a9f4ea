"""Sample one GPU through a ``GpuBackend`` while a scenario runs, and summarise a time window.

Why through the backend interface: the same code reads NVML on a real GPU and the emulated
backend in CPU tests, and every NVML call stays in ``collocate.gpus.nvml``. Metrics a backend
cannot read are None in its samples; the summary keeps them None (never a made-up zero), so a
table shows "n/a" where, e.g., GPM is unsupported.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from collocate.gpus.base import DeviceSample, GpuBackend

DEFAULT_PERIOD_S = 0.5


class BenchSampler:
    """A background thread calling ``backend.sample()`` every ``period_s`` for one device."""

    def __init__(self, backend: GpuBackend, uuid: str, *, period_s: float = DEFAULT_PERIOD_S) -> None:
        self.backend, self.uuid, self.period_s = backend, uuid, period_s
        self.samples: list[DeviceSample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)

    def __enter__(self) -> BenchSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10 * self.period_s + 5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for s in self.backend.sample():
                    if s.uuid == self.uuid:
                        self.samples.append(s)
            except Exception as exc:
                if len(self.errors) < 20:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.period_s)

    def between(self, start: float, end: float) -> list[DeviceSample]:
        return [s for s in self.samples if start <= s.time <= end]


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def summarize(samples: Sequence[DeviceSample], pids: Sequence[int] = ()) -> dict[str, Any]:
    """Means over a window (activity, utilization, power), energy from the counter, memory maxima.

    Energy is the difference of the monotonic counter between the first and last sample; when
    the device has no counter it is the integral of power (trapezoid), marked in
    ``energy_source``. ``process_mem_mib`` is the largest NVML memory seen per pid of ``pids``
    (all pids when empty).
    """
    out: dict[str, Any] = {"n_samples": len(samples)}
    for field in ("sm_activity", "sm_occupancy", "dram_activity", "gpu_util", "power_watts"):
        out[field] = _mean([getattr(s, field) for s in samples])
    out["used_mib_max"] = max((s.used_mib for s in samples), default=None)
    out["window_s"] = samples[-1].time - samples[0].time if len(samples) > 1 else 0.0
    energy: float | None = None
    source: str | None = None
    if len(samples) > 1:
        first, last = samples[0].energy_joules, samples[-1].energy_joules
        watts = [s.power_watts for s in samples if s.power_watts is not None]
        if first is not None and last is not None:
            energy, source = last - first, "counter"
        elif len(watts) == len(samples):  # every sample has its power
            energy = sum(
                (b.time - a.time) * (wa + wb) / 2.0
                for a, b, wa, wb in zip(samples, samples[1:], watts, watts[1:], strict=False)
            )
            source = "power integral"
    out["energy_joules"], out["energy_source"] = energy, source
    wanted = set(pids)
    per_pid: dict[int, float] = {}
    for s in samples:
        for p in s.processes:
            if not wanted or p.pid in wanted:
                per_pid[p.pid] = max(per_pid.get(p.pid, 0.0), p.used_mib)
    out["process_mem_mib"] = {str(pid): mib for pid, mib in sorted(per_pid.items())}
    return out


def sample_dict(s: DeviceSample) -> dict[str, Any]:
    """A sample as JSON (for the raw time series file)."""
    d = asdict(s)
    d["processes"] = [asdict(p) for p in s.processes]
    return d
