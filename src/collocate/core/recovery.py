"""What happens to a job when its process ends: done, retried, or failed for good.

Pure rules shared by the simulator and the daemon. An out-of-memory crash is retried with a
raised memory requirement and ahead of the queue (``Job.recovered`` sorts first); other failures
are retried only when the user asked for retries of them. An interactive job (``collocate run``)
is never requeued: it ends with its status, as its member's terminal did.

Never worse than a plain queue:

* A crash at (or within a margin of) the attempt's own fence (``ExitReport.fence_mib``: an MPS
  limit, a capped caching allocator) measured the fence, not the job: the fence is lifted for
  its later attempts (``Job.fence_lifted``), so the next crash, if any, shows what it needs.
  That first crash at the fence uses none of the job's retries: a job with ``--retries 0``
  still gets one unfenced attempt, as a plain queue would give it.
* The attempt that would be a job's last runs alone and unfenced (``Job.alone``), as CARMA's
  relaunch does: a job that fits a GPU alone never ends failed out of memory.
* A crash is charged to whoever overran (``charged_to``): a job that held no more than it was
  allowed while a neighbour held more than its own allowance is requeued ahead of the queue
  with its requirement unchanged, and the crash uses none of its retries; the neighbours'
  requirements rise from what they held (``Scheduler.charge_overrun``). A neighbour that
  ended just before the crash was seen counts too (``beside_at_crash``): the crash may reach
  the daemon after the job that filled the GPU has already gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from collocate.core.commitment import allowance_mib, at_fence, fence_mib
from collocate.core.model import Job, JobState


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    OOM = "oom"  # the job ran out of GPU memory (classified from exit status and stderr)
    FAILED = "failed"  # any other non-zero exit
    CANCELLED = "cancelled"
    LOST = "lost"  # the process vanished while the daemon was down; not the job's fault
    TIMEOUT = "timeout"  # stopped at its time limit; never retried (as Slurm's TIMEOUT)


@dataclass(frozen=True, slots=True)
class ExitReport:
    outcome: Outcome
    observed_peak_mib: float | None = None  # the most memory the attempt was seen holding
    reason: str = ""
    fence_mib: float | None = None  # the memory limit the attempt ran under (None: not fenced)
    #: The neighbours whose overrun an out-of-memory crash is charged to (``charged_to``):
    #: non-empty, the crash was not the job's.
    overrun_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RecoveryRules:
    """How an out-of-memory crash raises a job's requirement.

    The observed peak is a lower bound on what the job needs (it died asking for more), so the
    new requirement is the observed peak grown by ``growth`` plus ``margin_mib``, and never less
    than the old requirement.
    """

    growth: float = 1.25
    margin_mib: float = 512.0
    retry_failures: bool = False  # retry non-OOM failures of every job (``Job.retry_failures``: one job)


def after_exit(job: Job, report: ExitReport, rules: RecoveryRules = RecoveryRules()) -> Job:
    """The job's next state; a job that goes back to PENDING keeps its id and history."""
    if report.outcome is Outcome.SUCCEEDED:
        return job.evolve(state=JobState.DONE)
    if report.outcome is Outcome.CANCELLED:
        return job.evolve(state=JobState.CANCELLED)
    if report.outcome is Outcome.TIMEOUT:
        return job.evolve(state=JobState.TIMEOUT, reason=report.reason or "reached its time limit")
    if job.interactive:  # its member's terminal is gone with the attempt (even a lost one): end with the status
        return job.evolve(state=JobState.FAILED, reason=report.reason or "exited with an error",
                          oom_crashes=job.oom_crashes + (report.outcome is Outcome.OOM))
    if report.outcome is Outcome.LOST:  # not an attempt the job used up
        return job.evolve(state=JobState.PENDING, lost_attempts=job.lost_attempts + 1,
            reason=report.reason or "the attempt was lost; requeued",
        )
    used = job.attempts - job.lost_attempts
    retries_left = used <= job.max_retries
    if report.outcome is Outcome.OOM and report.overrun_by:  # not its fault: not an attempt it used
        return job.evolve(state=JobState.PENDING, lost_attempts=job.lost_attempts + 1,
            victim_crashes=job.victim_crashes + 1,
            reason=f"out of GPU memory because job(s) {', '.join(report.overrun_by)} beside it held "
                   "more than they committed; requeued ahead, requirement unchanged",
        )
    if report.outcome is Outcome.OOM:
        lifted = at_fence(report.observed_peak_mib, report.fence_mib)
        # The first crash at its fence measured the fence, not the job: not an attempt it used,
        # so even a job with no retries gets an unfenced attempt (a plain queue would run it).
        free = lifted and not job.fence_lifted
        if not retries_left and not free:
            return job.evolve(state=JobState.FAILED,
                oom_crashes=job.oom_crashes + 1,
                reason=f"out of GPU memory on all {used} attempts",
            )
        used -= free
        last = used == job.max_retries  # the next attempt is its last: alone, unfenced
        how = ("; runs alone next" if last else
               "; its fence is lifted (the crash measured the fence)" if lifted else "")
        return job.evolve(state=JobState.PENDING,
            lost_attempts=job.lost_attempts + free,
            oom_crashes=job.oom_crashes + 1,
            mem_mib=raised_requirement(job.mem_mib, report.observed_peak_mib, rules),
            mem_source="oom-raised",
            mem_uncertainty=0.0,
            fence_lifted=job.fence_lifted or lifted,
            alone=last,
            reason=f"out of GPU memory on attempt {job.attempts}; requeued{how}",
        )
    if (rules.retry_failures or job.retry_failures) and retries_left:
        return job.evolve(state=JobState.PENDING, reason=report.reason)
    return job.evolve(state=JobState.FAILED, reason=report.reason or "exited with an error")


def raised_requirement(old: float | None, observed: float | None, rules: RecoveryRules) -> float | None:
    if observed is None:
        return None if old is None else old * rules.growth
    raised = observed * rules.growth + rules.margin_mib
    return raised if old is None else max(old, raised)


def job_fence_mib(job: Job, room_mib: float | None) -> float | None:
    """The fence of ``job``'s attempt placed with ``room_mib`` (None: not fenced): none when its
    user opted out, after a crash at its fence, or when it runs alone."""
    return fence_mib(job.mem_mib, room_mib, job.mem_uncertainty, job.mem_source,
                     fenced=not why_unfenced(job))


def why_unfenced(job: Job) -> str:
    """Why ``job``'s attempts are not fenced ("" when they are, where the runtime allows)."""
    if not job.mem_fence:
        return "opted out (--no-mem-fence)"
    if job.alone:
        return "runs alone"
    if job.fence_lifted:
        return "lifted after it crashed at its fence"
    if job.placed_alone:
        return "its policy runs nothing beside it (exclusive)"
    return ""


@dataclass(frozen=True, slots=True)
class Holding:
    """What one job on a GPU held when a neighbour crashed, and what it was allowed
    (``job_allowance_mib``; None: no bound known)."""

    job_id: str
    held_mib: float
    allowed_mib: float | None


def job_allowance_mib(job: Job, room_mib: float | None) -> float | None:
    """What ``job``, placed with ``room_mib``, may hold before it overruns its commitment."""
    if job.alone:
        return None  # it has the GPU to itself
    return allowance_mib(job.mem_mib, room_mib, job.mem_uncertainty, job.mem_source)


def overran(h: Holding) -> bool:
    return h.allowed_mib is not None and h.held_mib > h.allowed_mib


def charged_to(crashed: Holding, neighbours: Iterable[Holding]) -> tuple[str, ...]:
    """Whose overrun an out-of-memory crash is charged to: the neighbours that held more than
    they were allowed, when the crashed job (``held_mib``: what it held and asked for) stayed
    within its own allowance; empty when the crash is its own."""
    if crashed.allowed_mib is None or crashed.held_mib > crashed.allowed_mib:
        return ()
    return tuple(h.job_id for h in neighbours if overran(h))


#: How long before a crash was seen a neighbour that left still counts as beside it: a runner
#: writes its exit after the job's last output, and the daemon reaps every second or so, so an
#: offender that ended a few seconds before its victim's end was seen still held the memory.
DEPARTED_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class Departure:
    """What a job held when its attempt ended, on which devices, and when."""

    holding: Holding
    devices: frozenset[int]
    end: float


def beside_at_crash(present: Sequence[Holding], departed: Iterable[Departure], devices: Iterable[int],
                    crashed_id: str, at: float, window_s: float = DEPARTED_WINDOW_S) -> list[Holding]:
    """The holdings an out-of-memory crash at ``at`` on ``devices`` is weighed against: the jobs
    there now, and those that left those devices within ``window_s`` before it (the job's own
    earlier attempts aside)."""
    on = frozenset(devices)
    seen = {h.job_id for h in present}
    recent = {d.holding.job_id: d.holding for d in departed
              if d.devices & on and at - window_s <= d.end <= at + window_s
              and d.holding.job_id != crashed_id and d.holding.job_id not in seen}
    return [*present, *recent.values()]


def overrun_requirement(job: Job, held_mib: float, rules: RecoveryRules = RecoveryRules()) -> Job:
    """A job that overran its commitment and made a neighbour crash: its requirement rises from
    what it held (as after its own crash), so its next placement charges it."""
    raised = raised_requirement(job.mem_mib, held_mib, rules)
    if raised is None or (job.mem_mib is not None and raised <= job.mem_mib):
        return job
    return job.evolve(mem_mib=raised, mem_source="oom-raised", mem_uncertainty=0.0)
