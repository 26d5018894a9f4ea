"""The sampler against the real emulated backend with real processes holding emulated memory."""

from __future__ import annotations

import math
import time

import pytest

from collocate.monitor.job_metrics import log_metric
from collocate.monitor.sampler import UsageJob, UsageSampler

from .conftest import NODE


def test_two_jobs_sharing_a_gpu_split_its_energy_exactly(backend, claimer, tmp_path):
    a = claimer(0, 4000, 0.6)
    b = claimer(0, 2000, 0.2)
    c = claimer(1, 1000, 0.5)
    metrics = tmp_path / "m.jsonl"
    jobs = {"1": UsageJob(a.pid, user="ann", metrics_file=metrics), "2": b.pid, "3": c.pid}
    sampler = UsageSampler.for_backend(backend)
    first = sampler.tick(backend, jobs)
    assert all(g.energy_j is None for g in first.gpus)  # no interval yet...
    assert {j.job_id: j.gpu_mem_mib for j in first.jobs} == {"1": 4000, "2": 2000, "3": 1000}
    log_metric("loss", 0.5, step=1, path=str(metrics))
    time.sleep(0.3)
    tick = sampler.tick(backend, jobs)
    gpu0 = next(g for g in tick.gpus if g.uuid == f"GPU-emu-{NODE}-0")
    assert gpu0.jobs == ("1", "2") and gpu0.energy_source == "counter"
    jobs_by_id = {j.job_id: j for j in tick.jobs}
    shares = [jobs_by_id[j].gpus[0] for j in ("1", "2")]
    assert math.isclose(sum(s.energy_j for s in shares) + gpu0.other_energy_j + gpu0.idle_energy_j,
                        gpu0.energy_j, rel_tol=1e-9)
    assert gpu0.other_energy_j == 0 and gpu0.idle_energy_j == 0
    assert shares[0].energy_j > shares[1].energy_j  # 0.6 vs 0.2 SM activity
    assert shares[0].gpu_time_s == pytest.approx(0.75 * gpu0.interval_s)
    assert jobs_by_id["1"].gpu_mem_mib == 4000 and jobs_by_id["1"].user == "ann"
    assert jobs_by_id["1"].nprocs == 1 and jobs_by_id["1"].rss_mib > 1
    assert jobs_by_id["1"].read_bytes is not None  # our own child: /proc/<pid>/io is readable
    assert [(m.job_id, m.key, m.value, m.step) for m in tick.metrics] == [("1", "loss", 0.5, 1)]


def test_gone_job_and_empty_gpu(backend, claimer):
    a = claimer(0, 1000, 0.5)
    sampler = UsageSampler.for_backend(backend)
    sampler.tick(backend, {"1": a.pid})
    a.kill()
    a.wait()
    time.sleep(0.05)
    tick = sampler.tick(backend, {"1": a.pid})
    job = tick.jobs[0]
    assert job.nprocs == 0 and job.cpu_s == 0
    gpu1 = next(g for g in tick.gpus if g.uuid.endswith("-1"))
    assert gpu1.jobs == () and gpu1.idle_energy_j == pytest.approx(gpu1.energy_j)
