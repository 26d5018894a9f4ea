"""Sinks: failures degrade and retry with backoff; the Prometheus text is valid and complete."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collocate.monitor.sampler import Tick
from collocate.monitor.sinks.base import GuardedSink, JobInfo, SinkSet
from collocate.monitor.sinks.prometheus import PrometheusSink

from .test_store import run_ticks


class FlakySink:
    name = "flaky"

    def __init__(self) -> None:
        self.down = False
        self.calls: list[tuple] = []

    def job_started(self, job):
        self._maybe_fail()
        self.calls.append(("start", job.job_id))

    def write(self, tick):
        self._maybe_fail()
        self.calls.append(("write", tick))

    def job_ended(self, job_id, status):
        self._maybe_fail()
        self.calls.append(("end", job_id, status))

    def close(self):
        raise OSError("disk full")

    def _maybe_fail(self):
        if self.down:
            raise OSError("No space left on device")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_failure_logs_once_backs_off_and_delivers_in_order(caplog):
    sink, clock = FlakySink(), Clock()
    guarded = GuardedSink(sink, base_backoff_s=1.0, max_backoff_s=4.0, max_pending=3, clock=clock)
    guarded.job_started(JobInfo("1"))
    sink.down = True
    with caplog.at_level(logging.WARNING, logger="collocate.monitor"):
        for i in range(5):  # tries at t=0 and t=1 fail (next at t=3); the rest wait
            guarded.job_ended(str(i), "done")
            clock.t += 0.5
    assert guarded.degraded and "No space left" in guarded.reason
    assert guarded.failures == 2 and guarded.status()["retry_in_s"] == pytest.approx(0.5)
    assert guarded.dropped == 2 and guarded.status()["pending"] == 3  # bounded queue
    assert len([r for r in caplog.records if "failed" in r.message]) == 1  # logged once
    sink.down = False
    clock.t += 1.0
    guarded.flush()
    assert not guarded.degraded and guarded.reason is None
    assert sink.calls == [("start", "1"), ("end", "2", "done"), ("end", "3", "done"),
                          ("end", "4", "done")]


def test_backoff_doubles_up_to_the_cap():
    sink, clock = FlakySink(), Clock()
    sink.down = True
    guarded = GuardedSink(sink, base_backoff_s=1.0, max_backoff_s=4.0, clock=clock)
    waits = []
    guarded.job_ended("1", "done")
    for _ in range(5):
        waits.append(guarded.status()["retry_in_s"])
        clock.t += waits[-1]
        guarded.flush()
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]


def test_sink_set_never_raises_and_reports_status():
    sinks = SinkSet([FlakySink()])
    sinks.sinks[0].sink.down = True
    sinks.job_started(JobInfo("1"))
    sinks.close()  # the sink's close raises; the set does not
    assert sinks.degraded and sinks.status()[0]["sink"] == "flaky"


def test_prometheus_output_parses_with_per_gpu_and_per_job_series(tmp_path):
    from collocate.monitor.store import MonitorStore

    sink = PrometheusSink(status=lambda: [{"sink": "mlflow", "degraded": True}])
    for tick in run_ticks(MonitorStore(tmp_path / "m.sqlite"), 3):
        sink.write(tick)
    text = generate_latest(sink.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    used = families["collocate_gpu_memory_used_bytes"].samples[0]
    assert used.labels == {"gpu": "n:0", "uuid": "GPU-t-0"} and used.value == 4000 * 2**20
    energy = {s.labels["job"]: s.value for s in families["collocate_job_energy_joules"].samples
              if s.name.endswith("_total")}
    assert energy["1"] + energy["2"] == pytest.approx(600.0)  # 2 intervals x 300 J
    gpu_energy = families["collocate_gpu_energy_joules"].samples[0]
    assert gpu_energy.name == "collocate_gpu_energy_joules_total" and gpu_energy.value == 600.0
    sm = {s.labels["job"]: s.value for s in families["collocate_job_sm_activity_ratio"].samples}
    assert sm == {"1": pytest.approx(0.6), "2": pytest.approx(0.2)}
    assert families["collocate_tracking_degraded"].samples[0].value == 1.0
    assert "# TYPE collocate_job_gpu_seconds_total counter" in text
    assert "collocate_gpu_occ" not in text and 'collocate_gpu_power_watts{gpu="n:0"' in text
    last = run_ticks(MonitorStore(tmp_path / "n.sqlite"), 2)[-1]
    sink.job_ended("1", "done")
    sink.write(Tick(last.time, last.gpus, tuple(j for j in last.jobs if j.job_id != "1")))
    after = generate_latest(sink.registry).decode()
    assert 'job="1"' not in after and 'job="2"' in after  # a finished job's series go away


def test_background_delivery_keeps_the_caller_fast_and_in_order():
    import threading
    import time

    release = threading.Event()

    class SlowSink(FlakySink):
        def job_started(self, job):
            release.wait(10)  # like MLflow creating its database
            super().job_started(job)

    sink = SlowSink()
    sink.background = True  # what MlflowSink declares
    sinks = SinkSet([sink])
    t0 = time.monotonic()
    sinks.job_started(JobInfo("1"))
    sinks.job_ended("1", "done")
    assert time.monotonic() - t0 < 5.0  # the caller only queued: delivering would wait out the sink's 10 s
    assert sinks.status()[0]["pending"] == 2
    release.set()
    deadline = time.monotonic() + 10
    while sinks.status()[0]["pending"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sink.calls == [("start", "1"), ("end", "1", "done")]
    sinks.close()  # FlakySink.close raises: logged, not raised
    assert not sinks.sinks[0]._worker.is_alive()
