"""Jobs' own metrics: the helper writes JSON lines, the tail reads them once, bad lines skipped."""

from __future__ import annotations

import json

import pytest

from collocate.monitor import ENV_METRICS_FILE, log_metric
from collocate.monitor.job_metrics import MetricsTail, metrics_env


def test_log_metric_is_a_no_op_outside_the_daemon(monkeypatch):
    monkeypatch.delenv(ENV_METRICS_FILE, raising=False)
    assert log_metric("loss", 0.1) is False


def test_log_metric_appends_json_lines_and_validates(monkeypatch, tmp_path):
    env = metrics_env(tmp_path)
    monkeypatch.setenv(ENV_METRICS_FILE, env[ENV_METRICS_FILE])
    assert log_metric("loss", 0.5, step=3) and log_metric("samples_per_s", 812)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(d["key"], d["value"], d.get("step")) for d in lines] == [
        ("loss", 0.5, 3), ("samples_per_s", 812.0, None)]
    with pytest.raises(ValueError, match="finite"):
        log_metric("loss", float("nan"))
    with pytest.raises(ValueError, match="key"):
        log_metric("", 1.0)


def test_tail_reads_new_lines_once_keeps_partial_lines_and_skips_bad_ones(tmp_path, caplog):
    path = tmp_path / "m.jsonl"
    tail = MetricsTail()
    assert tail.read({"1": path}) == []  # not written yet
    path.write_text('{"t": 1, "key": "loss", "value": 0.9, "step": 1}\nnot json\n{"t": 2, "ke')
    first = tail.read({"1": path})
    assert [(p.key, p.value, p.step) for p in first] == [("loss", 0.9, 1)]
    assert tail.bad_lines == {"1": 1} and "invalid metric" in caplog.text
    with open(path, "a") as f:
        f.write('y": "loss", "value": 0.8}\n{"key": "acc", "value": "inf"}\n')
    second = tail.read({"1": path})
    assert [(p.time, p.key, p.value) for p in second] == [(2.0, "loss", 0.8)]
    assert tail.bad_lines == {"1": 2}  # "inf" is not a finite value
    assert tail.read({"1": path}) == []
    other = tmp_path / "attempt-2.jsonl"  # a new attempt starts a new file from its beginning
    other.write_text('{"t": 5, "key": "loss", "value": 0.7}\n')
    assert [p.value for p in tail.read({"1": other})] == [0.7]
    assert tail.read({}) == [] and tail._fds == {}
