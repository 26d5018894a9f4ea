"""``round-robin``: exclusive on idle GPUs when enough are free, otherwise the next GPUs in a ring,
with no memory or utilization check; relies on out-of-memory recovery (CARMA's ``OR-RR``).

Like CARMA it keeps one launch in flight per GPU: a GPU takes no second job until the last one is
seen on it plus ``settle_s``, so the ring does not dump the whole queue at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from collocate.core.model import ClusterSnapshot, Job, Plan
from collocate.core.policies.base import Ledger, fits_alone, in_flight_wait, pick_gang


@dataclass(frozen=True)
class RoundRobin:
    name: ClassVar[str] = "round-robin"
    settle_s: float = 30.0  # CARMA server.py: GPU valid again 30 s after the job is first seen

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan:
        ledger = Ledger(cluster)
        n = len(cluster)
        for job in queue:
            available = ~ledger.in_flight(self.settle_s) & fits_alone(job, cluster)
            gpus = pick_gang(np.flatnonzero(available & (ledger.n_jobs == 0)), cluster.gang_node, job)
            if gpus is None:
                cursor = (cluster.placements_made + len(ledger.placements)) % max(n, 1)
                ring = np.roll(np.arange(n), -cursor)
                shared = available & ledger.shareable(job)
                gpus = pick_gang(ring[shared[ring]], cluster.gang_node, job)
            if gpus is None:
                ledger.wait(job, in_flight_wait(self.settle_s))
                break
            ledger.place(job, gpus)
        return ledger.plan()
