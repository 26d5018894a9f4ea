"""The discrete-event simulator: the real scheduler core on simulated GPUs and a simulated clock.

What is simulated (everything else is the production code path, the world model included):

* time: an event heap (arrivals, ends of start-up, memory ramp steps, ends of warm-up, finishes,
  wake-ups when the world model or the policy said something will change), not a fixed tick;
* GPUs: memory, the solo activity of the jobs on them, what their counters read (each job's
  activity at its progress rate, summed), power from the interference model;
* jobs: a start-up at full speed with no memory and no GPU activity (the job's ``startup_s``,
  else ``SimConfig.startup_s``), then a CUDA context and a memory ramp to the job's *actual*
  peak over ``ramp_s`` (at the first ramp step that does not fit its fence or beside its
  neighbours it crashes out of memory: the job that allocates last fails, as on a real GPU,
  saying what it held and tried to allocate, and goes through the recovery rules, restarting
  from scratch), an optional warm-up with no activity (the trace's ``warmup_s``),
  then progress at ``1 / slowdown`` of solo speed, where the slowdown comes from the
  interference model for the jobs sharing each of its GPUs. These phases are
  ``collocate.core.job_behaviour``'s, which the emulated job plays too.

What policies know is not simulated: the simulator feeds the same world model the daemon feeds
(``collocate.core.world``) with what its meters read (each job's memory as it ramps, each GPU's
realized activity whenever it changes), and the world model builds the policies' snapshot, the
phases of each job, its memory commitment and its beliefs of every job's activity, learned
while jobs share GPUs as the daemon learns them. ``SimConfig.profiles`` says what it starts from.

What the devices are is a small strategy object (``collocate.sim.devices``): ``WholeGpus``, or
with a MIG layout (``SimConfig.mig_layout``) ``collocate.sim.mig.MigInstances``, whose GPUs are
split into MIG instances that are scheduled as GPUs of their own. It says which devices there
are, meters their physical GPUs' energy, busy time and memory, and gives each device's share of
its GPU's SMs (``speed``: jobs on an instance are slowed relative to it, by
``InterferenceModel.slowdown``, and share it by the sharing mode, time-slicing or MPS, as a whole
GPU). Admission is the core's (``collocate.core.scheduler.Capacity`` reads MIG instances from the
snapshot).

Policies see estimates (``Job.mem_mib``, from the chosen estimator) while crashes follow the
actual peaks, so the cost of a poor estimator shows up as out-of-memory crashes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from collocate.common.errors import CollocateError, InputError
from collocate.core.belief import UNKNOWN, Belief, as_history, exact
from collocate.core.commitment import is_estimated
from collocate.core.fairness import Fairness
from collocate.core.gputypes import NodeSpec
from collocate.core.interference import InterferenceModel, default_interference, on_device
from collocate.core.job_behaviour import RAMP_STEPS, JobBehaviour, context_mib, progress_rate, ramp_mib, ramp_schedule
from collocate.core.knowledge import MemoryProfiles, ProfileKnowledge, carried_over, learned_here, price_pending
from collocate.core.model import Job, JobProfile, JobState, SharingMode
from collocate.core.policies.base import Policy
from collocate.core.recovery import (
    ExitReport,
    Holding,
    Outcome,
    RecoveryRules,
    charged_to,
    job_allowance_mib,
    job_fence_mib,
)
from collocate.core.scheduler import Capacity, Scheduler
from collocate.core.suspension import SuspendRules
from collocate.core.world import Device, World, observed_residents
from collocate.estimate.static import TRACED_REL_UNCERTAINTY
from collocate.sim.devices import WholeGpus
from collocate.sim.mig import MigInstances, resolve_layout
from collocate.sim.model_error import ModelError
from collocate.sim.trace import TraceJob, Workload

# Event kinds, in the order they are handled at equal times: work done frees GPUs before new
# work arrives, so a round at time t sees every change of time t.
_FINISH, _RAMP, _SEEN, _ACTIVE, _ARRIVE, _WAKE = range(6)

PROFILE_KNOWLEDGE = ("trace", "unknown", "blind", "learned")  # SimConfig.profiles

ESTIMATE_UNCERTAINTY = {
    # Relative uncertainty the simulator attaches to each catalogue estimator, from its published
    # accuracy on CARMA's models (shared notes carma.md §5.2): FakeTensor under-estimated every
    # CNN (median 0.54x of the peak), Horus ranged 0.37x-4.6x, GPUMemNet returns a bin's upper
    # edge and was >= actual in 16 of 18 cases.
    "peak": 0.0,
    "declared": 0.0,
    "gpumemnet": 0.0,
    "horus": 0.5,
    "faketensor": 0.85,
    # collocate's own (``collocate submit --estimate``): the traced peak's uncertainty, before the
    # CUDA context term the estimate adds (benchmarks/gpu/first_run_gpu.py compares it with a GPU)
    "static": TRACED_REL_UNCERTAINTY,
}


@dataclass(frozen=True)
class SimConfig:
    sharing: SharingMode = SharingMode.TIME_SLICING
    estimator: str = "peak"
    # What policies know of each job's solo activity. "trace": the trace's profile, exactly.
    # "unknown": what a fresh daemon knows, nothing at the start and all it learns as the trace
    # runs (``collocate.core.world``: every GPU's readings revise the beliefs of the jobs on it, alone
    # or shared), what earlier runs of the same job taught (``Workload.command``, its history),
    # and for a job without history its family's prior (``Workload.program``: a sweep's other
    # points) over history and observed running siblings. "blind": nothing, ever
    # (``model.UNKNOWN_PROFILE``). "learned": learning and the same job's history, no family
    # priors. Progress and power always
    # follow the trace.
    profiles: str = "trace"
    ramp_s: float = 10.0  # from the end of start-up until a job holds its peak memory
    # From placement until the process is seen on the GPU (import, CUDA context), unless the
    # trace gives a job its own. A job in start-up uses no SM or DRAM bandwidth and runs at full
    # speed: its trace duration includes this time, and on an H100 start-ups overlapped with
    # other jobs' training cost nothing.
    startup_s: float = 0.0
    # How often the daemon being modelled samples its GPUs (``serve --period``): its readings
    # lag a change by a sample, and a few samples price a job (``collocate.core.world``).
    period_s: float = 1.0
    rules: RecoveryRules = field(default_factory=RecoveryRules)
    interference: InterferenceModel = field(default_factory=default_interference)
    timeline_gpus: int = 16  # record memory/SM timelines of the first N GPUs (for plots)
    # The MIG instances every physical GPU is split into, e.g. "3g.20gb+4g.20gb", or per GPU
    # type "A100-40GB=3g.20gb+4g.20gb,H100-80GB=...", or "default" (each type's
    # collocate.sim.mig.default_layout); None: whole GPUs. Jobs share an instance by ``sharing``.
    mig_layout: str | None = None
    # Seed of the model error (``collocate.sim.model_error``): jobs in a mix run at the model's
    # slowdown times a held-out calibration error; None runs them at the model's prediction.
    model_error_seed: int | None = None
    # Fair share and per-user caps among the trace's users (``collocate.core.fairness``; a trace
    # without a ``user`` column is one user, and then neither changes anything).
    fairness: Fairness = field(default_factory=Fairness)
    # Whether a waiting job of higher priority freezes lower ones (``collocate.core.preemption``), as
    # ``serve --no-preemption`` sets it for the daemon being modelled.
    preemption: bool = True
    # Whether a pile-up of trial jobs is taken back in one step (``SuspendRules.at_once``), as
    # ``serve --freeze-at-once`` sets it.
    take_back_at_once: bool = False

    def __post_init__(self) -> None:
        if self.profiles not in PROFILE_KNOWLEDGE:
            raise InputError(f"unknown profile knowledge {self.profiles!r}",
                             hint=f"valid: {', '.join(PROFILE_KNOWLEDGE)}")


@dataclass
class SimJobRecord:
    id: str
    name: str
    gpus: int
    submit: float
    peak_mib: float
    mem_mib: float | None
    start: float | None = None  # first start
    end: float | None = None
    state: str = "pending"
    attempts: int = 0
    oom_crashes: int = 0
    last_gpus: str = ""
    reason: str = ""
    spans: list[list] = field(default_factory=list)  # [gpus, start, end, outcome] per attempt
    frozen: list[list] = field(default_factory=list)  # [start, end] per freeze (end None: it ended frozen)

    @property
    def completion_s(self) -> float | None:
        """Submission to end of a job that ended done; None for any other (failed, rejected, running)."""
        return self.end - self.submit if self.state == "done" and self.end is not None else None


@dataclass
class SimRun:
    job: Job
    gpus: list[int]
    peak_mib: float
    profile: JobProfile  # its real solo activity (job.profile is what the policies were told)
    limit_mib: float | None = None  # its fence: what it may hold (None: not fenced)
    room_mib: float | None = None  # the room its GPUs had for it when placed
    allocated: bool = False
    starting: bool = False  # no GPU activity yet (start-up, then the job's warmup_s)
    warming: bool = False  # in the warm-up part of starting: on its GPUs, drawing power
    ramp_step: int = 0  # memory ramp steps seen so far (``RAMP_STEPS``)
    seen_at: float = 0.0  # when its process holds memory on its GPUs (end of start-up)
    work_left: float = 0.0  # solo-seconds still to do
    rate: float = 1.0
    since: float = 0.0  # when work_left was last brought up to date
    version: int = 0
    frozen: bool = False  # suspended (``collocate.core.suspension``): no progress, no activity, memory kept
    frozen_since: float = 0.0


@dataclass
class SimResult:
    policy: str
    records: list[SimJobRecord]
    makespan_s: float
    energy_j: float
    sm_util: float  # time-averaged busy fraction over all (physical) GPUs
    mem_util: float  # time-averaged allocated fraction over all (physical) GPUs
    gpu_count: int  # physical GPUs (under MIG the schedulable instances are more)
    decisions: int
    timelines: dict[str, list[tuple[float, float, float]]]  # gpu -> (t, used MiB, busy)
    waits: dict[str, int] = field(default_factory=dict)  # wait kind -> job-rounds it was the reason
    frozen_seconds: float = 0.0  # job-seconds jobs spent frozen (``collocate.core.suspension``)


class Simulation:
    """One simulated run of ``trace`` under ``policy``, in every sharing mode."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        trace: Sequence[TraceJob],
        policy: Policy,
        config: SimConfig = SimConfig(),
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.cfg = config
        self.trace = trace
        self.policy = policy
        self.model_error = (None if config.model_error_seed is None
                            else ModelError.of(config.interference, config.sharing, config.model_error_seed))
        self.progress = progress
        if config.mig_layout is not None:
            self.devices: WholeGpus = MigInstances(nodes, resolve_layout(config.mig_layout, nodes))
        else:
            self.devices = WholeGpus(nodes)
        hw = self.devices
        ids = hw.ids
        n = len(ids)
        self.ids = tuple(ids)
        self._index = {g: i for i, g in enumerate(self.ids)}
        self.total = np.array(hw.total_mib)
        self.speed = np.array(hw.speed)
        learning = config.profiles in ("unknown", "learned")
        self.world = World([Device(g, t, sp) for g, t, sp in zip(ids, hw.total_mib, hw.speed, strict=True)],
                           sharing=config.sharing, learn=learning, period_s=config.period_s,
                           params=config.interference.modes.get(config.sharing))
        self.used = np.zeros(n)  # actually allocated memory
        # Realized activity, Σ a·rate over the residents: what the GPU's counters read. Measured
        # on an H100 it matches GPM SM activity within 0.035 on average, where Σ a misses by 0.155
        # (time-slicing 7 copies of a job of activity 0.3 read 0.49, not 1).
        self.sm_live = np.zeros(n)
        self.power_floor = np.zeros(n)  # busy-equivalent of warming jobs' power (``_realize``)
        self.dram_live = np.zeros(n)
        # Per device, its jobs in the order they came: a dict, not a set, so that every sum
        # over them runs in the same order whatever PYTHONHASHSEED is (bit-exact results).
        self.residents: list[dict[str, None]] = [{} for _ in range(n)]
        hw.bind(self.sm_live, self.power_floor, self.used, config.interference.power_exponent)
        self._advance = hw.advance  # the hot path: no extra call layer
        self.timelines: dict[str, list[tuple[float, float, float]]] = {
            str(ids[i]): [(0.0, 0.0, 0.0)] for i in range(min(n, config.timeline_gpus))
        }

        self.running: dict[str, SimRun] = {}
        self.scheduler = Scheduler(policy, Capacity.of(self.world.snapshot(0.0)), rules=config.rules,
                                   fairness=config.fairness, suspend=SuspendRules(preempt=config.preemption,
                                                                        at_once=config.take_back_at_once))
        self.records: dict[str, SimJobRecord] = {}
        self.peaks: dict[str, float] = {}
        self.profiles = MemoryProfiles()  # what runs taught, as the daemon's history
        self.knowledge = ProfileKnowledge(self.profiles)
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self._wake_at = math.inf  # the earliest wake-up pushed and not yet reached
        self._recheck_at = math.inf  # when the last plan asked to be looked at again
        self._review_at = math.inf  # when the last review of jobs on trial asked to be looked at again
        self.frozen_seconds = 0.0  # job-seconds spent frozen, over the run
        self.decisions = 0
        self.wait_counts: dict[str, int] = {}
        self.closed = 0  # jobs in a final state
        for tj in trace:
            self._push(tj.arrival_s, _ARRIVE, tj.id)
        self._by_id = {tj.id: tj for tj in trace}

    # -- event plumbing -----------------------------------------------------------------------
    def _push(self, t: float, kind: int, job_id: str, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, job_id, version))

    def _wake(self, at: float, now: float) -> None:
        """Look again at ``at`` (a world change or the policy's recheck), once per moment."""
        at = max(at, now + 1e-6)
        if math.isfinite(at) and (at < self._wake_at or self._wake_at <= now):
            self._wake_at = at
            self._push(at, _WAKE, "")

    def run(self) -> SimResult:
        now = 0.0
        done = 0
        total = len(self.trace)
        world = self.world
        while self.events:
            now = self.events[0][0]
            changed = False
            while self.events and self.events[0][0] == now:
                _, kind, _, job_id, version = heapq.heappop(self.events)
                if kind == _ARRIVE:
                    changed |= self._arrive(job_id, now)
                elif kind == _RAMP:
                    changed |= self._ramp(job_id, version, now)
                elif kind == _FINISH:
                    changed |= self._finish(job_id, version, now)
                elif kind == _SEEN:
                    changed |= self._seen(job_id, version, now)
                elif kind == _ACTIVE:
                    changed |= self._active(job_id, version, now)
            changed |= world.tick(now) or now >= self._recheck_at
            if self.scheduler.reviewing and (changed or now >= self._review_at):
                changed |= self._review(now)
            if changed and self.scheduler.waiting:
                self._recheck_at = self._round(now)
            if self.scheduler.waiting or self.scheduler.reviewing:
                # the policy's recheck is a pending job's: with an empty queue it is stale
                recheck = self._recheck_at if self.scheduler.waiting else math.inf
                self._wake(min(recheck, self._review_at, world.next_change_at()), now)
            if self.progress and self.closed != done:
                done = self.closed
                self.progress(done, total)
        if self.scheduler.waiting:  # nothing left to happen, yet jobs wait: a bug, never a result
            raise CollocateError(
                f"the simulation stalled at {now:.0f} s with {len(self.scheduler.queue)} job(s) pending "
                f"under {self.policy.name}", hint="a policy waits for something it never asks to be "
                "woken for (Plan.recheck_at); please report it with the trace")
        return self._result(now)

    def _known_profile(self, w: Workload) -> Belief:
        """What the daemon would know of a newly submitted workload's activity (``profiles``)."""
        if self.cfg.profiles == "trace":
            return exact(w.profile)
        if self.cfg.profiles == "blind":
            return UNKNOWN
        return self.knowledge.known(w.command, w.program, families=self.cfg.profiles != "learned")

    # -- events -----------------------------------------------------------------------------
    def _arrive(self, job_id: str, now: float) -> bool:
        w = self._by_id[job_id].workload
        mem_source = self.cfg.estimator
        mem = w.estimates.get(mem_source)
        if mem is None:  # what the user declared, if anything: kept whole, as a declaration is
            mem_source = "declared" if "declared" in w.estimates else "unknown"
            mem = w.estimates.get("declared")
        told = self._known_profile(w)
        job = Job(
            id=job_id,
            gpus=w.gpus,
            nodes=w.nodes,
            mem_mib=mem,
            mem_source=mem_source,
            mem_uncertainty=ESTIMATE_UNCERTAINTY.get(mem_source, 0.5) if mem is not None else 0.0,
            submit_time=now,
            name=w.name,
            user=self._by_id[job_id].user,  # multi-user traces: fair share and caps count by it
            priority=self._by_id[job_id].priority,
            profile=told.profile,
            profile_source=told.source,
            profile_var=(told.sm_var, told.dram_var),
        )
        self.peaks[job_id] = w.peak_mib
        self.records[job_id] = SimJobRecord(job_id, w.name, w.gpus * w.nodes, now, w.peak_mib, mem)
        job = self.scheduler.submit(job)
        if job.state is JobState.REJECTED:
            self._close(job, now)
            return False
        return True

    def _round(self, now: float) -> float:
        """One policy round; when the policy wants to look again."""
        if self.cfg.profiles == "unknown":
            self._price_pending()
        plan = self.scheduler.schedule(self.world.snapshot(now), lambda idle: self.world.snapshot(now, idle))
        self.decisions += 1
        for f in plan.freeze:  # jobs of lower priority, frozen for a placement (``collocate.core.preemption``)
            self._set_frozen(f.job_id, True, now)
        for wait in plan.waits.values():
            self.wait_counts[wait.kind.value] = self.wait_counts.get(wait.kind.value, 0) + 1
        for placement in plan.placements:
            self._launch(placement.job_id, [self._index[g] for g in placement.gpus], now,
                         placement.room_mib)
        return plan.recheck_at

    def _review(self, now: float) -> bool:
        """Freeze the jobs on trial that slow a neighbour past the limit and thaw those whose
        room returned, as the core decides (``Scheduler.review``): a frozen job keeps its memory
        and makes no progress. Whether anything changed."""
        decided = self.scheduler.review(self.world.neighbourhood, now)
        self._review_at = decided.recheck_at
        for f in decided.freeze:
            self._set_frozen(f.job_id, True, now)
        for job_id in decided.thaw:
            self._set_frozen(job_id, False, now)
        return bool(decided)

    def _set_frozen(self, job_id: str, frozen: bool, now: float) -> None:
        run = self.running.get(job_id)
        if run is None or run.frozen == frozen:
            return
        self._advance(run.gpus, now)
        run.frozen = frozen
        if frozen:
            run.frozen_since = now
            self.records[job_id].frozen.append([now, None])
        else:
            self.frozen_seconds += now - run.frozen_since
            self.records[job_id].frozen[-1][1] = now
        self.world.freeze(job_id, now, frozen, self.scheduler.jobs[job_id].suspended)  # as recorded
        self._rerate(run.gpus, now)

    def _price_pending(self) -> None:
        """Pending jobs without history take their family's prior over history and the observed
        running siblings (``knowledge.price_pending``, as the daemon)."""
        live = [(w.command, w.program, belief) for job_id, belief in observed_residents(self.world)
                for w in (self._by_id[job_id].workload,)]
        if not live:
            return
        keys = self._keys
        for job in price_pending(self.scheduler.queue, live, keys, self.knowledge):
            self.scheduler.update(job)

    def _keys(self, job_id: str) -> tuple[str | None, str | None]:
        w = self._by_id[job_id].workload
        return w.command, w.program

    def _launch(self, job_id: str, gpus: list[int], now: float, room_mib: float | None = None) -> None:
        job = self.scheduler.jobs[job_id]
        record = self.records[job_id]
        record.start = now if record.start is None else record.start
        record.attempts = job.attempts
        record.last_gpus = ",".join(str(self.ids[i]) for i in gpus)
        record.state = "running"
        record.spans.append([record.last_gpus, now, None, ""])
        workload = self._by_id[job_id].workload
        if not gpus:  # a CPU job (``gpus`` 0): on no GPU, so nothing to meter and no neighbours
            cpu = self.running[job_id] = SimRun(job, [], 0.0, workload.profile, since=now)
            self._push(now + workload.duration_s, _FINISH, job_id, cpu.version)
            return
        self._advance(gpus, now)
        behaviour = JobBehaviour(self.peaks[job_id], self.cfg.startup_s if workload.startup_s is None
                                 else workload.startup_s, self.cfg.ramp_s, workload.warmup_s)
        self.world.place(job, gpus, now, room_mib=room_mib)
        for i in gpus:
            self.residents[i][job_id] = None
        # fenced under every sharing mode, as the daemon fences (a capped caching allocator, an
        # MPS limit): ``collocate.core.recovery.job_fence_mib``
        limit = job_fence_mib(job, room_mib)
        run = SimRun(job, gpus, behaviour.mem_mib, workload.profile, limit, room_mib,
                     starting=behaviour.idle_first, work_left=workload.duration_s, since=now)
        run.seen_at = behaviour.seen_at(now)
        self.running[job_id] = run
        if behaviour.startup_s > 0:
            self._push(run.seen_at, _SEEN, job_id, job.attempts)
        else:  # seen at once, before its activity shows (the world sees that step)
            run.warming = run.starting
            self._see(run, now)
        if run.starting:
            self._push(behaviour.active_at(now), _ACTIVE, job_id, job.attempts)
        self._rerate(gpus, now)

    def _seen(self, job_id: str, attempt: int, now: float) -> bool:
        """Start-up is over: the process holds a CUDA context on its GPUs (the world sees it),
        its memory starts to ramp, and a warm-up draws power with no activity to speak of."""
        run = self.running.get(job_id)
        if run is None or run.job.attempts != attempt:
            return False
        self._advance(run.gpus, now)
        run.warming = run.starting
        self._see(run, now)
        self._realize(run.gpus, now)
        return True

    def _see(self, run: SimRun, now: float) -> None:
        job_id, attempt = run.job.id, run.job.attempts
        self.world.observe_memory(job_id, context_mib(run.peak_mib), now)
        # a ramp the daemon would sample as it grows matters only where the commitment
        # depends on memory holding still (unknown or estimated requirements)
        watched = run.job.mem_mib is None or is_estimated(run.job.mem_source) or self._outgrows(run)
        for after, step in ramp_schedule(self.cfg.ramp_s, sampled=watched):
            self._push(now + after, _RAMP, job_id, attempt * 16 + step)

    def _ramp(self, job_id: str, code: int, now: float) -> bool:
        """A step of the memory ramp; the last one allocates the job's peak (or crashes)."""
        run = self.running.get(job_id)
        attempt, step = divmod(code, 16)
        if run is None or run.job.attempts != attempt or run.allocated:
            return False
        run.ramp_step = step
        gpus = run.gpus
        room = self._room(run)
        if (room < ramp_mib(run.peak_mib, step)).any():
            # it crashes at the first allocation past its room, and says what it held and
            # tried to allocate (PyTorch's message, which the daemon reads: ``oom_lower_bound_mib``)
            room_mib = float(max(0.0, room.min()))
            observed = next(ramp_mib(run.peak_mib, k) for _, k in ramp_schedule(self.cfg.ramp_s)
                            if ramp_mib(run.peak_mib, k) > room_mib)
            # charged to whoever overran (``collocate.core.recovery.charged_to``), as in the daemon
            beside = [Holding(o, r.peak_mib, job_allowance_mib(r.job, r.room_mib))
                      for o in dict.fromkeys(o for i in gpus for o in self.residents[i] if o != job_id)
                      if (r := self.running[o]).allocated]
            crashed = Holding(job_id, observed, job_allowance_mib(run.job, run.room_mib))
            by = charged_to(crashed, beside) if run.limit_mib is None or observed <= run.limit_mib else ()
            resident = self._stop(run, now)
            job = self.scheduler.job_exited(job_id, ExitReport(Outcome.OOM, observed, "CUDA out of memory",
                                                               run.limit_mib, by),
                                            now)  # now: charges its GPU time to its user
            for h in beside:
                if h.job_id in by:
                    self.scheduler.charge_overrun(h.job_id, h.held_mib)
            if resident is not None and (known := carried_over(job, learned_here(resident.belief))) is not None:
                job = self.scheduler.update(known)  # requeued: its next attempt starts known, as in the daemon
            record = self.records[job_id]
            record.oom_crashes = job.oom_crashes
            record.spans[-1][2:] = [now, "oom"]
            if job.state.is_terminal:
                self._close(job, now)
            else:
                record.state = "pending"
            return True
        if step < RAMP_STEPS:
            self.world.observe_memory(job_id, ramp_mib(run.peak_mib, step), now)
            return self.world.tick(now)
        self._advance(gpus, now)
        self.used[gpus] += run.peak_mib
        for i in gpus:
            self.world.set_free(i, float(self.total[i] - self.used[i]))
        run.allocated = True
        self.world.observe_memory(job_id, run.peak_mib, now)
        self._mark(gpus, now)
        return False

    def _room(self, run: SimRun) -> np.ndarray:
        """What each of its GPUs lets it hold: what the jobs that allocated leave, within its fence."""
        room = self.total[run.gpus] - self.used[run.gpus]
        return room if run.limit_mib is None else np.minimum(room, run.limit_mib)

    def _outgrows(self, run: SimRun) -> bool:
        """Whether its ramp will pass its fence or the room its GPUs have now: it then crashes
        at the ramp step that does, which must be seen (a real process fails at that allocation)."""
        return bool((self._room(run) < run.peak_mib).any())

    def _active(self, job_id: str, attempt: int, now: float) -> bool:
        """Start-up and warm-up are over: the job's activity shows on its GPUs, and it now slows
        and is slowed by its neighbours."""
        run = self.running.get(job_id)
        if run is None or run.job.attempts != attempt or not run.starting:
            return False
        self._advance(run.gpus, now)
        run.starting = run.warming = False
        self._rerate(run.gpus, now)
        return True

    def _finish(self, job_id: str, version: int, now: float) -> bool:
        run = self.running.get(job_id)
        if run is None or run.version != version:
            return False
        resident = self._stop(run, now)
        command = self._by_id[job_id].workload.command
        learned = None if resident is None else learned_here(resident.belief)
        if learned is not None and command is not None:
            self.profiles.record(command, self._by_id[job_id].workload.program, as_history(learned))
        job = self.scheduler.job_exited(job_id, ExitReport(Outcome.SUCCEEDED), now)
        self._close(job, now)
        return True

    # -- state changes ----------------------------------------------------------------------
    def _stop(self, run: SimRun, now: float):
        gpus = run.gpus
        self._advance(gpus, now)
        job = run.job
        for i in gpus:
            if run.allocated:
                self.used[i] -= run.peak_mib
            self.residents[i].pop(job.id, None)
            if not self.residents[i]:
                self.used[i] = 0.0  # clear float drift
            self.world.set_free(i, float(self.total[i] - self.used[i]))
        del self.running[job.id]
        if not gpus:  # a CPU job: the world never saw it
            return None
        resident = self.world.remove(job.id, now)
        self._rerate(gpus, now)
        return resident

    def _rerate(self, gpus: list[int], now: float) -> None:
        """Recompute the progress rate of every job sharing any of these GPUs."""
        affected = {job_id: None for i in gpus for job_id in self.residents[i]}  # ordered, no repeats
        model, mode, error, speed = self.cfg.interference, self.cfg.sharing, self.model_error, self.devices.speed
        # A multi-GPU job's new rate changes what its other GPUs draw: meter them up to now first.
        beyond = [i for j in affected for i in self.running[j].gpus if i not in gpus]
        self._advance(beyond, now)
        for job_id in affected:
            run = self.running[job_id]
            run.work_left -= (now - run.since) * run.rate
            run.since = now
            slowdown = 1.0
            for i in run.gpus if not run.starting else ():  # inline: the simulator's hot path
                others = [r.profile for o in self.residents[i]
                          if o != job_id and not (r := self.running[o]).starting and not r.frozen]
                here = model.slowdown(mode, run.profile, others, speed=speed[i])
                if error is not None and others:
                    co_runners = [o for o in self.residents[i]
                                  if o != job_id and not self.running[o].starting and not self.running[o].frozen]
                    here = max(1.0, here * error.factor(job_id, co_runners))
                slowdown = max(slowdown, here)
            self._seq += 1  # unique across attempts: a crashed attempt's finish never ends the next
            run.version = self._seq
            run.rate = progress_rate(slowdown, run.frozen)
            if run.frozen:  # no progress until thawed (no finish to push); its memory stays
                continue
            self._push(now + max(run.work_left, 0.0) / run.rate, _FINISH, job_id, run.version)
        self._realize(gpus, now)
        self._realize(beyond, now)
        self._mark(gpus, now)

    def _realize(self, gpus, now: float) -> None:
        """Recompute the realized activity of these GPUs from their residents' rates (summed
        afresh, not updated by differences: drift would move decisions at policy thresholds),
        and tell the world what they read from now on."""
        warm_busy = self.cfg.interference.warmup_busy
        world = self.world
        for i in gpus:
            sm = dram = floor = 0.0
            for job_id in self.residents[i]:
                run = self.running[job_id]
                if run.frozen:
                    continue
                if run.starting:
                    floor = warm_busy if run.warming else floor
                    continue
                sm += run.profile.sm_activity * run.rate
                dram += run.profile.dram_activity * run.rate
            self.sm_live[i], self.dram_live[i], self.power_floor[i] = sm, dram, floor
            world.set_reading(i, now, sm, dram)

    def _mark(self, gpus: list[int], now: float) -> None:
        for i in gpus:  # memory and activity relative to each device (a MIG instance's own SMs)
            key = str(self.ids[i])
            if key in self.timelines:
                busy = min(1.0, on_device(self.sm_live[i], self.speed[i]))
                self.timelines[key].append((now, float(self.used[i]), float(busy)))

    def _close(self, job: Job, now: float) -> None:
        record = self.records[job.id]
        self.closed += 1
        record.state = job.state.value
        record.end = now
        record.reason = job.reason
        record.attempts = job.attempts
        record.oom_crashes = job.oom_crashes
        if record.spans and record.spans[-1][2] is None:
            record.spans[-1][2:] = [now, record.state]

    def _result(self, now: float) -> SimResult:
        first = min((r.submit for r in self.records.values()), default=0.0)
        ends = [r.end for r in self.records.values() if r.end is not None]
        end = max(ends, default=now)
        self._advance(range(len(self.ids)), end)
        span = max(end - first, 1e-9)
        meters = self.devices
        g = len(meters.energy)  # physical GPUs
        return SimResult(
            policy=self.policy.name,
            records=list(self.records.values()),
            makespan_s=end - first,
            energy_j=float(meters.energy.sum()),
            sm_util=float(meters.busy_int.sum() / (g * span)),
            mem_util=float(meters.mem_int.sum() / (g * span)),
            gpu_count=g,
            decisions=self.decisions,
            timelines=self.timelines,
            waits=dict(sorted(self.wait_counts.items())),
            frozen_seconds=self.frozen_seconds,
        )
