"""Live GPU readings turned into what the scheduler core needs: a ``ClusterSnapshot``.

Each sampling period the watch reads the backend once, pushes SM activity, SM occupancy and
DRAM activity into per-GPU sliding windows (``WINDOW_SAMPLES`` long, as the risk filter
expects), and attributes per-process memory to jobs (a job's processes are its runner's process
tree). From that it builds ``GpuView``s: each job commits its memory by the one rule of
``collocate.commitment`` (its requirement at once, raised to what it holds once it outgrows it;
a job of unknown memory the whole GPU until its peak is stable), ``mem_settling_at`` is when
memory on the GPU last grew beyond that, and ``launch_seen_at`` when its newest job was first
seen holding memory there (``inf`` until then; CARMA's guard).

It also learns each job's solo activity profile (``collocate.activity``) from the GPU readings
taken while the job's processes are the only ones on its GPUs (an MPS server aside), and hands
it to the policies in place of the job's assumed or historical profile once it is trusted.
MIG instances are not learned on: their readings are relative to a slice, and a job saturating
a slice says little about what it would do on a whole GPU.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from collocate.activity import INFER_AFTER_S, MIN_SOLO_SAMPLES, SoloActivity, infer_assumed
from collocate.commitment import STABLE_S, MemoryRamp
from collocate.gpus.base import DeviceInfo, DeviceSample, GpuBackend
from collocate.gpus.mps import is_mps_server
from collocate.interference import ModeParams
from collocate.model import (
    ClusterSnapshot,
    GpuView,
    Job,
    JobProfile,
    RunningJob,
    SharingMode,
    Utilization,
)
from collocate.policies.risk import WINDOW_SAMPLES, summarize_window


@dataclass(slots=True)
class WatchedJob:
    """A running job as the GPU watch follows it: its processes, memory ramp and activity."""

    job: Job
    uuids: tuple[str, ...]
    placed_seq: int  # order of placement: the newest job on a GPU has the largest
    stable_s: float = STABLE_S  # how long its memory must hold still to count as settled
    pids: frozenset[int] = frozenset()
    seen_at: float | None = None  # first time a process of the job held memory on its GPUs
    ramp: MemoryRamp = field(init=False)  # its memory as it grows: what it commits, settling
    solo: SoloActivity = field(default_factory=SoloActivity)
    #: Its profile as the readings of the GPU it shares imply (``activity.infer_assumed``), for
    #: a job measured neither alone nor in an earlier run.
    inferred: JobProfile | None = None

    def __post_init__(self) -> None:
        self.ramp = MemoryRamp.of(self.job.mem_mib, self.job.mem_source, self.stable_s)

    @property
    def peak_mib(self) -> float:
        """Max over samples of the job's memory on any one of its GPUs."""
        return self.ramp.peak_mib

    @property
    def learned(self) -> JobProfile | None:
        """The job's solo profile measured in this attempt, once there are enough samples."""
        return self.solo.profile()

    @property
    def assumed(self) -> bool:
        """Whether nothing was measured of its activity: neither alone nor in earlier runs."""
        return self.job.profile_source == "assumed" and self.learned is None

    @property
    def profile(self) -> JobProfile:
        """What policies price it with: measured alone, else inferred, else what it was told."""
        return self.learned or self.inferred or self.job.profile


@dataclass(slots=True)
class _Readings:
    """Mean of one GPU's readings since its newest job warmed up, for ``infer_assumed``."""

    key: tuple
    samples: int = 0
    sm: float = 0.0
    dram: float = 0.0
    has_dram: bool = True


class GpuWatch:
    def __init__(self, backend: GpuBackend, *, window: int = WINDOW_SAMPLES,
                 is_helper: Callable[[int], bool] = is_mps_server,
                 sharing: ModeParams | None = None) -> None:
        """``is_helper`` tells processes that serve jobs rather than belong to one (the MPS
        server), which do not stop a job from counting as alone on its GPU. ``sharing`` is the
        interference model of the sharing mode in use; with it, jobs nobody has measured are
        priced by what their GPU reads (``activity.infer_assumed``)."""
        self.backend = backend
        self.sharing = sharing
        self._readings: dict[str, _Readings] = {}
        self.is_helper = is_helper
        self.devices: list[DeviceInfo] = backend.devices()
        self.by_uuid = {d.uuid: d for d in self.devices}
        self.window = window
        self._sm: dict[str, deque[float]] = {d.uuid: deque(maxlen=window) for d in self.devices}
        self._occ: dict[str, deque[float]] = {d.uuid: deque(maxlen=window) for d in self.devices}
        self._dram: dict[str, deque[float]] = {d.uuid: deque(maxlen=window) for d in self.devices}
        self.last: dict[str, DeviceSample] = {}

    def refresh(self, tracked: Iterable[WatchedJob], now: float) -> None:
        """Read the backend once, update the windows and each tracked job's memory and SM."""
        self.read()
        self.attribute(tracked, now)

    def read(self) -> list[DeviceSample]:
        """Read the backend once and update the windows; the samples, for the usage monitor."""
        samples = self.backend.sample()
        for s in samples:
            if s.uuid not in self._sm:
                continue
            self.last[s.uuid] = s
            self._sm[s.uuid].append(_sm(s))
            self._occ[s.uuid].append(s.sm_occupancy or 0.0)
            self._dram[s.uuid].append(s.dram_activity or 0.0)
        return list(self.last.values())

    def attribute(self, tracked: Iterable[WatchedJob], now: float) -> None:
        """Each job's memory and solo activity from the last reading (its ``pids`` current)."""
        tracked = list(tracked)
        for t in tracked:
            self._attribute(t, now)
        if self.sharing is not None:
            self._infer(tracked, now)

    def _infer(self, tracked: Sequence[WatchedJob], now: float) -> None:
        """Price each GPU's unmeasured jobs by its readings once its newest job has warmed up:
        the mean reading since then, over at least ``MIN_SOLO_SAMPLES`` samples. A job on
        several GPUs takes the heaviest of their answers."""
        on_gpu: dict[str, list[WatchedJob]] = {}
        for t in tracked:
            for uuid in t.uuids:
                on_gpu.setdefault(uuid, []).append(t)
        inferred: dict[int, JobProfile] = {}
        for uuid, here in on_gpu.items():
            sample, device = self.last.get(uuid), self.by_uuid.get(uuid)
            assumed = [t for t in here if t.assumed]
            if (sample is None or device is None or device.sm_fraction < 1.0 or not assumed
                    or any(t.seen_at is None for t in here)):
                self._readings.pop(uuid, None)
                continue
            since = max(t.seen_at for t in here) + INFER_AFTER_S  # type: ignore[type-var]
            key = (frozenset(t.job.id for t in here), since)
            r = self._readings.get(uuid)
            if r is None or r.key != key:
                r = self._readings[uuid] = _Readings(key)
            if now < since:
                continue
            r.samples += 1
            r.sm += _sm(sample)
            r.dram += sample.dram_activity or 0.0
            r.has_dram &= sample.dram_activity is not None
            if r.samples < MIN_SOLO_SAMPLES:
                continue
            known = [t.profile for t in here if not t.assumed]
            guess = infer_assumed(known, len(assumed), r.sm / r.samples,
                                  r.dram / r.samples if r.has_dram else None, self.sharing)
            for t in assumed if guess is not None else ():
                best = inferred.get(id(t))
                if best is None or guess.sm_activity > best.sm_activity:
                    inferred[id(t)] = guess
        for t in tracked:
            if id(t) in inferred:
                t.inferred = inferred[id(t)]

    def _attribute(self, t: WatchedJob, now: float) -> None:
        held, alone, sm, dram = 0.0, True, 0.0, None
        for uuid in t.uuids:
            sample = self.last.get(uuid)
            if sample is None:
                alone = False
                continue
            mib = sum(p.used_mib for p in sample.processes if p.pid in t.pids)
            held = max(held, mib)
            alone = alone and mib > 0 and self._alone(t, sample)
            if alone:
                sm = max(sm, _sm(sample))
                if sample.dram_activity is not None:
                    dram = max(dram or 0.0, sample.dram_activity)
        if held > 0:
            if t.seen_at is None:
                t.seen_at = now
            t.ramp.observe(held, now)
            if alone:
                t.solo.observe(sm, dram)

    def _alone(self, t: WatchedJob, sample: DeviceSample) -> bool:
        """Whether this reading is the job's alone: a whole GPU, and no other process on it
        holds memory but the job's own and helpers (see ``is_helper``)."""
        if self.by_uuid[sample.uuid].sm_fraction < 1.0:
            return False
        return all(p.pid in t.pids or p.used_mib <= 0 or self.is_helper(p.pid)
                   for p in sample.processes)

    def util(self, uuid: str) -> Utilization:
        return summarize_window(self._sm[uuid], self._occ[uuid], self._dram[uuid])

    def snapshot(
        self, tracked: Sequence[WatchedJob], *, now: float, sharing: SharingMode
    ) -> ClusterSnapshot:
        on_gpu: dict[str, list[WatchedJob]] = {d.uuid: [] for d in self.devices}
        for t in tracked:
            for uuid in t.uuids:
                on_gpu.setdefault(uuid, []).append(t)
        views = []
        for d in self.devices:
            here = on_gpu.get(d.uuid, [])
            sample = self.last.get(d.uuid)
            if sample is not None and not sample.reachable:  # its node is away: not offered
                continue
            views.append(GpuView(
                id=d.id,
                total_mib=d.total_mib,
                free_mib=None if sample is None else sample.free_mib,
                committed_mib=sum(t.ramp.committed(d.total_mib, now) for t in here),
                util=self.util(d.uuid),
                jobs=tuple(t.job.id for t in here),
                launch_seen_at=_launch_seen_at(here),
                mem_settling_at=max((t.ramp.grew_at for t in here), default=-math.inf),
                speed=d.sm_fraction,
            ))
        running = {
            t.job.id: RunningJob(t.job.id, tuple(self.by_uuid[u].id for u in t.uuids if u in self.by_uuid),
                                 t.profile, _requirement(t.job, 0.0),
                                 dataset=t.job.dataset)
            for t in tracked
        }
        return ClusterSnapshot.from_views(views, now=now, sharing=sharing, running=running)


def _sm(sample: DeviceSample) -> float:
    """The GPU's SM activity: GPM's where the GPU has it, else NVML's utilization (which reads
    higher: it counts any kernel running, not the share of SMs busy)."""
    return sample.sm_activity if sample.sm_activity is not None else (sample.gpu_util or 0.0)


def _requirement(job: Job, unknown: float) -> float:
    """What a running job commits on a GPU; a job of unknown memory commits all of it."""
    return unknown if job.mem_mib is None else job.mem_mib


def _launch_seen_at(here: Sequence[WatchedJob]) -> float:
    """When the newest job on a GPU was first seen holding memory there (``inf`` until then)."""
    if not here:
        return -math.inf
    newest = max(here, key=lambda t: t.placed_seq)
    return math.inf if newest.seen_at is None else newest.seen_at
