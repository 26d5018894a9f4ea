"""`UsageMonitor` end to end on the emulated backend; a failing store degrades, never raises."""

from __future__ import annotations

import sqlite3

from collocate.monitor.service import UsageMonitor
from collocate.monitor.sinks.base import JobInfo


def test_ticks_reach_the_store_and_a_broken_store_only_degrades(backend, claimer, tmp_path):
    job = claimer(0, 3000, 0.5)
    mon = UsageMonitor(tmp_path, backend.devices())
    mon.job_started(JobInfo("1"))
    for _ in range(3):
        mon.tick(backend.sample(), {"1": job.pid})
    summary = mon.store.job_summary("1")
    assert summary is not None and summary.peak_mib == 3000 and summary.energy_wh > 0
    detail = mon.job_detail("1")
    assert detail["summary"]["peak_mib"] == 3000 and len(detail["samples"]) == 3
    assert mon.status() == {"degraded": False, "tracking": [
        {"sink": "store", "degraded": False, "reason": None, "pending": 0, "dropped": 0,
         "retry_in_s": 0.0}]}
    mon.store.db.execute("DROP TABLE mon_gpu")  # what a corrupted or full disk looks like
    tick = mon.tick(backend.sample(), {"1": job.pid})
    assert tick.jobs[0].gpu_mem_mib == 3000  # sampling goes on
    status = mon.status()
    assert status["degraded"] and "mon_gpu" in status["tracking"][0]["reason"]
    mon.close()
    assert not isinstance(mon.store.db, type(None))
    try:
        mon.store.db.execute("SELECT 1")
        closed = False
    except sqlite3.ProgrammingError:
        closed = True
    assert closed
