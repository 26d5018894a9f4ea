"""Start, observe, take back: which running jobs to freeze and which to thaw, one rule for both
worlds.

A job the model cannot price yet (its profile a prior) may start past the placement gates on a
GPU whose readings show room (``policies.auto``): it starts *on trial* (``Job.on_trial``). Once
it is seen working, its neighbours are watched: their slowdown as they report it (step rates,
``World.observe_progress``), else as the interference model gives it from what the GPU's
readings taught of every job there (never from a prior). If one of them is slowed past
``SuspendRules.max_slowdown``, the trial job is *frozen*: its attempt's cgroup freezer stops it
(no CPU, no new kernels), its memory and GPUs stay its own, and its ``--time`` stops running.
With ``SuspendRules.at_once`` a pile-up (several trial jobs that started on a GPU still reading
idle) is taken back in one step: as many of the most recently started trial jobs are frozen at
once as it takes to bring the rest within the limit (each working job taken to cause an equal
share of a neighbour's slowdown), then the GPU settles; by default one per GPU per settling
period (measured, see ``at_once``). When room returns (a neighbour it was frozen beside ends, or
is frozen itself) it is thawed, never killed: collocation may slow a job, never fail it.

By default every job frozen beside a job that ended thaws at that moment. With
``SuspendRules.thaw_one`` trial jobs yield in queue order (``model.queue_key``: priority, then
submission), as a plain queue would run them: the one frozen is the one that came last, and a GPU
thaws one job at a time, the first in the queue of those whose room returned, once nothing there
was frozen or thawed for ``settle_s`` and no job running there reads slowed past the limit, so
jobs frozen together no longer thaw together, collide and are frozen again. Measured
(``benchmarks/startup_trade.py``, results/startup_trade-2026-11-29d.md): fewer jobs worse off and
a lower p95 on the synthetic and CARMA traces, nothing changed on issue 35's mix and the first run,
more late starts on CARMA; off, since it does not shorten the mix's waits (docs/policies.md).

A job of higher priority freezes lower ones instead of waiting for them (``collocate.core.preemption``,
Slurm's ``PreemptMode=SUSPEND``): such a job is frozen *for* its preemptor (``suspended``
"preempt"), and thawed here once the preemptor is no longer running unfrozen (it ended, was
requeued, or was frozen itself).

A job its owner (or the daemon's owner) suspends (``collocate suspend``) stays frozen until
``collocate resume``: the scheduler never thaws it. A job across nodes and an interactive job are
never frozen by the scheduler (a frozen rank stalls its peers' collectives into their timeouts;
someone waits at an interactive job's terminal).

The decision is pure (no clock, no I/O): ``review`` reads the jobs and what the world observes of
each trial job's neighbourhood and says what to freeze and thaw; the ``Scheduler`` records it, the
simulator stops the job's progress, and the daemon asks the job's node to freeze its cgroup.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from collocate.core.model import Freeze, Job, JobState, queue_key

__all__ = ["DEFAULT_RULES", "Freeze", "Neighbour", "SuspendRules", "Suspensions", "holds_room", "may_freeze", "review"]


@dataclass(frozen=True, slots=True)
class SuspendRules:
    """The thresholds of ``review``, named.

    ``max_slowdown``: a neighbour seen slower than this takes a trial job back. 2.0: the bound
    ``policies.auto`` already admits an unpriced job by (``startup_max_slowdown``), so a job
    frozen is one the model would have kept waiting had it known what the readings now show.
    ``settle_s``: after jobs on a GPU were frozen or thawed, their neighbours' measurements need
    this long to show the new mix (a step rate is read over ``world.PROGRESS_WINDOW_S`` = 5 s of
    reports, a belief over a few 1 s samples), so nothing more is frozen there, and a job
    thawed is not frozen again, for 30 s: no flapping, and a mix that hurts is still taken back
    within a minute.
    """

    max_slowdown: float = 2.0
    settle_s: float = 30.0
    #: Whether a pile-up is taken back in one step (as many trial jobs of a GPU frozen at once as
    #: bring the rest within ``max_slowdown``) rather than one per GPU per settling period. Off:
    #: measured (``benchmarks/startup_trade.py``, 2026-11-29) it left the mix and the first run
    #: as they were under the defaults and added jobs worse off on the synthetic (33 to 36) and
    #: CARMA traces (42 to 44, p95 1.78 to 2.04): jobs frozen together thaw together, and wait.
    at_once: bool = False
    #: Whether trial jobs yield in queue order (``queue_key``: priority, then submission), as a
    #: plain queue would run them: the one frozen is the one that came last, and when room returns
    #: on a GPU only the frozen job that came first there is thawed, once no neighbour there reads
    #: slowed past ``max_slowdown``, and the GPU settles for ``settle_s`` before the next thaw.
    #: Off, the newest *started* is frozen and every job frozen beside a job gone thaws at once.
    #: Off by default: measured (module docstring) it helps jobs' tail but not the mix's waits.
    thaw_one: bool = False
    #: Whether a waiting job of higher priority freezes lower ones (``collocate.core.preemption``).
    preempt: bool = True


DEFAULT_RULES = SuspendRules()


@dataclass(frozen=True, slots=True)
class Neighbour:
    """A job on the GPUs of a job under review, as the world observes it."""

    job_id: str
    devices: tuple[int, ...]
    seq: int  # placement order
    active: bool  # seen working (its start-up and warm-up are over)
    #: Its slowdown as observed: measured from the steps it reports, else modelled from what
    #: the readings taught of it and its neighbours; 0 when nothing observed says.
    slowdown: float
    measured: bool = False  # ``slowdown`` from reported steps


@dataclass(frozen=True, slots=True)
class Suspensions:
    """What one review decided; ``recheck_at``: when it would decide otherwise with nothing
    else changed (a settling period ends)."""

    freeze: tuple[Freeze, ...] = ()
    thaw: tuple[str, ...] = ()
    recheck_at: float = math.inf

    def __bool__(self) -> bool:
        return bool(self.freeze or self.thaw)


def holds_room(suspended: str) -> bool:
    """Whether a job frozen so (``Job.suspended``) keeps a claim on its GPUs' compute that
    ``policies.auto`` must not offer a new unpriced start (``ClusterSnapshot.n_frozen``).

    A job the scheduler froze, on trial ("trial") or for a job of higher priority ("preempt"),
    draws nothing, so its GPU reads as if it had room; but it thaws by itself (when room returns,
    when its preemptor ends) and then competes again. A newcomer nobody has priced that took that
    room would slow it, and the thaw would take back nothing: measured, on the first-run trace
    14 unpriced jobs piled onto a GPU whose trial jobs had just been frozen (p95 2.47x, see
    ``benchmarks/startup_trade.py``). A job its owner suspended ("user") does not count: only
    ``collocate resume`` thaws it, perhaps never, and its GPU should not close for that long."""
    return suspended in ("trial", "preempt")


def may_freeze(job: Job) -> bool:
    """Whether the scheduler may ever freeze ``job``: never across nodes, never interactive."""
    return job.nodes == 1 and not job.interactive


def review(jobs: Mapping[str, Job], watched: Iterable[str],
           neighbourhood: Callable[[str], Sequence[Neighbour]], now: float,
           rules: SuspendRules = DEFAULT_RULES) -> Suspensions:
    """Which of the ``watched`` jobs (running on trial, or frozen by the scheduler) to freeze
    and which to thaw at ``now`` (see the module docstring). ``neighbourhood(job_id)``: every
    job on that job's GPUs, itself included."""
    watched = list(watched)
    # frozen for a preemptor that no longer runs unfrozen: thawed, whatever else holds
    thaw = [j for j in watched if (job := jobs[j]).suspended == "preempt" and job.state is JobState.RUNNING
            and not all(_runs(jobs.get(b)) for b in job.suspended_beside)]
    watched = [j for j in watched if jobs[j].suspended != "preempt"]
    freeze: list[Freeze] = []
    recheck = math.inf
    settling: set[int] = set()  # devices where something was frozen or thawed recently
    for job_id in thaw if watched else ():  # what their GPUs measured was measured without them
        settling.update(d for n in neighbourhood(job_id) if n.job_id == job_id for d in n.devices)
    if rules.thaw_one:  # the one that came last in the queue first
        order = sorted(watched, key=lambda j: queue_key(jobs[j]), reverse=True)
    else:  # the newest started first
        order = sorted(watched, key=lambda j: jobs[j].started_at or 0.0, reverse=True)
    ready: list[str] = []  # frozen on trial, room returned: thawed after the freezes (``thaw_one``)
    cache: dict[str, Sequence[Neighbour]] = {}

    def view(job_id: str) -> Sequence[Neighbour]:
        if job_id not in cache:
            cache[job_id] = neighbourhood(job_id)
        return cache[job_id]

    for job_id in order:
        for n in view(job_id):
            other = jobs.get(n.job_id)
            if other is None:
                continue
            moved = _last_moved(other)
            if now - moved < rules.settle_s:
                settling.update(n.devices)
                recheck = min(recheck, moved + rules.settle_s)
    taken: dict[str, str] = {}  # frozen in this review -> why
    for job_id in order:
        job = jobs[job_id]
        if job.state is not JobState.RUNNING:
            continue
        around = view(job_id)
        me = next((n for n in around if n.job_id == job_id), None)
        if me is None:
            continue
        others = [n for n in around if n.job_id != job_id and jobs.get(n.job_id) is not None]
        if job.suspended == "trial":
            still = {n.job_id for n in others if not jobs[n.job_id].suspended}
            gone = [b for b in job.suspended_beside if b not in still]
            if gone and rules.thaw_one:
                ready.append(job_id)
            elif gone:
                thaw.append(job_id)
                settling.update(me.devices)
            continue
        if job.suspended or not job.on_trial or not may_freeze(job) or not me.active:
            continue
        if settling.intersection(me.devices):
            continue
        slowed = [(n, after) for n in others if not jobs[n.job_id].suspended and n.job_id not in taken
                  and (after := _after(n, taken, view, jobs) if rules.at_once else n.slowdown) > rules.max_slowdown]
        if not slowed:
            continue
        worst, after = max(slowed, key=lambda s: s[1])
        how = "measured from its steps" if worst.measured else "from its GPU's readings"
        along = sum(1 for m in view(worst.job_id) if m.job_id in taken)
        estimate = f"; {after:.1f}x with the {along} newer frozen with it" if along and rules.at_once else ""
        if not rules.at_once:
            settling.update(me.devices)
        taken[job_id] = (f"slowed job {worst.job_id} to {worst.slowdown:.1f}x ({how}{estimate}; limit "
                         f"{rules.max_slowdown:g}x): frozen until room returns")
    thaw += _first_thaws(ready, taken, view, jobs, now, rules)
    for job_id, why in taken.items():  # beside: what runs on once the whole pile-up is taken back
        beside = tuple(n.job_id for n in view(job_id) if n.job_id != job_id and (o := jobs.get(n.job_id)) is not None
                       and not o.suspended and n.job_id not in taken)
        freeze.append(Freeze(job_id, why, beside))
    return Suspensions(tuple(freeze), tuple(thaw), recheck if math.isfinite(recheck) and recheck > now else math.inf)


def _after(n: Neighbour, taken: Mapping[str, str], view: Callable[[str], Sequence[Neighbour]],
           jobs: Mapping[str, Job]) -> float:
    """``n``'s slowdown once the jobs ``taken`` are frozen, as far as what was observed says:
    each job working beside it on a GPU is taken to cause an equal share of its slowdown over
    1x (exact for jobs alike under time-slicing, where n of them run 1/n as fast); across GPUs,
    the one relieved least bounds it. No model prices a job known only by a prior, so this is
    what lets a pile-up be taken back in one step rather than one job per settling period; the
    next review, on fresh readings, takes back more if it fell short."""
    if n.slowdown <= 1.0 or not taken:
        return n.slowdown
    working = [m for m in view(n.job_id) if m.job_id != n.job_id and m.active
               and (o := jobs.get(m.job_id)) is not None and not o.suspended]
    share = 0.0
    for d in n.devices:
        there = [m.job_id for m in working if d in m.devices]
        share = max(share, sum(1 for j in there if j not in taken) / len(there) if there else 1.0)
    return 1.0 + (n.slowdown - 1.0) * share


def _first_thaws(ready: Sequence[str], taken: Mapping[str, str], view: Callable[[str], Sequence[Neighbour]],
                 jobs: Mapping[str, Job], now: float, rules: SuspendRules) -> list[str]:
    """Which of the frozen trial jobs whose room returned (``ready``) to thaw with
    ``SuspendRules.thaw_one``: on each GPU, the one that came first in the queue; none where a job
    was frozen or thawed within ``settle_s`` or is frozen in this review (what the GPU reads does
    not show the new mix yet), and none beside a job running unfrozen that reads slowed past
    ``max_slowdown`` (the room that returned is not there yet). Thawed together, jobs frozen
    together collide again and are frozen again a settling period later, each time.

    A job frozen earlier in the queue whose room has not returned (a job it was frozen beside
    still runs) does not hold back a later one whose room has: measured, holding it back kept
    CARMA's jobs frozen about 1.4x as long, 52 jobs worse off against 38 (``startup_trade.py``,
    results/startup_trade-2026-11-29d.md)."""
    busy: set[int] = set()
    for job_id in ready:
        for n in view(job_id):
            other = jobs.get(n.job_id)
            if other is None:
                continue
            moved = _last_moved(other)
            if n.job_id in taken or (n.job_id != job_id and now - moved < rules.settle_s):
                busy.update(n.devices)
    out: list[str] = []
    for job_id in sorted(ready, key=lambda j: queue_key(jobs[j])):
        around = view(job_id)
        me = next(n for n in around if n.job_id == job_id)
        if busy.intersection(me.devices) or any(
                n.slowdown > rules.max_slowdown for n in around if n.job_id != job_id and n.job_id not in taken
                and (other := jobs.get(n.job_id)) is not None and not other.suspended):
            continue
        out.append(job_id)
        busy.update(me.devices)
    return out


def _last_moved(job: Job) -> float:
    """When ``job`` was last frozen or thawed (-inf: never): what a GPU reads settles after it."""
    return max(job.suspended_at or -math.inf, job.thawed_at or -math.inf)


def _runs(job: Job | None) -> bool:
    """Whether a preemptor still holds its place: running, not frozen itself."""
    return job is not None and job.state is JobState.RUNNING and not job.suspended
