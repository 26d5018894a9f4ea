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
