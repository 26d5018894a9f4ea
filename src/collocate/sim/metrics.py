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
    jct = np.array([r.end - r.submit for r in done]) / 60.0
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
