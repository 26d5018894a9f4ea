"""The extension points of docs/extending.md, each shown working: a new policy registered and
run in the simulator, a new GPU backend opened by name and scheduled on by the daemon's GPU
watch and the core, a new monitoring sink fed by ``UsageMonitor``, and a new executor that the
daemon runs a real job through."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from collocate.common.errors import InputError
from collocate.core import policies
from collocate.core.gputypes import parse_cluster
from collocate.core.model import ClusterSnapshot, GpuId, Job, JobProfile, Plan
from collocate.core.policies.base import Ledger, pick_on_one_node
from collocate.core.scheduler import Capacity, Scheduler
from collocate.daemon.fleet import InProcessNodes
from collocate.daemon.gpu_watch import GpuWatch
from collocate.daemon.server import Peer
from collocate.daemon.service import ServeConfig, Service
from collocate.gpus import registry
from collocate.gpus.base import DeviceInfo, DeviceSample
from collocate.monitor.service import UsageMonitor
from collocate.monitor.sinks.base import JobInfo
from collocate.node.local import LocalNode
from collocate.sim.engine import Simulation
from collocate.sim.metrics import summarize
from collocate.sim.trace import TraceJob, Workload

# -- a policy -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pairs:
    """Toy policy: at most ``per_gpu`` jobs on a GPU, first fit, whatever their memory."""

    name: ClassVar[str] = "pairs"
    per_gpu: int = 2

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan:
        ledger = Ledger(cluster)
        for job in queue:
            gpus = pick_on_one_node(np.flatnonzero(ledger.n_jobs < self.per_gpu), cluster.gang_node, job.gpus)
            if gpus is not None:
                ledger.place(job, gpus)
        return ledger.plan()


def test_a_new_policy_is_registered_validated_and_simulated(monkeypatch):
    monkeypatch.setitem(policies._REGISTRY, "pairs", (Pairs, {}))
    with pytest.raises(InputError, match="per_gpu must be an integer 1 or more"):
        policies.make_policy("pairs", per_gpu="0")
    trace = [TraceJob(f"j{i}", 0.0, Workload(f"w{i}", 1, 600.0, 1000.0, {"peak": 1000.0}, JobProfile(0.3, 0.1)))
             for i in range(4)]
    result = Simulation(parse_cluster("2xA100-40GB"), trace, policies.make_policy("pairs", per_gpu="2")).run()
    s = summarize(result)
    assert s.done == 4
    assert len({r.start for r in result.records}) == 1  # all four started at once, two per GPU


# -- a GPU backend ------------------------------------------------------------------------------


class TwoFakeGpus:
    """Toy backend: two idle 16 GiB GPUs that only exist in memory."""

    name = "fake"
    emulated_state_dir = None  # jobs need no state dir to find their GPUs
    needs_mps_server = False

    def __init__(self, node: str) -> None:
        self.node = node

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(GpuId(self.node, i), f"GPU-fake-{i}", "fake", 16384.0, 1) for i in range(2)]

    def sample(self) -> list[DeviceSample]:
        return [DeviceSample(f"GPU-fake-{i}", 0.0, 0.0, 16384.0, sm_activity=0.0) for i in range(2)]

    def close(self) -> None:
        pass


def test_a_new_backend_is_opened_by_name_and_scheduled_on(monkeypatch, tmp_path):
    monkeypatch.setitem(registry.BACKENDS, "fake", lambda arg, state_dir, node: TwoFakeGpus(node))
    backend = registry.open_backend("fake", state_dir=tmp_path, node="here")
    monitor = GpuWatch(backend, window=3)
    monitor.read()
    monitor.observe({}, now=0.0)
    snapshot = monitor.snapshot(0.0)
    scheduler = Scheduler(policies.make_policy("exclusive"), Capacity.of(snapshot))
    assert scheduler.submit(Job("big", mem_mib=20_000.0, mem_source="declared")).reason.startswith("needs 20000 MiB")
    scheduler.submit(Job("pair", gpus=2, mem_mib=8000.0, mem_source="declared"))
    plan = scheduler.schedule(snapshot)
    assert [str(g) for g in plan.placements[0].gpus] == ["here:0", "here:1"]


# -- a monitoring sink --------------------------------------------------------------------------


class Recorder:
    """Toy sink: keeps what it is given."""

    name = "recorder"

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def job_started(self, job: JobInfo) -> None:
        self.events.append(("started", job.job_id))

    def write(self, tick) -> None:
        self.events.append(("tick", len(tick.gpus)))

    def job_ended(self, job_id: str, status: str) -> None:
        self.events.append(("ended", job_id, status))

    def close(self) -> None:
        self.events.append(("closed",))


def test_a_new_sink_receives_ticks_and_job_events(tmp_path: Path):
    backend = TwoFakeGpus("here")
    sink = Recorder()
    monitoring = UsageMonitor(tmp_path, backend.devices(), sinks=[sink])
    monitoring.job_started(JobInfo("1"))
    monitoring.tick(backend.sample(), {}, now=1.0)
    monitoring.job_ended("1", "done")
    monitoring.close()
    assert sink.events == [("started", "1"), ("tick", 2), ("ended", "1", "done"), ("closed",)]
    assert monitoring.status()["degraded"] is False


# -- a node -----------------------------------------------------------------------------------


class CountingNode(LocalNode):
    """Toy node: runs attempts on this machine, as ``LocalNode``, and counts what the daemon
    asks of it through the ``Node`` API (a node on another machine forwards each call there, as
    ``cluster.ray_head.RayNode`` does)."""

    def __init__(self, root: Path) -> None:
        super().__init__("here", root, backend=TwoFakeGpus("here"))
        self.calls: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def start(self, plan, part, head_root):
        self._count("start")
        return super().start(plan, part, head_root)

    def tick(self, parts):
        self._count("tick")
        return super().tick(parts)

    def read_trees(self, roots, now, gpu_pids):
        self._count("read_trees")
        return super().read_trees(roots, now, gpu_pids)


def test_a_new_node_runs_the_daemons_jobs(tmp_path: Path):
    node = CountingNode(tmp_path / "state")
    service = Service(ServeConfig(tmp_path / "state", policy="exclusive", period_s=0.05),
                      nodes=InProcessNodes([node]))
    service.open()
    loop = threading.Thread(target=service.serve_forever, daemon=True)
    loop.start()
    try:
        me = Peer(os.getuid(), os.getgid())
        job = service.call("submit", {"argv": [sys.executable, "-c", "pass"], "cwd": str(tmp_path),
                                      "mem": 1000}, me)
        deadline = time.monotonic() + 60
        while (state := service.call("show", {"id": job["id"]}, me)["state"]) not in ("done", "failed"):
            assert time.monotonic() < deadline, "the job did not end within 60 s"
            time.sleep(0.05)
    finally:
        service.stop()
        loop.join(timeout=10)
        service.close()
    assert state == "done"
    assert node.calls["start"] == 1 and node.calls["tick"] >= 1
    assert node.calls["read_trees"] >= 1
