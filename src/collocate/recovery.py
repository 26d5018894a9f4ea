"""What happens to a job when its process ends: done, retried, or failed for good.

Pure rules shared by the simulator and the daemon. An out-of-memory crash is retried with a
raised memory requirement and ahead of the queue (``Job.recovered`` sorts first); other failures
are retried only when the user asked for retries of them. An interactive job (``collocate run``)
is never requeued: it ends with its status, as its member's terminal did.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from collocate.model import Job, JobState


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
    retries_left = job.attempts - job.lost_attempts <= job.max_retries
    if report.outcome is Outcome.OOM:
        if not retries_left:
            return job.evolve(state=JobState.FAILED,
                oom_crashes=job.oom_crashes + 1,
                reason=f"out of GPU memory on all {job.attempts - job.lost_attempts} attempts",
            )
        return job.evolve(state=JobState.PENDING,
            oom_crashes=job.oom_crashes + 1,
            mem_mib=raised_requirement(job.mem_mib, report.observed_peak_mib, rules),
            mem_source="oom-raised",
            mem_uncertainty=0.0,
            reason=f"out of GPU memory on attempt {job.attempts}; requeued",
        )
    if (rules.retry_failures or job.retry_failures) and retries_left:
        return job.evolve(state=JobState.PENDING, reason=report.reason)
    return job.evolve(state=JobState.FAILED, reason=report.reason or "exited with an error")


def raised_requirement(old: float | None, observed: float | None, rules: RecoveryRules) -> float | None:
    if observed is None:
        return None if old is None else old * rules.growth
    raised = observed * rules.growth + rules.margin_mib
    return raised if old is None else max(old, raised)
