"""What a running job holds against its GPUs' memory: one rule for every world.

The policies' per-round ledger, the world model (``collocate.core.world``, fed by the daemon's GPU
watch or the simulator's meters) and the MPS memory limit all charge memory through it.

* A job whose requirement is known (declared with ``--mem``, estimated, from history, or raised
  after an out-of-memory crash) commits that requirement the moment it is placed. Nothing waits
  for it to show on the GPU: the next job in the same round already sees it charged.
* Nothing enforces a requirement under time-slicing, so the world watches each job's memory as
  it ramps. Growth within ``growth_tolerance_mib`` (3% of the job's size, at least 64 MiB:
  allocator rounding, a cuDNN workspace) is noise. A job that outgrows what it committed
  commits what it holds plus the margin of ``settled_mib`` while it keeps growing, and what it
  holds once that has held still for ``QUIET_S``: its GPU is never closed to newcomers, they just
  find the room the growing job may still take already charged (a job that grew 76 MiB over a
  4 GiB declaration once kept a GPU with 60 GiB free shut for 30 s).
* A job whose memory nobody knows commits its whole GPU until it holds memory that has not grown
  for ``QUIET_S``, then its observed peak plus a margin (``settled_mib``). PyTorch jobs reach
  their peak within their first steps (docs/gpu-validation.md: the mini-trace's jobs held their
  peak from the first 2-20 s of a run, and the per-process peak was 0.95-1.05x of a good static
  estimate), so a few quiet seconds after the ramp are enough; the margin covers an evaluation
  pass or a larger last batch.
* An *estimated* requirement (an estimator's, not measured in an earlier run and not declared by
  the user) is a model's guess, and estimators err by several times either way (GPUMemNet
  returns a bin's upper edge: 8,000 MiB for CIFAR jobs that hold 600-1,100). Once such a job's
  own peak has held still for ``QUIET_S`` below its estimate, it commits that peak plus the
  margin, as a job of unknown memory does. A declared requirement is the user's reservation, as
  Slurm's ``--mem`` is, and a measured one already is a peak: both stay as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Growth below this share of a job's size (and below ``GROWTH_TOLERANCE_MIB``) is noise.
GROWTH_TOLERANCE = 0.03
GROWTH_TOLERANCE_MIB = 64.0
#: How long a job's memory must hold no new peak before the peak counts as reached: a few of a
#: PyTorch job's first steps (see the module docstring).
QUIET_S = 5.0
#: A job whose peak is committed holds ``peak × (1 + PEAK_MARGIN) + PEAK_MARGIN_MIB``: later
#: steps may allocate a little more (an evaluation pass, a larger last batch).
PEAK_MARGIN = 0.10
PEAK_MARGIN_MIB = 512.0
#: The least relative slack an MPS memory limit leaves above a requirement that is not measured:
#: the estimator came out at 0.88x of the measured peak for a LLaMA-style model in bf16 on an
#: H100 (issue 16's first-run trace), so a limit at the estimate would kill such a job.
MIN_LIMIT_SLACK = 0.15


#: Where a requirement comes from when it was measured (an earlier run, a crash's raised peak, or
#: a simulated trace's actual peak), rather than estimated or declared.
MEASURED_SOURCES = frozenset({"measured", "history", "oom-raised", "peak"})


def is_estimated(source: str) -> bool:
    """Whether a requirement from ``source`` is an estimator's guess: not measured, not
    declared by the user, not absent."""
    return source not in MEASURED_SOURCES and source not in ("declared", "unknown")


def settled_mib(peak_mib: float) -> float:
    """What a job commits once its memory has held still at ``peak_mib``: later steps may
    allocate a little more."""
    return peak_mib * (1.0 + PEAK_MARGIN) + PEAK_MARGIN_MIB


def growth_tolerance_mib(size_mib: float) -> float:
    """Growth of a job of this size that is noise, not a new peak."""
    return max(GROWTH_TOLERANCE_MIB, GROWTH_TOLERANCE * size_mib)


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
    """One running attempt's memory as the world watches it.

    ``peaked_at`` is when its peak last grew beyond the tolerance (``-inf``: never);
    ``active_at`` when its training steps showed on the GPU (``collocate.core.world``; ``inf``: not
    yet): memory counts as still only from then, since a job's first steps (cuDNN autotuning,
    compilation) may hold a CUDA context and its weights for seconds before the activations of
    its first step arrive. ``estimated``: the requirement is an estimator's
    (``is_estimated``), given up for the observed peak once that holds still.
    """

    requirement: float | None
    quiet_s: float = QUIET_S
    estimated: bool = False
    whole: bool = False  # it runs alone (``Job.alone``): it commits its whole GPU throughout
    peak_mib: float = 0.0
    peaked_at: float = -math.inf
    active_at: float = math.inf

    @classmethod
    def of(cls, requirement: float | None, source: str, quiet_s: float = QUIET_S,
           whole: bool = False) -> MemoryRamp:
        """The ramp of a job placed with ``requirement`` from ``source`` (``Job.mem_source``);
        ``whole``: it runs alone and commits its whole GPU."""
        return cls(requirement, quiet_s, estimated=requirement is not None and is_estimated(source),
                   whole=whole)

    def observe(self, held_mib: float, now: float) -> None:
        """One reading of the memory the job holds (on its most loaded GPU)."""
        if held_mib <= self.peak_mib:
            return
        grown = self.peak_mib == 0.0 or held_mib - self.peak_mib > growth_tolerance_mib(self.peak_mib)
        if grown:
            self.peaked_at = now
        self.peak_mib = held_mib

    def quiet(self, now: float) -> bool:
        """Whether its memory has held still for ``quiet_s`` of training (a job holding nothing,
        or not training yet, never has)."""
        return self.peak_mib > 0.0 and now - max(self.peaked_at, self.active_at) >= self.quiet_s

    def committed(self, total_mib: float, now: float) -> float:
        """What the job holds against each of its GPUs now."""
        if self.whole:
            return total_mib
        if self.requirement is None:
            return min(total_mib, settled_mib(self.peak_mib)) if self.quiet(now) else total_mib
        if self.outgrown:  # it may grow on: what it holds and a margin
            return settled_mib(self.peak_mib)
        if self.estimated and self.quiet(now):
            return min(max(self.requirement, self.peak_mib), settled_mib(self.peak_mib))
        return max(self.requirement, self.peak_mib)

    @property
    def outgrown(self) -> bool:
        """Whether it holds more than its requirement and the tolerance allow."""
        return self.requirement is not None and \
            self.peak_mib > self.requirement + growth_tolerance_mib(self.requirement)

    def changes_at(self) -> float:
        """When ``committed`` will next change with no new reading (``inf``: never)."""
        if self.peak_mib > 0.0 and (self.requirement is None or self.estimated) and not self.outgrown \
                and not self.whole:
            return max(self.peaked_at, self.active_at) + self.quiet_s
        return math.inf


#: What an MPS memory limit adds above a job's upper bound (its CUDA context and allocator
#: slack; CARMA keeps 512 MiB free on every GPU for the same reason).
LIMIT_MARGIN_MIB = 512.0


def mps_limit_mib(requirement: float | None, room_mib: float | None, uncertainty: float,
                  source: str) -> float | None:
    """The pinned memory limit of a job under MPS (None: no limit).

    A declared or measured requirement: its upper bound plus ``LIMIT_MARGIN_MIB``, so the user's
    reservation is enforced as Slurm enforces ``--mem``. A job of unknown memory: the room it
    was placed with, so it cannot take what its neighbours committed. An estimate: the larger of
    the two, so a job running above an estimator's low guess is not killed while its GPU had
    room to spare when it was placed (it then commits what it holds, like any job that outgrows
    its requirement)."""
    if requirement is None:
        return room_mib
    bound = upper_bound_mib(requirement, uncertainty, source) + LIMIT_MARGIN_MIB
    if is_estimated(source) and room_mib is not None:
        return max(bound, room_mib)
    return bound


def fence_mib(requirement: float | None, room_mib: float | None, uncertainty: float, source: str, *,
              fenced: bool = True) -> float | None:
    """The memory an attempt is fenced at on each of its GPUs, under every sharing mode (None:
    not fenced): a PyTorch job's caching allocator is capped there (``collocate.node.fence``),
    an emulated job refuses claims beyond it, and under MPS it is the pinned memory limit. The
    same number as ``mps_limit_mib``: what the job committed and the margins a declaration or
    an estimate needs. ``fenced`` False (``submit --no-mem-fence``, a fence lifted after a
    crash at it, an attempt that runs alone): no fence. Nor for a job of unknown memory that a
    policy placed with no room at all (round-robin ignores memory): a fence at nothing means
    nothing."""
    if not fenced or (requirement is None and (room_mib is None or room_mib <= 0.0)):
        return None
    return mps_limit_mib(requirement, room_mib, uncertainty, source)


def allowance_mib(requirement: float | None, room_mib: float | None, uncertainty: float,
                  source: str) -> float | None:
    """What a job may hold before it overruns its commitment, fenced or not (None: no bound,
    a job of unknown memory placed with no room known): its fence's value, so that a fenced job
    never overruns and an unfenced one is judged as if it were."""
    return mps_limit_mib(requirement, room_mib, uncertainty, source)


def at_fence(observed_mib: float | None, fence: float | None) -> bool:
    """Whether an out-of-memory crash that proved the job needed ``observed_mib`` happened at
    (or within a margin of) its own fence: then it measured the fence, not the job."""
    if fence is None or observed_mib is None:
        return False
    return observed_mib >= fence - max(LIMIT_MARGIN_MIB, 0.05 * fence)
