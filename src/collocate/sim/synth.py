"""A seeded generator of large synthetic traces shaped like published cluster traces.

Shapes (parameters below, each with its source; the exact figures are approximations read from
the papers' plots, not the raw traces, which are not available offline):

* arrivals: a Poisson process whose rate follows a day/night cycle (Philly, Jeon et al. ATC'19,
  Fig. 2: submissions peak in working hours); the mean rate is set so the offered load is
  ``load`` times the cluster's GPU capacity;
* GPUs per job: mostly 1, a tail of 2/4/8 (Philly: most jobs use one GPU);
* duration: log-normal, median 20 min, heavy tail (Philly: median minutes, tail of days),
  capped at ``max_hours``;
* peak memory: log-normal, median 6 GiB, capped at the GPU's memory (Alibaba PAI 2020, Weng et
  al. NSDI'22: most tasks use a small part of a GPU's memory);
* SM activity: Beta(1.2, 3), mean ~0.29 (PAI: median GPU utilization well under half);
* DRAM activity: 0.5 x SM activity with noise.
"""

from __future__ import annotations

import math

import numpy as np

from collocate.core.model import JobProfile
from collocate.sim.trace import TraceJob, Workload

GPU_COUNTS = (1, 2, 4, 8)
GPU_COUNT_WEIGHTS = (0.80, 0.10, 0.06, 0.04)


def synthetic_trace(
    jobs: int,
    *,
    gpus: int,
    gpu_mem_mib: float = 40_536.0,
    max_gpus_per_job: int = 8,
    load: float = 0.9,
    seed: int = 0,
    median_minutes: float = 20.0,
    max_hours: float = 24.0,
) -> list[TraceJob]:
    rng = np.random.default_rng(seed)
    allowed = [g for g in GPU_COUNTS if g <= max_gpus_per_job]
    weights = np.array([w for g, w in zip(GPU_COUNTS, GPU_COUNT_WEIGHTS, strict=True) if g <= max_gpus_per_job])
    gpu_counts = rng.choice(allowed, size=jobs, p=weights / weights.sum())
    duration_s = np.minimum(
        rng.lognormal(math.log(median_minutes * 60), 1.2, size=jobs), max_hours * 3600
    )
    peak = np.clip(rng.lognormal(math.log(6 * 1024), 0.8, size=jobs), 300, gpu_mem_mib * 0.95)
    sm = rng.beta(1.2, 3.0, size=jobs)
    dram = np.clip(sm * 0.5 + rng.normal(0, 0.05, size=jobs), 0.01, 1.0)

    # Offered GPU-seconds per second = load * gpus; thin a diurnal rate to get arrivals.
    mean_rate = load * gpus / float(np.mean(gpu_counts * duration_s))
    arrivals = _diurnal_arrivals(rng, jobs, mean_rate)
    return [
        TraceJob(
            str(i + 1),
            float(arrivals[i]),
            Workload(
                name=f"synthetic-{i + 1}",
                gpus=int(gpu_counts[i]),
                duration_s=float(duration_s[i]),
                peak_mib=float(peak[i]),
                estimates={"peak": float(peak[i])},
                profile=JobProfile(float(sm[i]), float(dram[i])),
            ),
        )
        for i in range(jobs)
    ]


def _diurnal_arrivals(rng: np.random.Generator, n: int, mean_rate: float) -> np.ndarray:
    """Arrival times of a Poisson process with rate mean_rate * (1 + 0.5 sin(day phase))."""
    peak_rate = mean_rate * 1.5
    times = np.empty(n)
    t, count = 0.0, 0
    while count < n:
        gaps = rng.exponential(1.0 / peak_rate, size=2 * (n - count) + 16)
        candidates = t + np.cumsum(gaps)
        rate = mean_rate * (1 + 0.5 * np.sin(2 * math.pi * candidates / 86_400))
        keep = candidates[rng.random(candidates.size) < rate / peak_rate]
        take = keep[: n - count]
        times[count : count + take.size] = take
        count += take.size
        t = candidates[-1]
    return np.round(times - times[0], 3)
