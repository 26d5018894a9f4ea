"""Learning a job's solo activity profile (``model.JobProfile``) from GPU-level samples.

``auto`` prices a collocation with each job's SM and DRAM activity *when it runs alone*; a job
nobody has measured is priced at ``model.UNKNOWN_PROFILE``. The daemon learns the profile while
the job runs, so the policy stops guessing after the job's first seconds alone, and keeps it in
its history for the next job with the same command.

Why GPU-level readings and only while the job is alone: a GPU's GPM SM activity (or, without GPM,
NVML's utilization) is the quantity the interference model is written in, but it cannot be split
between processes. NVML's per-process ``smUtil`` can, but on an H100 it read like
``utilization.gpu``, 0.155 above GPM's SM activity on average for one job alone; it is a time
share, not a solo activity, once jobs time-slice; and under MPS the driver charges all of it to
the MPS server (docs/gpu-validation.md). So a sample counts only when every process holding
memory on the job's GPUs is the job's own (or the MPS server).

Why warm-up is skipped: a job's first steps (CUDA context, cuDNN autotuning, lazy loading) run
at almost no SM activity for up to 20 s on an H100, which would halve the mean of a short job.
Samples before the first one at ``ACTIVE_FLOOR`` or above are not counted; afterwards every
solo sample is, stalls included, since the model wants the average over training.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from collocate.interference import ModeParams, shared_slowdown
from collocate.model import UNKNOWN_PROFILE, JobProfile

ACTIVE_FLOOR = 0.05  # SM activity a job must reach once before its samples count
MIN_SOLO_SAMPLES = 10  # counted samples before the profile is trusted (10 s at the daemon's 1 s)


@dataclass(slots=True)
class SoloActivity:
    """Running sums of a job's solo samples after warm-up; ``profile()`` once there are enough."""

    warm: bool = False
    samples: int = 0
    sm_sum: float = 0.0
    dram_samples: int = 0
    dram_sum: float = 0.0

    def observe(self, sm: float, dram: float | None) -> None:
        """One GPU reading taken while the job was alone on its GPU(s)."""
        if not self.warm:
            if sm < ACTIVE_FLOOR:
                return
            self.warm = True
        self.samples += 1
        self.sm_sum += _fraction(sm)
        if dram is not None:
            self.dram_samples += 1
            self.dram_sum += _fraction(dram)

    def profile(self, min_samples: int = MIN_SOLO_SAMPLES) -> JobProfile | None:
        """The mean solo profile, or None before ``min_samples`` samples counted. DRAM activity
        falls back to the unknown profile's when the GPU does not report it."""
        if self.samples < max(1, min_samples):
            return None
        dram = (self.dram_sum / self.dram_samples if self.dram_samples
                else UNKNOWN_PROFILE.dram_activity)
        return JobProfile(self.sm_sum / self.samples, dram)


def program_prior(profiles: Sequence[JobProfile]) -> JobProfile | None:
    """The profile a new command starts with from its program's other measured commands (a
    sweep's points): the median of each number, so one odd point does not move it."""
    if not profiles:
        return None
    return JobProfile(statistics.median(p.sm_activity for p in profiles),
                      statistics.median(p.dram_activity for p in profiles))


def _fraction(value: float) -> float:
    return min(1.0, max(0.0, value))


#: A GPU's readings count for inference once its newest job has been active this long (its
#: first steps on an H100 ran at almost no SM activity for up to 20 s, docs/gpu-validation.md).
INFER_AFTER_S = 20.0


def infer_assumed(
    known: Sequence[JobProfile],
    n_assumed: int,
    sm_reading: float,
    dram_reading: float | None,
    params: ModeParams,
) -> JobProfile | None:
    """The solo profile that ``n_assumed`` jobs nobody has measured would each need for a GPU
    shared with jobs of ``known`` profiles to read what it reads, by the interference model.

    A GPU-level reading cannot be split between processes, but placement only needs the load a
    GPU already carries: the profile that explains the reading is a better price for its
    unmeasured residents than a fixed guess. Checked against the H100 bench's 23 mixes per mode
    (benchmarks/activity_inference.py): the summed solo SM activity of a GPU's jobs is off by a
    median 22% (time-slicing) and 23% (MPS) this way, against 37% for the fixed 0.5 per job,
    and errs on the heavy side (it reads a saturated GPU as fully loaded), so a GPU it prices
    wrong is left alone rather than crowded. None when nothing is to be inferred.
    """
    if n_assumed < 1 or sm_reading <= 0.0:
        return None
    dram_ratio = (dram_reading / sm_reading) if dram_reading is not None else (
        UNKNOWN_PROFILE.dram_activity / UNKNOWN_PROFILE.sm_activity)

    def reads(a: float) -> float:
        d = min(1.0, a * dram_ratio)
        everyone = [*known, *([JobProfile(a, d)] * n_assumed)]
        total = 0.0
        for k, p in enumerate(everyone):
            others = everyone[:k] + everyone[k + 1:]
            sm_o = sum(o.sm_activity for o in others)
            dram_o = sum(o.dram_activity for o in others)
            slow = float(shared_slowdown(params, p.sm_activity, p.dram_activity, sm_o, dram_o)) if others else 1.0
            total += p.sm_activity / slow
        return total

    lo, hi = 0.0, 1.0
    if reads(hi) <= sm_reading:
        return JobProfile(1.0, min(1.0, dram_ratio))  # saturated: read as fully loaded
    for _ in range(40):  # bisection: what the GPU reads grows with its jobs' activity
        mid = (lo + hi) / 2.0
        if reads(mid) < sm_reading:
            lo = mid
        else:
            hi = mid
    a = (lo + hi) / 2.0
    return JobProfile(a, min(1.0, a * dram_ratio))
