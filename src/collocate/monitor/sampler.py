"""The daemon's one sampler: per-GPU and per-job records, once per tick, no threads of its own.

The daemon's loop calls ``UsageSampler.observe`` each period with the ``DeviceSample``s and the
jobs' process trees it already read for its GPU watch, so the GPUs and the trees are read once
per tick, not twice (``UsageSampler.tick(backend, jobs)`` reads both itself, for standalone use).
``jobs`` maps each running job id to its root pid (the runner), or to a ``UsageJob`` carrying its
user, name and metrics file. One call:

1. reads each job's process tree from ``/proc`` unless given (CPU, host memory, I/O;
   ``process_tree``);
2. maps every GPU process to the job whose tree holds it and splits each device's interval
   between the previous and this sample among jobs (``attribution``; idle power from the GPU
   type when known, else the lowest power seen on that device);
3. picks up the metrics jobs logged themselves (``job_metrics``);
4. returns a ``Tick``: what the store, the sinks and the dashboard consume.

Why no thread: the daemon's loop already runs once per period and owns all state; a second
timer would need locks and could sample while the scheduler is mid-change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collocate.common.errors import UnknownNameError
from collocate.core.gputypes import gpu_type
from collocate.gpus.base import DeviceInfo, DeviceSample, GpuBackend
from collocate.gpus.mps import is_mps_server
from collocate.monitor.attribution import IDLE, OTHER, Attribution, attribute
from collocate.monitor.job_metrics import MetricPoint, MetricsTail
from collocate.monitor.process_tree import EMPTY, TreeReader, TreeUsage


@dataclass(frozen=True, slots=True)
class UsageJob:
    """A running job as the sampler needs it; only ``root_pid`` is required."""

    root_pid: int
    user: str = ""
    name: str = ""
    metrics_file: Path | None = None  # the job's $COLLOCATE_METRICS_FILE
    expected_sm: float | None = None  # its expected share of SM activity where it shares a GPU


@dataclass(frozen=True, slots=True)
class JobGpuShare:
    """One job's part of one device over the last interval (see ``attribution``)."""

    uuid: str
    mem_mib: float
    sm_activity: float
    energy_j: float | None
    gpu_time_s: float
    occupancy_s: float  # 0 on the device's first reading (no interval yet)


@dataclass(frozen=True, slots=True)
class UsageRecord:
    job_id: str
    time: float
    user: str
    name: str
    nprocs: int
    cpu_s: float  # CPU seconds since the previous tick (whole tree)
    cpu_percent: float  # 100 = one core
    rss_mib: float
    read_bytes: int | None
    write_bytes: int | None
    gpus: tuple[JobGpuShare, ...] = ()

    @property
    def gpu_mem_mib(self) -> float:
        """Memory on its busiest device: the per-GPU peak the scheduler reasons with."""
        return max((g.mem_mib for g in self.gpus), default=0.0)

    @property
    def sm_activity(self) -> float | None:
        """Mean SM activity over the devices it held in the interval."""
        return sum(g.sm_activity for g in self.gpus) / len(self.gpus) if self.gpus else None

    @property
    def energy_j(self) -> float | None:
        known = [g.energy_j for g in self.gpus if g.energy_j is not None]
        return sum(known) if known else None

    @property
    def gpu_time_s(self) -> float:
        return sum(g.gpu_time_s for g in self.gpus)

    @property
    def occupancy_s(self) -> float:
        return sum(g.occupancy_s for g in self.gpus)


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """One device's reading, with the energy of the interval that ended at it and who got it."""

    uuid: str
    gpu: str  # GpuId as text, e.g. "host:0" or "host:0/1.0"
    type_name: str
    total_mib: float
    sample: DeviceSample
    interval_s: float  # 0 on a device's first reading
    energy_j: float | None  # measured energy of the interval (None: unknown or first reading)
    energy_source: str
    idle_energy_j: float  # energy of the interval no process was there to take
    other_energy_j: float  # energy charged to processes no job owns
    jobs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Tick:
    time: float
    gpus: tuple[GpuRecord, ...]
    jobs: tuple[UsageRecord, ...]
    metrics: tuple[MetricPoint, ...] = ()
    attributions: tuple[Attribution, ...] = field(default=(), repr=False)
    #: Per GPU uuid, the memory its jobs commit (``collocate.core.commitment``), when the caller knows
    #: it: the daemon does; kept beside what is used so the dashboard shows both over time.
    committed: Mapping[str, float] = field(default_factory=dict, repr=False)


class UsageSampler:
    """See the module docstring. One per daemon; owns the previous sample of every device."""

    def __init__(self, devices: Sequence[DeviceInfo], *,
                 idle_watts: Mapping[str, float] | None = None,
                 is_helper: Callable[[int], bool] = is_mps_server) -> None:
        self.devices: dict[str, DeviceInfo] = {}
        self._idle: dict[str, float] = {}
        self.add_devices(devices)
        self._idle.update(idle_watts or {})
        self._learned_min: dict[str, float] = {}
        self._is_helper = is_helper
        self._last: dict[str, DeviceSample] = {}
        self._trees = TreeReader()
        self._metrics = MetricsTail()

    def add_devices(self, devices: Sequence[DeviceInfo]) -> None:
        """GPUs to attribute (at start, and those of a node that joined the cluster)."""
        for d in devices:
            self.devices[d.uuid] = d
            if (w := _type_idle_watts(d)) is not None:
                self._idle[d.uuid] = w

    @classmethod
    def for_backend(cls, backend: GpuBackend, **kwargs: object) -> UsageSampler:
        return cls(backend.devices(), **kwargs)  # type: ignore[arg-type]

    def tick(self, backend: GpuBackend, jobs: Mapping[str, int | UsageJob],
             now: float | None = None) -> Tick:
        """Read the backend once and ``observe`` it."""
        return self.observe(backend.sample(), jobs, now)

    def observe(self, samples: Sequence[DeviceSample], jobs: Mapping[str, int | UsageJob],
                now: float | None = None, *, trees: Mapping[str, TreeUsage] | None = None,
                metrics: Sequence[MetricPoint] | None = None) -> Tick:
        """Turn one reading of every device plus the running jobs into a ``Tick``. ``trees``:
        the jobs' process trees when the caller read them already this tick (the daemon's
        loop reads them once for its GPU watch and for this), else they are read here.
        ``metrics``: the jobs' new metric points when the caller read them (on a cluster, each
        job's node reads its file), else they are read here from each job's ``metrics_file``."""
        now = time.time() if now is None else now
        refs = {j: r if isinstance(r, UsageJob) else UsageJob(int(r)) for j, r in jobs.items()}
        gpu_pids = {p.pid for s in samples for p in s.processes}
        if trees is None:
            trees = self._trees.read({j: r.root_pid for j, r in refs.items()}, now, gpu_pids)
        owner_of = {pid: job_id for job_id, t in trees.items() for pid in t.pids}
        for job_id, ref in refs.items():  # a root that just exited may still hold GPU memory
            owner_of.setdefault(ref.root_pid, job_id)
        shares: dict[str, list[JobGpuShare]] = {j: [] for j in refs}
        helpers = frozenset(p for p in gpu_pids if p not in owner_of and self._is_helper(p))
        expected = {j: r.expected_sm for j, r in refs.items() if r.expected_sm is not None}
        gpu_records, attributions = [], []
        for s in samples:
            info = self.devices.get(s.uuid)
            if info is None:
                continue
            prev = self._last.get(s.uuid)
            self._last[s.uuid] = s
            idle = self._idle_watts(s)
            if prev is None or s.time <= prev.time:
                prev = s  # first reading (or the clock stepped back): who is there, no interval
            a = attribute(prev, s, owner_of, idle_watts=idle, helpers=helpers, expected=expected)
            if a.dt > 0:
                attributions.append(a)
            for owner, sh in a.shares.items():
                if owner in shares:
                    shares[owner].append(JobGpuShare(s.uuid, sh.mem_mib, sh.sm_activity,
                                                     sh.energy_j, sh.gpu_time_s, sh.occupancy_s))
            gpu_records.append(self._gpu_record(info, s, a, owner_of))
        if metrics is None:
            files = {j: r.metrics_file for j, r in refs.items() if r.metrics_file is not None}
            metrics = self._metrics.read(files)
        job_records = []
        for job_id, ref in refs.items():
            t = trees.get(job_id, EMPTY)
            job_records.append(UsageRecord(job_id, now, ref.user, ref.name, len(t.pids), t.cpu_s,
                                         t.cpu_percent, t.rss_mib, t.read_bytes, t.write_bytes,
                                         tuple(shares[job_id])))
        return Tick(now, tuple(gpu_records), tuple(job_records), tuple(metrics),
                    tuple(attributions))

    def close(self) -> None:
        """Close the jobs' metrics files the sampler keeps open."""
        self._metrics.close()

    def _idle_watts(self, s: DeviceSample) -> float | None:
        if s.uuid in self._idle:
            return self._idle[s.uuid]
        if s.power_watts is None:
            return self._learned_min.get(s.uuid)
        low = min(s.power_watts, self._learned_min.get(s.uuid, s.power_watts))
        self._learned_min[s.uuid] = low
        return low

    def _gpu_record(self, info: DeviceInfo, s: DeviceSample, a: Attribution,
                    owner_of: Mapping[int, str]) -> GpuRecord:
        jobs = sorted({owner_of[p.pid] for p in s.processes if p.pid in owner_of})
        if a.dt <= 0:
            return GpuRecord(s.uuid, str(info.id), info.type_name, info.total_mib, s, 0.0, None,
                             "none", 0.0, 0.0, tuple(jobs))
        idle = a.shares.get(IDLE)
        other = a.shares.get(OTHER)
        return GpuRecord(s.uuid, str(info.id), info.type_name, info.total_mib, s, a.dt,
                         a.energy_j, a.energy_source,
                         (idle.energy_j or 0.0) if idle else 0.0,
                         (other.energy_j or 0.0) if other else 0.0, tuple(jobs))


def _type_idle_watts(d: DeviceInfo) -> float | None:
    """Idle power of a whole GPU of a known type; MIG instances have no power of their own."""
    if d.parent_uuid is not None:
        return None
    try:
        return gpu_type(d.type_name).idle_watts
    except UnknownNameError:
        return None
