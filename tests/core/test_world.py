"""The world model (``collocate.core.world``): what is on each GPU, observed, for both worlds."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core.belief import realized
from collocate.core.device_table import DeviceTable
from collocate.core.interference import default_interference
from collocate.core.model import GpuId, Job, JobProfile, SharingMode
from collocate.core.world import MIN_SEGMENT_SAMPLES, ONSET_STEP, STARTUP_MAX_S, WARMUP_MAX_S, Device, Phase, World

LEARN_S = MIN_SEGMENT_SAMPLES + 1.0  # at a 1-s period: a sample's lag, then a few samples

TS = default_interference().modes[SharingMode.TIME_SLICING]
GIB = 1024.0


def world(n: int = 1, **kw) -> World:
    return World([Device(GpuId("n", i), 80 * GIB) for i in range(n)], sharing=SharingMode.TIME_SLICING,
                 params=TS, **kw)


def job(job_id: str, mem: float | None = 4 * GIB, **kw) -> Job:
    return Job(job_id, mem_mib=mem, mem_source="declared" if mem else "unknown", **kw)


def test_a_job_starts_warms_then_is_active_when_its_gpus_reading_steps_up():
    w = world()
    w.place(job("a"), [0], now=0.0)
    assert w.residents["a"].phase is Phase.STARTING and w.table.n_starting[0] == 1
    assert w.table.seen_at[0] == math.inf  # placed, not seen: CARMA's guard is closed
    w.set_reading(0, 5.0, 0.0, 0.0)
    w.observe_memory("a", 500.0, now=6.0)  # a CUDA context: seen, warming
    assert w.residents["a"].phase is Phase.WARMING and w.table.seen_at[0] == 6.0
    w.set_reading(0, 7.0, ONSET_STEP / 2, 0.0)  # first steps: almost nothing
    assert w.residents["a"].phase is Phase.WARMING
    w.set_reading(0, 9.0, 0.4, 0.1)  # its steps show
    assert w.residents["a"].phase is Phase.ACTIVE and w.table.n_starting[0] == 0


def test_a_job_whose_activity_never_shows_counts_as_active_after_the_longest_warm_up():
    w = world()
    w.place(job("a"), [0], now=0.0)
    w.observe_memory("a", 500.0, now=1.0)
    w.tick(10.0)  # an idle GPU would show its steps: its memory holding still proves nothing
    assert w.residents["a"].phase is Phase.WARMING
    assert w.tick(1.0 + WARMUP_MAX_S) and w.residents["a"].phase is Phase.ACTIVE


def test_a_job_that_holds_no_gpu_memory_past_the_longest_start_up_stops_counting_as_starting():
    w = world(2)
    w.place(job("sleep"), [0], now=0.0)  # e.g. ``sleep``, or a long CPU step: never holds memory
    w.place(job("gang"), [0, 1], now=0.0)
    assert list(w.table.n_starting) == [2, 1]
    assert w.next_change_at() == STARTUP_MAX_S  # the simulator wakes for it
    assert not w.tick(STARTUP_MAX_S - 1.0) and list(w.table.n_starting) == [2, 1]
    w.observe_memory("gang", 500.0, now=STARTUP_MAX_S - 1.0)  # the gang holds memory: warming
    assert w.tick(STARTUP_MAX_S) and list(w.table.n_starting) == [1, 1]
    assert w.residents["sleep"].phase is Phase.STARTING  # its phase is what was seen; only the count lapses
    assert w.snapshot(STARTUP_MAX_S).n_starting[0] == 1
    assert w.idle_view(w.snapshot(STARTUP_MAX_S), ["sleep"]).n_starting[0] == 1  # counted once only
    w.observe_memory("sleep", 500.0, now=70.0)  # it reached the GPU at last: warming, counted again
    assert list(w.table.n_starting) == [2, 1]
    w.remove("sleep", now=71.0)
    w.remove("gang", now=71.0)
    assert list(w.table.n_starting) == [0, 0]


def test_a_job_that_lapsed_as_starting_and_ended_leaves_the_count_as_it_was():
    w = world()
    w.place(job("sleep"), [0], now=0.0)
    w.tick(STARTUP_MAX_S)
    w.place(job("b"), [0], now=STARTUP_MAX_S + 1.0)
    assert w.table.n_starting[0] == 1
    w.remove("sleep", now=STARTUP_MAX_S + 2.0)
    assert w.table.n_starting[0] == 1 and w.next_change_at() == STARTUP_MAX_S * 2 + 1.0


def test_on_a_gpu_too_busy_to_show_its_steps_a_job_whose_memory_holds_still_is_active():
    from collocate.core.world import WARM_QUIET_S

    w = World([Device(GpuId("n", 0), 80 * GIB)], sharing=SharingMode.MPS,
              params=default_interference().modes[SharingMode.MPS])
    for j in ("a", "b", "c"):
        w.place(job(j, profile=JobProfile(0.9, 0.4), profile_source="history"), [0], now=0.0)
        w.observe_memory(j, 2 * GIB, 0.0)
        w.set_reading(0, 0.0, 0.3 * (1 + "abc".index(j)), 0.1)  # each one's steps show
    assert all(r.phase is Phase.ACTIVE for r in w.residents.values())
    w.place(job("d"), [0], now=1.0)
    w.observe_memory("d", 2 * GIB, 1.0)  # saturated under MPS: its steps cannot raise the reading
    w.tick(1.0 + WARM_QUIET_S - 0.1)
    assert w.residents["d"].phase is Phase.WARMING
    assert w.tick(1.0 + WARM_QUIET_S) and w.residents["d"].phase is Phase.ACTIVE


def _active(w: World, job_id: str, device: int, now: float, level: float) -> None:
    w.observe_memory(job_id, 2 * GIB, now)
    w.set_reading(device, now, level, level * 0.4)


def test_jobs_that_only_ever_share_a_gpu_are_priced_from_its_readings_within_seconds():
    w = world()
    true = [JobProfile(0.2, 0.08), JobProfile(0.2, 0.08)]
    w.place(job("a"), [0], now=0.0)
    w.place(job("b"), [0], now=0.0)
    w.observe_memory("a", 2 * GIB, 1.0)
    w.set_reading(0, 1.0, 0.15, 0.05)  # a's steps
    w.observe_memory("b", 2 * GIB, 1.0)
    w.set_reading(0, 2.0, realized(TS, true, 0), realized(TS, true, 1))  # b's too
    assert all(r.phase is Phase.ACTIVE for r in w.residents.values())
    assert w.table.sm_sum[0] == pytest.approx(1.0)  # still the prior: no readings counted yet
    w.tick(2.0 + LEARN_S - 0.01)
    assert w.table.sm_sum[0] == pytest.approx(1.0)
    assert w.tick(2.0 + LEARN_S)
    assert w.table.sm_sum[0] < 0.7 and all(r.pricing.source == "inferred" for r in w.residents.values())


def test_a_gpus_known_load_is_the_solo_activity_learned_of_its_working_jobs_never_a_prior():
    # three jobs at 0.4 SM time-sliced read about 0.57 together (each slowed ~2.1x); what the
    # readings teach of them sums to about 1.2, which the snapshot shows as ``sm_known``
    w = world()
    true = [JobProfile(0.4, 0.2)] * 3
    for j in ("a", "b", "c"):
        w.place(job(j), [0], now=0.0)
        w.observe_memory(j, 2 * GIB, 1.0)
    w.set_reading(0, 1.0, realized(TS, true, 0), realized(TS, true, 1))
    assert all(r.phase is Phase.ACTIVE for r in w.residents.values())
    assert w.snapshot(1.0).sm_known is None  # active, but priced by the prior: nothing known yet
    w.tick(1.0 + LEARN_S)
    snap = w.snapshot(1.0 + LEARN_S)
    assert realized(TS, true, 0) < 0.6 < snap.sm_known[0]
    assert snap.sm_known[0] == pytest.approx(sum(r.pricing.profile.sm_activity for r in w.on(0)))
    assert snap.sm_known[0] == pytest.approx(1.2, abs=0.3)
    # a frozen job draws nothing: it leaves the known load (also "as if frozen"), and is back thawed
    known, one = float(snap.sm_known[0]), w.residents["c"].pricing.profile.sm_activity
    assert w.snapshot(6.0, idle=["c"]).sm_known[0] == pytest.approx(known - one)
    w.freeze("c", 6.0, True, "trial")
    assert w.table.sm_known[0] == pytest.approx(known - one)
    w.freeze("c", 7.0, False, "")
    assert w.table.sm_known[0] == pytest.approx(sum(r.pricing.profile.sm_activity for r in w.on(0)))
    for j in ("a", "b", "c"):  # and an emptied GPU knows nothing
        w.remove(j, now=8.0)
    assert w.snapshot(8.0).sm_known is None


def test_a_departure_re_solves_the_rest_and_what_was_learned_is_kept():
    w = world()
    heavy, light = JobProfile(0.7, 0.3), JobProfile(0.15, 0.05)
    for j in ("h", "l"):
        w.place(job(j), [0], now=0.0)
        w.observe_memory(j, 2 * GIB, 0.0)
    w.set_reading(0, 0.0, realized(TS, [heavy, light], 0), realized(TS, [heavy, light], 1))
    w.tick(10.0)
    gone = w.remove("h", now=10.0)  # the shared segment taught both; h leaves with its share
    assert gone.belief.source == "inferred" and gone.belief.sm_var < 0.25 ** 2
    w.set_reading(0, 10.0, light.sm_activity, light.dram_activity)  # l alone now
    w.tick(10.0 + LEARN_S)
    (left,) = w.on(0)
    assert left.pricing.profile.sm_activity == pytest.approx(0.15, abs=0.02)
    assert left.pricing.source == "measured"


def test_memory_nobody_owns_is_charged_and_an_emptied_gpu_reads_idle():
    w = world(window=5)
    w.set_reading(0, 0.0, 0.6, 0.2, 0.5, free_mib=10 * GIB, other_mib=70 * GIB)
    snap = w.snapshot(0.0)
    assert snap.other_mib[0] == 70 * GIB and snap.util_sm[0] > 0.0  # a foreign job: not idle
    w.set_reading(0, 1.0, 0.9, 0.5, 0.7, free_mib=80 * GIB)
    w.place(job("a"), [0], now=1.0)
    w.remove("a", now=2.0)
    snap = w.snapshot(2.0)
    assert snap.util_sm[0] == 0.0 and snap.n_jobs[0] == 0 and snap.committed_mib[0] == 0.0


def test_an_unknown_jobs_memory_is_its_whole_gpu_until_its_peak_holds_still_in_training():
    from collocate.core.commitment import QUIET_S, settled_mib

    w = world()
    w.place(job("u", mem=None), [0], now=0.0)
    assert w.table.committed[0] == 80 * GIB
    w.observe_memory("u", 3 * GIB, 4.0)
    w.set_reading(0, 5.0, 0.3, 0.1)  # active: its peak counts as reached QUIET_S from now
    w.tick(5.0 + QUIET_S - 0.1)
    assert w.table.committed[0] == 80 * GIB
    assert w.tick(5.0 + QUIET_S) and w.table.committed[0] == pytest.approx(settled_mib(3 * GIB))


def test_under_mps_a_gpu_belongs_to_the_user_of_its_jobs_until_it_empties():
    w = World([Device(GpuId("n", 0), 80 * GIB)], sharing=SharingMode.MPS,
              params=default_interference().modes[SharingMode.MPS])
    w.place(job("a", user="alice"), [0], now=0.0)
    assert w.snapshot(0.0).owner == ("alice",)
    w.remove("a", now=1.0)
    assert w.snapshot(1.0).owner == ("",)


# -- progress a job reports ----------------------------------------------------------------------
def _report(w: World, job_id: str, start: float, end: float, rate: float, step0: float = 0.0) -> float:
    """Steps at ``rate`` a second from ``start`` to ``end``, reported every half second; the
    last step reported."""
    step, t = step0, start
    while t <= end + 1e-9:
        w.observe_progress(job_id, t, step)
        t += 0.5
        step += 0.5 * rate
    return step - 0.5 * rate


def test_a_jobs_measured_slowdown_is_its_fastest_step_rate_over_its_rate_now():
    w = world()
    w.place(job("a"), [0], now=0.0)
    _report(w, "a", 0.0, 3.0, 10.0)  # starting: start-up and first steps are not its pace
    assert w.residents["a"].best_rate == 0.0
    _active(w, "a", 0, 4.0, 0.6)
    step = _report(w, "a", 4.0, 12.0, 10.0)
    assert w.residents["a"].slowdown == pytest.approx(1.0) and w.table.slowed[0] == pytest.approx(1.0)
    _report(w, "a", 12.5, 30.0, 4.0, step)  # something slows it to 4 steps a second
    assert w.residents["a"].slowdown == pytest.approx(2.5)
    assert w.snapshot(30.0).slowed[0] == pytest.approx(2.5)


def test_a_warming_job_whose_step_counter_moves_is_active_at_once_on_a_gpu_too_busy_to_show_it():
    w = world()
    w.place(job("busy"), [0], now=0.0)
    _active(w, "busy", 0, 1.0, 0.97)  # a saturated GPU: the newcomer's steps cannot step it up
    w.place(job("a"), [0], now=2.0)
    w.observe_memory("a", 2 * GIB, now=3.0)
    w.set_reading(0, 3.0, 0.97, 0.4)
    assert w.residents["a"].phase is Phase.WARMING and w.table.n_starting[0] == 1
    w.observe_progress("a", 4.0, 0.0)
    w.observe_progress("a", 4.5, 0.0)  # a counter that does not move: not training yet
    assert w.residents["a"].phase is Phase.WARMING and w.table.n_starting[0] == 1
    w.observe_progress("a", 5.0, 2.0)  # it moved: training, its start-up slot free long before WARMUP_MAX_S
    assert w.residents["a"].phase is Phase.ACTIVE and w.table.n_starting[0] == 0
    assert w.residents["a"].best_rate == 0.0  # warming reports are not its pace
    _report(w, "a", 5.5, 10.0, 4.0, 4.0)
    assert w.residents["a"].slowdown == pytest.approx(1.0)


def test_an_evaluation_without_steps_or_a_restarted_counter_is_not_a_slowdown():
    w = world()
    w.place(job("a"), [0], now=0.0)
    _active(w, "a", 0, 1.0, 0.6)
    step = _report(w, "a", 1.0, 10.0, 10.0)
    _report(w, "a", 10.5, 20.0, 0.0, step)  # no steps for 10 s: unknown, not infinitely slow
    assert w.residents["a"].slowdown == pytest.approx(1.0)
    for t in (25.0, 25.5, 26.0, 28.0, 28.5, 29.0):  # one 2-s gap between reports: a stall
        step += 5.0
        w.observe_progress("a", t, step)
    assert w.residents["a"].slowdown == pytest.approx(1.0)
    _report(w, "a", 20.5, 30.0, 10.0, 0.0)  # the counter went back (a new epoch loop): start over
    assert w.residents["a"].slowdown == pytest.approx(1.0)


def test_a_gpu_shows_its_slowest_jobs_measurement_until_that_job_leaves():
    w = world()
    for j, level in (("a", 0.4), ("b", 0.8)):
        w.place(job(j), [0], now=0.0)
        _active(w, j, 0, 1.0, level)
    step = _report(w, "a", 1.0, 8.0, 10.0)
    _report(w, "a", 8.5, 20.0, 5.0, step)
    _report(w, "b", 1.0, 20.0, 7.0)  # b reports a steady rate: 1x
    assert w.table.slowed[0] == pytest.approx(2.0)
    w.remove("a", 21.0)
    assert w.table.slowed[0] == pytest.approx(1.0)
    assert w.snapshot(21.0).slowed is not None
    w.remove("b", 22.0)
    assert w.table.slowed[0] == 0.0 and w.snapshot(22.0).slowed is None  # nothing measured anywhere


def test_devices_that_join_start_unmeasured_beside_a_measured_one():
    w = world()
    w.place(job("a"), [0], now=0.0)
    _active(w, "a", 0, 1.0, 0.6)
    step = _report(w, "a", 1.0, 8.0, 10.0)
    _report(w, "a", 8.5, 20.0, 5.0, step)
    w.add_devices([Device(GpuId("m", 0), 80 * GIB)])  # a node joined
    assert len(w.table.slowed) == len(w.ids) and w.table.slowed[-1] == 0.0
    assert w.snapshot(21.0).slowed is not None and len(w.snapshot(21.0).slowed) == len(w.ids)


def test_a_device_that_joins_has_every_column_a_fresh_device_has_and_the_others_keep_theirs():
    w = world(2, window=5)
    w.place(job("a", user="ann"), [0], now=0.0)
    _active(w, "a", 0, 1.0, 0.6)
    before = {f.name: list(getattr(w.table, f.name)) for f in fields(DeviceTable)}
    joined = Device(GpuId("m", 0), 40 * GIB, speed=0.5)
    w.add_devices([joined])
    fresh = DeviceTable.of([joined])
    for f in fields(DeviceTable):
        column = list(getattr(w.table, f.name))
        assert len(column) == 3, f.name
        if f.name == "state":
            assert column[:2] == before["state"] and not column[2].residents and column[2].segment is None
        else:
            assert column == before[f.name] + list(getattr(fresh, f.name)), f.name
    w.place(job("b"), [2], now=9.0)
    w.set_reading(2, 10.0, 0.3, 0.1)
    snap = w.snapshot(10.0)
    assert snap.n_jobs.tolist() == [1, 0, 1] and snap.speed.tolist() == [1.0, 1.0, 0.5]
    # its risk window reads the half-GPU instance relative to its own SMs: 0.3 of the GPU is 0.6 of it
    assert list(snap.residents[2]) == ["b"] and snap.util_sm[2] == pytest.approx(0.6)


def test_recent_load_follows_the_readings_of_the_last_few_samples_not_the_risk_windows_peaks():
    # issue 35: a start on trial asks whether the GPU's load leaves room now; the risk window
    # (30 samples leaning to their 95th percentile) still reads a job that left half a minute ago
    w = world(window=30)
    w.place(job("a"), [0], now=0.0)
    for t in range(30):
        w.set_reading(0, float(t), 0.9, 0.3)
    for t in range(30, 40):
        w.set_reading(0, float(t), 0.2, 0.1)
    snap = w.snapshot(40.0)
    assert snap.util_sm[0] > 0.6  # the window: still busy
    # 10 s at 0.2, averaged over about 5 samples: what it reads lately, below the threshold
    assert snap.sm_recent[0] == pytest.approx(0.2 + 0.7 * math.exp(-10 / 5), abs=0.01)
    assert snap.sm_recent[0] < 0.6
    # a rise counts at once (the average would still count the quiet seconds before it)
    w.set_reading(0, 40.0, 0.8, 0.3)
    assert w.snapshot(41.0).sm_recent[0] == 0.8  # but never less than it reads now
    w.set_reading(0, 42.0, 0.3, 0.1)
    assert 0.3 < w.snapshot(43.0).sm_recent[0] < w.snapshot(42.5).sm_recent[0] < 0.8  # it falls over ~5 s


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 4)), max_size=30))
def test_the_multi_gpu_table_kept_as_gangs_come_and_go_is_the_one_built_afresh(steps):
    """The world keeps its table of gangs up to date as they are placed and removed (rebuilding
    it cost a pass over every gang in each round of a large simulation): in the same order, the
    same arrays as one built from the residents."""
    from collocate.core.model import Gangs

    w = world(8)
    for n, (add, first, width) in enumerate(steps):
        gangs = [j for j, r in w.residents.items() if len(r.devices) > 1]
        if add or not gangs:
            w.place(job(f"j{n}", profile=JobProfile(0.1 * (n % 7), 0.05 * (n % 5))),
                    list(range(first, min(8, first + width))), now=float(n))
        else:
            w.remove(gangs[first % len(gangs)], now=float(n))
        kept = w.snapshot(float(n)).gangs
        fresh = [(r.devices, r.profile) for r in w.residents.values() if len(r.devices) > 1]
        if not fresh:
            assert kept is None
            continue
        built = Gangs.of(fresh, 8)
        for name in ("sm", "dram", "width", "member_gang", "member_gpu", "hosts"):
            assert getattr(kept, name).tolist() == getattr(built, name).tolist(), name
            assert getattr(kept, name).dtype == getattr(built, name).dtype, name


def test_jobs_the_scheduler_froze_count_in_their_gpus_n_frozen_and_a_users_suspension_does_not():
    # trial and preempt: the scheduler thaws them by itself, so their room is held for them;
    # a job its owner suspended thaws only on `collocate resume`, and holds nothing back
    w = world(3)
    w.place(job("trial"), [0], now=0.0)
    w.place(job("gang"), [1, 2], now=0.0)
    w.place(job("mine"), [2], now=0.0)
    assert w.snapshot(1.0).n_frozen is None  # nothing frozen anywhere
    w.freeze("trial", 2.0, True, "trial")
    w.freeze("gang", 2.0, True, "preempt")
    w.freeze("mine", 2.0, True, "user")
    assert list(w.snapshot(3.0).n_frozen) == [1, 1, 1]
    w.freeze("trial", 4.0, True, "user")  # its owner suspends it too: it is theirs now
    assert list(w.snapshot(5.0).n_frozen) == [0, 1, 1]
    w.freeze("gang", 6.0, False, "")  # thawed: held until the readings can show it (a few samples)
    assert list(w.snapshot(6.0).n_frozen) == [0, 1, 1]
    assert w.next_change_at() == 6.0 + 1.0 + MIN_SEGMENT_SAMPLES  # the simulator wakes for it
    assert w.tick(w.next_change_at()) and w.snapshot(11.0).n_frozen is None
    w.freeze("gang", 8.0, True, "preempt")
    w.remove("gang", 9.0)  # ended frozen (cancelled): it holds nothing any more
    assert w.snapshot(10.0).n_frozen is None
    w.place(job("next"), [1], now=11.0)
    assert w.snapshot(12.0, idle=["next"]).n_frozen is None  # "as if frozen" for a preemptor holds nothing


def test_every_devices_recent_load_in_the_snapshot_is_what_it_reads_lately_alone():
    """The snapshot takes the recent load's exponential only where a reading dropped (elsewhere
    the level is the answer): every device still agrees with ``recent_sm``, one by one."""
    w = world(n=4)
    for k in range(4):
        w.place(job(f"j{k}"), [k], now=0.0)
    levels = {0: (0.9, 0.2), 1: (0.2, 0.9), 2: (0.5, 0.5)}  # fell, rose, held; device 3 never read
    for i, (before, after) in levels.items():
        for t in range(10):
            w.set_reading(i, float(t), before)
        w.set_reading(i, 10.0, after)
    for now in (10.0, 11.0, 14.0, 60.0, 1e6):
        recent = w.snapshot(now).sm_recent
        assert recent.tolist() == pytest.approx([w.recent_sm(i, now) for i in range(4)], abs=1e-12)
    assert w.snapshot(11.0).sm_recent[0] > 0.2 and w.snapshot(1e6).sm_recent[0] == 0.2
    assert w.snapshot(11.0).sm_recent[1] == 0.9


def test_on_a_mig_instance_the_neighbourhood_reports_what_neighbours_cost_there():
    """An instance is a device shared by the mode: the world prices a job's neighbours with the
    one slowdown, activity relative to the instance, and leaves out what the instance alone costs."""
    from collocate.core.interference import device_slowdown

    f = 3 / 7
    w = World([Device(GpuId("n", 0, "1.0"), 20 * GIB, f)], sharing=SharingMode.TIME_SLICING, params=TS)
    light = JobProfile(0.2, 0.1)
    for name in ("a", "b"):
        w.place(job(name, profile=light, profile_source="declared"), [0], now=0.0)
        w.observe_memory(name, 2 * GIB, now=1.0)
    w.tick(1.0 + WARMUP_MAX_S)
    seen = {n.job_id: n.slowdown for n in w.neighbourhood("a")}
    expected = device_slowdown(TS, light, [light], f)
    assert expected > device_slowdown(TS, light, [light])  # busier relative to 3/7 of the SMs
    assert seen == {"a": pytest.approx(expected), "b": pytest.approx(expected)}
