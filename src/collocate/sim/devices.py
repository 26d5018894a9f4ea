"""What the simulator's GPUs are, and how their power and utilization are metered.

The engine (``sim/engine.py``) keeps per-device state (memory, residents, activity) and asks a
``Devices`` strategy for what differs between sharing modes: which devices there are, how
their physical GPUs integrate energy, busy time and memory, and each device's share of its GPU's
SMs (``speed``). ``WholeGpus`` is one device per physical GPU; ``collocate.sim.mig.MigInstances``
splits each GPU into MIG instances. Admission needs no hook: ``collocate.core.scheduler.Capacity``
reads MIG instances from the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from collocate.core.gputypes import NodeSpec
from collocate.core.model import GpuId


class WholeGpus:
    """Each physical GPU is one schedulable device."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.ids: list[GpuId] = []
        self.node: list[int] = []
        self.total_mib: list[float] = []
        self.speed: list[float] = []
        self._add_devices(nodes)
        # Per physical GPU: power parameters and the integrals since t=0, brought up to date
        # lazily by ``advance``.
        self.idle_w = np.array([s.gpu_type.idle_watts for s in nodes for _ in range(s.count)])
        self.max_w = np.array([s.gpu_type.max_watts for s in nodes for _ in range(s.count)])
        boards = len(self.idle_w)
        self.last_t = np.zeros(boards)
        self.energy = np.zeros(boards)
        self.busy_int = np.zeros(boards)
        self.mem_int = np.zeros(boards)

    def _add_devices(self, nodes: Sequence[NodeSpec]) -> None:
        for number, spec in enumerate(nodes):
            for index in range(spec.count):
                self._add(GpuId(spec.name, index), number, float(spec.gpu_type.memory_mib), 1.0)

    def _add(self, gpu: GpuId, node: int, total_mib: float, speed: float) -> None:
        self.ids.append(gpu)
        self.node.append(node)
        self.total_mib.append(total_mib)
        self.speed.append(speed)

    def bind(self, sm_live: np.ndarray, power_floor: np.ndarray, used: np.ndarray, exponent: float) -> None:
        """The engine's live per-device arrays (updated in place) that ``advance`` meters."""
        self._sm, self._floor, self._used, self._exponent = sm_live, power_floor, used, exponent

    def advance(self, gpus: Iterable[int], now: float) -> None:
        """Integrate energy, busy time and memory of these devices' GPUs up to ``now``."""
        exponent, sm_live, floor, used = self._exponent, self._sm, self._floor, self._used
        total = self.total_mib
        for i in gpus:  # scalar loop: jobs hold few GPUs, and fancy indexing costs more
            dt = now - self.last_t[i]
            busy = min(1.0, sm_live[i])
            drawn = max(busy, floor[i])  # a warming job draws above what it computes
            self.energy[i] += (self.idle_w[i] + (self.max_w[i] - self.idle_w[i]) * drawn**exponent) * dt
            self.busy_int[i] += busy * dt
            self.mem_int[i] += used[i] / total[i] * dt
            self.last_t[i] = now
