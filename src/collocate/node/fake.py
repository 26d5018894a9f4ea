"""``FakeNode``: the ``Node`` API without processes, for tests of the head's rules and for the
head-scale benchmark (hundreds of nodes in one process).

A fake node has GPUs of one type and runs nothing: a started part is alive until the test ends
it (``finish``, ``fail``) or its ``run_s`` is over (then it exits 0), or the node is cut off
(``down``: every call raises ``NodeUnreachable``). Its GPU readings show the memory its parts
were placed with, so the head's world model sees them as a real node's would.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace

from collocate.core.gputypes import GPU_TYPES
from collocate.core.model import GpuId
from collocate.gpus.base import DeviceInfo, DeviceSample
from collocate.monitor.job_metrics import MetricPoint
from collocate.monitor.process_tree import TreeUsage
from collocate.node.api import ExitRecord, NodeTick, NodeUnreachable, PartEnd, PartRef, PartStatus, Producers
from collocate.node.datasets import ProducerRequest
from collocate.node.launcher import LaunchPlan


class FakeNode:
    """A node of ``gpus`` GPUs of ``gpu_type`` that runs nothing (see the module docstring)."""

    def __init__(self, name: str, gpus: int = 8, gpu_type: str = "H100-80GB", *,
                 run_s: float | None = None, clock=time.time) -> None:
        self.name, self.run_s, self.clock = name, run_s, clock
        total = GPU_TYPES[gpu_type].memory_mib
        self._devices = [DeviceInfo(GpuId(name, i), f"GPU-fake-{name}-{i}", gpu_type, total, 132)
                         for i in range(gpus)]
        self.down = False
        self.plans: dict[tuple[str, int], LaunchPlan] = {}  # what each part was started with
        self._parts: dict[tuple[str, int], tuple[PartRef, float]] = {}  # live parts, started at
        self._ended: dict[tuple[str, int], ExitRecord] = {}
        self._pid = 1000
        self.signals: list[tuple[tuple[str, int], int]] = []
        self.frozen: set[tuple[str, int]] = set()  # parts frozen now

    def _check(self) -> None:
        if self.down:
            raise NodeUnreachable(f"node {self.name} does not answer")

    def finish(self, job_id: str, n: int, returncode: int = 0) -> None:
        """End a part as its job would, with ``returncode``."""
        self._parts.pop((job_id, n), None)
        self._ended[(job_id, n)] = ExitRecord(returncode, self.clock(), "" if returncode == 0 else "boom")

    def devices(self) -> list[DeviceInfo]:
        self._check()
        return list(self._devices)

    def address(self) -> str:
        return f"10.0.0.{abs(hash(self.name)) % 250 + 1}"

    def free_port(self) -> int:
        self._check()
        return 29500

    def _expire(self) -> None:
        if self.run_s is None:
            return
        now = self.clock()
        for key, (_, at) in list(self._parts.items()):
            if now - at >= self.run_s:
                self.finish(*key)

    def tick(self, parts: Sequence[PartRef]) -> NodeTick:
        self._check()
        self._expire()
        now = self.clock()
        samples = [DeviceSample(d.uuid, now, 0.0, d.total_mib, gpu_util=0.0) for d in self._devices]
        return NodeTick(samples, self.status(parts))

    def status(self, parts: Sequence[PartRef]) -> dict[tuple[str, int], PartStatus]:
        self._check()
        return {p.key: PartStatus(p.key in self._parts) for p in parts}

    def start(self, plan: LaunchPlan, part: PartRef, head_root: str) -> PartRef:
        self._check()
        self._pid += 1
        started = replace(part, pid=self._pid, started=float(self._pid))
        self._parts[part.key] = (started, self.clock())
        self.plans[part.key] = plan
        return started

    def started(self, part: PartRef) -> PartRef | None:
        self._check()
        live = self._parts.get(part.key)
        return live[0] if live else None

    def ended(self, part: PartRef) -> PartEnd:
        self._check()
        record = self._ended.get(part.key)
        return PartEnd(record, job_started=True)

    def signal(self, part: PartRef, sig: int) -> None:
        self._check()
        self.signals.append((part.key, sig))
        if part.key in self._parts:
            self.finish(part.job_id, part.n, -sig)

    def suspend(self, part: PartRef, frozen: bool) -> str:
        self._check()
        if frozen:
            self.frozen.add(part.key)
        else:
            self.frozen.discard(part.key)
        return "fake"

    def release(self, part: PartRef) -> None:
        self._check()
        self._parts.pop(part.key, None)

    def running(self) -> list[tuple[str, int]]:
        """The parts that run here now."""
        return list(self._parts)

    def read_log(self, part: PartRef, stream: str, offset: int, limit: int) -> bytes:
        self._check()
        return b""

    def drop_logs(self, part: PartRef) -> int:
        self._check()
        return 0

    def read_trees(self, roots: Mapping[str, int], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        self._check()
        return {job: TreeUsage(frozenset({pid}), 0.0, 0.0, 0.0, None, None) for job, pid in roots.items()}

    def read_metrics(self, parts: Mapping[str, PartRef]) -> list[MetricPoint]:
        self._check()
        return []

    def collect(self, owned: Collection[PartRef]) -> list[str]:
        self._check()
        return []

    def ensure_producer(self, request: ProducerRequest) -> Producers:
        self._check()
        return Producers({}, ready=True)

    def reconcile_producers(self, wanted: AbstractSet[str], known: AbstractSet[str]) -> Producers:
        return Producers({})

    def adopt_producers(self, names: AbstractSet[str]) -> Producers:
        return Producers({})

    def confinement_words(self) -> str:
        return "fake node: nothing confined"

    def close(self) -> None:
        pass
