"""``exclusive``: FIFO on whole GPUs, never shared — what a plain Slurm GPU queue gives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from collocate.core.model import ClusterSnapshot, Job, Plan
from collocate.core.policies.base import Ledger, fits_alone, gpus_wait, pick_gang


@dataclass(frozen=True)
class Exclusive:
    name: ClassVar[str] = "exclusive"

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan:
        ledger = Ledger(cluster)
        for job in queue:
            gpus = pick_gang(np.flatnonzero((ledger.n_jobs == 0) & fits_alone(job, cluster)), cluster.gang_node, job)
            if gpus is None:
                ledger.wait(job, gpus_wait(job))
                break  # strict FIFO: the head waits, and so does everyone behind it
            ledger.place(job, gpus, alone=True)  # nothing will be put beside it: no fence
        return ledger.plan()
