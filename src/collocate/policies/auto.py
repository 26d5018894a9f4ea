"""``auto``: collocate by predicted interference, without head-of-line blocking.

Where the CARMA family asks "does it fit and is the GPU not saturated?", ``auto`` asks "which
placement adds the most total training progress?" and answers with the interference model
(``collocate.interference``):

* An idle GPU is always the best place for a job (it runs at full speed and slows nobody), so
  idle GPUs are used first, as in CARMA.
* Otherwise each GPU that fits the job's memory is scored by the change in the summed progress
  rates of every job on it: the newcomer's rate ``1 / slowdown`` plus the rate its neighbours
  lose. A placement must gain at least ``min_gain`` and keep every job on the GPU under
  ``max_slowdown``; among those the best gain wins.
* Memory must fit both what is measured free and what is committed: ``min(free, total -
  committed) - reserve >= estimate * (1 + uncertainty) + headroom``, so jobs that have not
  allocated yet are counted, and uncertain estimates get a wider margin.
* The queue is scanned up to ``backfill_depth`` jobs, so a blocked head does not stop smaller
  jobs behind it. Once the first blocked job has waited ``reserve_after_s``, it gets GPUs
  reserved (the least loaded ones on one node): nothing else is placed there, so those GPUs
  drain and it cannot starve. Reserving at once costs throughput (reserved GPUs sit half
  empty while they drain); waiting an hour first keeps the guarantee for the rare long wait.
* Jobs recovered from an out-of-memory crash come first in the queue and are placed like any
  other job with their raised memory requirement; they never stop the rest of the queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from collocate.interference import InterferenceModel, default_interference, shared_slowdown
from collocate.model import ClusterSnapshot, Job, Plan, SharingMode
from collocate.policies.base import Ledger, pick_on_one_node
from collocate.policies.risk import RiskLimits, too_busy


@dataclass(frozen=True)
class Auto:
    name: ClassVar[str] = "auto"
    reserve_mib: float = 512.0  # CUDA context and fragmentation slack, as CARMA's reserve
    headroom_mib: float = 1024.0  # below CARMA's 2048: committed memory is counted too
    uncertainty_margin: float = 1.0  # add this many relative uncertainties to each estimate
    settle_s: float = 30.0  # same in-flight guard as CARMA for jobs of unmeasured memory
    max_slowdown: float = 1.5  # no job on a shared GPU predicted slower than this
    min_gain: float = 0.1  # summed progress-rate gain a collocation must bring
    backfill_depth: int = 32  # jobs scanned per round beyond a blocked head
    reserve_after_s: float = 3600.0  # a blocked job gets GPUs reserved once it waited this long
    limits: RiskLimits = field(default_factory=RiskLimits)  # measured saturation still vetoes
    interference: InterferenceModel = field(default_factory=default_interference)

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan:
        ledger = Ledger(cluster)
        busy = too_busy(cluster.util_sm, cluster.util_occ, cluster.util_dram, self.limits)
        reserved = np.zeros(len(cluster), dtype=bool)
        for position, job in enumerate(queue):
            if position >= self.backfill_depth:
                break
            gpus = self._choose(job, ledger, ~reserved & ~busy)
            if gpus is not None:
                ledger.place(job, gpus)
            elif not reserved.any() and cluster.now - job.submit_time >= self.reserve_after_s:
                self._reserve_for(job, ledger, reserved)
        return ledger.plan()

    def _choose(self, job: Job, ledger: Ledger, usable: np.ndarray) -> list[int] | None:
        cluster = ledger.cluster
        alone_fits = job.mem_mib is None or cluster.total_mib - self.reserve_mib >= job.mem_mib
        idle = np.flatnonzero(usable & (ledger.n_jobs == 0) & alone_fits)
        if (gpus := pick_on_one_node(idle, cluster.node, job.gpus)) is not None:
            return gpus
        if job.mem_mib is None:
            return None  # unknown memory: only a GPU of its own is safe
        need = job.mem_mib * (1.0 + self.uncertainty_margin * job.mem_uncertainty)
        room = np.minimum(ledger.free_mib, cluster.total_mib - ledger.committed_mib)
        fits = room - self.reserve_mib >= need + self.headroom_mib
        candidates = np.flatnonzero(usable & fits & ~ledger.in_flight(self.settle_s))
        if candidates.size == 0:
            return None
        gain, ok = self._score(job, ledger, candidates)
        candidates, gain = candidates[ok], gain[ok]
        return pick_on_one_node(candidates[np.argsort(-gain, kind="stable")], cluster.node, job.gpus)

    def _score(self, job: Job, ledger: Ledger, gpus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Progress-rate gain of adding ``job`` to each GPU, and whether the placement is allowed.

        Residents are represented by their mean profile, which keeps the score one vector
        expression per GPU set.
        """
        mode = ledger.cluster.sharing
        params = self.interference.modes[SharingMode.TIME_SLICING if mode is SharingMode.MIG else mode]
        a, d = job.profile.sm_activity, job.profile.dram_activity
        n = ledger.n_jobs[gpus].astype(float)
        sm, dram = ledger.sm_sum[gpus], ledger.dram_sum[gpus]
        mean_sm, mean_dram = sm / np.maximum(n, 1.0), dram / np.maximum(n, 1.0)
        newcomer = shared_slowdown(params, a, d, sm, dram)
        resident_after = shared_slowdown(params, mean_sm, mean_dram, sm - mean_sm + a, dram - mean_dram + d)
        resident_before = np.where(
            n > 1, shared_slowdown(params, mean_sm, mean_dram, sm - mean_sm, dram - mean_dram), 1.0
        )
        gain = 1.0 / newcomer + n * (1.0 / resident_after - 1.0 / resident_before)
        ok = (
            (newcomer <= self.max_slowdown)
            & (resident_after <= self.max_slowdown)
            & (gain >= self.min_gain)
        )
        return gain, ok

    def _reserve_for(self, job: Job, ledger: Ledger, reserved: np.ndarray) -> None:
        cluster = ledger.cluster
        order = np.lexsort((-ledger.free_mib, ledger.n_jobs))  # fewest jobs, then most free
        gpus = pick_on_one_node(order, cluster.node, job.gpus)
        if gpus is not None:
            reserved[gpus] = True
