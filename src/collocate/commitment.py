"""What a running job holds against its GPUs' memory, and when that is still settling.

One rule for every world: the policies' per-round ledger, the daemon's GPU watch and the
simulator all charge memory through it.

* A job whose requirement is known (declared with ``--mem``, estimated, from history, or raised
  after an out-of-memory crash) commits that requirement the moment it is placed. Nothing waits
  for it to show on the GPU: the next job in the same round already sees it charged.
* Nothing enforces a requirement under time-slicing, so the executor watches each job's real
  memory as it ramps. Once a job holds more than it committed, it commits what it holds at once,
  and its GPU counts as *settling* (``MemoryRamp.grew_at``): no job is placed beside it until its
  memory has stopped growing for the policy's ``settle_s``. (Under MPS the pinned memory limit
  enforces the requirement's upper bound, ``upper_bound_mib``.)
* A job whose memory nobody knows commits its whole GPU while it ramps, so nothing is packed
  beside memory that is still growing. Once its memory has been stable for ``stable_s`` (the
  policy's ``settle_s``, ``STABLE_S`` by default) it commits its observed peak plus a margin,
  and the rest of the GPU is free for others. PyTorch
  jobs reach their peak within their first steps: on an H100 the mini-trace's jobs held their
  peak from the first 2-20 s of a run (docs/gpu-validation.md), so 30 s without growth is a
  conservative sign that the peak is reached.
* An *estimated* requirement (from an estimator, not measured in an earlier run and not declared
  by the user) is a model's guess, and estimators err by several times either way (GPUMemNet
  returns a bin's upper edge: 8,000 MiB for CIFAR jobs that hold 600-1,100). Once such a job's
  own memory has held still for ``stable_s`` below its estimate, it commits its observed peak
  plus the same margin, as a job of unknown memory does: the CARMA policies pack by measured
  free memory and so got that room, while ``auto`` kept the estimate and lost 8% of makespan
  to them on carma-mix-90 with GPUMemNet under MPS (docs/simulator.md). If it grows past that again its GPU
  settles and it commits its estimate until it holds still again. A declared requirement is
  the user's reservation, as Slurm's ``--mem`` is, and a measured one already is a peak: both
  stay as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Growth smaller than this (allocator rounding, a cuDNN workspace) does not restart settling.
GROWTH_TOLERANCE_MIB = 64.0
#: How long a job of unknown memory must hold no new peak before its peak is committed, unless
#: the policy says otherwise (its ``settle_s``: one notion of "memory has settled").
STABLE_S = 30.0
#: A job of unknown memory then commits ``peak × (1 + PEAK_MARGIN) + PEAK_MARGIN_MIB``: later
#: steps may allocate a little more (an evaluation pass, a larger last batch).
PEAK_MARGIN = 0.10
PEAK_MARGIN_MIB = 512.0
#: The least relative slack an MPS memory limit leaves above a requirement that is not measured:
#: the estimator came out at 0.88x of the measured peak for a LLaMA-style model in bf16 on an
#: H100 (issue 16's first-run trace), so a limit at the estimate would kill such a job.
MIN_LIMIT_SLACK = 0.15


#: Where a requirement comes from when it was measured (an earlier run, or a crash's raised
#: peak), rather than estimated or declared.
MEASURED_SOURCES = frozenset({"measured", "history", "oom-raised"})


def is_estimated(source: str) -> bool:
    """Whether a requirement from ``source`` is an estimator's guess: not measured, not
    declared by the user, not absent."""
    return source not in MEASURED_SOURCES and source not in ("declared", "unknown")


def settled_mib(peak_mib: float) -> float:
    """What a job commits once its memory has held still at ``peak_mib``: later steps may
    allocate a little more."""
    return peak_mib * (1.0 + PEAK_MARGIN) + PEAK_MARGIN_MIB


def committed_mib(requirement: float | None, total_mib):
    """What a job placed with ``requirement`` commits before anything is observed: the
    requirement, or the whole GPU when unknown (``total_mib`` may be an array)."""
    return total_mib if requirement is None else requirement


def upper_bound_mib(requirement: float, uncertainty: float, source: str) -> float:
    """The most a job with this requirement is expected to use: a measured requirement (history
    or a peak raised after a crash) plus its own uncertainty, an estimate or a declaration plus
    at least ``MIN_LIMIT_SLACK``."""
    measured = source in MEASURED_SOURCES
    slack = uncertainty if measured else max(uncertainty, MIN_LIMIT_SLACK)
    return requirement * (1.0 + slack)


@dataclass(slots=True)
class MemoryRamp:
    """One running attempt's memory as its executor watches it.

    ``grew_at`` is when the job last grew beyond what it had committed (``-inf``: never, so it
    does not hold its GPU in settling; ``inf``: a job of unknown memory that holds nothing yet);
    ``peaked_at`` when its peak last grew at all. ``estimated``: the requirement is an
    estimator's (``is_estimated``), given up for the observed peak once that holds still.
    """

    requirement: float | None
    stable_s: float = STABLE_S
    estimated: bool = False
    peak_mib: float = 0.0
    grew_at: float = -math.inf
    peaked_at: float = -math.inf

    def __post_init__(self) -> None:
        if self.requirement is None:
            self.grew_at = math.inf

    @classmethod
    def of(cls, requirement: float | None, source: str, stable_s: float = STABLE_S) -> MemoryRamp:
        """The ramp of a job placed with ``requirement`` from ``source`` (``Job.mem_source``)."""
        return cls(requirement, stable_s, estimated=requirement is not None and is_estimated(source))

    def observe(self, held_mib: float, now: float) -> None:
        """One reading of the memory the job holds (on its most loaded GPU)."""
        if held_mib <= self.peak_mib:
            return
        grown = held_mib - self.peak_mib > GROWTH_TOLERANCE_MIB or self.peak_mib == 0.0
        outgrown = grown and held_mib > self.committed(math.inf, now) + GROWTH_TOLERANCE_MIB
        self.peak_mib = held_mib
        if grown:
            self.peaked_at = now
        if self.requirement is None:
            if grown:
                self.grew_at = now
        elif outgrown:
            self.grew_at = now  # beyond what it committed: commit what it holds, and settle

    def stable(self, now: float) -> bool:
        return now - self.grew_at >= self.stable_s

    def committed(self, total_mib: float, now: float) -> float:
        """What the job holds against each of its GPUs now."""
        if self.requirement is not None:
            held = max(self.requirement, self.peak_mib)
            if self.estimated and self.peak_mib > 0.0 and now - self.peaked_at >= self.stable_s:
                return min(held, settled_mib(self.peak_mib))
            return held
        if self.peak_mib > 0.0 and self.stable(now):
            return min(total_mib, settled_mib(self.peak_mib))
        return total_mib


#: What an MPS memory limit adds above a job's upper bound (its CUDA context and allocator
#: slack; CARMA keeps 512 MiB free on every GPU for the same reason).
LIMIT_MARGIN_MIB = 512.0


def stable_s_of(policy: object) -> float:
    """How long memory must hold still to count as settled under ``policy``: its ``settle_s``
    where it has one (so its guard and the commitment agree), else ``STABLE_S``."""
    return float(getattr(policy, "settle_s", STABLE_S))


def mps_limit_mib(requirement: float | None, given_mib: float | None, uncertainty: float,
                  source: str) -> float | None:
    """The pinned memory limit of a job under MPS: its requirement's upper bound plus
    ``LIMIT_MARGIN_MIB``, or, for a job of unknown memory, the room it was placed with (so it
    cannot take what its neighbours committed). None: no limit."""
    if requirement is None:
        return given_mib
    return upper_bound_mib(requirement, uncertainty, source) + LIMIT_MARGIN_MIB
