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

from collocate.common.units import format_mib
from collocate.core.commitment import committed_mib
from collocate.core.model import ClusterSnapshot, Gangs, Job, Placement, Plan, Wait, WaitKind


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
        self.n_starting = cluster.n_starting.copy()
        self.owner = list(cluster.owner)  # under MPS: whose jobs each GPU serves
        self.placements: list[Placement] = []
        self.waits: dict[str, Wait] = {}
        self.gangs = cluster.gangs  # the multi-GPU jobs on the cluster, this round's too
        self.recheck_at = math.inf
        self.placed_on: set[int] = set()  # GPUs given a job in this round

    def place(self, job: Job, gpus: Iterable[int], *, trial: bool = False, alone: bool = False) -> None:
        """Charge ``job`` to these GPUs at once (``collocate.core.commitment``). A job of unknown
        memory is placed with the room it was given, which bounds it under MPS."""
        idx = list(gpus)
        room = self.room()
        given_room = float(min(room[i] for i in idx))
        for i in idx:  # scalar updates: a job holds a few GPUs, and fancy indexing costs more
            mem = committed_mib(job.mem_mib, self.cluster.total_mib[i] - self.cluster.other_mib[i])
            self.free_mib[i] -= mem
            self.committed_mib[i] += mem
            self.n_jobs[i] += 1
            self.n_starting[i] += 1
            self.sm_sum[i] += job.profile.sm_activity
            self.dram_sum[i] += job.profile.dram_activity
            self.launch_seen_at[i] = math.inf  # not seen on the GPU yet
            if self.owner and job.user:
                self.owner[i] = job.user
            self.placed_on.add(i)
        if len(idx) > 1:
            self.gangs = (Gangs.of([(idx, job.profile)], len(self.cluster)) if self.gangs is None
                          else self.gangs.plus(idx, job.profile))
        ids = self.cluster.ids
        given = given_room if job.mem_mib is None else job.mem_mib
        self.placements.append(Placement(job.id, tuple(ids[i] for i in idx), given, given_room, trial, alone))

    def wait(self, job: Job, why: Wait) -> None:
        self.waits[job.id] = why

    def recheck(self, at: float) -> None:
        """The policy would decide otherwise at ``at`` with nothing else changed; ``at`` = now:
        once this round's placements are under way (a job placed now may be seen at once)."""
        if at >= self.cluster.now:
            self.recheck_at = min(self.recheck_at, at)

    def room(self) -> np.ndarray:
        """Memory each GPU can still give: what is measured free and what is neither committed
        (jobs that have not allocated yet count) nor held by processes that are no job's,
        whichever is less."""
        return np.minimum(self.free_mib, self.cluster.total_mib - self.committed_mib - self.cluster.other_mib)

    def shareable(self, job: Job) -> np.ndarray | bool:
        """GPUs ``job`` may join: under MPS a GPU serves one user's jobs at a time (the control
        daemon runs one server per user and queues another user's clients until it is idle,
        gpu-facts.md), so only GPUs serving nobody or the job's own user."""
        if not self.owner or not job.user:
            return True
        return np.array([o in ("", job.user) for o in self.owner], dtype=bool)

    def in_flight(self, settle_s: float) -> np.ndarray:
        """GPUs whose newest job is not yet seen running plus ``settle_s`` (CARMA's guard)."""
        now = self.cluster.now
        in_flight = (now - self.launch_seen_at) < settle_s
        seen = self.launch_seen_at[in_flight]
        if seen.size:  # a job not seen yet is seen at the earliest now
            self.recheck(float(np.min(np.minimum(seen, now))) + settle_s)
        return in_flight

    def plan(self) -> Plan:
        return Plan(tuple(self.placements), waits=self.waits, recheck_at=self.recheck_at)


def memory_wait(job: Job, ledger: Ledger, need_mib: float | None = None) -> Wait:
    """Why ``job`` does not fit: what it needs per GPU and the most room any GPU has."""
    room = ledger.room()
    need = job.mem_mib if need_mib is None else need_mib
    what = "a whole GPU (memory unknown)" if need is None else f"{format_mib(need)} free per GPU"
    if need is not None and job.mem_mib is not None and need > job.mem_mib:
        what += f" (its {format_mib(job.mem_mib)} and margins)"
    if not len(room):
        return Wait(WaitKind.MEMORY, f"needs {what}")
    best = int(np.argmax(room))
    return Wait(WaitKind.MEMORY, f"needs {what}; most room {format_mib(max(0.0, float(room[best])))} "
                                 f"on {ledger.cluster.ids[best]}")


def gpus_wait(job: Job, which: str = "idle") -> Wait:
    """A job that waits for whole GPUs (or slots) to come free."""
    n = (f"{job.gpus} GPU(s) on each of {job.nodes} nodes" if job.nodes > 1
         else f"{job.gpus} GPUs on one node" if job.gpus > 1 else "a GPU")
    return Wait(WaitKind.GPUS, f"needs {n} {which}; none is free")


def in_flight_wait(settle_s: float) -> Wait:
    return Wait(WaitKind.IN_FLIGHT, f"GPUs that could take it started a job less than "
                                    f"{settle_s:g} s ago (or memory still growing)")


def fits_alone(job: Job, cluster: ClusterSnapshot) -> np.ndarray | bool:
    """GPUs big enough for the job with none of ours beside it (clusters may mix GPU sizes, and
    processes that are no job's may hold some of a GPU's memory)."""
    return True if job.mem_mib is None else cluster.total_mib - cluster.other_mib >= job.mem_mib


def pick_gang(candidates: np.ndarray, node: np.ndarray, job: Job) -> list[int] | None:
    """The GPUs a job takes among ``candidates`` (kept in their given order), one rule for every
    policy and both worlds: ``job.gpus`` of one node, or for a job on ``job.nodes`` nodes
    ``job.gpus`` on each of that many different nodes, grouped by node in the order their first
    candidate appears (the first group is rank 0's). All or none: None when too few nodes have
    enough candidates. ``node`` is the snapshot's ``gang_node`` (MIG instances, -1, never join)."""
    if job.nodes == 1:
        return pick_on_one_node(candidates, node, job.gpus)
    if len(candidates) < job.width:
        return None
    nodes = node[candidates]
    ok = _on_roomy_nodes(nodes, job.gpus)
    first, at = np.unique(nodes[ok], return_index=True)
    if len(first) < job.nodes:
        return None
    chosen: list[int] = []
    for n in first[np.argsort(at, kind="stable")][:job.nodes]:  # in the order they first appear
        chosen.extend(candidates[nodes == n][:job.gpus].tolist())
    return chosen


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
    ok = _on_roomy_nodes(nodes, count)
    if not ok.any():
        return None
    # the first node in candidate order with enough: the node of the first such candidate
    return candidates[nodes == nodes[np.argmax(ok)]][:count].tolist()


def _on_roomy_nodes(nodes: np.ndarray, count: int) -> np.ndarray:
    """Per candidate (``nodes``: each one's ``gang_node``), whether its node has at least
    ``count`` candidates: counted at once, not node by node (a loop over nodes that compared
    every candidate each time cost a simulation at 1,000 GPUs more than its gang's choice). MIG
    instances (-1) never join a multi-GPU job."""
    per_node = np.bincount(nodes + 1)
    return (per_node[nodes + 1] >= count) & (nodes >= 0)

