"""MIG in the simulator: static partitions of every GPU, scheduled as GPUs of their own.

Each physical GPU is split once, at the start, into the instances of a layout (``--mig-layout``,
validated with ``collocate.gpus.mig_profiles.place``, the same check the emulated backend runs).
Every instance is a GPU in the snapshot, as the daemon sees real MIG devices:
``GpuId(node, gpu index, "<n>.0")`` with ``n`` = 1, 2, ... in layout order, the profile's memory,
and ``speed`` = its SM fraction (``collocate.gpus.mig_profiles.sm_fraction``, as every backend
takes it).

The model, ``InterferenceModel.slowdown(mode, job, others, speed=f)``, also what
``collocate emulate-job`` does on an emulated MIG instance:

* alone on an instance of SM fraction ``f`` a job runs ``InterferenceModel.alone(job, f)`` times
  slower than alone on the whole GPU (``data/interference.toml``, ``[mig]``);
* jobs that share one instance share it by the sharing mode in use (time-slicing or MPS), as on
  a whole GPU: that factor is multiplied by the mode's slowdown among them, with every activity
  taken relative to the instance (``interference.on_device``, at most 1, for SM and DRAM
  activity alike): a job busy on 20% of a whole GPU's SMs keeps 47% of a 3g instance busy;
* instances never slow each other down (separate SMs, L2 slices and memory controllers);
* a physical GPU draws its idle power once: ``idle + (max - idle) · min(1, Σ_instances
  f · busy)^exponent`` with ``busy = min(1, Σ a·rate / f)`` per instance (the realized activity,
  as in ``engine.py``), at least the warm-up level (``InterferenceModel.warmup_busy``) on an
  instance where a job warms up, as on a whole GPU; SM and memory utilization are likewise per
  physical GPU (memory: allocated MiB over the whole GPU's MiB);
* a job needing more than one GPU is rejected at admission: a CUDA process sees one MIG device
  and NCCL does not run across MIG instances. That rule is the core's
  (``collocate.core.scheduler.Capacity`` reads instances from the snapshot), so the daemon applies it
  to real and emulated MIG devices too.

``MigInstances`` is the engine's device strategy for this (see ``collocate.sim.devices``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from collocate.common.errors import InputError
from collocate.core.gputypes import NodeSpec, gpu_type
from collocate.core.model import GpuId
from collocate.gpus.mig_profiles import mig_profile, place, profiles_for, sm_fraction, split_profiles
from collocate.sim.devices import WholeGpus


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


def resolve_layout(text: str | None, nodes: Sequence[NodeSpec]) -> dict[str, tuple[MigInstance, ...]]:
    """The instances of each GPU type in the cluster, validated; ``text`` as ``--mig-layout``.

    ``text`` is one layout for every GPU type (``3g.20gb+4g.20gb``), or comma-separated layouts
    per type (``A100-40GB=3g.20gb+4g.20gb,H100-80GB=3g.40gb+4g.40gb``; types left out get their
    default); ``default`` (or None) gives every type its default. Raises ``InputError`` (``UnknownNameError`` for
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
        instances = []
        for name in names:
            p = mig_profile(type_name, name)
            if p.memory_mib is None:
                raise InputError(
                    f"MIG profile {name} of {type_name} has no measured size, so it cannot be simulated",
                    hint="use another profile; its numbers were never captured from a real GPU",
                )
            instances.append(MigInstance(name, p.memory_mib, sm_fraction(type_name, p.sm_count, name)))
        out[type_name] = tuple(instances)
    return out


def _parse_layout_text(text: str | None) -> tuple[list[str] | None, dict[str, list[str]]]:
    if text is None:
        return None, {}
    if not text.strip():
        raise InputError("--mig-layout is empty", hint="e.g. --mig-layout 3g.20gb+4g.20gb, or default")
    if text.strip() == "default":
        return None, {}
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


class MigInstances(WholeGpus):
    """Every physical GPU split into the instances of its type's layout, each a device."""

    def __init__(self, nodes: Sequence[NodeSpec], layout: dict[str, tuple[MigInstance, ...]]) -> None:
        self.layout = layout
        self.board: list[int] = []  # instance -> its physical GPU
        self.members: list[list[int]] = []  # physical GPU -> its instances
        super().__init__(nodes)
        self.board_mib = [float(s.gpu_type.memory_mib) for s in nodes for _ in range(s.count)]

    def _add_devices(self, nodes: Sequence[NodeSpec]) -> None:
        for number, spec in enumerate(nodes):
            for index in range(spec.count):
                self.members.append([])
                for n, instance in enumerate(self.layout[spec.gpu_type.name], start=1):
                    self.members[-1].append(len(self.ids))
                    self.board.append(len(self.members) - 1)
                    self._add(GpuId(spec.name, index, f"{n}.0"), number, instance.memory_mib, instance.sm_fraction)

    def advance(self, gpus: Iterable[int], now: float) -> None:
        """Integrate the physical GPUs of these instances up to ``now``: a GPU draws its idle
        power once, and each instance adds its share ``f`` of the GPU's SMs times its busy
        fraction (at least the warm-up level while a job on it warms up)."""
        exponent, sm_live, floor, used, fraction = self._exponent, self._sm, self._floor, self._used, self.speed
        for i in gpus:
            b = self.board[i]
            dt = now - self.last_t[b]
            if dt <= 0.0:
                continue
            busy = drawn = mib = 0.0
            for k in self.members[b]:
                f = fraction[k]
                active = min(f, sm_live[k])  # f · min(1, Σa·rate / f)
                busy += active
                drawn += max(active, f * floor[k])
                mib += used[k]
            busy, drawn = min(1.0, busy), min(1.0, drawn)
            self.energy[b] += (self.idle_w[b] + (self.max_w[b] - self.idle_w[b]) * drawn**exponent) * dt
            self.busy_int[b] += busy * dt
            self.mem_int[b] += mib / self.board_mib[b] * dt
            self.last_t[b] = now
