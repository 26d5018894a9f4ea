"""The attribution rule under MPS: per-process readings are the MPS server's, never the jobs'."""

from __future__ import annotations

import pytest

from collocate.gpus.base import DeviceSample, ProcessUsage
from collocate.monitor.attribution import OTHER, attribute

SERVER = 99  # the MPS server: holds a little memory and, per NVML, all of its clients' SM


def _sample(t: float, sm: float) -> DeviceSample:
    return DeviceSample("GPU-0", t, 9000, 72000, sm_activity=sm, energy_joules=1000.0 * t,
                        processes=(ProcessUsage(SERVER, 66, 0.6), ProcessUsage(11, 5000, 0.0),
                                   ProcessUsage(22, 4000, 0.0)))


def test_mps_readings_are_split_among_the_jobs_by_what_they_are_expected_to_draw():
    a = attribute(_sample(0.0, 0.6), _sample(10.0, 0.6), {11: "a", 22: "b"}, idle_watts=70.0,
                  helpers=frozenset({SERVER}), expected={"a": 0.3, "b": 0.1})
    assert set(a.shares) == {"a", "b"}  # the server is no owner: nothing goes to <other>
    assert a.shares["a"].sm_activity == pytest.approx(0.45)  # 0.6 split 3:1
    assert a.shares["b"].sm_activity == pytest.approx(0.15)
    assert a.shares["a"].gpu_time_s == pytest.approx(7.5) and a.shares["b"].gpu_time_s == pytest.approx(2.5)
    assert sum(s.energy_j for s in a.shares.values()) == pytest.approx(10000.0)


def test_without_the_rule_the_server_took_everything():
    a = attribute(_sample(0.0, 0.6), _sample(10.0, 0.6), {11: "a", 22: "b"}, idle_watts=70.0)
    assert a.shares["a"].sm_activity == 0.0 and a.shares[OTHER].sm_activity == pytest.approx(0.6)
    # and with no expectations the reading is split equally
    a = attribute(_sample(0.0, 0.6), _sample(10.0, 0.6), {11: "a", 22: "b"}, idle_watts=70.0,
                  helpers=frozenset({SERVER}))
    assert a.shares["a"].sm_activity == pytest.approx(0.3) == a.shares["b"].sm_activity
