"""MIG in the simulator: static partitions of every GPU, scheduled as GPUs of their own.

Each physical GPU is split once, at the start, into the instances of a layout (``--mig-layout``,
validated with ``collocate.gpus.mig_profiles.place``, the same check the emulated backend runs).
Every instance is a GPU in the snapshot, as the daemon sees real MIG devices:
``GpuId(node, gpu index, "<n>.0")`` with ``n`` = 1, 2, ... in layout order, the profile's memory,
and ``speed`` = its SM fraction (the profile's SMs over the 7g instance's SMs, as
``gpus/emulated.py`` computes it; on H100 these are not multiples of 1/7).

The model, also what ``collocate emulate-job`` does on an emulated MIG instance:

* alone on an instance of SM fraction ``f`` a job runs ``slowdown(MIG, job, speed=f)`` times slower
  than alone on the whole GPU (``data/interference.toml``, ``[modes.mig]``);
* jobs that share one instance time-slice it: that factor is multiplied by the time-slicing
  slowdown among them, with every activity taken relative to the instance (``min(1, a / f)``
  for SM and DRAM activity alike): a job busy on 20% of a whole GPU's SMs keeps 47% of a 3g
  instance's busy;
* instances never slow each other down (separate SMs, L2 slices and memory controllers);
* a physical GPU draws its idle power once: ``idle + (max - idle) · min(1, Σ_instances
  f · busy)^exponent`` with ``busy = min(1, Σ a·rate / f)`` per instance (the realized activity,
  as in ``engine.py``); SM and memory utilization are likewise per physical GPU (memory:
  allocated MiB over the whole GPU's MiB);
* a job needing more than one GPU is rejected at admission: a CUDA process sees one MIG device
  and NCCL does not run across MIG instances.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from collocate.errors import InputError
from collocate.gpus.mig_profiles import (
    COMPUTE_SLICES,
    full_gpu_sm_count,
    mig_profile,
    place,
    profiles_for,
)
from collocate.gputypes import NodeSpec, gpu_type
from collocate.model import ClusterSnapshot, GpuId, Job, SharingMode
from collocate.policies.base import Policy
from collocate.scheduler import Capacity
from collocate.sim.engine import _FINISH, OCCUPANCY_PER_SM, SimConfig, Simulation
from collocate.sim.trace import TraceJob


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One instance of a layout: its profile, memory and share of the GPU's SMs."""

    profile: str
    memory_mib: float
    sm_fraction: float


def default_layout(type_name: str) -> tuple[str, ...]:
    """The 3g + 4g split: all 7 compute and 8 memory slices in the fewest instances that still
    partition the GPU, each with half the memory, so the larger jobs of a trace still fit; it is
    also the pair of the published MIG collocation anchor (ResNet-152 on 4g, DLRM on 3g)."""
    table = profiles_for(type_name)
    pick = {p.compute_slices: p.name for p in table.values() if not p.name.endswith("+me")}
    return (pick[3], pick[4])


def split_profiles(text: str) -> list[str]:
    """``"1g.5gb+me+3g.20gb"`` → ``["1g.5gb+me", "3g.20gb"]`` (``+me`` belongs to its profile)."""
    names: list[str] = []
    for part in (p.strip() for p in text.split("+")):
        if part.lower() == "me" and names:
            names[-1] += "+me"
        else:
            names.append(part)
    if not all(names):
        raise InputError(
            f"empty MIG profile name in layout {text!r}",
            hint="join profile names with +, e.g. 3g.20gb+4g.20gb",
        )
    return names


def resolve_layout(text: str | None, nodes: Sequence[NodeSpec]) -> dict[str, tuple[MigInstance, ...]]:
    """The instances of each GPU type in the cluster, validated; ``text`` as ``--mig-layout``.

    ``text`` is one layout for every GPU type (``3g.20gb+4g.20gb``), or comma-separated layouts
    per type (``A100-40GB=3g.20gb+4g.20gb,H100-80GB=3g.40gb+4g.40gb``; types left out get their
    default); None gives every type its default. Raises ``InputError`` (``UnknownNameError`` for
    bad names, listing the valid ones) when a type has no MIG or a layout does not fit its GPUs.
    """
    types = list(dict.fromkeys(n.gpu_type.name for n in nodes))
    common, per_type = _parse_layout_text(text)
    unknown = sorted(set(per_type) - set(types))
    if unknown:
        raise InputError(
            f"--mig-layout names GPU type(s) {', '.join(unknown)}, which the cluster does not have",
            hint=f"the cluster's GPU types: {', '.join(types)}",
        )
    out: dict[str, tuple[MigInstance, ...]] = {}
    for type_name in types:
        profiles_for(type_name)  # no MIG on this type: the error lists the MIG-capable types
        names = per_type.get(type_name) or common or list(default_layout(type_name))
        place(type_name, names)  # unknown names, too many slices, no placement: as the driver
        full_sms = full_gpu_sm_count(type_name, gpu_type(type_name).sm_count)
        instances = []
        for name in names:
            p = mig_profile(type_name, name)
            if p.memory_mib is None:
                raise InputError(
                    f"MIG profile {name} of {type_name} has no measured size, so it cannot be simulated",
                    hint="use another profile; its numbers were never captured from a real GPU",
                )
            fraction = p.sm_count / full_sms if p.sm_count else p.compute_slices / COMPUTE_SLICES
            instances.append(MigInstance(name, p.memory_mib, fraction))
        out[type_name] = tuple(instances)
    return out


def _parse_layout_text(text: str | None) -> tuple[list[str] | None, dict[str, list[str]]]:
    if text is None:
        return None, {}
    if not text.strip():
        raise InputError("--mig-layout is empty", hint="e.g. --mig-layout 3g.20gb+4g.20gb")
    common: list[str] | None = None
    per_type: dict[str, list[str]] = {}
    for item in (i.strip() for i in text.split(",")):
        type_text, eq, layout = item.rpartition("=")
        if not eq:
            if common is not None:
                raise InputError(
                    f"--mig-layout {text!r} gives more than one layout for every GPU type",
                    hint="give one layout, or one per type: A100-40GB=3g.20gb+4g.20gb,H100-80GB=...",
                )
            common = split_profiles(item)
            continue
        name = gpu_type(type_text.strip()).name  # unknown type: lists the known ones
        if name in per_type:
            raise InputError(f"--mig-layout gives GPU type {name} two layouts", hint="give each type once")
        per_type[name] = split_profiles(layout)
    return common, per_type


def layout_text(layout: dict[str, tuple[MigInstance, ...]]) -> dict[str, str]:
    """``{"A100-40GB": "3g.20gb+4g.20gb"}``: how reports print a resolved layout."""
    return {t: "+".join(i.profile for i in instances) for t, instances in layout.items()}


class MigCapacity(Capacity):
    """Admission under MIG: one instance per job, and it must fit the largest instance."""

    __slots__ = ()

    def why_not(self, job: Job) -> str | None:
        if job.gpus > 1:
            return (
                f"needs {job.gpus} GPUs, but under MIG a job runs on one instance: a CUDA process "
                "sees a single MIG device and NCCL does not run across MIG instances"
            )
        if job.gpus == 1 and job.mem_mib is not None and job.mem_mib > self._largest[1]:
            return (
                f"needs {job.mem_mib:.0f} MiB but the largest MIG instance has "
                f"{self._largest[1]:.0f} MiB (see --mig-layout)"
            )
        return super().why_not(job)


MIG_CONFIG = SimConfig(sharing=SharingMode.MIG)


class MigSimulation(Simulation):
    """``Simulation`` on MIG instances: devices, meters, admission and slowdown differ."""

    capacity_type = MigCapacity

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        trace: Sequence[TraceJob],
        policy: Policy,
        config: SimConfig = MIG_CONFIG,
        **kwargs,
    ) -> None:
        if config.sharing is not SharingMode.MIG:
            raise InputError(
                f"MigSimulation needs sharing mode mig, got {config.sharing.value}",
                hint="use Simulation(...) for the other sharing modes",
            )
        self.layout = resolve_layout(config.mig_layout, nodes)
        super().__init__(nodes, trace, policy, config, **kwargs)

    def _devices(self, nodes):
        ids, node_no, totals, speed = [], [], [], []
        self.board: list[int] = []  # instance -> its physical GPU
        self.members: list[list[int]] = []  # physical GPU -> its instances
        for number, spec in enumerate(nodes):
            for index in range(spec.count):
                self.members.append([])
                for n, instance in enumerate(self.layout[spec.gpu_type.name], start=1):
                    self.members[-1].append(len(ids))
                    self.board.append(len(self.members) - 1)
                    ids.append(GpuId(spec.name, index, f"{n}.0"))
                    node_no.append(number)
                    totals.append(instance.memory_mib)
                    speed.append(instance.sm_fraction)
        self._fraction = speed  # plain floats: read per event
        return ids, node_no, totals, speed

    def _meters(self, nodes):
        super()._meters(nodes)  # per physical GPU already
        self.board_mib = np.array([float(s.gpu_type.memory_mib) for s in nodes for _ in range(s.count)])

    def _snapshot(self, now: float, placements_made: int = 0) -> ClusterSnapshot:
        """A monitor reads a MIG device's activity relative to the instance's own SMs."""
        snap = super()._snapshot(now, placements_made)
        busy = np.minimum(1.0, self.sm_live / self.speed)
        return replace(
            snap, util_sm=busy, util_occ=busy * OCCUPANCY_PER_SM, util_dram=np.minimum(1.0, self.dram_live / self.speed)
        )

    def _mark(self, gpus, now: float) -> None:
        for i in gpus:  # timelines show memory and activity relative to each instance
            key = str(self.ids[i])
            if key in self.timelines:
                busy = min(1.0, self.sm_live[i] / self._fraction[i])
                self.timelines[key].append((now, float(self.used[i]), float(busy)))

    def _rerate(self, gpus, now: float) -> None:
        """``Simulation._rerate`` with the per-instance slowdown (the base keeps its loop inline
        because it is the hot path of every other sharing mode)."""
        model = self.cfg.interference
        for job_id in {job_id for i in gpus for job_id in self.residents[i]}:
            run = self.running[job_id]
            run.work_left -= (now - run.since) * run.rate
            run.since = now
            slowdown = 1.0
            for i in run.gpus if not run.starting else ():
                others = [r.profile for o in self.residents[i]
                          if o != job_id and not (r := self.running[o]).starting]
                slowdown = max(slowdown, model.instance_slowdown(run.profile, others, self._fraction[i]))
            run.rate = 1.0 / slowdown
            run.version += 1
            self._push(now + max(run.work_left, 0.0) / run.rate, _FINISH, job_id, run.version)
        self._realize(gpus)  # one instance per job: its boards were metered by the caller
        self._mark(gpus, now)

    def _advance(self, gpus, now: float) -> None:
        """Integrate the physical GPUs of these instances up to ``now``."""
        exponent = self.cfg.interference.power_exponent
        for i in gpus:
            b = self.board[i]
            dt = now - self.last_t[b]
            if dt <= 0.0:
                continue
            busy = used = 0.0
            for k in self.members[b]:
                busy += min(self._fraction[k], self.sm_live[k])  # f · min(1, Σa·rate / f)
                used += self.used[k]
            busy = min(1.0, busy)
            self.energy[b] += (self.idle_w[b] + (self.max_w[b] - self.idle_w[b]) * busy**exponent) * dt
            self.busy_int[b] += busy * dt
            self.mem_int[b] += used / self.board_mib[b] * dt
            self.last_t[b] = now
