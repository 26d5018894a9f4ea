"""The attribution rule: exact sums, no negative shares, and the hand-computable cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.gpus.base import DeviceSample, ProcessUsage
from collocate.monitor.attribution import IDLE, OTHER, attribute, interval_energy


def sample(t: float, energy: float | None = None, power: float | None = None,
           procs: tuple[ProcessUsage, ...] = ()) -> DeviceSample:
    return DeviceSample("GPU-x", t, used_mib=sum(p.used_mib for p in procs), free_mib=0.0,
                        power_watts=power, energy_joules=energy, processes=procs)


def test_counter_delta_split_by_utilization_after_equal_idle_part():
    procs = (ProcessUsage(10, 1000, 0.6), ProcessUsage(20, 500, 0.2))
    a = attribute(sample(0, 1000.0, procs=procs), sample(10, 3000.0, procs=procs),
                  {10: "a", 20: "b"}, idle_watts=50.0)
    assert a.energy_source == "counter" and a.energy_j == 2000.0
    # idle 50 W x 10 s = 500 J split equally; the other 1500 J split 3:1
    assert a.shares["a"].energy_j == pytest.approx(250 + 1125)
    assert a.shares["b"].energy_j == pytest.approx(250 + 375)
    assert a.shares["a"].gpu_time_s == pytest.approx(7.5)
    assert a.shares["b"].occupancy_s == 10.0
    assert a.shares["a"].sm_activity == pytest.approx(0.6)


def test_counter_reset_falls_back_to_power_and_no_reading_is_unknown():
    assert interval_energy(sample(0, 500.0, 100.0), sample(2, 10.0, 300.0)) == (400.0, "power")
    assert interval_energy(sample(0), sample(2)) == (None, "none")
    a = attribute(sample(0, procs=(ProcessUsage(1, 10, 0.5),)), sample(2), {1: "j"})
    assert a.shares["j"].energy_j is None and a.shares["j"].gpu_time_s == 2.0


def test_empty_device_goes_to_idle_and_foreign_process_to_other():
    a = attribute(sample(0, 0.0), sample(1, 70.0), {})
    assert set(a.shares) == {IDLE} and a.shares[IDLE].energy_j == 70.0
    procs = (ProcessUsage(1, 10, 0.5), ProcessUsage(99, 10, 0.5))
    a = attribute(sample(0, 0.0, procs=procs), sample(1, 100.0, procs=procs), {1: "j"})
    assert a.shares["j"].energy_j == pytest.approx(50.0)
    assert a.shares[OTHER].energy_j == pytest.approx(50.0)


def test_no_utilization_reported_splits_equally():
    procs = (ProcessUsage(1, 10, None), ProcessUsage(2, 10, None), ProcessUsage(3, 10, None))
    a = attribute(sample(0, 0.0, procs=procs), sample(3, 90.0, procs=procs),
                  {1: "a", 2: "b", 3: "c"})
    assert [a.shares[j].energy_j for j in "abc"] == pytest.approx([30.0] * 3)


def test_samples_of_different_devices_are_refused():
    other = DeviceSample("GPU-y", 1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="different devices"):
        attribute(sample(0), other, {})


procs_strategy = st.lists(
    st.tuples(st.integers(1, 8), st.floats(0, 80_000), st.one_of(st.none(), st.floats(0, 1))),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(
    p0=procs_strategy, p1=procs_strategy,
    dt=st.floats(0.0, 3600.0),
    e0=st.one_of(st.none(), st.floats(0, 1e9)),
    de=st.one_of(st.none(), st.floats(-1e6, 1e7)),
    w0=st.one_of(st.none(), st.floats(0, 1000)), w1=st.one_of(st.none(), st.floats(0, 1000)),
    idle=st.one_of(st.none(), st.floats(0, 2000)),
    owners=st.dictionaries(st.integers(1, 8), st.sampled_from(["a", "b", "c"])),
)
def test_shares_are_non_negative_and_sum_to_the_device_measurement(
    p0, p1, dt, e0, de, w0, w1, idle, owners
):
    e1 = None if e0 is None or de is None else e0 + de
    s0 = sample(0.0, e0, w0, tuple(ProcessUsage(p, m, u) for p, m, u in p0))
    s1 = sample(dt, e1, w1, tuple(ProcessUsage(p, m, u) for p, m, u in p1))
    a = attribute(s0, s1, owners, idle_watts=idle)
    assert a.shares, "every interval is charged to someone (a job, OTHER or IDLE)"
    time_total = sum(s.gpu_time_s for s in a.shares.values())
    assert math.isclose(time_total, dt, rel_tol=1e-9, abs_tol=1e-9)
    for s in a.shares.values():
        assert s.gpu_time_s >= 0 and s.occupancy_s == pytest.approx(dt) and s.mem_mib >= 0
        assert 0.0 <= s.sm_activity <= 1.0
        if a.energy_j is None:
            assert s.energy_j is None
        else:
            assert s.energy_j is not None and s.energy_j >= 0
    if a.energy_j is not None:
        assert a.energy_j >= 0
        total = sum(s.energy_j for s in a.shares.values())
        assert math.isclose(total, a.energy_j, rel_tol=1e-9, abs_tol=1e-6)
