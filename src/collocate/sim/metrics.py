"""Summary metrics of a simulation run: what the comparison table shows."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from collocate.sim.engine import SimResult


@dataclass(frozen=True)
class Summary:
    policy: str
    jobs: int
    done: int
    failed: int
    rejected: int
    makespan_min: float
    mean_jct_min: float
    median_jct_min: float
    p95_jct_min: float
    mean_wait_min: float
    sm_util: float
    mem_util: float
    energy_kwh: float
    oom_crashes: int
    recovered_jobs: int

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(result: SimResult) -> Summary:
    records = result.records
    done = [r for r in records if r.state == "done"]
    jct = np.array([c for r in done if (c := r.completion_s) is not None]) / 60.0
    waits = np.array([r.start - r.submit for r in records if r.start is not None]) / 60.0

    def stat(values: np.ndarray, fn) -> float:
        return round(float(fn(values)), 2) if values.size else float("nan")

    return Summary(
        policy=result.policy,
        jobs=len(records),
        done=len(done),
        failed=sum(r.state == "failed" for r in records),
        rejected=sum(r.state == "rejected" for r in records),
        makespan_min=round(result.makespan_s / 60.0, 2),
        mean_jct_min=stat(jct, np.mean),
        median_jct_min=stat(jct, np.median),
        p95_jct_min=stat(jct, lambda v: np.percentile(v, 95)),
        mean_wait_min=stat(waits, np.mean),
        sm_util=round(result.sm_util, 4),
        mem_util=round(result.mem_util, 4),
        energy_kwh=_round_kwh(result.energy_j / 3.6e6),
        oom_crashes=sum(r.oom_crashes for r in records),
        recovered_jobs=sum(1 for r in records if r.oom_crashes > 0 and r.state == "done"),
    )


def _round_kwh(kwh: float) -> float:
    """Three decimals, or four significant digits where that is finer: a few-minute trace on one
    GPU uses about 0.01 kWh, which three decimals would round to one digit."""
    if kwh <= 0 or not math.isfinite(kwh):
        return round(kwh, 3)
    return round(kwh, max(3, 3 - math.floor(math.log10(kwh))))


#: A job counts as worse off than under ``exclusive`` when its completion time is more than this
#: fraction longer: 5 %, below which a real run's rounds and start-up jitter decide (a daemon's
#: 1 s period is 5 % of a 20 s job), and a model's rounding too.
WORSE_TOLERANCE = 0.05


@dataclass(frozen=True)
class VersusExclusive:
    """Each job's completion time (submission to end) over its completion time under
    ``exclusive`` on the same trace: the quantiles over the jobs that ended done in both runs,
    and how many are worse off (ratio > 1 + ``tolerance``; a job done under ``exclusive`` but
    not here counts as worse off, and in ``not_done``)."""

    jobs: int
    p50: float
    p95: float
    max: float
    worse: int
    not_done: int
    tolerance: float = WORSE_TOLERANCE

    def as_dict(self) -> dict:
        return asdict(self)


def versus_exclusive(completion: dict[str, float | None], exclusive: dict[str, float | None],
                     tolerance: float = WORSE_TOLERANCE) -> tuple[VersusExclusive, dict[str, float]]:
    """Job by job against a plain queue: ``completion`` and ``exclusive`` map job ids to their
    completion time in seconds (None: did not end done). Returns the summary and each job's
    ratio. Pure: the simulator's report and ``benchmarks/first_run.py`` both call it."""
    ratios = {job: done / base for job, base in exclusive.items()
              if base is not None and base > 0 and (done := completion.get(job)) is not None}
    not_done = sum(1 for job, base in exclusive.items() if base is not None and completion.get(job) is None)
    values = np.array(sorted(ratios.values()))

    def q(p: float) -> float:
        return round(float(np.percentile(values, p)), 3) if values.size else float("nan")

    summary = VersusExclusive(
        jobs=len(ratios), p50=q(50), p95=q(95),
        max=round(float(values.max()), 3) if values.size else float("nan"),
        worse=int((values > 1.0 + tolerance).sum()) + not_done, not_done=not_done, tolerance=tolerance)
    return summary, ratios


def completion_times(result: SimResult) -> dict[str, float | None]:
    """Per job, submission to end for a job that ended done; None otherwise."""
    return {r.id: r.completion_s for r in result.records}
