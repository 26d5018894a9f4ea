"""A job's behaviour over an attempt (``collocate.core.job_behaviour``): the ramp, the phases, the later
peak and the progress rate, and that the simulator and the emulated job both play it; and what an
attempt's end teaches the next one, in the simulator as in the daemon (``knowledge.carried_over``)."""

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collocate.core.gputypes import parse_cluster
from collocate.core.job_behaviour import (
    CONTEXT_MIB,
    RAMP_STEPS,
    JobBehaviour,
    context_mib,
    progress_rate,
    ramp_mib,
    ramp_schedule,
)
from collocate.core.model import JobProfile
from collocate.core.policies import make_policy
from collocate.node.emulate_job import JobSpec
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload

mibs = st.floats(0.0, 200_000.0)
seconds = st.floats(0.0, 600.0)


@st.composite
def behaviours(draw):
    mem = draw(mibs)
    peak = draw(st.none() | st.floats(mem, 400_000.0))
    ramp = draw(st.just(0.0) | st.floats(0.001, 600.0))  # no ramp, or one of at least a millisecond
    return JobBehaviour(mem, draw(seconds), ramp, draw(seconds), peak, draw(st.floats(0.0, 1.0)))


@given(behaviours(), seconds, seconds, st.floats(0.0, 1.0))
def test_memory_only_grows_within_an_attempt(b, t1, t2, progress):
    early, late = sorted((t1, t2))
    a, z = b.mem_at(early, progress), b.mem_at(late, progress)
    if a is not None:
        assert z is not None and z >= a
    assert b.mem_at(late, 0.0) is None or b.mem_at(late, progress) >= b.mem_at(late, 0.0)


@given(behaviours(), seconds)
def test_nothing_is_held_in_start_up_and_never_less_than_a_context_after(b, t):
    held = b.mem_at(t, 0.0)
    if t < b.startup_s:
        assert held is None
    else:
        assert held is not None and held >= context_mib(b.mem_mib)
        peaked = b.peak_mib is not None and b.peak_at == 0.0
        assert held <= (b.peak_mib if peaked else b.mem_mib)


@given(behaviours())
def test_the_ramp_reaches_the_memory_at_its_last_step_and_the_peak_at_its_progress(b):
    done = b.seen_at(0.0) + b.ramp_s
    ramp = replace(b, peak_mib=None)
    assert ramp.mem_at(done, 1.0) == b.mem_mib
    before = ramp.mem_at(math.nextafter(done, -1.0), 1.0)
    if b.ramp_s > 0 and before is not None:
        assert before <= max(context_mib(b.mem_mib), b.mem_mib * 3 / RAMP_STEPS)
    if b.peak_mib is not None:
        assert b.mem_at(done, b.peak_at) == b.peak_mib
        assert b.peak_at == 0.0 or b.mem_at(done, math.nextafter(b.peak_at, 0.0)) == b.mem_mib


@given(behaviours(), st.booleans())
def test_the_schedule_and_the_step_at_a_time_agree(b, sampled):
    """The simulator schedules ``ramp_schedule`` from ``seen_at``; the emulated job asks
    ``ramp_step`` each tick: each scheduled step is reached at that moment, not an ulp later."""
    schedule = ramp_schedule(b.ramp_s, sampled)
    assert len(schedule) == (RAMP_STEPS if sampled and b.ramp_s > 0 else 1)
    assert schedule[-1] == (b.ramp_s, RAMP_STEPS)
    for after, step in ramp_schedule(b.ramp_s):
        at = b.seen_at(0.0) + after
        assert b.ramp_step(at) == step
        assert b.ramp_step(math.nextafter(at, -1.0)) < step
    assert JobBehaviour(1.0).ramp_step(0.0) == RAMP_STEPS  # no ramp: all at once


@given(mibs, st.integers(0, RAMP_STEPS - 1))
def test_ramp_steps_climb_to_the_memory(mem, step):
    assert context_mib(mem) <= ramp_mib(mem, step) <= ramp_mib(mem, step + 1)
    assert ramp_mib(mem, RAMP_STEPS) == mem


@given(behaviours(), seconds)
def test_phases_follow_each_other(b, start):
    assert start <= b.seen_at(start) <= b.active_at(start)
    assert b.training(b.startup_s + b.warmup_s)
    assert b.idle_first == (b.active_at(0.0) > 0)


@given(st.floats(1.0, 100.0))
def test_progress_is_slowed_by_sharing_and_stopped_by_freezing(slowdown):
    assert 0 < progress_rate(slowdown) <= 1.0 == progress_rate(1.0)
    assert progress_rate(slowdown, frozen=True) == 0.0


def test_the_emulated_job_behaves_as_its_flags_say():
    spec = JobSpec(mem_mib=4096, seconds=10, ramp_s=4, peak_mib=8192, peak_at=0.5, startup_s=2, warmup_s=3)
    assert spec.behaviour == JobBehaviour(4096, startup_s=2, ramp_s=4, warmup_s=3, peak_mib=8192, peak_at=0.5)


@pytest.mark.parametrize("ramp_s", [0.0, 4.0])
def test_the_simulator_shows_the_world_the_memory_an_emulated_job_claims(ramp_s):
    """Parity of memory: every amount the simulator tells the world a job holds, at every moment
    it tells it, is what the emulated job with the same flags claims at that moment."""
    startup, warmup, mem = 2.0, 1.0, 4096.0
    trace = [TraceJob("1", 5.0, Workload("j", 1, 30.0, mem, {}, JobProfile(0.3, 0.1), warmup_s=warmup,
                                         startup_s=startup))]
    sim = Simulation(parse_cluster("1xA100-40GB"), trace, make_policy("auto"),
                     SimConfig(ramp_s=ramp_s, profiles="unknown"))
    seen: list[tuple[float, float]] = []
    observe = sim.world.observe_memory

    def recording(job_id: str, held_mib: float, now: float) -> None:
        seen.append((now, held_mib))
        observe(job_id, held_mib, now)

    sim.world.observe_memory = recording  # type: ignore[method-assign]
    result = sim.run()
    start = result.records[0].start
    assert start is not None and result.records[0].state == "done"
    emulated = JobSpec(mem_mib=mem, seconds=30.0, ramp_s=ramp_s, startup_s=startup, warmup_s=warmup).behaviour
    # the context, then each step of the ramp (without a ramp, both at one moment)
    steps = range(1, RAMP_STEPS + 1) if ramp_s else [RAMP_STEPS]
    assert [held for _, held in seen] == [CONTEXT_MIB, *(ramp_mib(mem, k) for k in steps)]
    last_word = dict(seen)  # what the world holds at each moment: the last it was told then
    assert last_word == {t: emulated.mem_at(t - start, 0.0) for t in last_word}
    assert seen[0] == (start + startup, CONTEXT_MIB) and seen[-1] == (start + startup + ramp_s, mem)


def test_a_requeued_job_starts_its_next_attempt_from_what_its_last_one_read():
    """The end-of-attempt rule both worlds apply (``knowledge.carried_over``): a job measured on
    its GPU and then requeued after an out-of-memory crash is priced by that reading (as history)
    on its next attempt, not by the prior it was submitted with."""
    big = Workload("big", 1, 60.0, 30_000.0, {"horus": 30_000.0}, JobProfile(0.2, 0.1))
    under = Workload("under", 1, 60.0, 20_000.0, {"horus": 5_000.0}, JobProfile(0.6, 0.3))
    trace = [TraceJob("1", 0.0, big), TraceJob("2", 1.0, under)]
    sim = Simulation(parse_cluster("1xA100-40GB"), trace, make_policy("carma-magm"),
                     SimConfig(estimator="horus", profiles="unknown", ramp_s=20.0))
    result = sim.run()
    crashed = {r.id: r for r in result.records}["2"]
    assert crashed.oom_crashes >= 1 and crashed.state == "done"
    assert crashed.spans[0][3] == "oom"
    job = sim.scheduler.jobs["2"]
    assert job.profile_source == "history"  # told at submission: the prior ("assumed")
    assert job.profile.sm_activity == pytest.approx(0.6, abs=0.1)
