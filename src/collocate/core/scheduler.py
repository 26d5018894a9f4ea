"""The scheduling core that the simulator and the daemon both run.

It owns the queue and the jobs' states, asks the policy for a plan each round, checks the plan,
and applies the recovery rules when a job's process ends. A job that depends on others
(``Job.after``: must end done; ``after_any``: must end; ``after_notok``: must end other than
done) stays pending outside the policy's queue until they have, and is cancelled once they
never can; so does a held job (``hold``/``release``). A CPU job (``Job.gpus == 0``: a pipeline's
prepare or evaluate step) never reaches the policy: every round starts it at once, on no GPU,
while its user runs fewer CPU jobs than ``UserLimits.max_cpu_jobs`` (one rule for every policy,
here). Among users who wait, fair share orders
the queue and per-user caps bound what one user runs (``collocate.core.fairness``); a sweep's
``sweep_max`` bounds how many of its jobs run at once (Slurm's ``--array=0-9%2``); a job with a time
limit is reported ``overdue`` once it has run that long. It does no I/O and reads no clock:
the caller passes the cluster snapshot and the time, and persists every changed job through the
``on_change`` hook (the daemon writes it to SQLite; the simulator keeps it in memory).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sortedcontainers import SortedKeyList

from collocate.common.errors import CollocateError
from collocate.core.fairness import Fairness, FairQueue, Usage
from collocate.core.model import (
    ClusterSnapshot,
    Job,
    JobState,
    Placement,
    Plan,
    Rejection,
    Wait,
    WaitKind,
    queue_key,
)
from collocate.core.policies.base import Policy
from collocate.core.preemption import DEPTH, SCAN, Idle, may_preempt, preempt
from collocate.core.recovery import ExitReport, Outcome, RecoveryRules, after_exit, overrun_requirement
from collocate.core.suspension import DEFAULT_RULES, Neighbour, SuspendRules, Suspensions, may_freeze, review


class PolicyError(CollocateError):
    """A policy returned an impossible plan: a bug in the policy, never the user's fault."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """The static shape of the cluster, to reject jobs no node could ever run.

    Hardware rules live here, read from the snapshot, so the simulator and the daemon admit the
    same jobs: a GPU whose ``GpuId.mig`` names an instance is a MIG instance, which runs one
    job's single device only (a CUDA process sees one MIG device and NCCL does not run across
    MIG instances), so a multi-GPU job needs whole GPUs of one node.
    """

    nodes: tuple[tuple[int, float], ...]  # per node: (whole GPU count, largest whole GPU MiB)
    largest_instance_mib: float = 0.0  # the largest MIG instance's memory; 0 when there is none
    _largest: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Largest GPU memory among nodes with at least k whole GPUs, for every k: O(1) checks.
        most = max((n for n, _ in self.nodes), default=0)
        if self.largest_instance_mib:
            most = max(most, 1)  # a 1-GPU job may take an instance
        largest = [0.0] * (most + 1)
        for count, mib in self.nodes:
            for k in range(1, count + 1):
                largest[k] = max(largest[k], mib)
        if self.largest_instance_mib:
            largest[1] = max(largest[1], self.largest_instance_mib)
        object.__setattr__(self, "_largest", tuple(largest))

    @classmethod
    def of(cls, cluster: ClusterSnapshot) -> Capacity:
        shape: dict[int, tuple[int, float]] = {}
        instance = 0.0
        for gpu, node, total in zip(cluster.ids, cluster.node.tolist(), cluster.total_mib.tolist(), strict=True):
            count, largest = shape.get(node, (0, 0.0))
            if gpu.mig is not None:
                instance = max(instance, total)
                shape[node] = (count, largest)
            else:
                shape[node] = (count + 1, max(largest, total))
        return cls(tuple(shape.values()), instance)

    def why_not(self, job: Job) -> str | None:
        if job.gpus == 0:  # a CPU job: any machine runs it
            return None if job.nodes == 1 else "a CPU job (0 GPUs) runs on one node"
        if job.gpus < 0 or job.nodes < 1:
            return "a job needs 0 GPUs (a CPU job) or at least 1 GPU, on at least 1 node"
        if job.nodes > 1:
            return self._why_not_across(job)
        most_gpus = len(self._largest) - 1
        if job.gpus > most_gpus:
            if self.largest_instance_mib:
                return (
                    f"needs {job.gpus} GPUs, but under MIG a job runs on one instance: a CUDA process "
                    "sees a single MIG device and NCCL does not run across MIG instances"
                    + (f" (the largest node has {most_gpus} whole GPUs)" if most_gpus > 1 else "")
                )
            return f"needs {job.gpus} GPUs on one node but the largest node has {most_gpus}"
        if job.mem_mib is not None:
            largest = self._largest[job.gpus]
            if job.mem_mib > largest:
                if job.gpus == 1 and largest == self.largest_instance_mib:
                    return (
                        f"needs {job.mem_mib:.0f} MiB but the largest MIG instance has "
                        f"{largest:.0f} MiB"
                    )
                return (
                    f"needs {job.mem_mib:.0f} MiB per GPU but the largest GPU has {largest:.0f} MiB"
                )
        return None

    def largest_mib(self, job: Job) -> float:
        """The most memory per GPU any placement of ``job`` could give it (0: none could)."""
        if job.nodes > 1:
            return max((mib for count, mib in self.nodes if count >= job.gpus), default=0.0)
        return self._largest[job.gpus] if 0 < job.gpus < len(self._largest) else 0.0

    def _why_not_across(self, job: Job) -> str | None:
        """A job on several nodes needs that many nodes with ``job.gpus`` whole GPUs each, big
        enough for it (MIG instances never join: NCCL does not run across them)."""
        fit = [(count, mib) for count, mib in self.nodes if count >= job.gpus]
        if len(fit) < job.nodes:
            return (f"needs {job.nodes} nodes with {job.gpus} whole GPU(s) each, but only {len(fit)} "
                    f"of the {len(self.nodes)} node(s) have that many")
        if job.mem_mib is not None:
            big = [mib for _, mib in fit if mib >= job.mem_mib]
            if len(big) < job.nodes:
                return (f"needs {job.mem_mib:.0f} MiB per GPU on {job.nodes} nodes, but only {len(big)} "
                        f"node(s) have {job.gpus} GPU(s) that large")
        return None


class AloneAsWhole(Sequence[Job]):
    """The queue as policies see it when some jobs run alone (``Job.alone``): such a job asks
    for the whole of the largest GPU it may use, so every policy places it only on an empty GPU
    (the world then charges it the whole GPU while it runs: nothing is placed beside it)."""

    def __init__(self, queue: Sequence[Job], capacity: Capacity) -> None:
        self._queue, self._capacity = queue, capacity

    def _view(self, job: Job) -> Job:
        if not job.alone:
            return job
        return job.evolve(mem_mib=self._capacity.largest_mib(job), mem_source="declared",
                          mem_uncertainty=0.0)

    def __iter__(self):
        return (self._view(j) for j in self._queue)

    def __len__(self) -> int:
        return len(self._queue)

    def __getitem__(self, i):
        item = self._queue[i]
        return [self._view(j) for j in item] if isinstance(i, slice) else self._view(item)


class Scheduler:
    def __init__(
        self,
        policy: Policy,
        capacity: Capacity,
        *,
        rules: RecoveryRules = RecoveryRules(),
        on_change: Callable[[Job], None] | None = None,
        fairness: Fairness | None = None,
        suspend: SuspendRules | None = DEFAULT_RULES,
    ) -> None:
        self.policy = policy
        self.suspend_rules = suspend  # None: jobs started on trial are never taken back
        self.capacity = capacity
        self.rules = rules
        self.jobs: dict[str, Job] = {}
        self._queues: dict[str, SortedKeyList] = {}  # user -> their pending jobs the policy may see
        self._cpu_queues: dict[str, SortedKeyList] = {}  # user -> their pending CPU jobs (no policy)
        self._cpu_running: dict[str, int] = {}  # user -> CPU jobs running
        #: The CPU-job cap of a user whose limits set none (``UserLimits.max_cpu_jobs``); None:
        #: no cap. The daemon sets its machine's cores; the simulator leaves it None.
        self.cpu_jobs_default: int | None = None
        self._dependents: dict[str, set[str]] = {}  # job id -> pending jobs waiting for it
        self._on_change = on_change or (lambda job: None)
        self.placements_made = 0
        self.waits: dict[str, Wait] = {}  # why the jobs the last round looked at still wait
        self._known_gpus: tuple[tuple, frozenset] = ((), frozenset())
        self.fairness = fairness = fairness or Fairness()
        self.usage = Usage(fairness.half_life_s)
        self._deadlines: dict[str, float] = {}  # running job id -> when its time limit is up
        self._now = 0.0  # the last round's time: the order ``queue`` shows between rounds
        self._alone: set[str] = set()  # pending jobs whose next attempt runs alone
        #: user -> why their jobs get no new attempt (at their storage quota; the daemon's
        #: ``quotas.Accounts.over_quota`` sets it every round, the simulator never)
        self.stopped_users: Mapping[str, str] = {}
        self._watched: dict[str, None] = {}  # running jobs on trial or frozen by the scheduler
        self._running_gpu: dict[str, None] = {}  # running GPU jobs: who a preemptor may freeze
        self._priorities: dict[int, int] = {}  # priority -> running GPU jobs of it (preemption's fast path)
        self._sweep_running: dict[str, int] = {}  # sweep (with a sweep_max) -> its jobs running

    # -- queue ------------------------------------------------------------------------------
    @property
    def queue(self) -> Sequence[Job]:
        """Pending jobs the policy may place, in queue order (read-only view): the order of the
        last round, with users at a cap included (``eligible`` leaves them out)."""
        return FairQueue(self._queues, self._usage_at(self._now))

    @property
    def waiting(self) -> bool:
        """Whether any job waits in the queue (cheaper than ``queue``: a simulation asks after
        every event), CPU jobs included."""
        return any(self._queues.values()) or any(self._cpu_queues.values())

    def pending_by_user(self) -> Iterator[Sequence[Job]]:
        """Each user's pending jobs, GPU then CPU queues (a user may have both): per user,
        without merging the queues, for what needs the users and not the order."""
        for queues in (self._queues, self._cpu_queues):
            yield from (q for q in queues.values() if q)

    @property
    def cpu_queue(self) -> Sequence[Job]:
        """Pending CPU jobs ready to start (``queue`` holds the GPU jobs the policy sees)."""
        return FairQueue(self._cpu_queues, None)

    def eligible(self, now: float) -> Sequence[Job]:
        """What the policy sees at ``now``: the queue without the jobs of users at a cap or
        stopped (``stopped_users``), and of sweeps that run their ``sweep_max``."""
        queues = self._queues if not self.stopped_users else {
            user: q for user, q in self._queues.items() if user not in self.stopped_users}
        if not self.fairness.capped:
            return FairQueue(queues, self._usage_at(now), self._sweep_full if self._sweep_running else None)
        # users at a cap whatever the job: left out whole, so a flood costs nothing per round
        open_users = {user: q for user, q in queues.items()
                      if q and self._cap(q[0].evolve(gpus=1, nodes=1)) is None}
        skip = self._over_cap if not self._sweep_running else (
            lambda job: self._sweep_full(job) or self._over_cap(job))
        return FairQueue(open_users, self._usage_at(now), skip)

    def set_fairness(self, fairness: Fairness) -> None:
        """New caps or fair-share settings (the daemon's owner changed them); usage is kept."""
        self.fairness = fairness
        self.usage.half_life_s = fairness.half_life_s

    def submit(self, job: Job) -> Job:
        """Queue a job, or reject it with a reason when no node could ever run it or a job it
        depends on is unknown or has already ended in a way that rules it out."""
        if job.id in self.jobs:
            raise CollocateError(f"job id {job.id!r} is already known")
        reason = self.capacity.why_not(job) or self.why_not_after(job)
        if reason is not None:
            return self._store(job.evolve(state=JobState.REJECTED, reason=reason))
        waiting = self._unfinished(job)
        if waiting:
            for dep in waiting:
                self._dependents.setdefault(dep, set()).add(job.id)
            return self._store(job.evolve(state=JobState.PENDING, reason=_waits_for(waiting)))
        return self._store(job.evolve(state=JobState.PENDING))

    def why_not_after(self, job: Job) -> str | None:
        """Why ``job``'s dependencies can never be met, or None."""
        for dep in (*job.after, *job.after_any, *job.after_notok):
            if dep not in self.jobs:
                return f"depends on job {dep}, which does not exist"
        for dep in job.after:
            state = self.jobs[dep].state
            if state.is_terminal and state is not JobState.DONE:
                return f"depends on job {dep}, which ended {state.value}"
        for dep in job.after_notok:
            if self.jobs[dep].state is JobState.DONE:
                return f"runs only if job {dep} does not succeed (--after-notok), but it ended done"
        if (through := self._cycle(job)) is not None:
            return ("depends on itself" if through == job.id
                    else f"would wait for itself: job {through} waits for it")
        return None

    def _cycle(self, job: Job) -> str | None:
        """The dependency of ``job`` that leads back to it (a pending job's dependencies edited
        by ``edit``; a new job's cannot, as they existed before it), or None."""
        seen: set[str] = set()
        for first in (*job.after, *job.after_any, *job.after_notok):
            stack = [first]
            while stack:
                dep = stack.pop()
                if dep == job.id:
                    return first
                other = self.jobs.get(dep)
                if dep in seen or other is None or other.state is not JobState.PENDING:
                    continue
                seen.add(dep)
                stack.extend((*other.after, *other.after_any, *other.after_notok))
        return None

    def restore(self, jobs: Iterable[Job]) -> None:
        """Load jobs saved by an earlier run (the daemon after a restart), without callbacks
        except for jobs whose dependencies ended badly while the daemon was down (cancelled)."""
        for job in jobs:
            self.jobs[job.id] = job
        doomed = []
        for job in self.jobs.values():
            if job.state is JobState.RUNNING:
                self._running(job)
                if _watch(job):
                    self._watched[job.id] = None
            if job.state is not JobState.PENDING:
                continue
            if job.alone:
                self._alone.add(job.id)
            if why := self.why_not_after(job):
                doomed.append(job.evolve(state=JobState.CANCELLED, reason=why))
            elif waiting := self._unfinished(job):
                for dep in waiting:
                    self._dependents.setdefault(dep, set()).add(job.id)
            elif not job.held:
                self._queue_for(job).add(job)
        for job in doomed:
            self._store(job)

    # -- rounds -----------------------------------------------------------------------------
    def schedule(self, cluster: ClusterSnapshot, idle: Idle | None = None) -> Plan:
        """Run one policy round and mark the placed jobs running. With ``idle`` (the cluster as
        if given jobs were frozen: ``World.snapshot(now, idle)``), a round that placed nothing
        lets a waiting job of higher priority freeze lower ones and start beside them
        (``collocate.core.preemption``): the plan's ``freeze`` names them."""
        self._now = cluster.now
        cpu = self._cpu_plan() if any(self._cpu_queues.values()) else Plan()
        if not any(self._queues.values()):
            return self._placed(cpu, cluster) if cpu.placements or cpu.waits else Plan()
        if self.placements_made:  # the scheduler alone counts them; snapshot builders do not
            cluster = cluster.evolve(placements_made=self.placements_made)
        queue = self.eligible(cluster.now)
        if self._alone:
            queue = AloneAsWhole(queue, self.capacity)
        plan = self.policy(queue, cluster) if queue else Plan()
        self._check(plan, cluster)
        plan = self._within_sweeps(plan)  # first: a job it holds back takes no one's cap
        if self.fairness.capped:
            plan = self._within_caps(plan)
        if cpu.placements or cpu.waits:
            plan = Plan(cpu.placements + plan.placements, plan.rejections, {**plan.waits, **cpu.waits},
                        plan.recheck_at)
        plan = self._placed(plan, cluster)
        if idle is not None and self.suspend_rules is not None and self.suspend_rules.preempt:
            plan = self._preempt(plan, queue, cluster, idle)
        return plan

    def _preempt(self, plan: Plan, queue: Sequence[Job], cluster: ClusterSnapshot, idle: Idle) -> Plan:
        """Let the first waiting jobs of higher priority than some running job try to start by
        freezing lower ones (``preemption.preempt``); one per round, and only in a round that
        started no GPU job: the snapshot does not show this round's placements, so the next
        round (at once: ``recheck_at``) looks again."""
        if not self._priorities or (top := self._top_waiting_priority()) is None or top <= min(self._priorities):
            return plan
        if any(p.gpus for p in plan.placements):
            return Plan(plan.placements, plan.rejections, plan.waits, min(plan.recheck_at, cluster.now))
        lowest, tried = min(self._priorities), 0
        for job in itertools.islice(queue, DEPTH):
            if job.priority <= lowest:
                continue
            if tried >= SCAN:
                break
            job = self.jobs[job.id]  # not the queue's view of it (``AloneAsWhole``)
            if not may_preempt(job, self.waits.get(job.id)) or (self.fairness.capped and self._cap(job)):
                continue
            tried += 1
            found = preempt(job, (self.jobs[j] for j in self._running_gpu), self.policy, cluster, idle)
            if found is None:
                continue
            self._check(Plan((found.placement,)), cluster)
            for f in found.freeze:
                self.suspend(f.job_id, f.by, cluster.now, why=f.why, beside=f.beside)
            self._store(job.evolve(state=JobState.RUNNING, attempts=job.attempts + 1, started_at=cluster.now,
                                   frozen_s=0.0, thawed_at=None, placed_alone=found.placement.alone,
                                   on_trial=found.placement.trial and may_freeze(job)))
            self.placements_made += 1
            self.waits.pop(job.id, None)
            # the next round at once: another job may preempt, on a snapshot that shows this one
            return Plan(plan.placements + (found.placement,), plan.rejections,
                        {k: w for k, w in plan.waits.items() if k != job.id}, min(plan.recheck_at, cluster.now),
                        found.freeze)
        return plan

    def _top_waiting_priority(self) -> int | None:
        """The highest priority among the GPU jobs in the queues, None when none waits: per user
        the first job, or the first not recovered (recovered ones go first whatever their
        priority, ``queue_key``). O(users x log jobs): preemption's fast path, every round."""
        top: int | None = None
        for queue in self._queues.values():
            if not queue:
                continue
            best = queue[0].priority
            first_fresh = queue.bisect_key_left((True,))
            if 0 < first_fresh < len(queue):
                best = max(best, queue[first_fresh].priority)
            top = best if top is None else max(top, best)
        return top

    def _placed(self, plan: Plan, cluster: ClusterSnapshot) -> Plan:
        """Mark a checked plan's jobs running (or rejected)."""
        self.waits = dict(plan.waits)
        for placement in plan.placements:
            job = self.jobs[placement.job_id]
            self._store(job.evolve(state=JobState.RUNNING, attempts=job.attempts + 1,
                                   started_at=cluster.now, frozen_s=0.0, thawed_at=None,
                                   on_trial=placement.trial and may_freeze(job),
                                   placed_alone=placement.alone))
        for rejection in plan.rejections:
            job = self.jobs[rejection.job_id]
            self._store(job.evolve(state=JobState.REJECTED, reason=rejection.reason))
        self.placements_made += len(plan.placements)
        return plan

    def why_waiting(self, job_id: str) -> Wait | None:
        """Why a pending job has not started: a hold, its dependencies, its user's cap, the
        last round's reason, or its turn in the queue (the policy stopped before it). None for
        a job that is not pending."""
        job = self.jobs.get(job_id)
        if job is None or job.state is not JobState.PENDING:
            return None
        if job.held:
            by = "the daemon's owner" if job.held == "admin" else "its owner"
            return Wait(WaitKind.HELD, f"held by {by}: `collocate release {job.id}` lets it start")
        if (job.after or job.after_any or job.after_notok) and (waiting := self._unfinished(job)):
            return Wait(WaitKind.DEPENDENCY, _waits_for(waiting))
        if job.user in self.stopped_users:
            return Wait(WaitKind.QUOTA, self.stopped_users[job.user])
        if why := self.why_not_sweep(job):
            return Wait(WaitKind.LIMIT, why)
        if job.gpus == 0:
            why = self.fairness.limits(job.user).why_not_cpu(job.user, self._cpu_running.get(job.user, 0),
                                                             self.cpu_jobs_default)
            return Wait(WaitKind.LIMIT, why) if why else Wait(
                WaitKind.QUEUE, "a CPU job: it starts at the next scheduling round")
        if self.fairness.capped and (why := self._cap(job)):
            return Wait(WaitKind.LIMIT, why)
        return self.waits.get(job_id) or Wait(
            WaitKind.QUEUE, "not reached by the last scheduling round: jobs ahead of it go first")

    def job_exited(self, job_id: str, report: ExitReport, now: float | None = None) -> Job:
        """Apply the recovery rules to a running job's end; ``now`` (when it ended) charges the
        GPU time it held to its user's fair-share usage."""
        job = self.jobs[job_id]
        if job.state is not JobState.RUNNING:
            raise CollocateError(f"job {job_id} is {job.state}, not running")
        job = after_exit(job, report, self.rules)
        if report.outcome is Outcome.OOM and job.state is JobState.PENDING and job.mem_mib is not None:
            top = self.capacity.largest_mib(job)
            if job.mem_mib > top > (report.observed_peak_mib or 0.0):
                # what it needed fits a GPU but the raised requirement's margins do not: alone
                job = job.evolve(mem_mib=top, alone=True)
        if job.state is JobState.PENDING and (why := self.capacity.why_not(job)):
            # e.g. an OOM raised its requirement beyond every GPU: waiting would be forever
            cause = report.reason or report.outcome.value
            job = job.evolve(state=JobState.FAILED, reason=f"{cause}; cannot retry: it now {why}")
        return self._store(job, now)

    def charge_overrun(self, job_id: str, held_mib: float) -> Job | None:
        """A job held ``held_mib``, more than it committed, and a neighbour crashed out of
        memory for it: its requirement rises from what it held (within the largest GPU), so its
        next attempt is charged for it (``collocate.core.recovery``). None: no such job."""
        job = self.jobs.get(job_id)
        if job is None or job.state.is_terminal:
            return job
        raised = overrun_requirement(job, held_mib, self.rules)
        if raised is job:
            return job
        if raised.mem_mib is not None:
            raised = raised.evolve(mem_mib=min(raised.mem_mib, max(held_mib, self.capacity.largest_mib(job))))
        return self._store(raised)

    def cancel(self, job_id: str, reason: str = "cancelled by the user", now: float | None = None) -> Job:
        job = self.jobs[job_id]
        if job.state.is_terminal:
            return job
        return self._store(job.evolve(state=JobState.CANCELLED, reason=reason), now)

    def hold(self, job_id: str, by: str = "user") -> Job:
        """Keep a pending job from starting until ``release`` (Slurm's ``scontrol hold``)."""
        job = self.jobs[job_id]
        if job.state is not JobState.PENDING:
            raise CollocateError(f"job {job_id} is {job.state.value}: only a pending job can be held")
        return self._store(job.evolve(held=by or "user"))

    def release(self, job_id: str) -> Job:
        job = self.jobs[job_id]
        return job if not job.held else self._store(job.evolve(held=""))

    def overdue(self, now: float) -> list[Job]:
        """Running jobs whose time limit is up at ``now``: the caller stops them and reports
        ``Outcome.TIMEOUT``."""
        return [self.jobs[j] for j, deadline in self._deadlines.items() if deadline <= now]

    # -- suspension (``collocate.core.suspension``) -------------------------------------------------
    @property
    def reviewing(self) -> bool:
        """Whether any running job is on trial or frozen by the scheduler (``review`` has work)."""
        return bool(self._watched)

    def review(self, neighbourhood: Callable[[str], Sequence[Neighbour]], now: float) -> Suspensions:
        """Freeze the jobs on trial that slow a neighbour past the limit, thaw the frozen ones
        whose room returned or whose preemptor ended (``suspension.review``), and record it; the caller carries it out
        (the simulator stops their progress, the daemon freezes their cgroups)."""
        if not self._watched or self.suspend_rules is None:
            return Suspensions()
        decided = review(self.jobs, list(self._watched), neighbourhood, now, self.suspend_rules)
        for f in decided.freeze:
            self.suspend(f.job_id, "trial", now, why=f.why, beside=f.beside)
        for job_id in decided.thaw:
            self.resume(job_id, now)
        return decided

    def suspend(self, job_id: str, by: str, now: float, *, why: str = "",
                beside: tuple[str, ...] = ()) -> Job:
        """Record a running job as frozen (``by``: "trial" or "preempt", the scheduler; "user",
        its owner or the daemon's owner): its time limit stops running until ``resume``. A job already
        frozen by the scheduler that its owner suspends becomes theirs to resume."""
        job = self.jobs[job_id]
        if job.state is not JobState.RUNNING:
            raise CollocateError(f"job {job_id} is {job.state.value}: only a running job can be suspended")
        if job.suspended:
            return job if job.suspended == by or by != "user" else self._store(
                job.evolve(suspended=by, suspended_why=why or job.suspended_why, suspended_beside=()))
        self._deadlines.pop(job_id, None)
        return self._store(job.evolve(suspended=by, suspended_at=now, suspended_why=why,
                                      suspended_beside=beside))

    def resume(self, job_id: str, now: float) -> Job:
        """Record a frozen job as running again; its time limit runs on from where it stopped."""
        job = self.jobs[job_id]
        if not job.suspended:
            return job
        frozen = job.frozen_s + max(0.0, now - (job.suspended_at if job.suspended_at is not None else now))
        job = self._store(job.evolve(suspended="", suspended_at=None, suspended_why="", suspended_beside=(),
                                     thawed_at=now, frozen_s=frozen))
        self._running(job, deadline_only=True)
        return job

    def update(self, job: Job) -> Job:
        """Replace a job's record (e.g. a new estimate), keeping the queue consistent."""
        return self._store(job)

    def edit(self, job: Job) -> Job:
        """A pending job as its owner changed it (Slurm's ``scontrol update``): its memory,
        time limit, name, priority or dependencies. New dependencies are checked as at submit
        (they exist and can still be met) and for a cycle; the job then waits for them."""
        old = self.jobs[job.id]
        if old.state is not JobState.PENDING:
            raise CollocateError(f"job {job.id} is {old.state.value}: only a pending job can be changed")
        if why := self.capacity.why_not(job) or self.why_not_after(job):
            raise CollocateError(f"job {job.id} cannot be changed so: it {why}")
        for dep in (*old.after, *old.after_any, *old.after_notok):
            self._dependents.get(dep, set()).discard(job.id)
        waiting = self._unfinished(job)
        for dep in waiting:
            self._dependents.setdefault(dep, set()).add(job.id)
        return self._store(job.evolve(reason=_waits_for(waiting) if waiting else ""))

    # -- internals --------------------------------------------------------------------------
    def _queue_for(self, job: Job) -> SortedKeyList:
        """The queue a pending job waits in: its user's CPU queue for a CPU job, else theirs."""
        if job.gpus:
            return self._queue_of(job.user)
        queue = self._cpu_queues.get(job.user)
        if queue is None:
            queue = self._cpu_queues[job.user] = SortedKeyList(key=queue_key)
        return queue

    def cpu_running(self, user: str) -> int:
        """How many CPU jobs ``user`` runs now."""
        return self._cpu_running.get(user, 0)

    def _cpu_plan(self) -> Plan:
        """Every pending CPU job whose user is under their CPU cap, placed on no GPU, in each
        user's queue order; the others wait with the cap as their reason. O(users + placed)."""
        placed: list[Placement] = []
        waits: dict[str, Wait] = {}
        swept: dict[str, int] = {}  # sweep -> its jobs placed here (``Job.sweep_max``)
        for user, queue in self._cpu_queues.items():
            if user in self.stopped_users:  # at their storage quota: no new attempt, CPU or not
                continue
            limits = self.fairness.limits(user)
            running = self._cpu_running.get(user, 0)
            for job in queue:
                if job.sweep_max and (why := self.why_not_sweep(job, swept.get(job.sweep, 0))):
                    waits[job.id] = Wait(WaitKind.LIMIT, why)
                    continue
                why = limits.why_not_cpu(user, running, self.cpu_jobs_default)
                if why is not None:
                    waits[job.id] = Wait(WaitKind.LIMIT, why)
                    break  # the rest of this user's CPU jobs wait for the same reason
                placed.append(Placement(job.id, ()))
                running += 1
                if job.sweep_max:
                    swept[job.sweep] = swept.get(job.sweep, 0) + 1
        return Plan(tuple(placed), (), waits)

    def _queue_of(self, user: str) -> SortedKeyList:
        queue = self._queues.get(user)
        if queue is None:
            queue = self._queues[user] = SortedKeyList(key=queue_key)
        return queue

    def _usage_at(self, now: float) -> Callable[[str], float] | None:
        if not self.fairness.fair_share:
            return None
        return lambda user: self.usage.of(user, now)

    def _store(self, job: Job, now: float | None = None) -> Job:
        old = self.jobs.get(job.id)
        if job.state is not JobState.RUNNING and (job.suspended or job.on_trial):
            job = job.evolve(suspended="", suspended_at=None, suspended_why="", suspended_beside=(),
                             on_trial=False)
        if job.state is JobState.RUNNING and _watch(job):
            self._watched[job.id] = None
        else:
            self._watched.pop(job.id, None)
        if old is not None and old.state is JobState.PENDING:
            self._queue_for(old).discard(old)
        if old is not None and old.state is JobState.RUNNING and job.state is not JobState.RUNNING:
            self._deadlines.pop(job.id, None)
            started = old.started_at if old.started_at is not None else (now or 0.0)
            if old.sweep_max:
                self._sweep_ran(old.sweep, -1)
            if old.gpus:
                self.usage.stopped(old.user, old.width, started, now)
                self._running_gpu.pop(job.id, None)
                if (left := self._priorities.get(old.priority, 0) - 1) > 0:
                    self._priorities[old.priority] = left
                else:
                    self._priorities.pop(old.priority, None)
            elif (left := self._cpu_running.get(old.user, 0) - 1) > 0:
                self._cpu_running[old.user] = left
            else:
                self._cpu_running.pop(old.user, None)
        self.jobs[job.id] = job
        if job.alone and job.state is JobState.PENDING:
            self._alone.add(job.id)
        else:
            self._alone.discard(job.id)
        if job.state is JobState.RUNNING and (old is None or old.state is not JobState.RUNNING):
            self._running(job)
        if job.state is JobState.PENDING and not job.held and not (
                (job.after or job.after_any or job.after_notok) and self._unfinished(job)):
            self._queue_for(job).add(job)
        self._on_change(job)
        if job.state.is_terminal and job.id in self._dependents:
            self._release_dependents(job)
        return job

    def _running(self, job: Job, *, deadline_only: bool = False) -> None:
        started = job.started_at if job.started_at is not None else self._now
        if not deadline_only:
            if job.sweep_max:
                self._sweep_ran(job.sweep, +1)
            if job.gpus:
                self.usage.started(job.user, job.width, started)
                self._running_gpu[job.id] = None
                self._priorities[job.priority] = self._priorities.get(job.priority, 0) + 1
            else:  # a CPU job counts against its own cap only (``UserLimits.max_cpu_jobs``)
                self._cpu_running[job.user] = self._cpu_running.get(job.user, 0) + 1
        if job.time_limit_s is not None and not job.suspended:  # frozen time does not count
            self._deadlines[job.id] = started + job.time_limit_s + job.frozen_s

    def _unfinished(self, job: Job) -> list[str]:
        """The jobs ``job`` still waits for (by id, in the order it named them)."""
        jobs = self.jobs
        return ([dep for dep in job.after if jobs[dep].state is not JobState.DONE]
                + [dep for dep in (*job.after_any, *job.after_notok) if not jobs[dep].state.is_terminal])

    def _release_dependents(self, job: Job) -> None:
        """Queue the jobs that waited only for ``job``, or cancel those it can no longer let
        start (which cancels their own dependents in turn)."""
        for dep_id in sorted(self._dependents.pop(job.id), key=lambda i: (self.jobs[i].submit_time, i)):
            waiter = self.jobs[dep_id]
            if waiter.state is not JobState.PENDING:
                continue
            if job.id in waiter.after and job.state is not JobState.DONE:
                self._store(waiter.evolve(
                    state=JobState.CANCELLED, reason=f"job {job.id} it depends on ended {job.state.value}"
                ))
            elif job.id in waiter.after_notok and job.state is JobState.DONE:
                self._store(waiter.evolve(
                    state=JobState.CANCELLED,
                    reason=f"job {job.id} ended done; this job was to run only if it did not (--after-notok)"))
            elif not (waiting := self._unfinished(waiter)):
                self._store(waiter.evolve(reason=""))
            else:
                self._store(waiter.evolve(reason=_waits_for(waiting)))

    def why_not_sweep(self, job: Job, extra: int = 0) -> str | None:
        """Why one more job of ``job``'s sweep may not start beside those running (and
        ``extra`` placed in this round), or None."""
        if not job.sweep_max:
            return None
        running = self._sweep_running.get(job.sweep, 0) + extra
        if running < job.sweep_max:
            return None
        return f"sweep {job.sweep}: {running} of its jobs running (--sweep-max {job.sweep_max})"

    def _sweep_full(self, job: Job) -> bool:
        return bool(job.sweep_max) and self._sweep_running.get(job.sweep, 0) >= job.sweep_max

    def _sweep_ran(self, sweep: str, change: int) -> None:
        if (running := self._sweep_running.get(sweep, 0) + change) > 0:
            self._sweep_running[sweep] = running
        else:
            self._sweep_running.pop(sweep, None)

    def _within_sweeps(self, plan: Plan) -> Plan:
        """The plan without placements that would run more of a sweep at once than its
        ``sweep_max`` (in the plan's order); those jobs wait with the sweep's reason."""
        taken: dict[str, int] = {}
        kept: list[Placement] = []
        waits: dict[str, Wait] = {}
        for p in plan.placements:
            job = self.jobs[p.job_id]
            if job.sweep_max and (why := self.why_not_sweep(job, taken.get(job.sweep, 0))):
                waits[job.id] = Wait(WaitKind.LIMIT, why)
                continue
            kept.append(p)
            if job.sweep_max:
                taken[job.sweep] = taken.get(job.sweep, 0) + 1
        if not waits:
            return plan
        return Plan(tuple(kept), plan.rejections, {**plan.waits, **waits}, plan.recheck_at)

    def _cap(self, job: Job, extra_jobs: int = 0, extra_gpus: int = 0) -> str | None:
        jobs, gpus = self.usage.running(job.user)
        return self.fairness.limits(job.user).why_not(job.user, jobs + extra_jobs, gpus + extra_gpus, job.width)

    def _over_cap(self, job: Job) -> bool:
        return self._cap(job) is not None

    def _within_caps(self, plan: Plan) -> Plan:
        """The plan without placements that would take a user past a cap in this round (in the
        policy's order); those jobs wait with the cap as their reason."""
        taken: dict[str, tuple[int, int]] = {}
        kept: list[Placement] = []
        waits = dict(plan.waits)
        for p in plan.placements:
            job = self.jobs[p.job_id]
            jobs, gpus = taken.get(job.user, (0, 0))
            why = self._cap(job, jobs, gpus)
            if why is None:
                kept.append(p)
                taken[job.user] = (jobs + 1, gpus + job.width)
            else:
                waits[job.id] = Wait(WaitKind.LIMIT, why)
        if len(kept) == len(plan.placements):
            return plan
        return Plan(tuple(kept), plan.rejections, waits)

    def _check(self, plan: Plan, cluster: ClusterSnapshot) -> None:
        if self._known_gpus[0] is not cluster.ids:
            self._known_gpus = (cluster.ids, frozenset(cluster.ids))
        known = self._known_gpus[1]
        owner = dict(zip(cluster.ids, cluster.owner, strict=True)) if cluster.owner else None
        seen: set[str] = set()
        for p in plan.placements:
            job = self.jobs.get(p.job_id)
            if job is None or job.state is not JobState.PENDING or p.job_id in seen:
                raise PolicyError(f"policy {self.policy.name} placed job {p.job_id} that is not pending")
            seen.add(p.job_id)
            if len(set(p.gpus)) != job.width or not set(p.gpus) <= known:
                raise PolicyError(
                    f"policy {self.policy.name} gave job {p.job_id} GPUs {p.gpus}; it needs {job.width}"
                )
            if len({g.node for g in p.gpus}) != job.nodes:
                raise PolicyError(f"policy {self.policy.name} put job {p.job_id} on GPUs {p.gpus}; it "
                                  f"runs on {job.nodes} node(s), {job.gpus} GPU(s) each")
            if job.width > 1 and any(g.mig is not None for g in p.gpus):
                raise PolicyError(
                    f"policy {self.policy.name} spread job {p.job_id} over GPUs {p.gpus}, which "
                    "include a MIG instance: a multi-GPU job needs whole GPUs"
                )
            if owner is not None and job.user:  # under MPS a GPU serves one user at a time
                for g in p.gpus:
                    if owner[g] not in ("", job.user):
                        raise PolicyError(f"policy {self.policy.name} put {job.user}'s job {p.job_id} "
                                          f"on {g}, which serves {owner[g]}'s jobs under MPS")
                    owner[g] = job.user
        for r in plan.rejections:
            job = self.jobs.get(r.job_id) if isinstance(r, Rejection) else None
            if job is None or job.state is not JobState.PENDING or r.job_id in seen:
                raise PolicyError(f"policy {self.policy.name} rejected {r}, which is not a pending job")


def _watch(job: Job) -> bool:
    """Whether ``review`` follows a running job: on trial, or frozen by the scheduler."""
    return job.on_trial or job.suspended in ("trial", "preempt")


def _waits_for(job_ids: Sequence[str]) -> str:
    """The reason of a job that waits on others; a job named by two kinds of dependency
    (``--after 3 --after-any 3``) once."""
    once = list(dict.fromkeys(job_ids))
    return f"waits for job{'s' if len(once) > 1 else ''} {', '.join(once)}"
