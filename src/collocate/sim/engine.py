"""The discrete-event simulator: the real scheduler core on simulated GPUs and a simulated clock.

What is simulated (everything else is the production code path):

* time: an event heap (arrivals, ends of start-up, memory ramp-ups, finishes, wake-ups), not a
  fixed tick;
* GPUs: memory, the solo activity of the jobs on them, power from the interference model;
* what policies know of each job's activity: the trace's profile, nothing, or (``learned``)
  what the daemon would have measured: the profile once the job has run alone for
  ``SimConfig.learn_s`` (``collocate.activity``; not on MIG instances, where the daemon does
  not learn either), and for later jobs of the same workload from their submission on;
* jobs: an optional idle phase at full speed and with no GPU activity (``SimConfig.startup_s``
  until the process shows on its GPUs, then the trace's per-job ``warmup_s``), then progress
  at ``1 / slowdown`` of solo speed, where the slowdown comes from the
  interference model for the jobs sharing each of their GPUs; a job allocates its *actual*
  peak memory ``ramp_s`` after it starts, and if that does not fit beside its neighbours it
  crashes out of memory (the job that allocates last is the one that fails, as on a real GPU)
  and goes through the recovery rules, restarting from scratch.

What differs between sharing modes is a small strategy object (``collocate.sim.devices``):
``WholeGpus``, or under ``SharingMode.MIG`` ``collocate.sim.mig.MigInstances``, whose GPUs are
split into MIG instances that are scheduled as GPUs of their own. It says which devices there
are, meters their physical GPUs' energy, busy time and memory, gives each instance's SM fraction
(jobs on an instance are slowed relative to it) and whether solo profiles are learned there.
Admission is the core's (``collocate.scheduler.Capacity`` reads MIG instances from the snapshot).

Policies see estimates (``Job.mem_mib``, from the chosen estimator) while crashes follow the
actual peaks, so the cost of a poor estimator shows up as out-of-memory crashes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from collocate.activity import INFER_AFTER_S, MIN_SOLO_SAMPLES, infer_assumed
from collocate.commitment import MemoryRamp, committed_mib, mps_limit_mib, stable_s_of
from collocate.errors import CollocateError, InputError
from collocate.estimate.static import TRACED_REL_UNCERTAINTY
from collocate.fairness import Fairness
from collocate.gputypes import NodeSpec
from collocate.interference import InterferenceModel, default_interference
from collocate.knowledge import MemoryProfiles, ProfileKnowledge, Sibling, sibling_priors
from collocate.model import (
    UNKNOWN_PROFILE,
    ClusterSnapshot,
    Gangs,
    Job,
    JobProfile,
    JobState,
    SharingMode,
    gang_nodes,
)
from collocate.policies.base import Policy
from collocate.recovery import ExitReport, Outcome, RecoveryRules
from collocate.scheduler import Capacity, Scheduler
from collocate.sim.devices import WholeGpus
from collocate.sim.mig import MigInstances, resolve_layout
from collocate.sim.model_error import ModelError
from collocate.sim.trace import TraceJob, Workload

# Event kinds, in the order they are handled at equal times: work done frees GPUs before new
# work arrives, so a round at time t sees every change of time t.
_FINISH, _RAMP, _STABLE, _ACTIVE, _LEARN, _INFER, _WARM, _ARRIVE, _WAKE = range(9)

PROFILE_KNOWLEDGE = ("trace", "unknown", "blind", "learned", "similar")  # SimConfig.profiles

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
    # What policies know of each job's solo activity. "trace": the trace's profile. "unknown":
    # what a fresh daemon knows, nothing at the start and all it learns as the trace runs: a
    # job's profile once it has run alone and active for learn_s; the profile of an earlier
    # successful run of the same command (its history) or the median of its program's
    # (``Workload.program``: a sweep's other points), measured alone or, while they run, inferred
    # from what their GPU reads; and for a job still unmeasured, the profile its GPU's reading
    # implies (``activity.infer_assumed``) INFER_AFTER_S + learn_s after its GPU's newest job
    # started. "blind": nothing, ever (``model.UNKNOWN_PROFILE``, the daemon before it learned).
    # "learned": only learning alone and the same command's history; "similar": that and the
    # program's history (the parts of "unknown", for comparing them). Progress and power always
    # follow the trace.
    profiles: str = "trace"
    learn_s: float = float(MIN_SOLO_SAMPLES)  # the daemon's samples at its default 1 s period
    ramp_s: float = 10.0  # from start until a job holds its peak memory
    # From placement until the process is seen on the GPU (import, CUDA context). A job in
    # start-up uses no SM or DRAM bandwidth and runs at full speed: its trace duration includes
    # this time, and on an H100 start-ups overlapped with other jobs' training cost nothing.
    startup_s: float = 0.0
    wake_s: float = 30.0  # re-run the policy this long after a launch is seen (in-flight guard)
    rules: RecoveryRules = field(default_factory=RecoveryRules)
    interference: InterferenceModel = field(default_factory=default_interference)
    timeline_gpus: int = 16  # record memory/SM timelines of the first N GPUs (for plots)
    # MIG only: the instances every physical GPU is split into, e.g. "3g.20gb+4g.20gb", or per
    # GPU type "A100-40GB=3g.20gb+4g.20gb,H100-80GB=..."; None: the default of each type
    # (collocate.sim.mig.default_layout).
    mig_layout: str | None = None
    # Seed of the model error (``collocate.sim.model_error``): jobs in a mix run at the model's
    # slowdown times a held-out calibration error; None runs them at the model's prediction.
    model_error_seed: int | None = None
    # Fair share and per-user caps among the trace's users (``collocate.fairness``; a trace
    # without a ``user`` column is one user, and then neither changes anything).
    fairness: Fairness = field(default_factory=Fairness)

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


@dataclass
class SimRun:
    job: Job
    gpus: list[int]
    peak_mib: float
    commitment: float  # what it holds against each of its GPUs' committed memory
    profile: JobProfile  # its real solo activity (job.profile is what the policies were told)
    ramp: MemoryRamp  # its memory as the daemon would watch it (collocate.commitment)
    limit_mib: float | None = None  # what MPS lets it hold (None: no limit)
    allocated: bool = False
    starting: bool = False  # no GPU activity yet (SimConfig.startup_s + the job's warmup_s)
    warming: bool = False  # in the warm-up part of starting: on its GPUs, drawing power
    alone: bool = False  # active with no active neighbour since the last rerate (when learning)
    alone_s: float = 0.0  # time spent alone and active, up to the last rerate
    learned: bool = False  # policies now see its real profile
    inferred: bool = False  # policies see the profile its GPU's reading implies ("unknown")
    seen_at: float = 0.0  # when the daemon would first see it on its GPUs (after start-up)
    work_left: float = 0.0  # solo-seconds still to do
    rate: float = 1.0
    since: float = 0.0  # when work_left was last brought up to date
    version: int = 0


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
        if config.mig_layout is not None and config.sharing is not SharingMode.MIG:
            raise InputError(
                f"a MIG layout was given but the sharing mode is {config.sharing.value}",
                hint="use sharing mode mig with a MIG layout, or drop the layout",
            )
        self.cfg = config
        self.trace = trace
        self.policy = policy
        self._stable_s = stable_s_of(policy)
        self.model_error = (None if config.model_error_seed is None
                            else ModelError.of(config.interference, config.sharing, config.model_error_seed))
        self.progress = progress
        if config.sharing is SharingMode.MIG:
            self.devices: WholeGpus = MigInstances(nodes, resolve_layout(config.mig_layout, nodes))
        else:
            self.devices = WholeGpus(nodes)
        hw = self.devices
        ids = hw.ids
        n = len(ids)
        self.ids = tuple(ids)
        self._index = {g: i for i, g in enumerate(self.ids)}
        self.node = np.array(hw.node, dtype=np.int64)
        self.gang_node = gang_nodes(self.ids, self.node)
        self.total = np.array(hw.total_mib)
        self.speed = np.array(hw.speed)
        self.used = np.zeros(n)  # actually allocated memory
        self.committed = np.zeros(n)  # requirements of resident jobs
        self.n_jobs = np.zeros(n, dtype=np.int64)
        self.sm_sum = np.zeros(n)  # solo activities of the residents: what they ask for
        self.dram_sum = np.zeros(n)
        # Realized activity, Σ a·rate over the residents: what the GPU's counters read. Measured
        # on an H100 it matches GPM SM activity within 0.035 on average, where Σ a misses by 0.155
        # (time-slicing 7 copies of a job of activity 0.3 read 0.49, not 1).
        self.sm_live = np.zeros(n)
        self.power_floor = np.zeros(n)  # busy-equivalent of warming jobs' power (``_realize``)
        self.dram_live = np.zeros(n)
        self.seen_at = np.full(n, -math.inf)  # newest job first seen (CARMA's guard)
        self.settling_at = np.full(n, -math.inf)  # memory last grew beyond its commitment
        # Per device, its jobs in the order they came: a dict, not a set, so that every sum
        # over them runs in the same order whatever PYTHONHASHSEED is (bit-exact results).
        self.residents: list[dict[str, None]] = [{} for _ in range(n)]
        self.gpu_epoch = [0] * n  # bumped whenever a GPU's residents change (inference events)
        hw.bind(self.sm_live, self.power_floor, self.used, config.interference.power_exponent)
        self._advance = hw.advance  # the hot path: no extra call layer
        self.timelines: dict[str, list[tuple[float, float, float]]] = {
            str(ids[i]): [(0.0, 0.0, 0.0)] for i in range(min(n, config.timeline_gpus))
        }

        self.running: dict[str, SimRun] = {}
        self.gang_ids: dict[str, None] = {}  # running multi-GPU jobs, in the order they started
        self._gang_table: Gangs | None = None  # ``_gangs``' cache
        self.scheduler = Scheduler(policy, Capacity.of(self._snapshot(0.0)), rules=config.rules,
                                   fairness=config.fairness)
        self.records: dict[str, SimJobRecord] = {}
        self.peaks: dict[str, float] = {}
        self.profiles = MemoryProfiles()  # what runs measured alone, as the daemon's history
        self.knowledge = ProfileKnowledge(self.profiles)
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
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

    def run(self) -> SimResult:
        now = 0.0
        done = 0
        total = len(self.trace)
        while self.events:
            now = self.events[0][0]
            changed = False
            while self.events and self.events[0][0] == now:
                _, kind, _, job_id, version = heapq.heappop(self.events)
                if kind == _ARRIVE:
                    changed |= self._arrive(job_id, now)
                elif kind == _RAMP:
                    changed |= self._ramp(job_id, version, now)
                elif kind == _STABLE:
                    changed |= self._stable(job_id, version, now)
                elif kind == _FINISH:
                    changed |= self._finish(job_id, version, now)
                elif kind == _ACTIVE:
                    changed |= self._active(job_id, version, now)
                elif kind == _LEARN:
                    changed |= self._learn(job_id, version, now)
                elif kind == _INFER:
                    changed |= self._infer(int(job_id), version, now)
                elif kind == _WARM:
                    self._warm(job_id, version, now)  # power only: nothing to place
                else:
                    changed = True
            if changed and len(self.scheduler.queue):
                self._round(now)
            if self.progress and self.closed != done:
                done = self.closed
                self.progress(done, total)
        if len(self.scheduler.queue):  # nothing left to happen, yet jobs wait: a bug, never a result
            raise CollocateError(
                f"the simulation stalled at {now:.0f} s with {len(self.scheduler.queue)} job(s) pending "
                f"under {self.policy.name}", hint="a guard outlasts the wake-ups: is wake_s shorter than "
                "the policy's settle_s? Otherwise please report it with the trace")
        return self._result(now)

    def _known_profile(self, w: Workload) -> tuple[JobProfile, str]:
        """What the daemon would know of a newly submitted workload's activity (``profiles``),
        and where it comes from (``Job.profile_source``)."""
        if self.cfg.profiles == "trace":
            return w.profile, "trace"
        profile, source = self.knowledge.known(
            w.command, w.program, similar=self.cfg.profiles in ("similar", "unknown"))
        return (profile, source) if profile is not None else (UNKNOWN_PROFILE, "assumed")

    # -- events -----------------------------------------------------------------------------
    def _arrive(self, job_id: str, now: float) -> bool:
        w = self._by_id[job_id].workload
        mem_source = self.cfg.estimator
        mem = w.estimates.get(mem_source)
        if mem is None:  # what the user declared, if anything: kept whole, as a declaration is
            mem_source = "declared" if "declared" in w.estimates else "unknown"
            mem = w.estimates.get("declared")
        profile, source = self._known_profile(w)
        job = Job(
            id=job_id,
            gpus=w.gpus,
            mem_mib=mem,
            mem_source=mem_source,
            mem_uncertainty=ESTIMATE_UNCERTAINTY.get(mem_source, 0.5) if mem is not None else 0.0,
            submit_time=now,
            name=w.name,
            user=self._by_id[job_id].user,  # multi-user traces: fair share and caps count by it
            profile=profile,
            profile_source=source,
        )
        self.peaks[job_id] = w.peak_mib
        self.records[job_id] = SimJobRecord(job_id, w.name, w.gpus, now, w.peak_mib, mem)
        job = self.scheduler.submit(job)
        if job.state is JobState.REJECTED:
            self._close(job, now)
            return False
        return True

    def _round(self, now: float) -> None:
        if self.cfg.profiles == "unknown":
            self._price_from_siblings()
        plan = self.scheduler.schedule(self._snapshot(now))
        self.decisions += 1
        for wait in plan.waits.values():
            self.wait_counts[wait.kind.value] = self.wait_counts.get(wait.kind.value, 0) + 1
        for placement in plan.placements:
            self._launch(placement.job_id, [self._index[g] for g in placement.gpus], now,
                         placement.mem_mib)
        if len(self.scheduler.queue):  # guards lift wake_s after a launch is seen or memory grew
            recent = np.concatenate([self.seen_at, self.settling_at])
            recent = recent[(recent > now - self.cfg.wake_s) & np.isfinite(recent)]
            if recent.size:
                self._push(max(float(recent.min()) + self.cfg.wake_s, now + 1e-6), _WAKE, "")

    def _price_from_siblings(self) -> None:
        """Pending jobs nobody has measured take the median profile of their program's running
        commands that are measured or inferred (``knowledge.sibling_priors``, as the daemon)."""
        live = [Sibling(self._by_id[run.job.id].workload.program, run.job.profile,
                        measured=bool(run.learned or run.inferred
                                      or run.job.profile_source != "assumed"))
                for run in self.running.values()]
        for job in sibling_priors(self.scheduler.queue, live,
                                  lambda job_id: self._by_id[job_id].workload.program):
            self.scheduler.update(job)

    def _launch(self, job_id: str, gpus: list[int], now: float, given_mib: float | None = None) -> None:
        job = self.scheduler.jobs[job_id]
        record = self.records[job_id]
        record.start = now if record.start is None else record.start
        record.attempts = job.attempts
        record.last_gpus = ",".join(str(self.ids[i]) for i in gpus)
        record.state = "running"
        record.spans.append([record.last_gpus, now, None, ""])
        self._advance(gpus, now)
        seen = now + self.cfg.startup_s
        workload = self._by_id[job_id].workload
        idle_s = self.cfg.startup_s + workload.warmup_s
        starting = idle_s > 0
        held = committed_mib(job.mem_mib, self.total[gpus[0]])  # a job's GPUs: one node, one type
        ramp = MemoryRamp.of(job.mem_mib, job.mem_source, self._stable_s)
        for i in gpus:
            self.committed[i] += held
            self.n_jobs[i] += 1
            self.sm_sum[i] += job.profile.sm_activity  # what the scheduler placed, starting or not
            self.dram_sum[i] += job.profile.dram_activity
            self.seen_at[i] = seen
            self.residents[i][job_id] = None
        warms_later = workload.warmup_s > 0 and self.cfg.startup_s > 0
        limit = None
        if self.cfg.sharing is SharingMode.MPS:
            limit = mps_limit_mib(job.mem_mib, given_mib, job.mem_uncertainty, job.mem_source)
        run = SimRun(
            job, gpus, self.peaks[job_id], held, workload.profile, ramp, limit, starting=starting,
            warming=workload.warmup_s > 0 and not warms_later, work_left=workload.duration_s, since=now,
        )
        run.seen_at = seen
        self.running[job_id] = run
        if len(run.gpus) > 1:
            self.gang_ids[job_id] = None
            self._gang_table = None
        self._resettle(gpus)
        self._plan_inference(gpus)
        self._push(now + self.cfg.ramp_s, _RAMP, job_id, job.attempts)
        if starting:
            self._push(now + idle_s, _ACTIVE, job_id, job.attempts)
        if warms_later:
            self._push(now + self.cfg.startup_s, _WARM, job_id, job.attempts)
        self._rerate(gpus, now)

    def _ramp(self, job_id: str, attempt: int, now: float) -> bool:
        run = self.running.get(job_id)
        if run is None or run.job.attempts != attempt or run.allocated:
            return False
        gpus = run.gpus
        room = self.total[gpus] - self.used[gpus]
        if run.limit_mib is not None:  # MPS refuses allocations beyond the pinned limit
            room = np.minimum(room, run.limit_mib)
        if (room < run.peak_mib).any():
            observed = float(max(0.0, room.min()))
            self._stop(run, now)
            job = self.scheduler.job_exited(job_id, ExitReport(Outcome.OOM, observed, "CUDA out of memory"),
                                            now)  # now: charges its GPU time to its user
            record = self.records[job_id]
            record.oom_crashes = job.oom_crashes
            record.spans[-1][2:] = [now, "oom"]
            if job.state.is_terminal:
                self._close(job, now)
            else:
                record.state = "pending"
            return True
        self._advance(gpus, now)
        self.used[gpus] += run.peak_mib
        run.allocated = True
        run.ramp.observe(run.peak_mib, now)
        self._recommit(run, now)
        if run.job.mem_mib is None or run.ramp.estimated:  # its peak is committed once stable
            self._push(now + run.ramp.stable_s, _STABLE, job_id, attempt)
        self._mark(gpus, now)
        return False

    def _stable(self, job_id: str, attempt: int, now: float) -> bool:
        """A job of unknown or estimated memory has held its peak for ``stable_s``: it now
        commits that peak plus a margin instead of its whole GPU or its estimate."""
        run = self.running.get(job_id)
        if run is None or run.job.attempts != attempt:
            return False
        # a round where memory came free, and always once a job of unknown memory holds still
        # (its GPU stops settling now)
        return self._recommit(run, now) or run.job.mem_mib is None

    def _recommit(self, run: SimRun, now: float) -> bool:
        """Charge what ``run`` commits now (``MemoryRamp``) and when its GPUs last grew;
        whether its commitment changed."""
        held = run.ramp.committed(float(self.total[run.gpus[0]]), now)
        changed = held != run.commitment
        for i in run.gpus:
            self.committed[i] += held - run.commitment
        run.commitment = held
        self._resettle(run.gpus)
        return changed

    def _resettle(self, gpus: list[int]) -> None:
        """When memory on these GPUs last grew beyond what was committed: the latest of their
        residents' (``inf`` while one of unknown memory has not allocated)."""
        for i in gpus:
            self.settling_at[i] = max((self.running[o].ramp.grew_at for o in self.residents[i]),
                                      default=-math.inf)

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

    def _warm(self, job_id: str, attempt: int, now: float) -> None:
        """Start-up is over and the first steps begin: still no SM activity to speak of, but the
        GPU's power rises to the warm-up level (``InterferenceModel.warmup_busy``)."""
        run = self.running.get(job_id)
        if run is None or run.job.attempts != attempt or not run.starting:
            return
        self._advance(run.gpus, now)
        run.warming = True
        self._realize(run.gpus)

    def _learn(self, job_id: str, version: int, now: float) -> bool:
        """The job has run alone for ``learn_s``: from now on policies see its real profile."""
        run = self.running.get(job_id)
        if run is None or run.version != version or run.learned:
            return False
        run.learned = True
        told, real = run.job.profile, run.profile
        for i in run.gpus:
            self.sm_sum[i] += real.sm_activity - told.sm_activity
            self.dram_sum[i] += real.dram_activity - told.dram_activity
        run.job = run.job.evolve(profile=real)
        if len(run.gpus) > 1:
            self._gang_table = None
        return True

    def _plan_inference(self, gpus: list[int]) -> None:
        """Residents changed: where some are unmeasured, price them by their GPU's reading once
        the newest has been seen for INFER_AFTER_S and learn_s more (the daemon's samples)."""
        if self.cfg.profiles != "unknown" or self.cfg.sharing is SharingMode.MIG:
            return
        for i in gpus:
            self.gpu_epoch[i] += 1
            here = [self.running[o] for o in self.residents[i]]
            if any(r.job.profile_source == "assumed" and not r.learned for r in here):
                at = max(r.seen_at for r in here) + INFER_AFTER_S + self.cfg.learn_s
                self._push(at, _INFER, str(i), self.gpu_epoch[i])

    def _infer(self, i: int, epoch: int, now: float) -> bool:
        """Price GPU ``i``'s unmeasured residents by what it reads now (``infer_assumed``)."""
        if self.gpu_epoch[i] != epoch:
            return False
        here = [self.running[o] for o in sorted(self.residents[i])]
        unmeasured = [r for r in here if r.job.profile_source == "assumed" and not r.learned]
        known = [r.job.profile for r in here if r not in unmeasured]
        params = self.cfg.interference.modes[self.cfg.sharing]
        guess = infer_assumed(known, len(unmeasured), float(self.sm_live[i]), float(self.dram_live[i]), params)
        if guess is None:
            return False
        for run in unmeasured:  # a job on several GPUs keeps the last GPU's answer
            told = run.job.profile
            for g in run.gpus:
                self.sm_sum[g] += guess.sm_activity - told.sm_activity
                self.dram_sum[g] += guess.dram_activity - told.dram_activity
            run.job = run.job.evolve(profile=guess)
            if len(run.gpus) > 1:
                self._gang_table = None
            run.inferred = True
        return True

    def _finish(self, job_id: str, version: int, now: float) -> bool:
        run = self.running.get(job_id)
        if run is None or run.version != version:
            return False
        self._stop(run, now)
        command = self._by_id[job_id].workload.command
        if run.learned and command is not None:  # the daemon's history, for the same command
            self.profiles.record(command, self._by_id[job_id].workload.program, run.profile)
        job = self.scheduler.job_exited(job_id, ExitReport(Outcome.SUCCEEDED), now)
        self._close(job, now)
        return True

    # -- state changes ----------------------------------------------------------------------
    def _stop(self, run: SimRun, now: float) -> None:
        gpus = run.gpus
        self._advance(gpus, now)
        job = run.job
        for i in gpus:
            self.committed[i] -= run.commitment
            self.n_jobs[i] -= 1
            self.sm_sum[i] -= job.profile.sm_activity
            self.dram_sum[i] -= job.profile.dram_activity
            if run.allocated:
                self.used[i] -= run.peak_mib
            self.residents[i].pop(job.id, None)
            if not self.residents[i]:  # clear float drift; an empty GPU has nothing in flight
                self.committed[i] = self.used[i] = self.sm_sum[i] = self.dram_sum[i] = 0.0
                self.seen_at[i] = -math.inf
        del self.running[job.id]
        if self.gang_ids.pop(job.id, 0) is None:
            self._gang_table = None
        self._resettle(gpus)
        self._plan_inference(gpus)
        self._rerate(gpus, now)

    def _rerate(self, gpus: list[int], now: float) -> None:
        """Recompute the progress rate of every job sharing any of these GPUs."""
        affected = {job_id: None for i in gpus for job_id in self.residents[i]}  # ordered, no repeats
        model, mode, error = self.cfg.interference, self.cfg.sharing, self.model_error
        instance = self.devices.fraction  # MIG: jobs are slowed relative to their instance
        learning = self.cfg.profiles in ("learned", "similar", "unknown") and self.devices.learns_alone
        # A multi-GPU job's new rate changes what its other GPUs draw: meter them up to now first.
        beyond = [i for j in affected for i in self.running[j].gpus if i not in gpus]
        self._advance(beyond, now)
        for job_id in affected:
            run = self.running[job_id]
            run.work_left -= (now - run.since) * run.rate
            if run.alone:
                run.alone_s += now - run.since
            run.since = now
            slowdown, crowded = 1.0, False
            for i in run.gpus if not run.starting else ():  # inline: the simulator's hot path
                others = [r.profile for o in self.residents[i]
                          if o != job_id and not (r := self.running[o]).starting]
                crowded = crowded or bool(others)
                if instance is None:
                    here = model.slowdown(mode, run.profile, others)
                else:
                    here = model.instance_slowdown(run.profile, others, instance[i])
                if error is not None and others:
                    co_runners = [o for o in self.residents[i] if o != job_id and not self.running[o].starting]
                    here = max(1.0, here * error.factor(job_id, co_runners))
                slowdown = max(slowdown, here)
            run.rate = 1.0 / slowdown
            run.version += 1
            self._push(now + max(run.work_left, 0.0) / run.rate, _FINISH, job_id, run.version)
            if learning and not run.learned:
                run.alone = not (run.starting or crowded)
                if run.alone:
                    self._push(now + max(0.0, self.cfg.learn_s - run.alone_s), _LEARN, job_id,
                               run.version)
        self._realize(gpus)
        self._realize(beyond)
        self._mark(gpus, now)

    def _realize(self, gpus) -> None:
        """Recompute the realized activity of these GPUs from their residents' rates (summed
        afresh, not updated by differences: drift would move decisions at policy thresholds)."""
        warm_busy = self.cfg.interference.warmup_busy
        for i in gpus:
            sm = dram = floor = 0.0
            for job_id in self.residents[i]:
                run = self.running[job_id]
                if run.starting:
                    floor = warm_busy if run.warming else floor
                    continue
                sm += run.profile.sm_activity * run.rate
                dram += run.profile.dram_activity * run.rate
            self.sm_live[i], self.dram_live[i], self.power_floor[i] = sm, dram, floor

    def _mark(self, gpus: list[int], now: float) -> None:
        for i in gpus:  # memory and activity relative to each device (a MIG instance's own SMs)
            key = str(self.ids[i])
            if key in self.timelines:
                busy = min(1.0, self.sm_live[i] / self.speed[i])
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

    def _snapshot(self, now: float) -> ClusterSnapshot:
        # A monitor reads a MIG device's activity relative to the instance's own SMs.
        relative = self.devices.fraction is not None
        busy = np.minimum(1.0, self.sm_live / self.speed if relative else self.sm_live)
        return ClusterSnapshot(
            now=now,
            ids=self.ids,
            node=self.node,
            total_mib=self.total,
            free_mib=self.total - self.used,
            committed_mib=_frozen(self.committed),
            n_jobs=_frozen(self.n_jobs),
            sm_sum=_frozen(self.sm_sum),
            dram_sum=_frozen(self.dram_sum),
            # The monitor's 30 s window has settled on the current level by the time the
            # in-flight guard (30 s) releases a GPU, so the current level stands in for it.
            util_sm=busy,
            util_occ=busy * OCCUPANCY_PER_SM,
            util_dram=np.minimum(1.0, self.dram_live / self.speed if relative else self.dram_live),
            launch_seen_at=_frozen(self.seen_at),
            speed=self.speed,
            mem_settling_at=_frozen(self.settling_at),
            gang_node=self.gang_node,
            has_mig_instances=relative,
            sharing=self.cfg.sharing,
            gangs=self._gangs(),
        )

    def _gangs(self) -> Gangs | None:
        """The running multi-GPU jobs as policies see them, rebuilt only when one starts, ends
        or is told a new profile (``gang_ids`` then drops the cached table)."""
        if self._gang_table is None and self.gang_ids:
            self._gang_table = Gangs.of([(self.running[j].gpus, self.running[j].job.profile) for j in self.gang_ids],
                                        len(self.ids))
        return self._gang_table

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
        )


def _frozen(array: np.ndarray) -> np.ndarray:
    """A read-only view: the policy cannot change the simulator's state, and nothing is copied."""
    view = array.view()
    view.flags.writeable = False
    return view


# SM occupancy is not in the catalogue; assume resident warps fill ~60% of the SM's slots when it
# is active (typical of training kernels), awaiting measurement.
OCCUPANCY_PER_SM = 0.6
