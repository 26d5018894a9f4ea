"""The CARMA family: ``carma-ff``, ``carma-bf``, ``carma-magm``, ``carma-lug``.

Reproduces the placement rules of the CARMA resource manager (Yousefzadeh-Asl-Miandoab et al.,
arXiv 2508.19073; see shared notes ``carma.md`` §2.6–3.1), with its hard-coded constants as
named parameters:

1. exclusive first: when enough idle GPUs (not in flight) exist, the head job gets them alone;
2. otherwise collocate where ``free - reserve >= estimate + headroom`` and the GPU passes the
   risk filter, choosing among candidates by the ordering (first-fit, best-fit, most available
   memory, least utilized);
3. strict head-of-line order, no backfilling;
4. a job recovered from an out-of-memory crash runs only exclusively, and while one waits no
   job is collocated at all;
5. a GPU takes no second job until its last one is seen on it plus ``settle_s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from collocate.core.model import ClusterSnapshot, Job, Plan, Wait, WaitKind
from collocate.core.policies.base import (
    Ledger,
    fits_alone,
    gpus_wait,
    in_flight_wait,
    memory_wait,
    pick_gang,
)
from collocate.core.policies.risk import RiskLimits, too_busy


class CarmaOrder(StrEnum):
    FIRST_FIT = "ff"  # candidates in GPU index order
    BEST_FIT = "bf"  # least free memory that still fits
    MOST_AVAILABLE = "magm"  # most available GPU memory
    LEAST_UTILIZED = "lug"  # lowest SM-activity risk score


@dataclass(frozen=True)
class Carma:
    order: CarmaOrder
    reserve_mib: float = 512.0  # CARMA monitor: free memory - 512 MiB
    headroom_mib: float = 2048.0  # CARMA mapper: estimate + 2048 MiB (v2 "2gig" experiments)
    settle_s: float = 30.0  # CARMA server.py: GPU valid again 30 s after the job is first seen
    limits: RiskLimits = field(default_factory=RiskLimits)

    @property
    def name(self) -> str:
        return f"carma-{self.order.value}"

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan:
        ledger = Ledger(cluster)
        busy = too_busy(cluster.util_sm, cluster.util_occ, cluster.util_dram, self.limits)
        for job in queue:
            available = ~ledger.in_flight(self.settle_s) & fits_alone(job, cluster)
            idle = np.flatnonzero(available & (ledger.n_jobs == 0))
            gpus = pick_gang(idle, cluster.gang_node, job)
            if gpus is None and not job.recovered and job.mem_mib is not None:
                gpus = self._collocate(job, ledger, available & ~busy & ledger.shareable(job))
            if gpus is None:
                ledger.wait(job, self._why_not(job, ledger, busy))
                break  # head-of-line blocking, as in CARMA
            ledger.place(job, gpus)
        return ledger.plan()

    def _why_not(self, job: Job, ledger: Ledger, busy: np.ndarray) -> Wait:
        """Why the head job found no GPU (only computed for the one blocked job of a round)."""
        if job.recovered or job.mem_mib is None:
            why = "recovered from an out-of-memory crash: runs alone" if job.recovered else "idle"
            return gpus_wait(job, why)
        fits = ledger.free_mib - self.reserve_mib >= job.mem_mib + self.headroom_mib
        if not fits.any():
            return memory_wait(job, ledger, job.mem_mib + self.headroom_mib + self.reserve_mib)
        if ledger.in_flight(self.settle_s)[fits].all():
            return in_flight_wait(self.settle_s)
        if busy[fits].all():
            return Wait(WaitKind.BUSY, "every GPU with room is saturated (SM and occupancy or DRAM)")
        return gpus_wait(job, "with room")

    def _collocate(self, job: Job, ledger: Ledger, eligible: np.ndarray) -> list[int] | None:
        cluster = ledger.cluster
        assert job.mem_mib is not None  # only jobs of known size are collocated (see __call__)
        fits = ledger.free_mib - self.reserve_mib >= job.mem_mib + self.headroom_mib
        candidates = np.flatnonzero(eligible & fits)
        if self.order is CarmaOrder.BEST_FIT:
            candidates = candidates[np.argsort(ledger.free_mib[candidates], kind="stable")]
        elif self.order is CarmaOrder.MOST_AVAILABLE:
            candidates = candidates[np.argsort(-ledger.free_mib[candidates], kind="stable")]
        elif self.order is CarmaOrder.LEAST_UTILIZED:
            candidates = candidates[np.argsort(cluster.util_sm[candidates], kind="stable")]
        return pick_gang(candidates, cluster.gang_node, job)
