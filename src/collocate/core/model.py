"""Plain data shared by every part: jobs, GPUs, cluster snapshots and placement plans.

Everything here is an immutable value. The scheduler core, the policies, the simulator and the
daemon exchange these objects; none of them carries behaviour beyond small derived properties.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import TYPE_CHECKING

from collocate.core.jobstate import JobState  # re-exported: the client imports it from there alone

if TYPE_CHECKING:  # imported where used: the client (``collocate ls``) needs JobState, not numpy
    import numpy as np


class SharingMode(StrEnum):
    """How jobs on one device share it, a whole GPU or a MIG instance alike. MIG is no sharing
    mode: an instance is a device of its own, with its share of its GPU's SMs (``GpuId.mig``,
    ``ClusterSnapshot.speed``), that its jobs share by the mode in use."""

    TIME_SLICING = "time-slicing"  # the driver's default: contexts take turns
    MPS = "mps"  # NVIDIA Multi-Process Service: kernels of several processes run concurrently


@dataclass(frozen=True, slots=True, order=True)
class GpuId:
    """A GPU (or MIG instance) in the cluster: node, device index, optional MIG instance.

    ``mig`` is ``"<gpu instance id>.<compute instance id>"`` as NVML numbers them (``"1.0"``);
    written out, a MIG device reads ``node0:2/1.0``.
    """

    node: str
    index: int
    mig: str | None = None

    def __str__(self) -> str:
        base = f"{self.node}:{self.index}"
        return f"{base}/{self.mig}" if self.mig else base

    @classmethod
    def parse(cls, text: str) -> GpuId:
        head, _, mig = text.partition("/")
        node, _, index = head.rpartition(":")
        return cls(node, int(index), mig or None)


@dataclass(frozen=True, slots=True)
class JobProfile:
    """How a job uses a GPU when it runs alone: the inputs of the interference model.

    ``sm_activity`` and ``dram_activity`` are fractions in [0, 1] as DCGM/GPM report them
    (SM active cycles, DRAM interface active cycles).
    """

    sm_activity: float = 0.5
    dram_activity: float = 0.2


UNKNOWN_PROFILE = JobProfile()


#: Priorities are whole numbers within +/- this (raising one above 0 is the daemon owner's right,
#: ``wire/rights.py``); a bound keeps a pasted 10**22 from meaning anything.
PRIORITY_MAX = 1_000_000


@dataclass(frozen=True, slots=True)
class Job:
    """A training job as the scheduler sees it; the daemon keeps command, cwd and env beside it.

    ``mem_mib`` is the memory requirement placement uses (an estimate, a declaration, a measured
    peak, or a value raised after an out-of-memory crash); ``mem_source`` says which, and
    ``mem_uncertainty`` is its relative uncertainty (0 = measured).
    """

    id: str
    gpus: int = 1  # per node
    mem_mib: float | None = None
    mem_source: str = "unknown"
    mem_uncertainty: float = 0.0
    submit_time: float = 0.0
    priority: int = 0
    name: str = ""
    profile: JobProfile = UNKNOWN_PROFILE
    #: Where ``profile`` came from (``collocate.core.belief.Belief.source``): "assumed" (nothing
    #: measured), "history" (measured in an earlier run or attempt of the same job), "similar"
    #: (its family's measured siblings, e.g. a sweep's other points), "trace" (a simulation told).
    profile_source: str = "assumed"
    #: The variances of ``profile``'s SM and DRAM activity; None: the default for its source.
    profile_var: tuple[float, float] | None = None
    max_retries: int = 3
    retry_failures: bool = False  # retry non-OOM failures too (the user asked with --retries)
    attempts: int = 0
    lost_attempts: int = 0  # attempts not charged to the job (daemon down, node gone, a neighbour's overrun, its fence)
    oom_crashes: int = 0
    state: JobState = JobState.PENDING
    dataset: str | None = None
    after: tuple[str, ...] = ()  # ids of jobs that must end done before this one may start
    after_any: tuple[str, ...] = ()  # ids of jobs that must end, in any state, first
    after_notok: tuple[str, ...] = ()  # ids of jobs that must end other than done first
    reason: str = ""  # why it was rejected, failed or last requeued
    #: Who submitted it: fair share and the per-user caps count by this name (``collocate.core.fairness``),
    #: and under MPS a GPU serves one user's jobs at a time.
    user: str = ""
    time_limit_s: float | None = None  # stopped this long after it started (Slurm's --time)
    started_at: float | None = None  # when its current attempt was placed (the round's ``now``)
    #: Non-empty while it is held (``Scheduler.hold``): who held it, "user" or "admin" (a hold
    #: only the daemon's owner may release, as Slurm's admin hold). A held job stays pending,
    #: outside the policy's queue.
    held: str = ""
    #: How many nodes it runs on, ``gpus`` on each (a data-parallel job across servers): placed
    #: as a gang, all of its GPUs in one round or none (``policies.base.pick_gang``).
    nodes: int = 1
    #: Whether its memory is fenced where the runtime allows (a PyTorch caching allocator cap,
    #: an MPS limit; ``collocate.core.commitment.fence_mib``): ``submit --no-mem-fence`` clears it.
    mem_fence: bool = True
    #: Set once an attempt crashed out of memory at its own fence: the crash measured the fence,
    #: not the job, so its later attempts run without one (``collocate.core.recovery``).
    fence_lifted: bool = False
    #: Its next attempt runs alone and unfenced: only on an empty GPU, with nothing placed beside
    #: it while it runs (the attempt that would be its last, as CARMA's relaunch).
    alone: bool = False
    #: Its current attempt was placed by a policy that puts no running job beside it
    #: (``exclusive``; ``Placement.alone``): nothing to protect, so it runs unfenced, as under a
    #: plain queue. Set at each placement.
    placed_alone: bool = False
    #: Out-of-memory crashes charged to a neighbour's overrun: requeued ahead, not counted.
    victim_crashes: int = 0
    #: An interactive job (``collocate run``): its command runs on a terminal its member is
    #: attached to, so it ends with that terminal: never requeued (``recovery.after_exit``) and
    #: never frozen (``collocate.core.suspension``).
    interactive: bool = False
    #: Non-empty while it is suspended (frozen: its processes stopped, its memory and GPUs
    #: kept; ``collocate.core.suspension``): "trial" (the scheduler froze a job started on
    #: observation, ``on_trial``, that slowed a neighbour past the limit: it thaws it when room
    #: returns), "preempt" (frozen for a waiting job of higher priority, ``collocate.core.preemption``:
    #: it thaws when that job ends) or "user" (its owner or the daemon's owner: only
    #: ``collocate resume`` thaws it).
    #: The state stays RUNNING, so every rule about jobs that hold GPUs holds for it too.
    suspended: str = ""
    suspended_at: float | None = None  # since when (the round's ``now``)
    suspended_why: str = ""  # why, in words (``ls`` and ``show`` print it)
    #: The neighbours it was frozen beside (on trial: it thaws once one of them is gone), or the
    #: job it was frozen for (preempted: it thaws once that one no longer runs unfrozen).
    suspended_beside: tuple[str, ...] = ()
    thawed_at: float | None = None  # when it was last thawed (the scheduler waits before refreezing)
    frozen_s: float = 0.0  # seconds its current attempt spent frozen: its --time does not count them
    #: Started on observation (``policies.auto``: measured room, past what the model predicts):
    #: the scheduler takes it back by freezing it if a neighbour is seen slowed past the limit.
    on_trial: bool = False
    #: The sweep it belongs to (``submit --sweep``): the id of the sweep's first job; "" for a
    #: job of its own. With ``sweep_max`` > 0, at most that many of the sweep's jobs run at
    #: once (Slurm's ``--array=0-9%2``; ``Scheduler``'s rule, in both worlds).
    sweep: str = ""
    sweep_max: int = 0

    @property
    def width(self) -> int:
        """All the GPUs it holds: ``gpus`` on each of its ``nodes``."""
        return self.gpus * self.nodes

    def evolve(self, **changes: object) -> Job:
        """``dataclasses.replace`` without its per-call introspection: the scheduler updates a
        job several times in its life, and a simulation of 100,000 jobs felt the difference."""
        return Job(*_replaced(self, changes, *_JOB_FIELDS))

    @property
    def recovered(self) -> bool:
        """True once the job has been requeued after an out-of-memory crash (its own, or one a
        neighbour's overrun caused): it goes ahead of the queue."""
        return self.oom_crashes > 0 or self.victim_crashes > 0


def queue_key(job: Job) -> tuple:
    """Queue order: recovered jobs first, then higher priority, then earlier submission. The
    scheduler orders each user's queue so (``FairQueue`` merges the users' queues by usage between
    priority and submission), and ``suspension.review`` freezes the job that came last by it and
    thaws the one that came first: what a plain queue would have run first runs first."""
    return (not job.recovered, -job.priority, job.submit_time, job.id)


@dataclass(frozen=True, slots=True)
class Utilization:
    """Window summaries of a GPU's activity (see ``collocate.core.policies.risk``), each in [0, 1]."""

    sm_activity: float = 0.0
    sm_occupancy: float = 0.0
    dram_activity: float = 0.0


IDLE = Utilization()


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU described by hand: how tests and the daemon (few GPUs) state a GPU's condition.

    ``free_mib`` is measured free memory; ``committed_mib`` the sum of what the jobs placed on
    it commit (``collocate.core.commitment``; they may not have allocated yet); ``other_mib`` memory
    held by processes that are no job's. ``launch_seen_at`` is when the newest job placed here
    was first seen holding memory on it: ``inf`` while not yet seen, ``-inf`` when it has no job
    (CARMA's one-launch-in-flight guard reads it). ``starting``: how many of its jobs have not
    shown their steady activity yet (``collocate.core.world.Phase``). ``owner``: under MPS, the user
    whose jobs it serves ("" when none). ``slowed``: the largest slowdown measured for its jobs
    from the progress they report (0: none measured; ``collocate.core.world``). ``frozen``: how many of
    its jobs the scheduler froze and will thaw (``ClusterSnapshot.n_frozen``). ``known_sm``: the
    summed solo SM activity of its working jobs whose activity was observed, not guessed
    (``ClusterSnapshot.sm_known``).
    """

    id: GpuId
    total_mib: float
    free_mib: float | None = None  # None: total minus committed
    committed_mib: float = 0.0
    util: Utilization = IDLE
    jobs: tuple[str, ...] = ()
    launch_seen_at: float = -math.inf
    speed: float = 1.0  # relative compute (a MIG slice is < 1); not used for memory
    starting: int = 0
    other_mib: float = 0.0
    owner: str = ""
    slowed: float = 0.0
    frozen: int = 0
    known_sm: float = 0.0


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job currently on the cluster, as policies see it (for interference predictions)."""

    id: str
    gpus: tuple[GpuId, ...]
    profile: JobProfile
    mem_mib: float
    dataset: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Gangs:
    """The running multi-GPU jobs (gangs), as arrays: per gang its profile as policies know it
    and its width; per membership (a gang on one of its GPUs) the gang and the GPU position,
    grouped by gang; and per GPU whether a gang is on it. A gang advances at the pace of its
    slowest GPU, on all of them."""

    sm: np.ndarray
    dram: np.ndarray
    width: np.ndarray
    member_gang: np.ndarray
    member_gpu: np.ndarray
    hosts: np.ndarray

    @classmethod
    def of(cls, gangs: Sequence[tuple[Sequence[int], JobProfile]], n_gpus: int) -> Gangs:
        """From (GPU positions, profile) pairs."""
        import numpy as np
        width = np.array([len(gpus) for gpus, _ in gangs], dtype=np.int64)
        member_gpu = np.array([i for gpus, _ in gangs for i in gpus], dtype=np.int64)
        hosts = np.zeros(n_gpus, dtype=bool)
        hosts[member_gpu] = True
        return cls(np.array([p.sm_activity for _, p in gangs], dtype=float),
                   np.array([p.dram_activity for _, p in gangs], dtype=float),
                   width, np.repeat(np.arange(len(gangs)), width), member_gpu, hosts)

    def __len__(self) -> int:
        return len(self.width)

    def without(self, k: int) -> Gangs:
        """These gangs less the ``k``-th (a gang that ended), the others in the same order."""
        import numpy as np
        keep = self.member_gang != k
        member_gang, member_gpu = self.member_gang[keep], self.member_gpu[keep]
        hosts = np.zeros(len(self.hosts), dtype=bool)
        hosts[member_gpu] = True
        return Gangs(np.delete(self.sm, k), np.delete(self.dram, k), np.delete(self.width, k),
                     member_gang - (member_gang > k), member_gpu, hosts)

    def plus(self, gpus: Sequence[int], profile: JobProfile) -> Gangs:
        """These gangs and one more (a gang placed in this round)."""
        import numpy as np
        hosts = self.hosts.copy()
        hosts[list(gpus)] = True
        return Gangs(np.append(self.sm, profile.sm_activity), np.append(self.dram, profile.dram_activity),
                     np.append(self.width, len(gpus)), np.append(self.member_gang, [len(self)] * len(gpus)),
                     np.append(self.member_gpu, gpus), hosts)


@dataclass(frozen=True, slots=True, eq=False)
class ClusterSnapshot:
    """The cluster at decision time, as parallel arrays indexed by GPU position.

    Arrays rather than a list of objects because a policy runs on every scheduling round of a
    simulation of thousands of GPUs; ``from_views`` builds one from hand-written ``GpuView``s.
    Policies treat the arrays as read-only.

    Per GPU: ``node`` (node number), ``total_mib``, ``free_mib`` (measured), ``committed_mib``
    (sum of placed jobs' requirements), ``n_jobs``, ``sm_sum``/``dram_sum`` (sum of the solo
    activity profiles of the jobs on it), ``util_sm``/``util_occ``/``util_dram`` (measured
    window summaries), ``launch_seen_at``, ``n_starting`` and ``other_mib`` (see ``GpuView``),
    ``speed`` and ``gang_node`` (the node number for multi-GPU placement, -1 on a MIG instance:
    see ``gang_nodes``). ``owner``: per GPU, the user whose jobs it serves under MPS ("" when
    none; empty when nobody's). ``residents``: per GPU, the ids of its jobs (for wait reasons
    that name them). ``slowed``: per GPU, the largest slowdown measured for its jobs from the
    progress they report (0 where none is measured; None: nothing measured anywhere). ``sm_recent``:
    per GPU, its SM reading averaged over the last few samples (``collocate.core.world``; None: not
    known, and policies read ``util_sm``), what a start on trial asks of the GPU's load: the risk
    window's ``util_sm`` leans to the peaks of the last half minute. ``n_frozen``: per GPU, how
    many of its jobs the scheduler froze and will thaw (``suspension.holds_room``; None: none
    anywhere): they draw nothing, so the readings show room that is theirs. ``datasets`` maps a
    shared dataset's name to the GPU positions whose jobs read it (for placing jobs of one
    ``collocate share`` producer together). ``gangs``: the running multi-GPU jobs, whose pace
    on one GPU is set by their slowest. ``sm_known``: per GPU, the summed solo SM activity of its
    jobs working there (active, not frozen) whose activity was observed (measured, inferred, from
    their history or a trace), never a prior's guess (``collocate.core.world``; None: nothing known
    anywhere): what the GPU is known to carry, which under time-slicing its reading does not show
    (n jobs slowed to about 1/n read about the mean of their solo activities).
    """

    now: float
    ids: tuple[GpuId, ...]
    node: np.ndarray
    total_mib: np.ndarray
    free_mib: np.ndarray
    committed_mib: np.ndarray
    n_jobs: np.ndarray
    sm_sum: np.ndarray
    dram_sum: np.ndarray
    util_sm: np.ndarray
    util_occ: np.ndarray
    util_dram: np.ndarray
    launch_seen_at: np.ndarray
    speed: np.ndarray
    gang_node: np.ndarray
    n_starting: np.ndarray
    other_mib: np.ndarray
    #: Whether any GPU is a MIG instance (``gang_node`` -1): policies then take activity relative
    #: to each GPU's ``speed``; a flag so that whole-GPU clusters skip that arithmetic.
    has_mig_instances: bool = False
    sharing: SharingMode = SharingMode.TIME_SLICING
    placements_made: int = 0  # set by the Scheduler: placements so far, for round-robin's rotation
    datasets: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    gangs: Gangs | None = None  # None: none running
    owner: Sequence[str] = ()
    residents: Sequence[Collection[str]] = ()
    slowed: np.ndarray | None = None
    sm_recent: np.ndarray | None = None
    n_frozen: np.ndarray | None = None
    sm_known: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def evolve(self, **changes: object) -> ClusterSnapshot:
        """``dataclasses.replace`` without its per-call introspection: the scheduler sets
        ``placements_made`` on every round, and simulations run a round per event."""
        return ClusterSnapshot(*_replaced(self, changes, *_SNAPSHOT_FIELDS))

    def subset(self, keep: Sequence[int]) -> ClusterSnapshot:
        """The snapshot of these GPU positions only (a node that does not answer is left out);
        a multi-GPU job with a GPU left out is left out of ``gangs``."""
        import numpy as np
        idx = np.asarray(keep, dtype=np.int64)
        where = np.full(len(self.ids), -1, dtype=np.int64)
        where[idx] = np.arange(len(idx))
        gangs = None
        if self.gangs is not None:
            kept = [(where[self.gangs.member_gpu[self.gangs.member_gang == g]].tolist(),
                     JobProfile(float(self.gangs.sm[g]), float(self.gangs.dram[g])))
                    for g in range(len(self.gangs))]
            kept = [(gpus, p) for gpus, p in kept if min(gpus) >= 0]
            gangs = Gangs.of(kept, len(idx)) if kept else None
        arrays = {name: getattr(self, name)[idx] for name in (
            "node", "total_mib", "free_mib", "committed_mib", "n_jobs", "sm_sum", "dram_sum", "util_sm",
            "util_occ", "util_dram", "launch_seen_at", "speed", "gang_node", "n_starting", "other_mib")}
        datasets = {name: tuple(int(where[i]) for i in gpus if where[i] >= 0) for name, gpus in self.datasets.items()}
        return self.evolve(
            ids=tuple(self.ids[i] for i in keep), **arrays, gangs=gangs,
            datasets={name: gpus for name, gpus in datasets.items() if gpus},
            owner=tuple(self.owner[i] for i in keep) if self.owner else (),
            residents=tuple(self.residents[i] for i in keep) if self.residents else (),
            slowed=None if self.slowed is None else self.slowed[idx],
            sm_recent=None if self.sm_recent is None else self.sm_recent[idx],
            n_frozen=None if self.n_frozen is None else self.n_frozen[idx],
            sm_known=None if self.sm_known is None else self.sm_known[idx])

    @classmethod
    def from_views(
        cls,
        views: Sequence[GpuView],
        *,
        now: float = 0.0,
        sharing: SharingMode = SharingMode.TIME_SLICING,
        running: Mapping[str, RunningJob] | None = None,
        placements_made: int = 0,
    ) -> ClusterSnapshot:
        """``running`` gives the profiles and datasets of the jobs named in ``GpuView.jobs``
        (those it lacks count as ``UNKNOWN_PROFILE``); only the sums per GPU are kept."""
        import numpy as np
        running = dict(running or {})
        node_numbers: dict[str, int] = {}
        sm = np.zeros(len(views))
        dram = np.zeros(len(views))
        datasets: dict[str, list[int]] = {}
        for i, v in enumerate(views):
            node_numbers.setdefault(v.id.node, len(node_numbers))
            for job_id in v.jobs:
                job = running.get(job_id)
                profile = job.profile if job else UNKNOWN_PROFILE
                sm[i] += profile.sm_activity
                dram[i] += profile.dram_activity
                if job and job.dataset:
                    datasets.setdefault(job.dataset, []).append(i)

        def column(values, dtype=float) -> np.ndarray:
            return np.array(list(values), dtype=dtype)

        return cls(
            now=now,
            ids=tuple(v.id for v in views),
            node=column((node_numbers[v.id.node] for v in views), np.int64),
            total_mib=column(v.total_mib for v in views),
            free_mib=column(
                v.total_mib - v.committed_mib if v.free_mib is None else v.free_mib for v in views
            ),
            committed_mib=column(v.committed_mib for v in views),
            n_jobs=column((len(v.jobs) for v in views), np.int64),
            sm_sum=sm,
            dram_sum=dram,
            util_sm=column(v.util.sm_activity for v in views),
            util_occ=column(v.util.sm_occupancy for v in views),
            util_dram=column(v.util.dram_activity for v in views),
            launch_seen_at=column(v.launch_seen_at for v in views),
            speed=column(v.speed for v in views),
            n_starting=column((v.starting for v in views), np.int64),
            other_mib=column(v.other_mib for v in views),
            gang_node=gang_nodes(tuple(v.id for v in views), column((node_numbers[v.id.node] for v in views), np.int64)),
            has_mig_instances=any(v.id.mig is not None for v in views),
            sharing=sharing,
            placements_made=placements_made,
            datasets={name: tuple(sorted(set(gpus))) for name, gpus in datasets.items()},
            gangs=running_gangs(views, running),
            owner=tuple(v.owner for v in views) if any(v.owner for v in views) else (),
            residents=tuple(v.jobs for v in views),
            slowed=column(v.slowed for v in views) if any(v.slowed for v in views) else None,
            n_frozen=column((v.frozen for v in views), np.int64) if any(v.frozen for v in views) else None,
            sm_known=column(v.known_sm for v in views) if any(v.known_sm for v in views) else None,
        )


def running_gangs(views: Sequence[GpuView], running: Mapping[str, RunningJob]) -> Gangs | None:
    """The multi-GPU jobs among ``running`` whose GPUs are all in ``views``; None if none."""
    position = {v.id: i for i, v in enumerate(views)}
    gangs = [(tuple(position[g] for g in job.gpus), job.profile)
             for job in running.values() if len(job.gpus) > 1 and all(g in position for g in job.gpus)]
    return Gangs.of(gangs, len(views)) if gangs else None


def gang_nodes(ids: Sequence[GpuId], node: np.ndarray) -> np.ndarray:
    """Per GPU, the node number under which it may join a multi-GPU job: its node, or -1 for a
    MIG instance (a CUDA process sees one MIG device, and NCCL does not run across instances)."""
    import numpy as np
    return np.where(np.array([g.mig is not None for g in ids], dtype=bool), -1, node).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    gpus: tuple[GpuId, ...]
    mem_mib: float | None = None  # the requirement it was placed with (a job of unknown memory: its room)
    room_mib: float | None = None  # the room its GPUs had for it (MPS limits derive from both)
    #: Started on observation, past what the model predicts (``Job.on_trial``): taken back by
    #: freezing if its neighbours are seen slowed past the limit (``collocate.core.suspension``).
    trial: bool = False
    #: Placed by a policy that never runs another job beside it (``exclusive``; a job frozen for
    #: a higher one cannot grow): the attempt runs unfenced (``Job.placed_alone``).
    alone: bool = False


@dataclass(frozen=True, slots=True)
class Rejection:
    job_id: str
    reason: str


class WaitKind(StrEnum):
    """Why a pending job was not placed in a round."""

    GPUS = "gpus"  # not enough GPUs it may use are free (policies that never share)
    MEMORY = "memory"  # no GPU has room for its requirement
    IN_FLIGHT = "in-flight"  # GPUs with room started a job not yet seen running (CARMA's guard)
    BUSY = "busy"  # GPUs with room are saturated (the risk filter)
    SLOWDOWN = "slowdown"  # sharing any GPU with room would slow jobs too much, or gain too little
    RESERVED = "reserved"  # the room it would take is kept for a job waiting longer
    QUEUE = "queue"  # a job ahead of it must start first (strict order, or beyond the scan depth)
    DEPENDENCY = "dependency"  # a job it runs --after has not ended yet
    DRAIN = "drain"  # the daemon is draining: nothing new starts
    DISK = "disk"  # the daemon's disk is (nearly) full: a launch could not be recorded
    HELD = "held"  # held by its owner or the daemon's owner (``collocate release`` frees it)
    LIMIT = "limit"  # its user runs as many jobs or GPUs as the daemon's owner allows
    QUOTA = "quota"  # its user's jobs store as much as the daemon's owner allows (logs, specs)


@dataclass(frozen=True, slots=True)
class Wait:
    """Why a job waits, as data: a kind to count and a sentence for people."""

    kind: WaitKind
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}" if self.detail else self.kind.value


@dataclass(frozen=True, slots=True)
class Freeze:
    """A running job to freeze (``collocate.core.suspension``), why in words, and the jobs it is
    frozen beside (a job on trial: it thaws once one of them is gone) or for (preempted by a
    job of higher priority: it thaws once that one ends or is frozen itself)."""

    job_id: str
    why: str
    beside: tuple[str, ...]
    by: str = "trial"  # ``Job.suspended`` it gets: "trial" or "preempt"


@dataclass(frozen=True, slots=True)
class Plan:
    """What one scheduling round decided. An executor (simulator or daemon) applies it.

    ``waits`` says why jobs the policy looked at and did not place wait; a pending job it did
    not look at (beyond its scan, or behind a blocked head) waits in the queue. ``recheck_at``
    is when the policy would decide otherwise with nothing else changed (a guard that lapses, a
    reservation that becomes due): the simulator looks again then; ``inf``: only on a change."""

    placements: tuple[Placement, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    waits: Mapping[str, Wait] = field(default_factory=dict)
    recheck_at: float = math.inf
    #: Running jobs to freeze before the placements launch (priority preemption by suspension,
    #: ``collocate.core.preemption``): the executor stops them, they keep their memory.
    freeze: tuple[Freeze, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.placements or self.rejections or self.freeze)



def _fields_of(cls: type) -> tuple[Callable[[object], tuple], dict[str, int]]:
    """A dataclass's fields read in one call, and each one's position (its ``__init__``'s)."""
    names = [f.name for f in fields(cls)]
    return operator.attrgetter(*names), {name: i for i, name in enumerate(names)}


def _replaced(obj: object, changes: dict[str, object], read: Callable[[object], tuple],
              position: dict[str, int]) -> list:
    """``obj``'s field values in order, with ``changes``: one ``attrgetter`` call and the
    dataclass's own ``__init__`` beat a loop over the fields (a simulation evolves jobs and
    snapshots hundreds of thousands of times)."""
    values = list(read(obj))
    for name, value in changes.items():
        i = position.get(name)
        if i is None:
            raise TypeError(f"{type(obj).__name__} has no field {name!r}")
        values[i] = value
    return values


_JOB_FIELDS = _fields_of(Job)
_SNAPSHOT_FIELDS = _fields_of(ClusterSnapshot)
