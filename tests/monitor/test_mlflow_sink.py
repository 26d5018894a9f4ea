"""The MLflow sink against a real local MLflow store (SQLite backend, fully offline)."""

from __future__ import annotations

import pytest

pytest.importorskip("mlflow", reason="the MLflow sink is optional: pip install 'collocate[mlflow]'")
pytest.importorskip("sqlalchemy", reason="MLflow's SQLite store needs sqlalchemy and alembic")

from mlflow.tracking import MlflowClient

from collocate.monitor.job_metrics import MetricPoint
from collocate.monitor.sampler import Tick
from collocate.monitor.sinks.base import GuardedSink, JobInfo
from collocate.monitor.sinks.mlflow_sink import MlflowSink, default_tracking_uri
from collocate.monitor.store import MonitorStore

from .test_store import run_ticks


@pytest.mark.slow
def test_one_run_per_job_with_params_tags_system_and_own_metrics(tmp_path):
    uri = default_tracking_uri(tmp_path)
    sink = MlflowSink(uri, flush_every_s=3600, system_every_s=2)
    sink.job_started(JobInfo("1", name="resnet", user="ann", argv=("python", "train.py"),
                             gpus=("n:0",), sharing="time-slicing", policy="auto"))
    ticks = run_ticks(MonitorStore(tmp_path / "m.sqlite"), 4)
    for tick in ticks:
        sink.write(tick)
        sink.write(tick)  # a retried tick is not buffered twice
    last = ticks[-1]
    sink.write(Tick(last.time + 1, (), (), (MetricPoint("1", last.time, "loss", 0.25, 40),)))
    sink.job_ended("1", "done")
    sink.close()  # flushes job 2, whose run was created on the fly

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("collocate")
    runs = {r.data.tags["collocate.job_id"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"1", "2"}
    one = runs["1"]
    assert one.info.status == "FINISHED" and one.info.run_name == "job-1-resnet"
    assert one.data.params == {"command": "python train.py", "gpus": "n:0",
                               "sharing": "time-slicing", "policy": "auto"}
    assert one.data.tags["collocate.neighbours"] == "2"
    assert one.data.tags["collocate.user"] == "ann"
    mem = client.get_metric_history(one.info.run_id, "system/gpu_mem_mib")
    assert [(m.value, m.timestamp) for m in mem] == [(3000.0, 1_000_000), (3000.0, 1_002_000)]
    energy = client.get_metric_history(one.info.run_id, "system/energy_wh")  # every 2 s
    assert energy[-1].value == pytest.approx(2 * (27.5 + 245 * 0.75) / 3600)
    loss = client.get_metric_history(one.info.run_id, "loss")
    assert [(m.value, m.step) for m in loss] == [(0.3, 7), (0.25, 40)]
    assert runs["2"].info.status == "RUNNING"


def test_unreachable_tracking_server_degrades_without_raising(tmp_path):
    # nothing listens on port 9 (discard); the sink fails fast and the guard keeps going
    guarded = GuardedSink(MlflowSink("http://127.0.0.1:9", flush_every_s=0))
    guarded.job_started(JobInfo("1"))
    assert guarded.degraded and guarded.status()["pending"] == 1
    assert "127.0.0.1:9" in guarded.reason or "Connection" in guarded.reason
