"""The daemon's GPU watch: live readings fed into the world model (``collocate.core.world``).

Each sampling period the watch reads the backend once and tells the world what the simulator's
meters tell it in a simulation: per device its SM, occupancy and DRAM activity (GPM where the GPU
has it, else NVML's utilization; SM and DRAM activity in whole-GPU units, as the simulator's,
where a monitor reads a MIG instance relative to its own SMs), its free memory, and the memory held by processes that belong
to no running attempt (an MPS server aside: ``is_helper``); per job the memory its processes
hold on its most loaded GPU (a job's processes are its runner's process tree), and the steps
jobs report with their metrics. Everything the
policies then see (phases, commitments, beliefs learned alone or shared, the risk window, the
snapshot) is the world's, the same code the simulator runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from collocate.core.interference import ModeParams
from collocate.core.model import ClusterSnapshot, Job, SharingMode, Utilization
from collocate.core.policies.risk import WINDOW_SAMPLES
from collocate.core.world import Device, Resident, World
from collocate.gpus.base import DeviceInfo, DeviceSample, GpuBackend
from collocate.gpus.mps import is_mps_server
from collocate.monitor.job_metrics import MetricPoint


class GpuWatch:
    def __init__(self, backend: GpuBackend, *, sharing: SharingMode = SharingMode.TIME_SLICING,
                 params: ModeParams | None = None, window: int = WINDOW_SAMPLES, period_s: float = 1.0,
                 is_helper: Callable[[int], bool] = is_mps_server) -> None:
        """``params``: the interference model of the sharing mode in use (beliefs are revised
        by it; None learns nothing). ``period_s``: the sampling period, how long a reading still
        mixes in the level before a change."""
        self.backend = backend
        self.is_helper = is_helper
        self.devices: list[DeviceInfo] = backend.devices()
        self.by_uuid = {d.uuid: d for d in self.devices}
        self.position = {d.uuid: i for i, d in enumerate(self.devices)}
        self.uuid_of = {d.id: d.uuid for d in self.devices}  # kept, not rebuilt per launch
        self.speed = [d.sm_fraction for d in self.devices]  # each device's share of its GPU's SMs
        self.world = World([Device(d.id, d.total_mib, d.sm_fraction) for d in self.devices],
                           sharing=sharing, params=params, window=window, period_s=period_s)
        self.last: dict[str, DeviceSample] = {}
        self.other_mib: dict[str, float] = {}  # per device, memory of processes that are no job's

    def add_devices(self, devices: Sequence[DeviceInfo]) -> list[DeviceInfo]:
        """GPUs that joined (a node that joined the cluster): appended; those new returned."""
        new = [d for d in devices if d.uuid not in self.position]
        for d in new:
            self.position[d.uuid] = len(self.devices)
            self.devices.append(d)
            self.by_uuid[d.uuid] = d
            self.uuid_of[d.id] = d.uuid
            self.speed.append(d.sm_fraction)
        self.world.add_devices([Device(d.id, d.total_mib, d.sm_fraction) for d in new])
        return new

    # -- residents ------------------------------------------------------------------------------
    def place(self, job: Job, uuids: Sequence[str], now: float, room_mib: float | None = None) -> Resident:
        return self.world.place(job, [self.position[u] for u in uuids], now, room_mib=room_mib)

    def remove(self, job_id: str, now: float) -> Resident | None:
        """The job's resident, with what it taught; None when the world never had it."""
        if self.world.resident(job_id) is None:
            return None
        return self.world.remove(job_id, now)

    def neighbours(self, job_id: str) -> set[str]:
        """The jobs that share a GPU with this resident (none when it is not one)."""
        return self.world.neighbours(job_id)

    def resident(self, job_id: str) -> Resident | None:
        return self.world.resident(job_id)

    def progress(self, points: Iterable[MetricPoint]) -> None:
        """The steps jobs reported with their metrics (``log_metric(..., step=)``): the world
        measures their slowdowns from them."""
        for p in points:
            if p.step is not None:
                self.world.observe_progress(p.job_id, p.time, float(p.step))

    # -- readings -------------------------------------------------------------------------------
    def read(self) -> list[DeviceSample]:
        """Read the backend once (taking in the GPUs of nodes that joined); the samples, for
        the usage monitor."""
        samples = self.backend.sample()
        if len(self.backend.devices()) != len(self.devices):
            self.add_devices(self.backend.devices())
        for s in samples:
            if s.uuid in self.position:
                self.last[s.uuid] = s
        return list(self.last.values())

    def observe(self, pids_of: Mapping[str, frozenset[int]], now: float) -> None:
        """Feed the last reading to the world: each running job's memory (``pids_of``: its
        processes), and each device's levels, free memory and memory nobody runs."""
        ours: set[int] = set()
        for job_id, pids in pids_of.items():
            ours |= pids
            r = self.world.resident(job_id)
            if r is None:
                continue
            held = 0.0
            for i in r.devices:
                sample = self.last.get(self.devices[i].uuid)
                if sample is not None:
                    held = max(held, sum(p.used_mib for p in sample.processes if p.pid in pids))
            self.world.observe_memory(job_id, held, now)
        for uuid, s in self.last.items():
            i = self.position[uuid]
            if not s.reachable:  # its node is away: left out of the snapshot until it answers
                continue
            other = sum(p.used_mib for p in s.processes
                        if p.used_mib > 0 and p.pid not in ours and not self.is_helper(p.pid))
            self.other_mib[uuid] = other
            speed = self.speed[i]  # a monitor reads a MIG instance relative to its own SMs
            self.world.set_reading(i, now, _sm(s) * speed,
                                   None if s.dram_activity is None else s.dram_activity * speed,
                                   s.sm_occupancy, free_mib=s.free_mib, other_mib=other)
        self.world.tick(now)

    # -- what policies and people see ------------------------------------------------------------
    def snapshot(self, now: float, idle: Collection[str] = ()) -> ClusterSnapshot:
        """The world's snapshot, without the GPUs of a node that does not answer; with
        ``idle``, as if those jobs were frozen (``World.idle_view``)."""
        if not idle:
            self.world.tick(now)
        snapshot = self.world.snapshot(now, idle)
        away = {u for u, s in self.last.items() if not s.reachable}
        if not away:
            return snapshot
        return snapshot.subset([i for i, d in enumerate(self.devices) if d.uuid not in away])

    def util(self, uuid: str) -> Utilization:
        return self.world.util(self.position[uuid])

    def committed_mib(self, uuid: str) -> float:
        return self.world.committed_mib(self.position[uuid])

    def held_mib(self, pids: frozenset[int], uuid: str) -> float:
        """What a job's processes hold on one device now."""
        sample = self.last.get(uuid)
        return 0.0 if sample is None else sum(p.used_mib for p in sample.processes if p.pid in pids)


def _sm(sample: DeviceSample) -> float:
    """The GPU's SM activity: GPM's where the GPU has it, else NVML's utilization (which reads
    higher: it counts any kernel running, not the share of SMs busy)."""
    return sample.sm_activity if sample.sm_activity is not None else (sample.gpu_util or 0.0)

