"""``UsageMonitor``: the one object the daemon holds for sampling, storage and sinks.

It wires the pieces in the order a tick needs them: ``UsageSampler.observe`` on the samples the
daemon's loop already read, then the store and every sink, each behind ``GuardedSink``, so a
full disk or an unreachable MLflow degrades tracking (visible in ``status()``) and never raises
into the scheduling loop. Sampling itself does raise on programming errors; the daemon's loop
already logs and survives those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from collocate.gpus.base import DeviceInfo, DeviceSample
from collocate.monitor.job_metrics import MetricPoint
from collocate.monitor.process_tree import TreeUsage
from collocate.monitor.sampler import Tick, UsageJob, UsageSampler
from collocate.monitor.sinks.base import JobInfo, Sink, SinkSet
from collocate.monitor.store import MonitorStore, Retention, monitor_db_path


class StoreSink:
    """The monitoring store as a sink, so its write failures are guarded like any sink's."""

    name = "store"

    def __init__(self, store: MonitorStore, *, background: bool = False) -> None:
        self.store = store
        self.background = background  # written from the sink's worker thread (``SinkSet``)

    def job_started(self, job: JobInfo) -> None:
        """Jobs appear in the store with their first tick."""

    def write(self, tick: Tick) -> None:
        self.store.write(tick)

    def job_ended(self, job_id: str, status: str) -> None:
        """Totals are already current; nothing to close."""

    def close(self) -> None:
        self.store.close()


class UsageMonitor:
    """UsageSampler + store + sinks for one daemon. Call from the daemon's loop thread only
    (``status`` and the store's reads are safe from other threads)."""

    def __init__(self, state_dir: Path, devices: Sequence[DeviceInfo], *,
                 sinks: Sequence[Sink] = (), retention: Retention | None = None,
                 idle_watts: Mapping[str, float] | None = None, store_in_background: bool = False) -> None:
        """``store_in_background``: ticks are written to the store from a worker thread, so
        the caller's loop does not wait for SQLite (the daemon's round, where a cluster's tick
        is thousands of rows); reads see a tick a moment after ``tick`` returns."""
        self.store = MonitorStore(monitor_db_path(state_dir), retention=retention)
        self.sampler = UsageSampler(devices, idle_watts=idle_watts)
        self.sinks = SinkSet([StoreSink(self.store, background=store_in_background), *sinks])
        self.last: Tick | None = None

    def tick(self, samples: Sequence[DeviceSample], jobs: Mapping[str, int | UsageJob],
             now: float | None = None, *, trees: Mapping[str, TreeUsage] | None = None,
             metrics: Sequence[MetricPoint] | None = None,
             committed: Mapping[str, float] | None = None) -> Tick:
        """One sampling period: attribute, store, export. Returns the tick for the dashboard.
        ``trees`` and ``metrics``: the jobs' process trees and new metric points, when the
        caller read them this tick (``UsageSampler.observe``); ``committed``: MiB committed on
        each GPU (by uuid), stored beside what is used."""
        tick = self.sampler.observe(samples, jobs, now, trees=trees, metrics=metrics)
        if committed:
            tick = replace(tick, committed=dict(committed))
        self.sinks.write(tick)
        self.last = tick
        return tick

    def job_started(self, job: JobInfo) -> None:
        self.sinks.job_started(job)

    def job_ended(self, job_id: str, status: str) -> None:
        self.sinks.job_ended(job_id, status)

    def job_detail(self, job_id: str, *, samples: int = 600) -> dict[str, Any]:
        """The monitoring part of a job's dashboard detail (``DashboardSource.job`` keys)."""
        summary = self.store.job_summary(job_id)
        return {"summary": None if summary is None else summary.to_dict(),
                "samples": self.store.job_series(job_id, limit=samples),
                "metrics": self.store.metrics(job_id, limit=samples)}

    def status(self) -> dict[str, Any]:
        """``{"degraded": bool, "tracking": [per-sink status]}``: for `collocate gpus`, the page."""
        return {"degraded": self.sinks.degraded, "tracking": self.sinks.status()}

    def close(self) -> None:
        self.sinks.close()
        self.sampler.close()
