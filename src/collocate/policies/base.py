"""What every placement policy shares: the signature, the per-round ledger and node grouping.

A policy is a pure function ``(queue, snapshot) -> Plan``. ``queue`` is the pending jobs in
queue order (jobs recovered from an out-of-memory crash first, then by priority, then by
submission); ``snapshot`` is the cluster at decision time. A policy may place several jobs in
one round; the ``Ledger`` keeps its own tentative bookkeeping so that the second placement of a
round sees the first one, without touching the snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from collocate.model import ClusterSnapshot, Job, Placement, Plan


class Policy(Protocol):
    name: str

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan: ...


class Ledger:
    """Per-round copies of the mutable columns of a snapshot, updated as jobs are placed."""

    def __init__(self, cluster: ClusterSnapshot) -> None:
        self.cluster = cluster
        self.free_mib = cluster.free_mib.copy()
        self.committed_mib = cluster.committed_mib.copy()
        self.n_jobs = cluster.n_jobs.copy()
        self.sm_sum = cluster.sm_sum.copy()
        self.dram_sum = cluster.dram_sum.copy()
        self.launch_seen_at = cluster.launch_seen_at.copy()
        self.placements: list[Placement] = []

    def place(self, job: Job, gpus: Iterable[int]) -> None:
        idx = list(gpus)
        seen = -math.inf if job.mem_known else math.inf  # not seen on the GPU yet, unless measured
        for i in idx:  # scalar updates: a job holds a few GPUs, and fancy indexing costs more
            mem = commitment(job, self.cluster.total_mib[i])
            self.free_mib[i] -= mem
            self.committed_mib[i] += mem
            self.n_jobs[i] += 1
            self.sm_sum[i] += job.profile.sm_activity
            self.dram_sum[i] += job.profile.dram_activity
            self.launch_seen_at[i] = seen
        ids = self.cluster.ids
        self.placements.append(
            Placement(job.id, tuple(ids[i] for i in idx), job.mem_mib)
        )

    def in_flight(self, settle_s: float) -> np.ndarray:
        """GPUs whose newest job is not yet seen running plus ``settle_s`` (memory still ramping)."""
        return (self.cluster.now - self.launch_seen_at) < settle_s

    def plan(self) -> Plan:
        return Plan(tuple(self.placements))


def commitment(job: Job, total_mib):
    """Memory a job holds against its GPUs: its requirement, or the whole GPU when unknown,
    so that nothing is packed beside a job whose size nobody knows."""
    return total_mib if job.mem_mib is None else job.mem_mib


def fits_alone(job: Job, cluster: ClusterSnapshot) -> np.ndarray | bool:
    """GPUs big enough for the job even with nobody beside it (clusters may mix GPU sizes)."""
    return True if job.mem_mib is None else cluster.total_mib >= job.mem_mib


def pick_on_one_node(candidates: np.ndarray, node: np.ndarray, count: int) -> list[int] | None:
    """The first ``count`` candidates (kept in their given order) that share one node.

    ``node`` is the snapshot's ``gang_node``: a multi-GPU job never takes a MIG instance (-1).
    Nodes are tried in the order their first candidate appears, so a policy's preference order
    also decides the node. Returns None when no node has enough candidates.
    """
    if count == 1:
        return [int(candidates[0])] if len(candidates) else None
    if len(candidates) < count:
        return None
    nodes = node[candidates]
    seen: set[int] = {-1}  # MIG instances (gang_node -1) never join a multi-GPU job
    for n in nodes:
        n = int(n)
        if n in seen:
            continue
        seen.add(n)
        members = candidates[nodes == n]
        if len(members) >= count:
            return [int(i) for i in members[:count]]
    return None

