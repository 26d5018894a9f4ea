"""``declared-memory``: pack jobs by the memory their users declared (gflow ``--shared``, KAI
gpu-memory requests). Trusts the declaration completely: it never looks at measured memory, so a
job that uses more than it declared can crash its neighbours' allocations.

A job without a declaration is treated as needing a whole GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from collocate.core.model import ClusterSnapshot, Job, Plan
from collocate.core.policies.base import Ledger, gpus_wait, memory_wait, pick_gang


@dataclass(frozen=True)
class DeclaredMemory:
    name: ClassVar[str] = "declared-memory"

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan:
        ledger = Ledger(cluster)
        for job in queue:
            if job.mem_mib is None:
                fits = ledger.n_jobs == 0
            else:
                fits = (cluster.total_mib - ledger.committed_mib - cluster.other_mib >= job.mem_mib) & ledger.shareable(job)
            gpus = pick_gang(np.flatnonzero(fits), cluster.gang_node, job)  # first fit
            if gpus is None:
                ledger.wait(job, memory_wait(job, ledger) if job.mem_mib is not None else gpus_wait(job))
                break
            ledger.place(job, gpus)
        return ledger.plan()
