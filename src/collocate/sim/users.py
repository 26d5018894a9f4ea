"""Multi-user traces for the simulator: a lab where one user floods the queue, and per-user waits.

What a shared server's fairness rules (``collocate.core.fairness``) must hold up against is one
member submitting a sweep of hundreds of jobs at once while the others submit a few jobs each
through the day. ``flood_trace`` generates that, seeded; ``user_waits`` says what each user
went through. Traces read from files carry users in their optional ``user`` column
(``collocate.sim.trace``).

Shapes: durations log-normal, median 30 min, capped at 2 h (short jobs of a sweep, as the
synthetic traces' Philly-like median of 20 min); memory log-normal, median 6 GiB, capped at
the GPU; SM activity Beta(1.2, 3) as ``collocate.sim.synth``; one GPU per job (a lab's sweeps).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collocate.core.model import JobProfile
from collocate.sim.engine import SimResult
from collocate.sim.trace import TraceJob, Workload


def flood_trace(*, gpus: int, flood_jobs: int = 200, others: int = 3, jobs_each: int = 12,
                horizon_s: float = 8 * 3600.0, gpu_mem_mib: float = 40_960.0,
                seed: int = 0) -> list[TraceJob]:
    """User ``flood`` submits ``flood_jobs`` jobs in the first minute; users ``u1``..``uN``
    submit ``jobs_each`` jobs each at random times over ``horizon_s``. ``gpus`` scales nothing
    but is kept for callers that size the flood to the cluster."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, str]] = [(float(t), "flood") for t in np.sort(rng.uniform(0, 60, flood_jobs))]
    for k in range(1, others + 1):
        rows += [(float(t), f"u{k}") for t in rng.uniform(0, horizon_s, jobs_each)]
    rows.sort()
    jobs = []
    for i, (arrival, user) in enumerate(rows):
        duration = float(min(2 * 3600.0, rng.lognormal(np.log(1800.0), 0.6)))
        peak = float(min(gpu_mem_mib * 0.9, rng.lognormal(np.log(6144.0), 0.5)))
        sm = float(rng.beta(1.2, 3.0))
        workload = Workload(f"{user}-{i}", 1, duration, peak, {"peak": peak},
                            JobProfile(round(sm, 4), round(min(1.0, 0.5 * sm), 4)))
        jobs.append(TraceJob(str(i), arrival, workload, user))
    return jobs


@dataclass(frozen=True, slots=True)
class UserWaits:
    """What one user went through: how long their jobs waited before their first start."""

    user: str
    jobs: int
    mean_wait_s: float
    max_wait_s: float
    first_wait_s: float  # the wait of the user's earliest submitted job


def user_waits(result: SimResult, trace: Sequence[TraceJob]) -> list[UserWaits]:
    """Per user, in name order; jobs that never started (rejected) count from the end."""
    user_of = {tj.id: tj.user for tj in trace}
    waits: dict[str, list[tuple[float, float]]] = {}
    for r in result.records:
        start = r.start if r.start is not None else (r.end or r.submit)
        waits.setdefault(user_of[r.id], []).append((r.submit, start - r.submit))
    out = []
    for user in sorted(waits):
        mine = sorted(waits[user])
        values = [w for _, w in mine]
        out.append(UserWaits(user, len(values), statistics.fmean(values), max(values), mine[0][1]))
    return out
