"""The monitoring store: totals outlive retention, retention bounds age and rows, sums add up."""

from __future__ import annotations

import pytest

from collocate.core.model import GpuId
from collocate.gpus.base import DeviceInfo, DeviceSample, ProcessUsage
from collocate.monitor.job_metrics import MetricPoint
from collocate.monitor.sampler import Tick, UsageJob, UsageSampler
from collocate.monitor.store import MonitorStore, Retention

UUID = "GPU-t-0"
DEVICE = DeviceInfo(GpuId("n", 0), UUID, "A100-40GB", 40_536, 108)


def run_ticks(store: MonitorStore, n: int, *, t0: float = 1000.0, dt: float = 1.0) -> list[Tick]:
    """n ticks of one GPU at a steady 300 W (counter) shared by jobs 1 (0.6 SM) and 2 (0.2 SM)."""
    sampler = UsageSampler([DEVICE])
    procs = (ProcessUsage(101, 3000, 0.6), ProcessUsage(202, 1000, 0.2))
    ticks = []
    for i in range(n):
        t = t0 + i * dt
        s = DeviceSample(UUID, t, 4000, 36_536, 1.0, 0.8, None, 0.1, 300.0, 300.0 * i * dt, procs)
        # the pids are not real processes: owner_of falls back to the given root pids
        tick = sampler.observe([s], {"1": UsageJob(101, user="ann"), "2": UsageJob(202, user="bob")},
                               now=t)
        if i == 1:
            tick = Tick(tick.time, tick.gpus, tick.jobs, (MetricPoint("1", t, "loss", 0.3, 7),))
        store.write(tick)
        ticks.append(tick)
    return ticks


def test_summary_totals_match_the_device_energy(tmp_path):
    store = MonitorStore(tmp_path / "m.sqlite")
    run_ticks(store, 11)
    one, two = store.job_summary("1"), store.job_summary("2")
    assert one is not None and two is not None and store.job_summary("nope") is None
    # 10 intervals x 300 J = 3000 J = 0.8333 Wh; idle 55 W (A100-40GB) split equally
    assert one.energy_wh + two.energy_wh == pytest.approx(3000 / 3600)
    assert one.energy_wh == pytest.approx((10 * 27.5 + 10 * 245 * 0.75) / 3600)
    assert one.gpu_hours == pytest.approx(7.5 / 3600)
    assert one.occupancy_hours == pytest.approx(10 / 3600)
    assert one.mean_sm == pytest.approx(0.6) and one.peak_mib == 3000
    assert one.user == "ann" and one.gpus == (UUID,)
    gpu = store.gpu_totals()[0]
    assert gpu["energy_j"] == pytest.approx(3000) and gpu["seconds"] == pytest.approx(10)
    assert store.metrics("1") == [{"t": 1001.0, "key": "loss", "value": 0.3, "step": 7}]
    window = {s.job_id: s for s in store.job_summaries(since=1005.0)}
    assert window["1"].energy_wh == pytest.approx(6 * (27.5 + 245 * 0.75) / 3600)
    assert window["1"].gpus == (UUID,)


def test_retention_by_age_and_rows_keeps_totals(tmp_path):
    store = MonitorStore(tmp_path / "m.sqlite",
                         retention=Retention(max_age_s=5.0, max_rows=4, prune_every_s=0))
    run_ticks(store, 20)
    counts = store.row_counts()
    assert counts["mon_gpu"] == 4 and counts["mon_job"] == 4  # row cap beats the 5 s age
    assert counts["mon_metric"] == 0  # logged at t=1001, older than 5 s
    assert [r["t"] for r in store.gpu_series()] == [1016.0, 1017.0, 1018.0, 1019.0]
    assert store.job_summary("1").energy_wh + store.job_summary("2").energy_wh == pytest.approx(
        19 * 300 / 3600)
    store.prune(10_000.0)
    assert store.row_counts() == {"mon_gpu": 0, "mon_job": 0, "mon_metric": 0}
    assert store.job_summary("1") is not None


def test_bad_retention_is_refused():
    with pytest.raises(ValueError, match="max_age_s"):
        Retention(max_age_s=0)


def test_history_buckets_gpus_and_users_with_committed_memory(tmp_path):
    """The dashboard's history: per GPU used beside committed memory, per user GPUs held and
    energy, in at most ``points`` buckets however long the range; a store of before (no
    committed column) is upgraded on open."""
    import dataclasses
    import sqlite3

    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE mon_gpu (t REAL NOT NULL, uuid TEXT NOT NULL, gpu TEXT NOT NULL,"
                   " used_mib REAL, total_mib REAL, gpu_util REAL, sm REAL, occ REAL, dram REAL,"
                   " power_w REAL, energy_j REAL, jobs TEXT NOT NULL)")
    store = MonitorStore(old)
    for tick in run_ticks(MonitorStore(tmp_path / "scratch.sqlite"), 11):
        store.write(dataclasses.replace(tick, committed={UUID: 6000.0}))
    h = store.history(1000.0, 1010.0, points=5)
    assert h["step_s"] == 2.0 and len(h["gpus"]) == 1 and len(h["gpus"][0]["points"]) == 6
    point = h["gpus"][0]["points"][0]
    assert point["used_mib"] == 4000 and point["committed_mib"] == 6000.0 and point["util"] == 0.8
    users = {u["user"]: u["points"] for u in h["users"]}
    assert set(users) == {"ann", "bob"}
    assert sum(p["energy_wh"] for p in users["ann"]) + sum(p["energy_wh"] for p in users["bob"]) == \
        pytest.approx(3000 / 3600)
    assert users["ann"][1]["gpus"] == pytest.approx(0.75)  # its share of the GPU's time


def test_history_draws_gaps_as_gaps(tmp_path):
    """Every bucket of the range has a point: None where the daemon sampled nothing (it was
    down), and for a user zero where the daemon sampled but she held no GPU, so a chart never
    draws a line across from her last job to her next (issue 37: 0.2 GPUs shown held of none)."""
    store = MonitorStore(tmp_path / "m.sqlite")
    sampler = UsageSampler([DEVICE])
    procs = (ProcessUsage(101, 3000, 0.6), ProcessUsage(202, 1000, 0.2))
    for t in [*range(1000, 1010), *range(1030, 1040)]:  # down from 1010 to 1030
        ann_runs = t < 1005 or t >= 1035  # ann's jobs: before and after a quiet spell
        jobs = {"2": UsageJob(202, user="bob")}
        if ann_runs:
            jobs["1"] = UsageJob(101, user="ann")
        held = procs if ann_runs else procs[1:]
        s = DeviceSample(UUID, float(t), 4000, 36_536, 1.0, 0.8, None, 0.1, 300.0, 300.0 * t, held)
        store.write(sampler.observe([s], jobs, now=float(t)))
    h = store.history(1000.0, 1039.0, points=8)  # 5 s buckets
    assert h["step_s"] == pytest.approx(39 / 8)
    gpu = h["gpus"][0]["points"]
    assert len(gpu) == 9 and [p["t"] for p in gpu] == sorted(p["t"] for p in gpu)
    down = [p for p in gpu if 1011 <= p["t"] <= 1029]
    assert down and all(p["util"] is None and p["used_mib"] is None for p in down)
    ann = {round(p["t"]): p["gpus"] for p in next(u for u in h["users"] if u["user"] == "ann")["points"]}
    assert all(v is None for t, v in ann.items() if 1011 <= t <= 1029)  # not sampled: unknown
    quiet = [v for t, v in ann.items() if 1006 <= t <= 1009 or 1031 <= t <= 1033]
    assert quiet and all(v == 0.0 for v in quiet)  # sampled, held nothing: zero, not a line across
    assert ann[min(ann)] > 0 and ann[max(ann)] > 0
