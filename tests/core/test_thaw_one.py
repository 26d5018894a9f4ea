"""Trial jobs yield in queue order (``SuspendRules.thaw_one``): the one frozen is the one that
came last in the queue, and when room returns on a GPU only the frozen job that came first there
thaws, one per GPU per settling period, as a plain queue would have run them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core.gputypes import parse_cluster
from collocate.core.model import Job, JobProfile, JobState, queue_key
from collocate.core.policies import make_policy
from collocate.core.suspension import Neighbour, SuspendRules, review
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload

THAW_ONE = SuspendRules(thaw_one=True)
SETTLE = THAW_ONE.settle_s


def _frozen(job_id: str, submit: float, *, priority: int = 0, oom: int = 0, at: float = 100.0) -> Job:
    """Frozen on trial at ``at`` beside ``old`` and ``gone`` (which has since ended)."""
    return Job(job_id, state=JobState.RUNNING, submit_time=submit, priority=priority, oom_crashes=oom,
               started_at=50.0 + submit, on_trial=True, suspended="trial", suspended_at=at,
               suspended_beside=("old", "gone"))


def _gpu(jobs: dict[str, Job], old_slowdown: float = 1.0, devices: dict[str, int] | None = None):
    """Everything in ``jobs`` on GPU 0 (or as ``devices`` says), ``old`` working at ``old_slowdown``."""
    devices = devices or {}
    views = [Neighbour(j, (devices.get(j, 0),), i, j == "old" or not jobs[j].suspended,
                       old_slowdown if j == "old" else 1.0, j == "old") for i, j in enumerate(jobs)]
    return lambda job_id: [n for n in views if set(n.devices) & set(next(m for m in views if m.job_id == job_id).devices)]


def test_jobs_frozen_together_thaw_one_at_a_time_the_first_in_the_queue_first():
    jobs = {"old": Job("old", state=JobState.RUNNING, started_at=0.0),
            "f1": _frozen("f1", 10.0), "f2": _frozen("f2", 5.0), "f3": _frozen("f3", 20.0)}
    watched = ["f1", "f2", "f3"]
    assert review(jobs, watched, _gpu(jobs), 200.0, THAW_ONE).thaw == ("f2",)
    # under the rule before, all three thaw at once
    assert sorted(review(jobs, watched, _gpu(jobs), 200.0, SuspendRules()).thaw) == ["f1", "f2", "f3"]
    # f2 thawed at 200: the GPU settles before the next thaw, and says when to look again
    jobs["f2"] = jobs["f2"].evolve(suspended="", suspended_at=None, suspended_beside=(), thawed_at=200.0)
    early = review(jobs, watched, _gpu(jobs), 200.0 + SETTLE / 2, THAW_ONE)
    assert not early and early.recheck_at == 200.0 + SETTLE
    assert review(jobs, watched, _gpu(jobs), 200.0 + SETTLE, THAW_ONE).thaw == ("f1",)


def test_no_thaw_while_a_job_running_there_reads_slowed_past_the_limit():
    jobs = {"old": Job("old", state=JobState.RUNNING, started_at=0.0), "f1": _frozen("f1", 10.0)}
    assert not review(jobs, ["f1"], _gpu(jobs, old_slowdown=2.5), 200.0, THAW_ONE)
    assert review(jobs, ["f1"], _gpu(jobs, old_slowdown=1.9), 200.0, THAW_ONE).thaw == ("f1",)


def test_a_job_whose_room_has_not_returned_does_not_hold_back_a_later_one_whose_room_has():
    # f1 (first in the queue) was frozen again at 190 beside old and f2, which still run; f3's
    # room returned (it was frozen beside `gone`): it thaws, f1 stays frozen
    jobs = {"old": Job("old", state=JobState.RUNNING, started_at=0.0),
            "f1": _frozen("f1", 5.0, at=190.0).evolve(suspended_beside=("old", "f2")),
            "f2": Job("f2", state=JobState.RUNNING, submit_time=6.0, started_at=60.0, on_trial=True, thawed_at=100.0),
            "f3": _frozen("f3", 20.0)}
    assert review(jobs, ["f1", "f2", "f3"], _gpu(jobs), 300.0, THAW_ONE).thaw == ("f3",)


def test_a_gpu_settles_after_a_freeze_before_a_thaw():
    jobs = {"old": Job("old", state=JobState.RUNNING, started_at=0.0), "f1": _frozen("f1", 5.0),
            "f2": _frozen("f2", 6.0, at=190.0)}
    # f2 frozen at 190 (beside `gone` too, for the example's sake): f1 waits for 190 + settle_s
    early = review(jobs, ["f1", "f2"], _gpu(jobs), 200.0, THAW_ONE)
    assert not early and early.recheck_at == 190.0 + SETTLE
    assert review(jobs, ["f1", "f2"], _gpu(jobs), 190.0 + SETTLE, THAW_ONE).thaw == ("f1",)


def test_the_job_frozen_is_the_last_in_the_queue_not_the_newest_started():
    # `early` was submitted first but started last (it waited behind others): a plain queue would
    # have run it first, so `late` yields; the rule before froze the newest started
    jobs = {"old": Job("old", state=JobState.RUNNING, started_at=0.0),
            "early": Job("early", state=JobState.RUNNING, submit_time=1.0, started_at=60.0, on_trial=True),
            "late": Job("late", state=JobState.RUNNING, submit_time=2.0, started_at=50.0, on_trial=True)}
    views = [Neighbour("old", (0,), 0, True, 3.0, True), Neighbour("early", (0,), 2, True, 1.0),
             Neighbour("late", (0,), 1, True, 1.0)]
    assert [f.job_id for f in review(jobs, ["early", "late"], lambda j: views, 100.0, THAW_ONE).freeze] == ["late"]
    assert [f.job_id for f in review(jobs, ["early", "late"], lambda j: views, 100.0, SuspendRules()).freeze] == ["early"]
    # priority comes before submission, as in the queue
    jobs["late"] = jobs["late"].evolve(priority=1)
    assert [f.job_id for f in review(jobs, ["early", "late"], lambda j: views, 100.0, THAW_ONE).freeze] == ["early"]


_queue_place = st.tuples(st.integers(0, 2), st.integers(0, 100), st.integers(0, 1), st.integers(0, 1))


@settings(max_examples=60, deadline=None)
@given(st.lists(_queue_place, min_size=1, max_size=8))
def test_on_each_gpu_exactly_the_first_ready_job_in_the_queue_thaws(places):
    # (priority, submission, recovered, GPU) of each frozen job whose room returned
    jobs = {"old": Job("old", state=JobState.RUNNING, started_at=0.0)}
    devices = {}
    for i, (priority, submit, oom, device) in enumerate(places):
        jobs[f"f{i}"] = _frozen(f"f{i}", float(submit), priority=priority, oom=oom)
        devices[f"f{i}"] = device
    watched = [j for j in jobs if j != "old"]
    thawed = review(jobs, watched, _gpu(jobs, devices=devices), 200.0, THAW_ONE).thaw
    expected = {min((j for j in watched if devices[j] == d), key=lambda j: queue_key(jobs[j]))
                for d in set(devices.values())}
    # `old` is on GPU 0 only: a job frozen on GPU 1 beside it finds it gone, and thaws too
    assert set(thawed) == expected and len(thawed) == len(expected)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 100), st.integers(0, 100)), min_size=1, max_size=8))
def test_the_trial_job_frozen_is_the_last_in_the_queue(trials):
    # (priority, submission, start) of trial jobs working beside `old`, slowed to 3x
    jobs = {"old": Job("old", state=JobState.RUNNING, started_at=0.0)}
    for i, (priority, submit, start) in enumerate(trials):
        jobs[f"t{i}"] = Job(f"t{i}", state=JobState.RUNNING, submit_time=float(submit), priority=priority,
                            started_at=float(start), on_trial=True)
    views = [Neighbour(j, (0,), i, True, 3.0 if j == "old" else 1.0, j == "old") for i, j in enumerate(jobs)]
    watched = [j for j in jobs if j != "old"]
    frozen = [f.job_id for f in review(jobs, watched, lambda j: views, 200.0, THAW_ONE).freeze]
    assert frozen == [max(watched, key=lambda j: queue_key(jobs[j]))]


def test_the_simulator_thaws_a_frozen_pile_up_one_at_a_time():
    # four jobs nobody has measured start beside `a` (observe_slots=99) and are taken back at
    # once; when h0 ends they thaw, together under the rule before, one per settling period
    # with thaw_one, the first submitted first, and every job ends done
    base = Workload("base", 1, 300.0, 8000.0, {"declared": 8192.0}, JobProfile(0.5, 0.3), command="a", program="a")
    trace = [TraceJob("a", 0.0, base)] + [
        TraceJob(f"h{i}", 30.0 + i, Workload(f"h{i}", 1, 100.0, 8000.0, {"declared": 8192.0}, JobProfile(0.6, 0.4),
                                             command=f"h{i}", program=f"h{i}")) for i in range(4)]
    thaws: dict[bool, list[tuple[float, tuple[str, ...]]]] = {}
    for thaw_one in (False, True):
        sim = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("auto", observe_slots=99),
                         SimConfig(estimator="declared", profiles="unknown", ramp_s=2.0, startup_s=5.0))
        sim.scheduler.suspend_rules = SuspendRules(at_once=True, thaw_one=thaw_one)
        seen = thaws[thaw_one] = []
        review_once = sim.scheduler.review

        def watch(neighbourhood, now, review_once=review_once, seen=seen):
            decided = review_once(neighbourhood, now)
            if decided.thaw:
                seen.append((now, decided.thaw))
            return decided

        sim.scheduler.review = watch  # type: ignore[method-assign]
        result = sim.run()
        assert all(r.state == "done" for r in result.records)
    assert any(len(t) > 1 for _, t in thaws[False])
    assert thaws[True] and all(len(t) == 1 for _, t in thaws[True])
    times = [now for now, _ in thaws[True]]
    assert all(b - a >= SETTLE for a, b in zip(times, times[1:], strict=False))
    assert [t for _, t in thaws[True][:2]] == [("h1",), ("h2",)]
