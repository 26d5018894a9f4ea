"""Priority preemption by suspension (Slurm's ``PreemptMode=SUSPEND``), one rule for both worlds.

A job the scheduling round left waiting may, instead of waiting, freeze running jobs of lower
priority and start beside them; they thaw when it ends (``suspension.review``).

**Higher priority** is strictly higher ``Job.priority`` (``submit --priority``/``--nice``,
``collocate priority``): the number the queue orders by first. What orders jobs among equals
(a recovered job's place at the head, fair share, submission time) never preempts. A member
may not raise a priority above 0 (the daemon owner's right), so a member's job freezes only
jobs someone lowered with ``--nice``, and a job the daemon's owner raised freezes jobs of the
default priority.

**What freezing frees: compute, never memory.** A frozen job stops (its attempt's cgroup
freezer: no CPU, no new kernels) but keeps its GPU memory: a stopped process's CUDA memory
cannot be taken from it, and its work must survive the thaw. So a preemptor must fit in memory
with every frozen job's memory still held: its requirement must be known and fit what its GPUs
have left, committed and measured, as they are (``fits``), and a job that waits for memory
waits on whatever its priority. What freezing changes is the policy's other gates (saturation,
slowdown, one job per GPU): the preemptor is placed by the same policy the round runs, on a
view of the cluster in which the chosen jobs draw nothing (``idle``: they leave their GPUs' job
counts and activity sums, and the readings shrink with them: ``World.idle_view``). Under
``exclusive`` this shares a GPU's memory between a frozen job and its preemptor, as Slurm's
suspend shares a node's memory.

**Which jobs.** Running jobs of strictly lower priority that the scheduler may freeze
(``suspension.may_freeze``: never one across nodes, never an interactive one) and that are not
suspended already (one its owner suspended is never frozen twice; one frozen on trial or for
another preemptor draws nothing, so freezing it again would free nothing). Lowest priority
first, then the most recently started (Slurm's order). The fewest are taken: one if any one
suffices (in that order); else the shortest prefix of that order with which the policy places
the job, then each of those dropped again, the highest priority first, while it still is.

A frozen job stays on its GPUs as far as the model goes (its priced activity stays in their
sums), so other jobs are not packed into the room it will need once thawed; a job started on
trial beside it on the strength of low readings is taken back in its turn if the thaw slows a
neighbour past the limit (``collocate.core.suspension``).

Pure: the caller passes the policy, the snapshot and ``idle`` (the world's view without given
jobs); the ``Scheduler`` records what this decides and both worlds carry it out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from collocate.core.model import ClusterSnapshot, Freeze, Job, JobState, Placement, Wait, WaitKind
from collocate.core.policies.base import Policy
from collocate.core.suspension import may_freeze

#: Pending jobs a round tries to preempt for, in queue order: each try runs the policy once per
#: candidate victim, and a job that cannot preempt now is tried again next round.
SCAN = 4
#: How deep into the queue a round looks for them (a recovered job of low priority may lead it).
DEPTH = 64
#: Candidate victims tried per preemptor, the lowest priority first.
MAX_CANDIDATES = 16
#: Why a job may not preempt, whatever its priority: waiting for memory (freezing frees none),
#: or for something freezing does not change.
_NOT_COMPUTE = frozenset({WaitKind.MEMORY, WaitKind.DEPENDENCY, WaitKind.HELD, WaitKind.LIMIT,
                          WaitKind.QUOTA, WaitKind.DRAIN, WaitKind.DISK})

Idle = Callable[[Collection[str]], ClusterSnapshot]


@dataclass(frozen=True, slots=True)
class Preemption:
    """One preemptor's placement and the jobs to freeze for it."""

    placement: Placement
    freeze: tuple[Freeze, ...]


def may_preempt(job: Job, wait: Wait | None) -> bool:
    """Whether a waiting job could start by freezing others: a GPU job of known memory (the
    frozen keep theirs, so it must be known to fit beside them), not to run alone, waiting for
    compute rather than memory or a rule."""
    return (job.gpus > 0 and job.mem_mib is not None and not job.alone
            and (wait is None or wait.kind not in _NOT_COMPUTE))


def victims(job: Job, running: Iterable[Job]) -> list[Job]:
    """The running jobs ``job`` may freeze, in the order they are taken."""
    out = [r for r in running if r.priority < job.priority and r.state is JobState.RUNNING
           and r.gpus > 0 and not r.suspended and may_freeze(r)]
    out.sort(key=lambda r: (r.priority, -(r.started_at or 0.0), r.id))
    return out[:MAX_CANDIDATES]


def fits(job: Job, cluster: ClusterSnapshot, gpus: Sequence[int]) -> bool:
    """Whether ``job``'s requirement fits each of these GPUs with every job there keeping its
    memory: what is measured free and what is not committed, whichever is less."""
    if job.mem_mib is None:
        return False
    room = np.minimum(cluster.free_mib[gpus], cluster.total_mib[gpus] - cluster.committed_mib[gpus]
                      - cluster.other_mib[gpus])
    return bool((room >= job.mem_mib).all())


def preempt(job: Job, running: Iterable[Job], policy: Policy, cluster: ClusterSnapshot,
            idle: Idle) -> Preemption | None:
    """The placement of ``job`` and the fewest lower-priority jobs to freeze for it (module
    docstring), or None when freezing would not let it start."""
    candidates = victims(job, running)
    if not candidates:
        return None
    position = {g: i for i, g in enumerate(cluster.ids)}

    def attempt(frozen: tuple[str, ...]) -> tuple[Placement, tuple[str, ...]] | None:
        placed = next((p for p in policy([job], idle(frozen)).placements if p.job_id == job.id), None)
        if placed is None:
            return None
        gpus = [position[g] for g in placed.gpus]
        there = {j for i in gpus for j in (cluster.residents[i] if len(cluster.residents) > i else ())}
        needed = tuple(j for j in frozen if j in there)
        # none needed: it fits without freezing, which is the round's to decide, not ours
        return (placed, needed) if needed and fits(job, cluster, gpus) else None

    found = next((got for c in candidates if (got := attempt((c.id,)))), None)
    for k in range(2, len(candidates) + 1) if found is None else ():
        if found := attempt(tuple(c.id for c in candidates[:k])):
            break
    if found is None:
        return None
    placed, needed = found
    for drop in reversed(needed):  # the highest priority first
        fewer = tuple(j for j in needed if j != drop)
        if drop in needed and fewer and (got := attempt(fewer)):
            placed, needed = got
    by_id = {c.id: c for c in candidates}
    return Preemption(placed, tuple(
        Freeze(j, f"for job {job.id} of higher priority ({job.priority} > {by_id[j].priority}); thaws when it ends",
               (job.id,), "preempt") for j in needed))
