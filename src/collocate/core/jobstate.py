"""A job's states, alone in a module: the client (``collocate ls``, ``cancel``) checks the
words members type against them, and importing ``collocate.core.model`` for that cost it a fifth of
its start (issue 37). ``collocate.core.model`` re-exports ``JobState``; import it from either."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    TIMEOUT = "timeout"  # stopped at its time limit (``Job.time_limit_s``, Slurm's --time)

    @property
    def is_terminal(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)
