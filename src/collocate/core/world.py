"""The one model of what is on each GPU, for the daemon and the simulator alike.

A policy sees the cluster as a ``ClusterSnapshot``; this is where that snapshot comes from. The
daemon's GPU watch feeds it what NVML (or the emulated GPUs) read, the simulator feeds it what its
meters read, and both get the same answers because every rule of observation lives here:

* **Residents and their phases.** A placed job is ``STARTING`` until its processes hold memory on
  its GPUs (interpreter start, ``import torch``, model construction: 4-10 s of no GPU use on an
  H100, gpu-facts.md), then ``WARMING`` (CUDA context, first steps: little SM activity) until
  its GPU's reading steps up by ``ONSET_STEP`` over what it read when the job appeared (the
  earliest-seen warming job on that GPU takes the step, with those seen within
  ``ONSET_TOGETHER_S`` of it while the step holds ``ONSET_STEP`` for each), or, on a GPU too
  busy to show such a step, once its memory has held still ``WARM_QUIET_S``, as soon as it
  reports its step counter moving (``log_metric(..., step=)``: it trains, whatever the reading
  shows), and at the latest after ``WARMUP_MAX_S``; then ``ACTIVE``. Policies see how many jobs of each GPU have not started in earnest
  (``n_starting``): start-ups overlap other jobs' training for free. A job still ``STARTING``
  after ``STARTUP_MAX_S`` (one that never holds GPU memory, such as ``sleep``, or a long CPU
  prelude) stops counting there, until it does hold memory.
* **Memory.** Each resident's ``collocate.core.commitment.MemoryRamp`` says what it commits against
  its GPUs; memory held by processes that are no resident's (``other_mib``) is charged too.
* **Activity, observed.** Each resident carries a ``collocate.core.belief.Belief``; each device keeps
  what is known of its residents together (``belief.Joint``: the covariance remembers that two
  jobs read together were learned as a sum). A GPU's readings
  are cut into *segments*, stretches in which its set of active residents stays the same and
  none is warming; once a segment has ``MIN_SEGMENT_SAMPLES`` readings, its short moving average
  (over about ``AVERAGE_SAMPLES``) revises the beliefs of every resident in it (``Joint.revised``),
  and when the segment ends (a resident leaves, joins or becomes active) what it taught is kept.
  Jobs learn while they share a GPU, and a departure re-solves the rest at once.
* **Progress, where a job reports it.** A job that logs a step counter (``log_metric(..., step=)``)
  shows its step rate over the last ``PROGRESS_WINDOW_S``; its fastest such rate while active is
  what it can do (sharing only slows a job), and that over its rate now is its *measured*
  slowdown. Policies see each GPU's largest (``slowed``): the model's predictions are checked
  against it, so a mix the model thinks harmless stops growing once its jobs are seen to slow.
* **Jobs the scheduler froze** (``n_frozen``): they draw nothing, so their GPUs read as if their
  room were free; each GPU counts them (``suspension.holds_room``), and a job thawed a few
  samples more, until the readings can show it.
* **When to look again** (``next_change_at``): when a commitment, a phase or a belief will change
  with no new reading, so the simulator wakes only then.

Readings are levels: ``set_reading(i, now, sm, dram)`` says device ``i`` reads this from ``now``
on. The daemon passes each sample as it comes, every ``period_s`` (a sample still mixes in the
level before a change for that long); the simulator passes each change of its GPUs' realized
activity, exactly, and models the daemon's sampling period for the rest. The world does no I/O
and reads no clock. What it keeps per device is one table (``collocate.core.device_table``); callers
read it through the methods below, never the table.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from collocate.core.belief import HISTORY_SD_FLOOR, SD_FLOOR, UNKNOWN, Belief, exact, realized
from collocate.core.commitment import MemoryRamp, committed_mib
from collocate.core.device_table import Device, DeviceTable, Segment
from collocate.core.interference import ModeParams, device_slowdown, on_device
from collocate.core.model import (
    ClusterSnapshot,
    Gangs,
    Job,
    JobProfile,
    SharingMode,
    Utilization,
    gang_nodes,
)
from collocate.core.policies.risk import summarize_window
from collocate.core.suspension import Neighbour, holds_room

#: A warming job's GPU must read this much more SM activity than when the job appeared for the
#: job to count as active (a job whose steady activity is below it becomes active at
#: ``WARMUP_MAX_S``).
ONSET_STEP = 0.05
#: Warming jobs seen within this long of each other may take one step of the reading together.
ONSET_TOGETHER_S = 2.0
#: On a GPU whose reading could not show a warming job's steps, its memory holding still this
#: long (a few samples: its first step has allocated its activations) marks it active.
WARM_QUIET_S = 2.0
#: The longest a job may hold memory without its activity showing before it counts as active:
#: an H100's cold first steps ran at almost no SM activity for up to 20 s (docs/gpu-validation.md).
WARMUP_MAX_S = 20.0
#: The longest a job may hold no GPU memory and still count as starting (``n_starting``): real
#: start-ups (interpreter, ``import torch``, model construction) took 4-10 s on an H100
#: (gpu-facts.md), so a job past several times that is not starting but doing something else
#: (a CPU step, ``sleep``) that uses no GPU. Counted for its whole life, it held a GPU's start-up
#: slot (``auto``'s ``startup_slots``) and kept every unpriced job from starting there.
STARTUP_MAX_S = 60.0
#: Readings a segment needs before they revise beliefs: a few samples.
MIN_SEGMENT_SAMPLES = 3
#: Time constant of a segment's moving average, in samples: recent readings count most, so a job
#: whose first steps were slow is priced by its steady steps within seconds.
AVERAGE_SAMPLES = 5
#: A reported step rate is read over this much of a job's latest reports, and needs
#: ``PROGRESS_MIN_REPORTS`` of them (a job logging every few steps shows a rate within seconds).
PROGRESS_WINDOW_S = 5.0
PROGRESS_MIN_REPORTS = 3


class Phase(IntEnum):
    STARTING = 0  # placed; its processes hold no memory on its GPUs yet
    WARMING = 1  # holds memory; its steady activity has not shown yet
    ACTIVE = 2


@dataclass(slots=True)
class Resident:
    """A running job as the world follows it."""

    job: Job
    devices: tuple[int, ...]
    seq: int  # placement order: the newest job on a GPU has the largest
    ramp: MemoryRamp
    belief: Belief  # what every ended segment taught
    pricing: Belief  # what policies price it with now: ``belief`` and its open segments
    placed_at: float
    room_mib: float | None = None  # the room its GPUs had for it when placed
    phase: Phase = Phase.STARTING
    seen_at: float = math.inf  # when it first held memory on its GPUs
    commitment: float = 0.0  # what it holds against each of its devices (the last charge)
    memory_due: float = math.inf  # the wake-up asked for its commitment's next change
    steps: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=256))  # reported (time, step)
    best_rate: float = 0.0  # its fastest reported step rate while active: what it can do
    slowdown: float = 0.0  # measured: ``best_rate`` over its rate now (0: not measured)
    frozen: bool = False  # suspended (``collocate.core.suspension``): holds its memory, draws nothing
    holds_room: bool = False  # counts in its devices' ``n_frozen`` (see ``World.freeze``)
    thawed_until: float = -math.inf  # thawed: it counts there until its readings can show it
    starting: bool = True  # counts in its devices' ``n_starting`` (not active, start-up not lapsed)

    @property
    def profile(self) -> JobProfile:
        return self.pricing.profile


def belief_of(job: Job) -> Belief:
    """What a job was told of its profile when placed, as a belief (``Job.profile_var``, else
    the spread that goes with its source)."""
    if job.profile_var is not None:
        return Belief(job.profile, job.profile_var[0], job.profile_var[1], job.profile_source)
    source = job.profile_source
    if source == "trace":
        return exact(job.profile)
    if source == "assumed":
        return Belief(job.profile, UNKNOWN.sm_var, UNKNOWN.dram_var, source)
    if source == "similar":
        return Belief(job.profile, UNKNOWN.sm_var / 2, UNKNOWN.dram_var / 2, source)
    floor = HISTORY_SD_FLOOR if source == "history" else SD_FLOOR
    return Belief(job.profile, floor ** 2, floor ** 2, source)


class World:
    """Residents, readings and beliefs of a set of devices; see the module docstring."""

    def __init__(
        self,
        devices: Sequence[Device],
        *,
        sharing: SharingMode,
        params: ModeParams | None,
        learn: bool = True,
        period_s: float = 1.0,
        window: int | None = None,
    ) -> None:
        """``params``: the interference model of ``sharing`` (beliefs are revised by it; None
        learns nothing). ``learn=False`` keeps every belief as placed (a simulation that tells
        policies the trace, or nothing ever). ``period_s``: how often readings are sampled (the
        daemon's ``--period``; a sample mixes in the level before a change for that long). ``window``: the risk filter's samples per device
        (the daemon's CARMA window); None reads the current level (the simulator: a window has
        settled on the level by the time a guard lets a GPU take another job)."""
        self.sharing = sharing
        self.mps = sharing is SharingMode.MPS  # a GPU serves one user's jobs (``owner``)
        self.params = params
        self.learn = learn and params is not None
        self.period = period_s
        self.min_segment_s = MIN_SEGMENT_SAMPLES * period_s
        self.average_s = AVERAGE_SAMPLES * period_s
        self.window = window
        self.devices = tuple(devices)
        self.table = DeviceTable.of(self.devices)  # every per-device fact, one column each
        self.residents: dict[str, Resident] = {}
        self._seq = 0
        self._gangs: dict[str, None] = {}
        self._gang_table: Gangs | None = None
        self._datasets: dict[str, dict[int, int]] = {}
        self._due: list[tuple[float, int, str, int]] = []  # (when, kind, key, epoch) wake-ups
        self._lay_out()

    def add_devices(self, devices: Sequence[Device]) -> None:
        """Devices that joined (a node of a cluster, or GPUs a node now shows), appended after
        the others: every resident keeps its positions, the new devices start empty."""
        new = tuple(d for d in devices if d.id not in self.index)
        if new:
            self.devices = self.devices + new
            self.table.extend(new)
            self._lay_out()

    def _lay_out(self) -> None:
        """What follows from the devices' ids: positions, nodes, multi-GPU groups, MIG."""
        self.ids = tuple(d.id for d in self.devices)
        self.index = {g: i for i, g in enumerate(self.ids)}
        nodes: dict[str, int] = {}
        self.node = np.array([nodes.setdefault(g.node, len(nodes)) for g in self.ids], dtype=np.int64)
        self.gang_node = gang_nodes(self.ids, self.node)
        self.has_mig = any(g.mig is not None for g in self.ids)
        self._ids_view = tuple(st.residents for st in self.table.state)
        self._gang_table = None

    # -- residents ------------------------------------------------------------------------------
    def place(self, job: Job, devices: Sequence[int], now: float, *, room_mib: float | None = None) -> Resident:
        """A job was placed on these devices (positions)."""
        t = self.table
        self._seq += 1
        belief = belief_of(job)
        total = float(t.total[devices[0]] - t.other[devices[0]])
        r = Resident(job, tuple(devices), self._seq,
                     MemoryRamp.of(job.mem_mib, job.mem_source, whole=job.alone),
                     belief, belief, now, room_mib)
        r.commitment = total if job.alone else float(committed_mib(job.mem_mib, total))
        self.residents[job.id] = r
        for i in r.devices:
            st = t.state[i]
            st.residents[job.id] = None
            if self.learn:
                st.joint.add(job.id, belief)
            t.committed[i] += r.commitment
            t.n_jobs[i] += 1
            t.n_starting[i] += 1
            t.sm_sum[i] += belief.profile.sm_activity
            t.dram_sum[i] += belief.profile.dram_activity
            t.seen_at[i] = math.inf
            if self.mps and job.user:
                t.owner[i] = job.user
            if job.dataset:
                counts = self._datasets.setdefault(job.dataset, {})
                counts[i] = counts.get(i, 0) + 1
        if len(r.devices) > 1:
            self._gangs[job.id] = None
            if self._gang_table is not None:  # kept up to date: rebuilt, it costs a pass over every gang
                self._gang_table = self._gang_table.plus(r.devices, r.profile)
        self._due_at(now + STARTUP_MAX_S, _STARTUP, job.id, r.seq)
        return r

    def remove(self, job_id: str, now: float) -> Resident:
        """A job ended: what it taught is kept in the returned resident's ``belief``."""
        t = self.table
        r = self.residents[job_id]
        for i in r.devices:
            self._integrate(i, now)
            self._close_segment(i)
        r.belief = r.pricing  # what its GPUs taught last (one device's view, for a gang)
        del self.residents[job_id]
        for i in r.devices:
            st = t.state[i]
            del st.residents[job_id]
            if job_id in st.joint:
                st.joint.drop(job_id)
            t.committed[i] -= r.commitment
            t.n_jobs[i] -= 1
            t.n_starting[i] -= r.starting
            t.n_frozen[i] -= r.holds_room
            t.sm_sum[i] -= r.pricing.profile.sm_activity
            t.dram_sum[i] -= r.pricing.profile.dram_activity
            t.sm_known[i] -= _known(r)
            if r.slowdown:
                self._refresh_slowed(i)
            if not st.residents:  # clear float drift; an empty GPU has nothing in flight
                t.committed[i] = t.sm_sum[i] = t.dram_sum[i] = t.sm_known[i] = 0.0
                t.seen_at[i] = -math.inf
                t.owner[i] = ""
                self._refresh_util(i)
            else:
                newest = self.residents[next(reversed(st.residents))]
                t.seen_at[i] = newest.seen_at
                st.baseline = min(st.baseline, st.sm)
            if r.job.dataset:
                counts = self._datasets[r.job.dataset]
                counts[i] -= 1
                if not counts[i]:
                    del counts[i]
            self._open_segment(i, now)
        if job_id in self._gangs:
            if self._gang_table is not None:
                self._gang_table = self._gang_table.without(list(self._gangs).index(job_id))
            del self._gangs[job_id]
        return r

    def freeze(self, job_id: str, now: float, frozen: bool, by: str = "trial") -> None:
        """A resident was frozen (or thawed): while frozen it draws nothing on its GPUs but keeps
        its memory, so their readings teach nothing of it (its segments leave it out) and its
        step rate is read afresh once it runs again. ``by``: who froze it (``Job.suspended``);
        frozen by the scheduler it counts in its devices' ``n_frozen`` (``suspension.holds_room``),
        also when a job already frozen changes hands (its owner suspends it), and once thawed it
        still counts for a sample and the few a segment needs: until then its GPUs read as if it
        were frozen (in the simulator, unpriced jobs started beside jobs thawed that instant)."""
        r = self.residents.get(job_id)
        if r is None:
            return
        if frozen:
            self._hold_room(r, holds_room(by))
        elif r.frozen and r.holds_room:
            r.thawed_until = now + self.period + self.min_segment_s
            self._due_at(r.thawed_until, _THAWED, job_id, r.seq)
        if r.frozen == frozen:
            return
        known = _known(r)
        r.frozen = frozen
        self._add_known(r, _known(r) - known)
        r.steps.clear()
        r.slowdown = 0.0
        for i in r.devices:
            self._integrate(i, now)
            self._close_segment(i)
            self._refresh_slowed(i)
            self._open_segment(i, now)

    def _hold_room(self, r: Resident, holds: bool) -> None:
        if holds != r.holds_room:
            for i in r.devices:
                self.table.n_frozen[i] += 1 if holds else -1
            r.holds_room = holds

    def neighbourhood(self, job_id: str) -> list[Neighbour]:
        """Every resident of ``job_id``'s devices, itself included, with its slowdown as
        observed (``collocate.core.suspension``): measured from the steps it reports, else what the
        interference model gives for the activity the readings taught of it and its running
        neighbours (0 while any of them is priced only by a prior)."""
        r = self.residents.get(job_id)
        if r is None:
            return []
        seen: dict[str, None] = {}
        for i in r.devices:
            seen.update(self.table.state[i].residents)
        return [self._observed(self.residents[j]) for j in seen]

    def _observed(self, r: Resident) -> Neighbour:
        active = r.phase is Phase.ACTIVE and not r.frozen
        if r.slowdown or not active or self.params is None:
            return Neighbour(r.job.id, r.devices, r.seq, active, r.slowdown if active else 0.0, bool(r.slowdown))
        worst = 0.0
        for i in r.devices:
            others = [self.residents[j] for j in self.table.state[i].residents if j != r.job.id]
            others = [o for o in others if o.phase is Phase.ACTIVE and not o.frozen]
            if any(o.pricing.source in _PRIORS for o in (r, *others)):
                return Neighbour(r.job.id, r.devices, r.seq, active, 0.0)
            worst = max(worst, device_slowdown(self.params, r.pricing.profile,
                                               [o.pricing.profile for o in others], float(self.table.speed[i])))
        return Neighbour(r.job.id, r.devices, r.seq, active, worst)

    # -- readings ------------------------------------------------------------------------------
    def observe_progress(self, job_id: str, now: float, step: float) -> None:
        """A resident reported reaching ``step`` at ``now`` (its own counter, e.g. the step of a
        ``log_metric``). Reports before it is active are not its pace, but a warming job whose
        counter moves is training: it is active at once (``_step_onset``)."""
        r = self.residents.get(job_id)
        if r is None or r.frozen:
            return
        if r.phase is Phase.WARMING:
            self._step_onset(r, now, step)
            return
        if r.phase is not Phase.ACTIVE:
            return
        if r.steps and (step < r.steps[-1][1] or now <= r.steps[-1][0]):
            if step < r.steps[-1][1]:  # its counter went back (a restarted loop): start over
                r.steps.clear()
            else:
                return
        r.steps.append((now, step))
        while r.steps[0][0] < now - PROGRESS_WINDOW_S:
            r.steps.popleft()
        if len(r.steps) < PROGRESS_MIN_REPORTS:
            return
        points = list(r.steps)
        rates = sorted((s1 - s0) / (t1 - t0) for (t0, s0), (t1, s1) in itertools.pairwise(points))
        if rates[0] <= 0.0:  # it paused in the window (an evaluation, a checkpoint): not its pace
            return
        rate = rates[len(rates) // 2]  # the median: one long gap between reports is no slowdown
        r.best_rate = max(r.best_rate, rate)
        slowdown = r.best_rate / rate
        if slowdown != r.slowdown:
            r.slowdown = slowdown
            for i in r.devices:
                self._refresh_slowed(i)

    def observe_memory(self, job_id: str, held_mib: float, now: float) -> None:
        """The memory a resident's processes hold on its most loaded device."""
        r = self.residents.get(job_id)
        if r is None:
            return
        if held_mib <= 0.0:
            if r.phase is Phase.ACTIVE:  # its processes let go (ending), or a reading missed them
                self._pause(r, now, True)
            return
        if r.phase is Phase.ACTIVE:
            self._pause(r, now, False)
        grew = held_mib > r.ramp.peak_mib
        r.ramp.observe(held_mib, now)
        if grew and r.phase is Phase.WARMING:  # look again once its memory holds still
            self._due_at(r.ramp.peaked_at + WARM_QUIET_S, _WARMUP, job_id, r.seq)
        if r.phase is Phase.STARTING:
            r.phase = Phase.WARMING
            r.seen_at = now
            for i in r.devices:
                self.table.n_starting[i] += not r.starting  # its start-up had lapsed: warming now
                st = self.table.state[i]
                if next(reversed(st.residents)) == job_id:
                    self.table.seen_at[i] = now
                st.baseline = st.sm
                self._close_segment(i)
                self._open_segment(i, now)
            r.starting = True
            self._due_at(now + WARMUP_MAX_S, _WARMUP, job_id, r.seq)
            self._due_at(now + WARM_QUIET_S, _WARMUP, job_id, r.seq)
        self._recommit(r, now)

    def set_reading(self, i: int, now: float, sm: float, dram: float | None = None,
                    occupancy: float | None = None, *, free_mib: float | None = None,
                    other_mib: float = 0.0) -> None:
        """Device ``i`` reads these levels from ``now`` on (SM and DRAM activity, occupancy as
        fractions; None: not reported), has ``free_mib`` free and ``other_mib`` held by
        processes that are no resident's. SM and DRAM activity come in whole-GPU units from
        every feeder (on a MIG instance, its share of its GPU's work), occupancy relative to
        the device."""
        t = self.table
        self._integrate(i, now)
        st = t.state[i]
        st.sm, st.dram, st.occupancy, st.level_at = sm, dram, occupancy, now
        t.load_sm[i] = self._average_sm(i, now)
        t.level_sm[i], t.load_at[i] = min(1.0, on_device(sm, t.speed[i])), now
        if free_mib is not None:
            t.free[i] = free_mib
        if other_mib != t.other[i]:
            t.other[i] = other_mib
            for j in st.residents:  # a job of unknown memory commits what others leave
                self._recommit(self.residents[j], now)
        if self.window:  # the risk filter's window reads the device relative to its own SMs
            if st.window is None:
                st.window = (deque(maxlen=self.window), deque(maxlen=self.window), deque(maxlen=self.window))
            busy = float(t.level_sm[i])
            st.window[0].append(busy)
            st.window[1].append(busy * OCCUPANCY_PER_SM if occupancy is None else occupancy)
            st.window[2].append(min(1.0, on_device(dram or 0.0, t.speed[i])))
        if st.segment is not None and dram is None:
            st.segment.has_dram = False
        self._refresh_util(i)
        self._onset(i, now)
        if st.segment is not None and st.segment.revised is not None:
            self._teach(i)

    def set_free(self, i: int, free_mib: float) -> None:
        """Device ``i``'s measured free memory."""
        self.table.free[i] = free_mib

    def tick(self, now: float) -> bool:
        """Apply what is due by ``now`` (quiet memory, lapsed warm-ups, segments with enough
        readings); whether anything policies see changed."""
        changed = False
        while self._due and self._due[0][0] <= now:
            _, kind, key, epoch = heapq.heappop(self._due)
            if kind == _MEMORY:
                r = self.residents.get(key)
                if r is not None and r.seq == epoch:
                    changed |= self._recommit(r, now)
            elif kind == _STARTUP:
                r = self.residents.get(key)
                if r is not None and r.seq == epoch and r.phase is Phase.STARTING and r.starting:
                    r.starting = False  # not starting but using no GPU: its slot is free
                    for i in r.devices:
                        self.table.n_starting[i] -= 1
                    changed = True
            elif kind == _THAWED:
                r = self.residents.get(key)
                if r is not None and r.seq == epoch and r.holds_room and not r.frozen and now >= r.thawed_until:
                    self._hold_room(r, False)
                    changed = True
            elif kind == _WARMUP:
                r = self.residents.get(key)
                if r is not None and r.seq == epoch and r.phase is Phase.WARMING and (
                        now >= r.seen_at + WARMUP_MAX_S or self._plateaued_unseen(r, now)):
                    self._activate(r, now)
                    changed = True
            else:
                i = int(key)
                st = self.table.state[i]
                if st.epoch == epoch and st.segment is not None:
                    self._integrate(i, now)
                    changed |= self._teach(i)
        return changed

    def next_change_at(self) -> float:
        """When ``tick`` next has something to do (``inf``: nothing pending)."""
        while self._due:
            when, kind, key, epoch = self._due[0]
            if kind == _SEGMENT:
                st = self.table.state[int(key)]
                live = st.epoch == epoch and st.segment is not None and st.segment.revised is None
            else:
                r = self.residents.get(key)
                live = r is not None and r.seq == epoch and (
                    r.holds_room and not r.frozen and when >= r.thawed_until if kind == _THAWED
                    else r.phase is Phase.WARMING if kind == _WARMUP
                    else r.phase is Phase.STARTING and r.starting if kind == _STARTUP
                    else r.ramp.changes_at() <= when)
            if live:
                return when
            heapq.heappop(self._due)
        return math.inf

    # -- what policies see -------------------------------------------------------------------
    def snapshot(self, now: float, idle: Collection[str] = ()) -> ClusterSnapshot:
        """What policies see at ``now``; with ``idle``, as if those residents drew nothing
        (``idle_view``: how priority preemption asks whether freezing them makes room)."""
        if idle:
            return self.idle_view(self.snapshot(now), idle)
        t = self.table
        return ClusterSnapshot(
            now=now, ids=self.ids, node=self.node, total_mib=t.total,
            free_mib=_frozen(t.free), committed_mib=_frozen(t.committed),
            n_jobs=_frozen(t.n_jobs), sm_sum=_frozen(t.sm_sum), dram_sum=_frozen(t.dram_sum),
            util_sm=_frozen(t.util_sm), util_occ=_frozen(t.util_occ),
            util_dram=_frozen(t.util_dram), launch_seen_at=_frozen(t.seen_at), speed=t.speed,
            gang_node=self.gang_node, n_starting=_frozen(t.n_starting),
            other_mib=_frozen(t.other), has_mig_instances=self.has_mig, sharing=self.sharing,
            datasets={name: tuple(sorted(c)) for name, c in self._datasets.items() if c},
            gangs=self._gang_view(), owner=tuple(t.owner) if self.mps else (), residents=self._ids_view,
            slowed=_frozen(t.slowed) if t.slowed.any() else None,
            n_frozen=_frozen(t.n_frozen) if t.n_frozen.any() else None,
            sm_recent=self._recent_sm_all(now),
            sm_known=_frozen(t.sm_known) if t.sm_known.any() else None,
        )

    def _recent_sm_all(self, now: float) -> np.ndarray:
        """``recent_sm`` of every device at ``now``. Only a device whose average is above its
        level (its reading dropped lately) can read more than its level: elsewhere the formula
        gives the level itself, bit for bit, so the exponential (a round's cost at 1,000 GPUs)
        runs on those alone, element by element as over all."""
        t = self.table
        recent = t.level_sm.copy()
        up = np.flatnonzero(t.load_sm > t.level_sm)
        if up.size:
            level = recent[up]
            recent[up] = np.maximum(level, level + (t.load_sm[up] - level)
                                    * np.exp(-(now - t.load_at[up]) / self.average_s))
        return recent

    def idle_view(self, snapshot: ClusterSnapshot, idle: Collection[str]) -> ClusterSnapshot:
        """``snapshot`` as if the residents ``idle`` were frozen: they stop competing for their
        GPUs' compute but keep their memory (a frozen process keeps its CUDA memory). So they
        leave their GPUs' job counts (and start-up counts), activity sums and multi-GPU table,
        each GPU's readings shrink in proportion to the priced activity that stays (a reading
        mixes its jobs), and the slowdowns measured there are dropped (measured beside them);
        memory, committed memory and the MPS owner stay as they are."""
        t = self.table
        gone = [r for j in idle if (r := self.residents.get(j)) is not None and not r.frozen]
        if not gone:
            return snapshot
        cols = {name: getattr(snapshot, name).copy() for name in (
            "n_jobs", "n_starting", "sm_sum", "dram_sum", "util_sm", "util_occ", "util_dram")}
        slowed = None if snapshot.slowed is None else snapshot.slowed.copy()
        known = None if snapshot.sm_known is None else snapshot.sm_known.copy()
        touched: set[int] = set()
        for r in gone:
            for i in r.devices:
                cols["n_jobs"][i] -= 1
                cols["n_starting"][i] -= r.starting
                cols["sm_sum"][i] -= r.profile.sm_activity
                cols["dram_sum"][i] -= r.profile.dram_activity
                if known is not None:
                    known[i] = max(0.0, known[i] - _known(r))
                touched.add(i)
        for i in touched:
            for reading, before, after in (("util_sm", t.sm_sum[i], cols["sm_sum"][i]),
                                           ("util_occ", t.sm_sum[i], cols["sm_sum"][i]),
                                           ("util_dram", t.dram_sum[i], cols["dram_sum"][i])):
                share = max(0.0, after) / before if before > 0 else 1.0
                cols[reading][i] *= min(1.0, share)
            cols["sm_sum"][i], cols["dram_sum"][i] = max(0.0, cols["sm_sum"][i]), max(0.0, cols["dram_sum"][i])
            if slowed is not None:
                slowed[i] = 0.0
        left = [j for j in self._gangs if j not in idle]
        gangs = (snapshot.gangs if len(left) == len(self._gangs) else Gangs.of(
            [(self.residents[j].devices, self.residents[j].profile) for j in left], len(self.ids)) if left else None)
        return snapshot.evolve(**cols, gangs=gangs, slowed=slowed if slowed is not None and slowed.any() else None,
                               sm_known=known if known is not None and known.any() else None)

    # -- what the daemon and people see of a job or a device --------------------------------------
    def resident(self, job_id: str) -> Resident | None:
        """The running job ``job_id`` as the world follows it (None: not one of its residents)."""
        return self.residents.get(job_id)

    def neighbours(self, job_id: str) -> set[str]:
        """The jobs that share a device with resident ``job_id`` (none when it is not one): read
        off its devices, not by comparing it with every resident."""
        r = self.residents.get(job_id)
        if r is None:
            return set()
        return {o for i in r.devices for o in self.table.state[i].residents if o != job_id}

    def on(self, i: int) -> list[Resident]:
        """Device ``i``'s residents, oldest first."""
        return [self.residents[j] for j in self.table.state[i].residents]

    def util(self, i: int) -> Utilization:
        """Device ``i``'s readings as the risk filter summarizes them."""
        t = self.table
        return Utilization(float(t.util_sm[i]), float(t.util_occ[i]), float(t.util_dram[i]))

    def committed_mib(self, i: int) -> float:
        """What device ``i``'s residents commit of its memory (``collocate.core.commitment``)."""
        return float(self.table.committed[i])

    def other_mib(self, i: int) -> float:
        """Memory of processes on device ``i`` that are no resident's."""
        return float(self.table.other[i])

    def slowed(self, i: int) -> float:
        """The largest slowdown measured of device ``i``'s residents (0: none measured)."""
        return float(self.table.slowed[i])

    def n_frozen(self, i: int) -> int:
        """How many of device ``i``'s residents the scheduler froze and holds the room of."""
        return int(self.table.n_frozen[i])

    def recent_sm(self, i: int, now: float) -> float:
        """Device ``i``'s SM reading lately at ``now`` (relative to a MIG instance's SMs): its
        average over the last ``average_s`` (about ``AVERAGE_SAMPLES`` samples), without the
        risk window's lean to the peaks of the last half minute, or what it reads now if more
        (the average alone still counts the idle seconds before a heavy job began)."""
        return max(float(self.table.level_sm[i]), self._average_sm(i, now))

    def _average_sm(self, i: int, now: float) -> float:
        keep = math.exp(-(now - self.table.load_at[i]) / self.average_s) if math.isfinite(self.table.load_at[i]) else 0.0
        return float(self.table.level_sm[i] + (self.table.load_sm[i] - self.table.level_sm[i]) * keep)

    def _refresh_slowed(self, i: int) -> None:
        self.table.slowed[i] = max((self.residents[j].slowdown for j in self.table.state[i].residents), default=0.0)

    # -- internals -------------------------------------------------------------------------
    def _recommit(self, r: Resident, now: float) -> bool:
        held = r.ramp.committed(float(self.table.total[r.devices[0]] - self.table.other[r.devices[0]]), now)
        changes_at = r.ramp.changes_at()
        if changes_at > now and changes_at != r.memory_due:
            r.memory_due = changes_at
            self._due_at(changes_at, _MEMORY, r.job.id, r.seq)
        if held == r.commitment:
            return False
        for i in r.devices:
            self.table.committed[i] += held - r.commitment
        r.commitment = held
        return True

    def _onset(self, i: int, now: float) -> None:
        """A warming resident whose GPU's reading stepped up is active."""
        st = self.table.state[i]
        if st.sm < st.baseline:
            st.baseline = st.sm
        if st.sm < st.baseline + ONSET_STEP:
            return
        warming = sorted((self.residents[j] for j in st.residents if self.residents[j].phase is Phase.WARMING),
                         key=lambda r: (r.seen_at, r.seq))
        if warming:
            # the earliest-seen, and those seen with it as long as the step holds ONSET_STEP
            # each (jobs started together, e.g. a sweep's points, step up together)
            room = int((st.sm - st.baseline) / ONSET_STEP)
            for r in warming[:max(1, room)]:
                if r.seen_at - warming[0].seen_at > ONSET_TOGETHER_S:
                    break
                self._activate(r, now)
            st.baseline = st.sm

    def _step_onset(self, r: Resident, now: float, step: float) -> None:
        """A warming job that reports its step counter moving is training, whatever its GPU's
        reading shows: a saturated GPU or a neighbour warming beside it can hide its onset
        (``_onset``) for up to ``WARMUP_MAX_S``, and until then it holds its GPU's start-up slot
        (``n_starting``) and keeps the next job from starting there. Its first report is kept
        in ``steps`` only to see the counter move; its pace is measured from the next ones."""
        moved = bool(r.steps) and step > r.steps[-1][1] and now > r.steps[-1][0]
        r.steps.clear()
        if moved:  # at the latest reading of its GPUs if later: a report may trail the sample
            self._activate(r, max(now, *(self.table.state[i].level_at for i in r.devices)))
        r.steps.append((now, step))

    def _plateaued_unseen(self, r: Resident, now: float) -> bool:
        """Whether a warming job's memory has held still for ``WARM_QUIET_S`` on a GPU whose
        reading could not show its steps: with its prior activity beside the active jobs there,
        the GPU would read less than ``ONSET_STEP`` more (a saturated GPU, under MPS above all).
        Its memory reaching its plateau is then the sign its steps run."""
        if now - r.ramp.peaked_at < WARM_QUIET_S or self.params is None:
            return False
        for i in r.devices:
            active = [self.residents[j].profile for j in self.table.state[i].residents
                      if self.residents[j].phase is Phase.ACTIVE]
            before = realized(self.params, active, 0) if active else 0.0
            if realized(self.params, [*active, r.profile], 0) - before >= ONSET_STEP:
                return False
        return True

    def _pause(self, r: Resident, now: float, paused: bool) -> None:
        """While an active resident's processes hold no memory (it is ending, or a reading
        missed them) what its GPUs read is not its steady work: its segments stop learning."""
        for i in r.devices:
            seg = self.table.state[i].segment
            if seg is not None and seg.paused != paused and r.job.id in seg.members:
                self._integrate(i, now)
                seg.paused = paused

    def _activate(self, r: Resident, now: float) -> None:
        known = _known(r)
        r.phase = Phase.ACTIVE
        self._add_known(r, _known(r) - known)
        r.starting = False
        r.steps.clear()  # a report while warming is not its pace
        r.ramp.active_at = now
        self._recommit(r, now)
        for i in r.devices:
            self.table.n_starting[i] -= 1
            self._integrate(i, now)
            self._close_segment(i)
            self._open_segment(i, now)

    def _open_segment(self, i: int, now: float) -> None:
        """Start a segment if device ``i``'s readings can teach: learning on, a whole GPU, some
        active residents and none warming."""
        st = self.table.state[i]
        st.epoch += 1
        st.segment = None
        if not self.learn or self.table.speed[i] < 1.0 or not st.residents:
            return
        members = []
        for j in st.residents:
            r = self.residents[j]
            if r.frozen:  # draws nothing: not in what the readings show
                continue
            if r.phase is Phase.WARMING:
                return
            if r.phase is Phase.ACTIVE:
                members.append(j)
        if members:
            st.segment = Segment(tuple(members), now + self.period)
            self._due_at(now + self.period + self.min_segment_s, _SEGMENT, str(i), st.epoch)

    def _close_segment(self, i: int) -> None:
        """End device ``i``'s segment: what it taught becomes what is known of its residents."""
        st = self.table.state[i]
        seg = st.segment
        if seg is not None and seg.revised is None:
            self._teach(i)  # enough readings, but nobody asked for the prices yet
        st.segment = None
        st.epoch += 1
        if seg is None or seg.revised is None:
            return
        st.joint = st.joint.updated_by(seg.revised)
        for j in st.residents:
            r = self.residents[j]
            r.belief = st.joint.belief(j)
            self._price(r, r.belief)

    def _integrate(self, i: int, now: float) -> None:
        """Fold device ``i``'s level since it was set into its segment's moving averages."""
        st = self.table.state[i]
        seg = st.segment
        if seg is None:
            return
        dt = now - max(st.level_at, seg.start)
        if dt <= 0.0:
            return
        if seg.paused:
            st.level_at = now
            return
        if seg.seconds == 0.0:
            seg.sm, seg.dram = st.sm, st.dram or 0.0
        else:
            keep = math.exp(-dt / self.average_s)
            seg.sm = st.sm + (seg.sm - st.sm) * keep
            seg.dram = (st.dram or 0.0) + (seg.dram - (st.dram or 0.0)) * keep
        seg.seconds += dt
        st.level_at = now

    def _teach(self, i: int) -> bool:
        """Revise what is known of device ``i``'s residents by its segment's readings so far, once
        there are ``MIN_SEGMENT_SAMPLES`` of them; whether a price changed."""
        st = self.table.state[i]
        seg = st.segment
        if seg is None or seg.seconds < self.min_segment_s - 1e-9 or self.params is None:
            return False
        samples = min(seg.seconds, 2.0 * self.average_s) / self.period
        seg.revised = st.joint.revised(seg.members, self.params, seg.sm,
                                       seg.dram if seg.has_dram else None, samples)
        changed = False
        for j in seg.members:
            changed |= self._price(self.residents[j], seg.revised.belief(j))
        return changed

    def _price(self, r: Resident, belief: Belief) -> bool:
        old, known = r.pricing.profile, _known(r)
        r.pricing = belief
        self._add_known(r, _known(r) - known)
        new = belief.profile
        if new == old:
            return False
        for i in r.devices:
            self.table.sm_sum[i] += new.sm_activity - old.sm_activity
            self.table.dram_sum[i] += new.dram_activity - old.dram_activity
        if len(r.devices) > 1:
            self._gang_table = None
        return True

    def _add_known(self, r: Resident, change: float) -> None:
        if change:
            for i in r.devices:
                self.table.sm_known[i] += change

    def _refresh_util(self, i: int) -> None:
        """The risk filter's window summary; an empty GPU with nothing foreign on it is idle,
        whatever its window still holds of the job that left."""
        t = self.table
        st = t.state[i]
        if not st.residents and t.other[i] <= 0.0:
            t.util_sm[i] = t.util_occ[i] = t.util_dram[i] = 0.0
            return
        if st.window is not None:
            u = summarize_window(*st.window)
        else:
            speed = t.speed[i]  # a monitor reads a MIG device relative to its own SMs
            busy = min(1.0, on_device(st.sm, speed))
            occupancy = busy * OCCUPANCY_PER_SM if st.occupancy is None else st.occupancy
            u = Utilization(busy, occupancy, min(1.0, on_device(st.dram or 0.0, speed)))
        t.util_sm[i], t.util_occ[i], t.util_dram[i] = u.sm_activity, u.sm_occupancy, u.dram_activity

    def _due_at(self, when: float, kind: int, key: str, epoch: int) -> None:
        if math.isfinite(when):
            heapq.heappush(self._due, (when, kind, key, epoch))

    def _gang_view(self) -> Gangs | None:
        if not self._gangs:
            return None
        if self._gang_table is None:
            self._gang_table = Gangs.of([(r.devices, r.pricing.profile)
                                         for r in map(self.residents.__getitem__, self._gangs)], len(self.ids))
        return self._gang_table


_MEMORY, _WARMUP, _SEGMENT, _STARTUP, _THAWED = range(5)
_PRIORS = ("assumed", "similar")  # belief sources that are guesses, not observations


def _known(r: Resident) -> float:
    """What ``r`` adds to its devices' ``sm_known``: its solo SM activity if it is working there
    (active, not frozen) and that activity was observed (measured, inferred, its history, a
    trace), else 0. A prior is left out: it is the guess the unpriced-start gate looks past."""
    if r.phase is not Phase.ACTIVE or r.frozen or r.pricing.source in _PRIORS:
        return 0.0
    return r.pricing.profile.sm_activity

#: SM occupancy when a reading does not say (an A100's NVML, the emulated GPUs, the simulator):
#: resident warps fill ~60% of an active SM's slots (typical of training kernels).
OCCUPANCY_PER_SM = 0.6


def _frozen(array: np.ndarray) -> np.ndarray:
    """A read-only view: a policy cannot change the world, and nothing is copied."""
    view = array.view()
    view.flags.writeable = False
    return view


def observed_residents(world: World) -> Iterable[tuple[str, Belief]]:
    """Running jobs whose activity readings taught something, with what (for family priors)."""
    for job_id, r in world.residents.items():
        if r.pricing.source in ("measured", "inferred"):
            yield job_id, r.pricing

