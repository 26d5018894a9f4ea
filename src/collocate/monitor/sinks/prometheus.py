"""Prometheus exposition: per-GPU and per-job series from the latest tick, for Grafana.

``PrometheusSink`` is a ``Sink`` (the daemon writes each tick to it) and a prometheus_client
collector registered in its own ``CollectorRegistry`` (``sink.registry``), which the web app
serves at ``/metrics``. Why a custom collector and not ``Gauge`` objects: jobs come and go every
minute, and a collector that renders the latest tick drops a finished job's series by itself
instead of leaking label sets forever.

Series (labels ``gpu`` = GpuId text, ``uuid``; jobs also ``job``, ``user``):

* ``collocate_gpu_memory_used_bytes``, ``collocate_gpu_memory_total_bytes``,
  ``collocate_gpu_utilization_ratio``, ``collocate_gpu_sm_activity_ratio``,
  ``collocate_gpu_dram_activity_ratio``, ``collocate_gpu_power_watts``, ``collocate_gpu_jobs``,
  ``collocate_gpu_temperature_celsius``, ``collocate_gpu_sm_clock_hertz``,
  ``collocate_gpu_memory_clock_hertz`` (absent where the backend cannot read them: emulated GPUs),
  ``collocate_gpu_energy_joules_total`` (measured since the daemon started);
* ``collocate_job_gpu_memory_bytes`` and ``collocate_job_sm_activity_ratio`` (per job and GPU),
  ``collocate_job_energy_joules_total``, ``collocate_job_gpu_seconds_total`` (its share of GPU
  time), ``collocate_job_cpu_seconds_total``, ``collocate_job_cpu_cores``,
  ``collocate_job_memory_rss_bytes``;
* ``collocate_tracking_degraded`` per sink, when a status function is given;
* queue metrics, when a ``queue`` function is given (the daemon's job rows, as ``collocate ls
  --all`` has them): ``collocate_jobs{state}`` (every state, zeros included),
  ``collocate_jobs_waiting{wait}`` (pending jobs by why they wait: memory, busy, ...), and the
  counters ``collocate_oom_crashes_total`` (attempts that ran out of GPU memory),
  ``collocate_oom_recoveries_total`` (jobs that finished after at least one such crash) and
  ``collocate_placements_total`` (attempts launched). The counters are sums over the jobs the
  daemon's store keeps, so they survive a daemon restart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from collocate.monitor.sampler import Tick
from collocate.monitor.sinks.base import JobInfo

MIB = 1024 * 1024
GPU_LABELS = ["gpu", "uuid"]
JOB_LABELS = ["job", "user"]


class PrometheusSink:
    name = "prometheus"

    def __init__(self, *, status: Callable[[], list[dict[str, Any]]] | None = None,
                 queue: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self._lock = threading.Lock()
        self._tick: Tick | None = None
        self._gpu_energy: dict[str, float] = {}
        self._job_totals: dict[str, list[float]] = {}  # energy J, GPU s, CPU s
        self._status = status
        self.queue = queue  # settable later: the daemon has its job rows once its loop runs
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # -- Sink ------------------------------------------------------------------------------
    def job_started(self, job: JobInfo) -> None:
        """Nothing to do: a job's series appear with its first tick."""

    def write(self, tick: Tick) -> None:
        with self._lock:
            for g in tick.gpus:
                self._gpu_energy[g.uuid] = self._gpu_energy.get(g.uuid, 0.0) + (g.energy_j or 0.0)
            running = {j.job_id for j in tick.jobs}
            self._job_totals = {k: v for k, v in self._job_totals.items() if k in running}
            for j in tick.jobs:
                totals = self._job_totals.setdefault(j.job_id, [0.0, 0.0, 0.0])
                totals[0] += j.energy_j or 0.0
                totals[1] += j.gpu_time_s
                totals[2] += j.cpu_s
            self._tick = tick

    def job_ended(self, job_id: str, status: str) -> None:
        with self._lock:
            self._job_totals.pop(job_id, None)

    def close(self) -> None:
        """Nothing to release."""

    # -- collector -------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            tick, gpu_energy = self._tick, dict(self._gpu_energy)
            totals = {k: list(v) for k, v in self._job_totals.items()}
        yield from _gpu_metrics(tick, gpu_energy)
        yield from _job_metrics(tick, totals)
        if self._status is not None:
            degraded = GaugeMetricFamily("collocate_tracking_degraded",
                                         "1 while a tracking sink is failing and retried",
                                         labels=["sink"])
            for s in self._status():
                degraded.add_metric([str(s["sink"])], 1.0 if s["degraded"] else 0.0)
            yield degraded
        if self.queue is not None:
            yield from queue_metrics(self.queue())


def queue_metrics(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    """Jobs by state and by why they wait, and OOM/placement counters, from job rows."""
    from collocate.core.model import JobState

    by_state = {s.value: 0 for s in JobState}
    waiting: dict[str, int] = {}
    ooms = recoveries = placements = 0
    for r in rows:
        by_state[r["state"]] = by_state.get(r["state"], 0) + 1
        if r["state"] == JobState.PENDING:
            kind = r.get("wait") or "queue"
            waiting[kind] = waiting.get(kind, 0) + 1
        ooms += r.get("oom_crashes") or 0
        recoveries += bool(r.get("oom_crashes")) and r["state"] == JobState.DONE
        placements += r.get("attempts") or 0
    jobs = _gauge("collocate_jobs", "jobs in each state", ["state"])
    for state, n in by_state.items():
        jobs.add_metric([state], float(n))
    wait = _gauge("collocate_jobs_waiting", "pending jobs by why they wait", ["wait"])
    for kind, n in sorted(waiting.items()):
        wait.add_metric([kind], float(n))
    yield jobs
    yield wait
    yield CounterMetricFamily("collocate_oom_crashes", "attempts that ran out of GPU memory",
                              value=float(ooms))
    yield CounterMetricFamily("collocate_oom_recoveries", "jobs that finished after an OOM crash",
                              value=float(recoveries))
    yield CounterMetricFamily("collocate_placements", "attempts launched", value=float(placements))


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _gpu_metrics(tick: Tick | None, energy: dict[str, float]) -> Iterator[Metric]:
    fams = {
        "used": _gauge("collocate_gpu_memory_used_bytes", "GPU memory in use", GPU_LABELS),
        "total": _gauge("collocate_gpu_memory_total_bytes", "GPU memory size", GPU_LABELS),
        "util": _gauge("collocate_gpu_utilization_ratio",
                       "NVML utilization.gpu (kernel running), 0-1", GPU_LABELS),
        "sm": _gauge("collocate_gpu_sm_activity_ratio", "SM activity (GPM/DCGM), 0-1", GPU_LABELS),
        "dram": _gauge("collocate_gpu_dram_activity_ratio", "DRAM activity, 0-1", GPU_LABELS),
        "power": _gauge("collocate_gpu_power_watts", "board power", GPU_LABELS),
        "jobs": _gauge("collocate_gpu_jobs", "collocate jobs holding memory on the GPU",
                       GPU_LABELS),
        "temp": _gauge("collocate_gpu_temperature_celsius", "GPU temperature", GPU_LABELS),
        "sm_clock": _gauge("collocate_gpu_sm_clock_hertz", "SM clock now", GPU_LABELS),
        "mem_clock": _gauge("collocate_gpu_memory_clock_hertz", "memory clock now", GPU_LABELS),
    }
    joules = CounterMetricFamily("collocate_gpu_energy_joules",
                                 "energy measured since the daemon started", labels=GPU_LABELS)
    for g in tick.gpus if tick else ():
        labels, s = [g.gpu, g.uuid], g.sample
        values = {"used": s.used_mib * MIB, "total": g.total_mib * MIB, "util": s.gpu_util,
                  "sm": s.sm_activity, "dram": s.dram_activity, "power": s.power_watts,
                  "jobs": float(len(g.jobs)), "temp": s.temperature_c,
                  "sm_clock": None if s.sm_clock_mhz is None else s.sm_clock_mhz * 1e6,
                  "mem_clock": None if s.mem_clock_mhz is None else s.mem_clock_mhz * 1e6}
        for key, value in values.items():
            if value is not None:  # an unreadable metric is absent, never a made-up zero
                fams[key].add_metric(labels, float(value))
        joules.add_metric(labels, energy.get(g.uuid, 0.0))
    yield from fams.values()
    yield joules


def _job_metrics(tick: Tick | None, totals: dict[str, list[float]]) -> Iterator[Metric]:
    mem = _gauge("collocate_job_gpu_memory_bytes", "GPU memory the job holds",
                 [*JOB_LABELS, *GPU_LABELS])
    sm = _gauge("collocate_job_sm_activity_ratio", "the job's SM activity on the GPU, 0-1",
                [*JOB_LABELS, *GPU_LABELS])
    cores = _gauge("collocate_job_cpu_cores", "CPU cores the job's process tree uses", JOB_LABELS)
    rss = _gauge("collocate_job_memory_rss_bytes", "host memory of the job's process tree",
                 JOB_LABELS)
    energy = CounterMetricFamily("collocate_job_energy_joules",
                                 "GPU energy attributed to the job", labels=JOB_LABELS)
    gpu_s = CounterMetricFamily("collocate_job_gpu_seconds",
                                "the job's share of GPU time", labels=JOB_LABELS)
    cpu_s = CounterMetricFamily("collocate_job_cpu_seconds",
                                "CPU time of the job's process tree", labels=JOB_LABELS)
    gpu_names = {g.uuid: g.gpu for g in tick.gpus} if tick else {}
    for j in tick.jobs if tick else ():
        labels = [j.job_id, j.user]
        for share in j.gpus:
            gl = [*labels, gpu_names.get(share.uuid, share.uuid), share.uuid]
            mem.add_metric(gl, share.mem_mib * MIB)
            sm.add_metric(gl, share.sm_activity)
        cores.add_metric(labels, j.cpu_percent / 100.0)
        rss.add_metric(labels, j.rss_mib * MIB)
        e, g, c = totals.get(j.job_id, (0.0, 0.0, 0.0))
        energy.add_metric(labels, e)
        gpu_s.add_metric(labels, g)
        cpu_s.add_metric(labels, c)
    yield from (mem, sm, cores, rss, energy, gpu_s, cpu_s)
