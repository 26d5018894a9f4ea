"""``shares``: up to K jobs per GPU with no memory check (Slurm "shard", Kubernetes time-slicing).

The GPU is advertised as K interchangeable slots; nothing stops K jobs from together needing more
memory than the GPU has, so out-of-memory crashes are expected when K is set optimistically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from collocate.common.errors import InputError
from collocate.core.model import ClusterSnapshot, Job, Plan
from collocate.core.policies.base import Ledger, fits_alone, gpus_wait, pick_gang


@dataclass(frozen=True)
class Shares:
    name: ClassVar[str] = "shares"
    slots_per_gpu: int = 2  # Kubernetes time-slicing "replicas"; 2 is the common example value

    def __post_init__(self) -> None:
        if self.slots_per_gpu < 1:
            raise InputError("shares: slots_per_gpu must be >= 1", hint="e.g. slots_per_gpu=2")

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan:
        ledger = Ledger(cluster)
        for job in queue:
            open_slots = np.flatnonzero((ledger.n_jobs < self.slots_per_gpu) & fits_alone(job, cluster)
                                       & ledger.shareable(job))
            least_loaded_first = open_slots[np.argsort(ledger.n_jobs[open_slots], kind="stable")]
            gpus = pick_gang(least_loaded_first, cluster.gang_node, job)
            if gpus is None:
                ledger.wait(job, gpus_wait(job, f"with fewer than {self.slots_per_gpu} jobs"))
                break
            ledger.place(job, gpus)
        return ledger.plan()
