"""Restart recovery: pick up where the previous daemon left off, never running a job twice.

At start the daemon reloads every job, then looks at each attempt that has no end: a live runner
with the recorded pid *and* process start time is re-adopted; a runner that ended while the
daemon was down left ``exit.json``, which is read as if the exit happened now; a runner that
vanished without a record is LOST (its process group is killed, the job requeued, the attempt
marked). A job re-adopted while suspended (frozen: its runner and cgroup outlive the daemon)
stays suspended, as it was recorded (who froze it, why, since when; its frozen time still off
its ``--time``), frozen again to be sure, and thaws by the same rule as before. A job that is
RUNNING with no open attempt (the daemon died between two of its writes)
is settled from its last attempt. A job is therefore never run twice and never dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from collocate.core.model import Job, JobState
from collocate.core.recovery import ExitReport, Outcome
from collocate.core.scheduler import Scheduler
from collocate.daemon.attempts import Attempts, LiveAttempt, cancel_key, timeout_key
from collocate.daemon.fleet import Fleet
from collocate.daemon.store import Attempt, Store

log = logging.getLogger("collocate.daemon")


def restore(store: Store, scheduler: Scheduler, attempts: Attempts, fleet: Fleet) -> None:
    """Reload the jobs into ``scheduler`` and ``attempts.specs``; re-adopt, end or settle each
    attempt the previous daemon left open."""
    rows = store.jobs()
    attempts.specs.update({job.id: spec for job, spec, _ in rows})
    open_attempts = {a.job_id: a for a in store.open_attempts()}
    scheduler.restore(_upgraded(job, spec, open_attempts.get(job.id)) for job, spec, _ in rows)
    for user, gpu_s, end in store.gpu_time(time.time() - 10 * scheduler.fairness.half_life_s):
        scheduler.usage.charge(user, gpu_s, end)  # fair share survives a restart
    for job_id, a in sorted(open_attempts.items(), key=lambda kv: kv[1].start):
        job = scheduler.jobs.get(job_id)
        if job is None or job.state is not JobState.RUNNING:
            store.update_attempt(replace(a, end=time.time(), outcome=Outcome.LOST.value,
                                         reason="closed at restart"))
            continue
        a = _fill_pid(store, fleet, a)
        attempts.watch.place(job, a.uuids, a.start, a.mem_mib if job.mem_mib is None else None)
        run = LiveAttempt(a, job.name)
        if store.get_flag(cancel_key(job_id)):
            run.cancel_at = time.time()  # asked before the restart; the grace period restarts
        if store.get_flag(timeout_key(job_id)):  # stopped at its time limit before the restart
            run.cancel_at, run.timeout_s = time.time(), job.time_limit_s or 0.0
        if fleet.matches(a):
            attempts.running[job_id] = run
            attempts.track_start(job_id)
            log.info("re-adopted job %s (runner pid %s)", job_id, a.pid)
            if job.suspended:  # frozen before: kept so (its cgroup, and the world's view of it)
                attempts.set_frozen(job_id, True, time.time(), f"re-adopted suspended: {job.suspended_why}")
        else:
            attempts.ended(run, runner_status=None, adopted=True)
    adopted = {j: r.attempt for j, r in attempts.running.items()}
    for job_id, tree in fleet.read_trees(adopted, time.time(), frozenset()).items():
        attempts.running[job_id].pids = tree.pids  # its processes, before the first round
    for job in list(scheduler.jobs.values()):
        if job.state is JobState.RUNNING and job.id not in attempts.running and job.id not in open_attempts:
            _settle_unlaunched(store, scheduler, job)


def _upgraded(job: Job, spec: Any, attempt: Attempt | None) -> Job:
    """A job as this version keeps it: stored by an older one, it lacks its user (fair share
    counts by it) and, running, when it started (its time limit and usage count from then)."""
    if not job.user and spec.user:
        job = job.evolve(user=spec.user)
    if job.state is JobState.RUNNING and job.started_at is None and attempt is not None:
        job = job.evolve(started_at=attempt.start)
    return job


def _settle_unlaunched(store: Store, scheduler: Scheduler, job: Job) -> None:
    """A RUNNING job with no open attempt: the daemon died between two of its writes."""
    history = store.attempts(job.id)
    last = history[-1] if history else None
    if last is not None and last.n == job.attempts and last.outcome:
        report = ExitReport(Outcome(last.outcome), last.peak_mib, last.reason or "")
    else:  # placed but never launched: not the job's fault
        report = ExitReport(Outcome.LOST, None, "placed but never launched")
    scheduler.job_exited(job.id, report, time.time())


def _fill_pid(store: Store, fleet: Fleet, a: Attempt) -> Attempt:
    """An attempt whose pids were not yet stored: take them from its runners' own records."""
    if a.pid is not None:
        return a
    a = fleet.started(a)
    if a.pid is not None:
        store.update_attempt(a)
    return a
