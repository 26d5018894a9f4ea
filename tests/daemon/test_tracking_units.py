"""The daemon's monitoring options and guards, in process: no daemon needed."""

from __future__ import annotations

import logging
import sys

import pytest

from collocate.client.render import measured_lines, tracking_line
from collocate.common.errors import CollocateError, InputError
from collocate.core.model import GpuId
from collocate.daemon.cli import _tracking_config
from collocate.daemon.tracking import DaemonTracking, TrackingConfig, parse_dashboard
from collocate.gpus.base import DeviceInfo


def test_dashboard_address_defaults_to_loopback():
    assert parse_dashboard("8765") == ("127.0.0.1", 8765)
    assert parse_dashboard("0.0.0.0:0") == ("0.0.0.0", 0)
    assert parse_dashboard("[::1]:80") == ("::1", 80)
    with pytest.raises(InputError, match="HOST:PORT"):
        parse_dashboard("localhost:http")


def test_dashboard_always_has_a_token_unless_opted_out_and_then_only_on_loopback():
    config = _tracking_config("0.0.0.0:8765", None, False, None)  # a random token at start
    assert config.dashboard == ("0.0.0.0", 8765) and config.dashboard_auth
    assert config.dashboard_token is None
    with pytest.raises(InputError, match="cannot go without a token"):
        _tracking_config("0.0.0.0:8765", None, False, None, dashboard_auth=False)
    config = _tracking_config("0.0.0.0:8765", "t" * 16, False, None)
    assert config.dashboard_token == "t" * 16
    assert not _tracking_config("8765", None, False, None, dashboard_auth=False).dashboard_auth


def test_mlflow_flag_without_mlflow_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # find_spec then reports it missing
    with pytest.raises(CollocateError) as err:
        _tracking_config(None, None, True, None)
    assert "pip install 'collocate[mlflow]'" in str(err.value)


def test_mlflow_options_pick_the_local_store_or_a_uri():
    pytest.importorskip("mlflow")
    assert _tracking_config(None, None, True, None).mlflow_uri == ""  # the state dir's store
    assert _tracking_config(None, None, False, "http://h:5000").mlflow_uri == "http://h:5000"
    assert _tracking_config(None, None, False, None).mlflow_uri is None


def test_a_failing_sampler_never_raises_into_the_loop(tmp_path, caplog):
    device = DeviceInfo(GpuId("n", 0), "GPU-x", "A100-40GB", 40960.0, 108)
    tracking = DaemonTracking(tmp_path, [device], TrackingConfig())

    def broken(*args, **kwargs):
        raise RuntimeError("sampler bug")

    tracking.mon.tick = broken
    with caplog.at_level(logging.DEBUG, logger="collocate.daemon"):
        tracking.tick([], {})
        tracking.tick([], {})
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "scheduling goes on" in errors[0].getMessage()  # logged once
    assert tracking.summary("1") is None  # no samples yet
    tracking.close()


def test_show_and_gpus_lines():
    summary = {"job_id": "1", "user": "u", "name": "n", "first": 0.0, "last": 1.0,
               "peak_mib": 1500.0, "mean_sm": 0.5, "gpu_hours": 0.25, "occupancy_hours": 0.5,
               "energy_wh": 12.5, "cpu_hours": 0.1, "peak_rss_mib": 100.0, "gpus": ["GPU-x"]}
    lines = measured_lines(summary)
    assert lines[0] == "measured" and any("12.50 Wh" in line for line in lines)
    assert measured_lines(None) == []
    ok = {"tracking": [{"sink": "store", "degraded": False}]}
    assert tracking_line(ok) is None
    bad = {"tracking": [{"sink": "mlflow", "degraded": True, "reason": "connection refused",
                         "pending": 3, "dropped": 0, "retry_in_s": 4.0}]}
    assert tracking_line(bad).startswith("tracking degraded: mlflow (connection refused")


def test_an_mlflow_uri_mlflow_refuses_is_a_clear_error(tmp_path):
    pytest.importorskip("mlflow")
    device = DeviceInfo(GpuId("n", 0), "GPU-x", "A100-40GB", 40960.0, 108)
    with pytest.raises(CollocateError, match="cannot track in MLflow at bogus://x") as err:
        DaemonTracking(tmp_path, [device], TrackingConfig(mlflow_uri="bogus://x"))
    assert "--mlflow-uri" in str(err.value)
