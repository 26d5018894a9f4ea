"""Parity beyond the plain case (``test_parity``): the daemon on emulated GPUs and the simulator on
the same small trace agree on a job that spans two GPUs, an out-of-memory requeue, a resubmission
priced from history, a trial job frozen beside a neighbour and thawed, and jobs time-slicing the
instances of a MIG layout.

Each trace is the smallest one that shows its case; each world is compared on the order jobs
start in, whom each ran unfrozen beside, which jobs were frozen, and the makespan
(``parity_harness``)."""

from __future__ import annotations

from contextlib import closing
from dataclasses import replace

import pytest
from parity_harness import (
    TOLERANCE,
    DaemonRun,
    TraceRun,
    counted_s,
    order,
    run_daemon,
    shares,
    shown,
    sim_freezes,
    sim_spans,
    sim_trace,
    simulate,
)

from collocate.daemon.store import Store


def _compare(got: DaemonRun, runs: list[TraceRun], policy: str, sharing: str, gpus: str, ramp_s: float = 0.0,
             mig_layout: str | None = None):
    """Assert the simulator decided as the daemon did; the simulation (told a quiet machine's
    process costs) and its result, for the case's own checks."""
    sim, result = simulate(sim_trace(runs, got.arrivals, ramp_s=ramp_s), policy, sharing, gpus, ramp_s,
                           mig_layout=mig_layout)
    spans, frozen = sim_spans(result), sim_freezes(result)
    seen = shown(got.spans, spans, got.spawn, got.frozen, frozen)
    assert order(got.spans) == order(spans), seen
    assert {j: g for j, (_, _, g) in got.spans.items()} == {j: g for j, (_, _, g) in spans.items()}, seen
    assert shares(got.spans, got.frozen) == shares(spans, frozen), seen
    assert {j for j, f in got.frozen.items() if f} == {j for j, f in frozen.items() if f}, seen
    _, timed = simulate(sim_trace(runs, got.arrivals, got.spawn, ramp_s), policy, sharing, gpus, ramp_s,
                        mig_layout=mig_layout)
    timed_spans = sim_spans(timed)
    seen = shown(got.spans, timed_spans, got.spawn, got.frozen, sim_freezes(timed))
    assert timed.makespan_s == pytest.approx(got.makespan, rel=TOLERANCE), seen
    for job, (_, end, _) in got.spans.items():  # and so does each job's end
        assert timed_spans[job][1] == pytest.approx(end, rel=TOLERANCE, abs=1.0), seen
    return sim, result


def test_a_job_on_two_gpus_beside_single_gpu_jobs(daemons):
    """A light job and a middling one, each on a GPU of its own, a job that needs both GPUs
    beside them, and a light one that goes beside the light one."""
    runs = [TraceRun(0.1, 0.05, 6.0), TraceRun(0.3, 0.15, 6.0), TraceRun(0.2, 0.1, 3.0, gpus=2),
            TraceRun(0.1, 0.05, 3.0)]
    d = daemons("--policy", "auto", gpus="emulated:2xA100-40GB")
    got = run_daemon(d, runs)
    _compare(got, runs, "auto", "time-slicing", "2xA100-40GB")
    assert len(got.spans["3"][2]) == 2 and shares(got.spans, got.frozen)["3"] == {"1", "2", "4"}


def test_an_out_of_memory_requeue(daemons):
    """A job declares 1000 MiB and holds 6000 once its ramp is done: it crashes at its fence in
    both worlds, having read its activity while it ramped, and is requeued with a raised
    requirement, priced from what that attempt read."""
    runs = [TraceRun(0.1, 0.05, 6.0), TraceRun(0.5, 0.2, 3.0, mem_mib=6000.0, declared_mib=1000.0)]
    d = daemons("--policy", "auto", gpus="emulated:1xA100-40GB")
    got = run_daemon(d, runs, ramp_s=2.0)
    sim, result = _compare(got, runs, "auto", "time-slicing", "1xA100-40GB", ramp_s=2.0)
    attempts = got.details["2"]["attempts"]
    assert [a["outcome"] for a in attempts] == ["oom", "succeeded"]
    assert [span[3] for span in result.records[1].spans] == ["oom", "done"]
    # raised from what it held and tried to allocate when it crashed (the step of its ramp past its fence)
    raised = sim.scheduler.jobs["2"]
    assert raised.mem_source == "oom-raised" and raised.mem_mib == pytest.approx(attempts[1]["mem_mib"], rel=0.02)
    # its second attempt started from what the first read, not from the prior it was submitted with
    with closing(Store(d.state_dir / "collocate.common.sqlite")) as store:
        requeued = store.job("2")[0]
    assert got.told["2"] == "assumed" and requeued.profile_source == raised.profile_source == "history"
    assert attempts[0]["solo_sm"] == pytest.approx(raised.profile.sm_activity, abs=0.05)
    assert requeued.profile.sm_activity == pytest.approx(raised.profile.sm_activity, abs=0.05)


def test_a_resubmission_priced_from_history(daemons):
    """A heavy job runs alone and is measured; a sibling (same script, other numbers) is priced
    from it; the heavy job submitted again while the sibling runs is priced from its history in
    both worlds, so both keep it apart from the sibling rather than start it on trial."""
    heavy = TraceRun(0.8, 0.4, 1.0)
    runs = [heavy, TraceRun(0.6, 0.3, 3.0, after=("1", "done")), replace(heavy, after=("2", "running"))]
    d = daemons("--policy", "auto", gpus="emulated:1xA100-40GB")
    got = run_daemon(d, runs)
    sim, result = _compare(got, runs, "auto", "time-slicing", "1xA100-40GB")
    told = {j: sim.scheduler.jobs[j].profile_source for j in got.told}
    assert got.told == told == {"1": "assumed", "2": "similar", "3": "history"}
    assert not shares(got.spans, got.frozen)["3"]
    # history decided it: the same job under another command (its family's prior only) shares
    _, other = simulate(sim_trace([*runs[:2], replace(heavy, seconds=1.001)], got.arrivals), "auto", "time-slicing")
    assert shares(sim_spans(other), sim_freezes(other))["3"] == {"2"}


def test_a_trial_job_frozen_beside_a_neighbour_and_thawed(daemons):
    """A light job and a heavy one nobody has measured, on one time-sliced GPU: the heavy one
    starts on trial while the GPU reads idle (its start-up is the longer), its readings price it
    once it works, it slows the light one past the limit, and both worlds freeze it, and thaw it
    when the light one ends."""
    runs = [TraceRun(0.2, 0.1, 4.0), TraceRun(1.0, 0.5, 2.0, startup_s=2.5)]
    d = daemons("--policy", "auto", gpus="emulated:1xA100-40GB")
    got = run_daemon(d, runs)
    _, result = _compare(got, runs, "auto", "time-slicing", "1xA100-40GB")
    for frozen, spans in ((got.frozen, got.spans), (sim_freezes(result), sim_spans(result))):
        ((start, end),) = frozen["2"]  # frozen once, thawed as the light job ended, then done
        assert end == pytest.approx(spans["1"][1], abs=1.0) and end < spans["2"][1]
    assert "frozen (slowed job 1" in got.log
    # frozen, it made no progress: it counted its start-up, its work, slowed, and its freeze
    ((start, end),) = got.frozen["2"]
    assert counted_s(got.details["2"]["attempts"][-1]) >= runs[1].startup_s + runs[1].seconds + (end - start) - 0.3


def test_light_jobs_time_slice_the_instances_of_a_mig_layout(daemons):
    """One GPU split 3g.20gb + 4g.20gb: each instance is a device of its own in both worlds, and
    jobs time-slice an instance as they would a whole GPU, slowed by its share of the SMs. Two
    light jobs take an idle instance each; two more nobody has measured join them on trial, each
    on the first instance with no job still starting: job 3 beside job 1 (the shorter start-up),
    job 4 beside job 2 (whose start-up ends before job 3's). Start-ups a second or more apart keep
    each choice from turning on which reading came first: with equal ones the worlds pick by a
    race decided within a sampling period."""
    runs = [TraceRun(0.1, 0.05, 4.0), TraceRun(0.2, 0.1, 4.0, startup_s=2.0),
            TraceRun(0.1, 0.05, 3.0, startup_s=2.0), TraceRun(0.15, 0.05, 3.0)]
    d = daemons("--policy", "auto", gpus="emulated:1xA100-40GB:mig=3g.20gb+4g.20gb")
    got = run_daemon(d, runs)
    _compare(got, runs, "auto", "time-slicing", "1xA100-40GB", mig_layout="3g.20gb+4g.20gb")
    assert {j: g for j, (_, _, g) in got.spans.items()} == {
        "1": {"0/1.0"}, "2": {"0/2.0"}, "3": {"0/1.0"}, "4": {"0/2.0"}}
    assert shares(got.spans, got.frozen) == {"1": {"3"}, "2": {"4"}, "3": {"1"}, "4": {"2"}}
