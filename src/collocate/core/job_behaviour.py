"""What one attempt of a training job does on its GPUs, written once for both worlds.

The simulator (``collocate.sim.engine``) turns it into events and the emulated job
(``collocate.node.emulate_job``) into what a real process claims tick by tick; if each wrote its
own, the parity between them would rest on two copies agreeing. The phases are those of a
PyTorch training script as a scheduler sees it (shared notes, gpu-facts.md, "How real PyTorch
training jobs look to a scheduler"), counted from the attempt's start:

* start-up (``startup_s``: interpreter, imports, model construction): the process exists but
  holds no GPU memory and uses no SM; it runs at full speed, since there is nothing to share;
* a CUDA context (``CONTEXT_MIB``) once start-up ends, then a memory ramp in ``RAMP_STEPS``
  equal steps over ``ramp_s`` up to the job's memory (step *k* at ``ramp_s * k / RAMP_STEPS``);
* warm-up (``warmup_s``, from the end of start-up): memory held, almost no activity, full speed;
* training: its solo activity shows and it progresses at ``progress_rate(slowdown)``, the
  slowdown coming from ``collocate.core.interference`` for whoever shares its devices;
* a later peak: ``peak_mib`` once ``peak_at`` of its work is done (a validation pass, a bigger
  batch), which a requirement measured early misses;
* frozen (``collocate.core.suspension``): memory kept, no activity, no progress.

Plain data and pure functions: no clock, no I/O. Times are seconds from the attempt's start.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Steps of a memory ramp: the daemon samples memory as it grows, so a ramp is seen as a few steps.
RAMP_STEPS = 4
#: MiB a process shows once it has a CUDA context (about 500 MiB on an H100; gpu-facts.md), held
#: from the end of its start-up until its ramp passes it.
CONTEXT_MIB = 500.0


def context_mib(mem_mib: float) -> float:
    """What a job holds as soon as it has a CUDA context: the context, or all it ever holds if less."""
    return min(CONTEXT_MIB, mem_mib)


def ramp_mib(mem_mib: float, step: int) -> float:
    """MiB held once ``step`` of the ``RAMP_STEPS`` ramp steps are done: never below the CUDA
    context, all of ``mem_mib`` at the last step."""
    return max(context_mib(mem_mib), mem_mib * step / RAMP_STEPS)


def ramp_schedule(ramp_s: float, sampled: bool = True) -> tuple[tuple[float, int], ...]:
    """(seconds after start-up, step reached) of each ramp step that is seen: every step when the
    ramp is ``sampled``, else only the last (a world that does not need to watch memory grow)."""
    steps = RAMP_STEPS if sampled and ramp_s > 0 else 1
    return tuple((ramp_s * k / steps, k * (RAMP_STEPS // steps)) for k in range(1, steps + 1))


def progress_rate(slowdown: float, frozen: bool = False) -> float:
    """Solo-seconds of work one second of wall time does: ``1 / slowdown`` (1 in start-up and
    warm-up, which share nothing), none while frozen."""
    return 0.0 if frozen else 1.0 / slowdown


@dataclass(frozen=True, slots=True)
class JobBehaviour:
    """One attempt's phases and memory; validated where it is built (the emulated job's
    ``JobSpec``, a trace row)."""

    mem_mib: float  # what it holds once its ramp is done
    startup_s: float = 0.0  # no GPU memory, no activity
    ramp_s: float = 0.0  # from the end of start-up until it holds ``mem_mib``
    warmup_s: float = 0.0  # from the end of start-up: memory held, no activity yet
    peak_mib: float | None = None  # held from ``peak_at`` of its progress on (None: no later peak)
    peak_at: float = 0.5

    def seen_at(self, start: float) -> float:
        """When the attempt started at ``start`` holds a CUDA context on its devices."""
        return start + self.startup_s

    def active_at(self, start: float) -> float:
        """When its activity shows, and sharing starts to slow it (start-up and warm-up over)."""
        return start + self.startup_s + self.warmup_s

    @property
    def idle_first(self) -> bool:
        """Whether it has a phase without activity at all (start-up or warm-up)."""
        return self.startup_s + self.warmup_s > 0

    def training(self, elapsed: float) -> bool:
        """Whether, ``elapsed`` seconds into the attempt, start-up and warm-up are over."""
        return elapsed >= self.active_at(0.0)

    def ramp_step(self, elapsed: float) -> int:
        """Ramp steps done ``elapsed`` seconds into the attempt (0 to ``RAMP_STEPS``), read off
        ``ramp_schedule`` as the simulator schedules it (``seen_at(start) + after``), so that a
        world ticking through the ramp meets each step exactly when a world scheduling it does."""
        seen = self.seen_at(0.0)
        return max((step for after, step in ramp_schedule(self.ramp_s) if seen + after <= elapsed), default=0)

    def mem_at(self, elapsed: float, progress: float) -> float | None:
        """MiB held ``elapsed`` seconds into the attempt with ``progress`` in [0, 1] of its work
        done; None during start-up (nothing on the GPU yet)."""
        if elapsed < self.seen_at(0.0):
            return None
        held = ramp_mib(self.mem_mib, self.ramp_step(elapsed))
        if self.peak_mib is not None and progress >= self.peak_at:
            held = max(held, self.peak_mib)
        return held
