"""Who goes first among users who wait, and how much one user may run at once.

Rules the daemon and the simulator both need, so they live here, in the core, once:

* **Fair share.** Among pending jobs of equal priority, the user who used the least GPU time
  recently goes first (Slurm's fair-share factor, reduced to its order). Usage is GPU-seconds
  (GPUs held x wall time), decayed with a half-life (Slurm's ``PriorityDecayHalfLife``, 7 days
  by default), and it counts the jobs running now: a user whose jobs fill the GPUs falls behind
  a newcomer at the next round, so one user's flood delays another user's first job by at most
  the time until a GPU frees up. Within one user the queue order stands (recovered jobs first,
  then priority, then submission), so a user's own order is theirs to set.
* **Caps per user** on running jobs and on GPUs held (Slurm's ``MaxJobsPerUser`` and
  ``MaxTRESPerUser=gres/gpu``), set by the daemon's owner: a user at a cap has their jobs left
  out of the policy's queue (they wait, kind ``limit``), and a round never places more of one
  user's jobs than the caps allow.
* **A cap per user on running CPU jobs** (``Job.gpus == 0``: a pipeline's prepare or evaluate
  step). They hold no GPU, so they count against neither cap above nor fair share; the
  ``Scheduler`` starts them outside the policy, at once, while their user runs fewer than
  ``max_cpu_jobs`` of them (the daemon's default: the machine's cores).

Pure and clock-free: callers pass ``now``; the ``Scheduler`` owns one ``Usage`` and feeds it
from the jobs it places and the exits it is told of.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from collocate.core.model import Job

#: Slurm's default ``PriorityDecayHalfLife``: usage a week old counts half.
DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class UserLimits:
    """The most one user may run at once; None: no cap."""

    max_running_jobs: int | None = None
    max_gpus: int | None = None
    #: Most CPU jobs (``--gpus 0``) one user may run at once; they count against no other cap.
    max_cpu_jobs: int | None = None

    def why_not(self, user: str, jobs: int, gpus: int, job_gpus: int) -> str | None:
        """Why one more job of ``job_gpus`` GPUs may not start beside ``jobs`` running jobs
        holding ``gpus`` GPUs, or None."""
        if self.max_running_jobs is not None and jobs + 1 > self.max_running_jobs:
            return (f"{user or 'this user'} runs {jobs} job(s), the most the daemon's owner allows "
                    f"per user (max_running_jobs {self.max_running_jobs})")
        if self.max_gpus is not None and gpus + job_gpus > self.max_gpus:
            return (f"{user or 'this user'} holds {gpus} GPU(s) and this job needs {job_gpus}: over "
                    f"the {self.max_gpus} the daemon's owner allows per user (max_gpus)")
        return None

    @property
    def capped(self) -> bool:
        """Whether a cap on GPU jobs is set (``max_cpu_jobs`` is checked on its own path)."""
        return self.max_running_jobs is not None or self.max_gpus is not None

    def why_not_cpu(self, user: str, running: int, default: int | None = None) -> str | None:
        """Why one more CPU job may not start beside ``running`` CPU jobs of ``user``, or None;
        ``default`` is the cap where ``max_cpu_jobs`` sets none (the daemon: its machine's cores)."""
        cap = self.max_cpu_jobs if self.max_cpu_jobs is not None else default
        if cap is not None and running + 1 > cap:
            return (f"{user or 'this user'} runs {running} CPU job(s), the most allowed per user "
                    f"(max_cpu_jobs {cap}{'' if self.max_cpu_jobs is not None else ': the default'})")
        return None


@dataclass(frozen=True)
class Fairness:
    """How users share the GPUs: fair share on or off, its half-life, and the per-user caps
    (``users`` overrides ``default`` for the users it names)."""

    fair_share: bool = True
    half_life_s: float = DEFAULT_HALF_LIFE_S
    default: UserLimits = UserLimits()
    users: Mapping[str, UserLimits] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.half_life_s > 0:
            raise ValueError("half_life_s must be > 0")

    def limits(self, user: str) -> UserLimits:
        return self.users.get(user, self.default)

    @property
    def capped(self) -> bool:
        return self.default.capped or any(lim.capped for lim in self.users.values())


class Usage:
    """Decayed GPU-seconds per user, and what each runs now.

    A charge made at ``at`` counts ``2 ** (-(now - at) / half_life_s)`` of itself at ``now``.
    A running job adds the GPU-seconds it has held so far, undecayed (a run is short beside a
    half-life of days), kept as sums so that reading a user's usage is O(1)."""

    def __init__(self, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self._charged: dict[str, tuple[float, float]] = {}  # user -> (GPU-seconds, as of when)
        self._jobs: dict[str, int] = {}
        self._gpus: dict[str, int] = {}
        self._gpu_starts: dict[str, float] = {}  # user -> sum of gpus x start over running jobs

    def charge(self, user: str, gpu_s: float, at: float) -> None:
        """Add ``gpu_s`` GPU-seconds used by ``user``, ending at ``at``."""
        if gpu_s <= 0:
            return
        value, when = self._charged.get(user, (0.0, at))
        if at >= when:
            value = value * self._decay(at - when) + gpu_s
        else:  # an older record (a restart reading history): decay it to ours
            value, at = value + gpu_s * self._decay(when - at), when
        self._charged[user] = (value, at)

    def started(self, user: str, gpus: int, at: float) -> None:
        self._jobs[user] = self._jobs.get(user, 0) + 1
        self._gpus[user] = self._gpus.get(user, 0) + gpus
        self._gpu_starts[user] = self._gpu_starts.get(user, 0.0) + gpus * at

    def stopped(self, user: str, gpus: int, started: float, at: float | None) -> None:
        """A running job ended (or left the running state); with ``at``, charge what it held."""
        self._jobs[user] = self._jobs.get(user, 0) - 1
        self._gpus[user] = self._gpus.get(user, 0) - gpus
        self._gpu_starts[user] = self._gpu_starts.get(user, 0.0) - gpus * started
        if not self._jobs[user]:  # clear float drift
            self._jobs.pop(user)
            self._gpus.pop(user, None)
            self._gpu_starts.pop(user, None)
        if at is not None:
            self.charge(user, gpus * max(0.0, at - started), at)

    def running(self, user: str) -> tuple[int, int]:
        """(jobs, GPUs) ``user`` runs now."""
        return self._jobs.get(user, 0), self._gpus.get(user, 0)

    def of(self, user: str, now: float) -> float:
        """``user``'s usage at ``now``: decayed charges plus what their running jobs held."""
        value, when = self._charged.get(user, (0.0, now))
        used = value * self._decay(max(0.0, now - when))
        return used + self._gpus.get(user, 0) * now - self._gpu_starts.get(user, 0.0)

    def _decay(self, dt: float) -> float:
        return math.exp2(-dt / self.half_life_s) if dt else 1.0


class FairQueue(Sequence[Job]):
    """Pending jobs in fair order, merged lazily from per-user queues.

    Each user's list is already in queue order; the merge key puts recovered jobs first, then
    priority, then the user's usage (``usage``; None: no fair share, by submission alone), then
    submission. A policy that scans 32 jobs of a 100,000-job queue pays for 32: only the users'
    usages are computed per round, never the whole queue re-sorted. ``skip`` leaves jobs out
    (those of users at a cap)."""

    def __init__(self, lists: Mapping[str, Sequence[Job]], usage: Callable[[str], float] | None,
                 skip: Callable[[Job], bool] | None = None) -> None:
        self._lists = [q for q in lists.values() if q]
        self._usage = usage
        self._skip = skip

    def __iter__(self) -> Iterator[Job]:
        if len(self._lists) == 1:
            merged: Iterable[Job] = self._lists[0]
        elif self._usage is None:
            merged = heapq.merge(*self._lists, key=_plain_key)
        else:
            used = {q[0].user: self._usage(q[0].user) for q in self._lists}
            merged = heapq.merge(*self._lists, key=lambda j: (not j.recovered, -j.priority,
                                                               used[j.user], j.submit_time, j.id))
        if self._skip is None:
            return iter(merged)
        skip = self._skip
        return (job for job in merged if not skip(job))

    def __len__(self) -> int:
        if self._skip is None:
            return sum(len(q) for q in self._lists)
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None

    @overload
    def __getitem__(self, index: int) -> Job: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Job]: ...

    def __getitem__(self, index: Any) -> Any:
        return list(self)[index]


def _plain_key(job: Job) -> tuple:
    return (not job.recovered, -job.priority, job.submit_time, job.id)
