"""Start, observe, take back (issue 35): the pure freeze/thaw rule, the scheduler's record of
it (frozen time does not count against --time), and the simulator carrying it out."""

from __future__ import annotations

import pytest

from collocate.gputypes import parse_cluster
from collocate.model import ClusterSnapshot, GpuId, GpuView, Job, JobProfile, JobState, Placement, Plan
from collocate.policies import make_policy
from collocate.scheduler import Capacity, Scheduler
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload
from collocate.suspension import Neighbour, SuspendRules, review

GPU = GpuId("n", 0)
RULES = SuspendRules()


def _jobs(**extra: Job) -> dict[str, Job]:
    base = {"old": Job("old", state=JobState.RUNNING, started_at=0.0),
            "new": Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True)}
    return {**base, **extra}


def _around(old_slowdown: float, *, measured: bool = True, new_active: bool = True):
    views = [Neighbour("old", (0,), 1, True, old_slowdown, measured), Neighbour("new", (0,), 2, new_active, 1.0)]
    return lambda job_id: views


def test_a_job_on_trial_is_frozen_when_a_neighbour_is_seen_slowed_past_the_limit():
    decided = review(_jobs(), ["new"], _around(2.4), 100.0, RULES)
    assert [f.job_id for f in decided.freeze] == ["new"] and not decided.thaw
    assert "job old" in decided.freeze[0].why and "2.4x" in decided.freeze[0].why
    assert decided.freeze[0].beside == ("old",)
    # within the limit, or not seen working yet: it runs on
    assert not review(_jobs(), ["new"], _around(1.9), 100.0, RULES)
    assert not review(_jobs(), ["new"], _around(2.4, new_active=False), 100.0, RULES)


def test_only_jobs_on_trial_and_never_one_across_nodes_or_interactive_are_frozen():
    for job in (Job("new", state=JobState.RUNNING, started_at=50.0),
                Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True, nodes=2),
                Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True, interactive=True)):
        assert not review(_jobs(new=job), ["new"], _around(3.0), 100.0, RULES), job


def test_a_frozen_job_thaws_when_room_returns_and_is_not_frozen_again_at_once():
    frozen = Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True, suspended="trial",
                 suspended_at=100.0, suspended_beside=("old",))
    # its neighbour still runs: it stays frozen, whatever the neighbour now measures
    assert not review(_jobs(new=frozen), ["new"], _around(1.0), 200.0, RULES)
    # its neighbour ended: thawed
    alone = [Neighbour("new", (0,), 2, False, 0.0)]
    assert review(_jobs(new=frozen), ["new"], lambda j: alone, 200.0, RULES).thaw == ("new",)
    # hysteresis: thawed at 200, it is not frozen again before 200 + settle_s
    thawed = Job("new", state=JobState.RUNNING, started_at=50.0, on_trial=True, thawed_at=200.0)
    early = review(_jobs(new=thawed), ["new"], _around(3.0), 200.0 + RULES.settle_s / 2, RULES)
    assert not early and early.recheck_at == pytest.approx(200.0 + RULES.settle_s)
    assert review(_jobs(new=thawed), ["new"], _around(3.0), 200.0 + RULES.settle_s, RULES).freeze


def test_one_freeze_per_gpu_per_settling_period_the_newest_first():
    jobs = _jobs(newer=Job("newer", state=JobState.RUNNING, started_at=60.0, on_trial=True))
    views = [Neighbour("old", (0,), 1, True, 3.0, True), Neighbour("new", (0,), 2, True, 1.0),
             Neighbour("newer", (0,), 3, True, 1.0)]
    decided = review(jobs, ["new", "newer"], lambda j: views, 100.0, RULES)
    assert [f.job_id for f in decided.freeze] == ["newer"]


def test_the_scheduler_stops_a_frozen_jobs_clock_and_a_user_suspension_is_the_users():
    cluster = ClusterSnapshot.from_views([GpuView(GPU, 80_000.0)], now=0.0)

    def place(queue, snapshot):
        return Plan((Placement(queue[0].id, (GPU,), trial=True),))

    s = Scheduler(place, Capacity.of(cluster))  # type: ignore[arg-type]
    s.submit(Job("j", mem_mib=1000.0, time_limit_s=100.0))
    s.schedule(cluster)
    assert s.jobs["j"].on_trial and s.reviewing
    s.suspend("j", "trial", 40.0, why="slowed job x")
    assert not s.overdue(500.0)  # frozen: its limit does not run
    s.resume("j", 70.0)
    assert s.jobs["j"].frozen_s == 30.0 and s.jobs["j"].thawed_at == 70.0
    assert not s.overdue(129.0) and [j.id for j in s.overdue(130.0)]  # 100 s of running, 30 frozen
    s.suspend("j", "user", 80.0)
    # the scheduler never thaws what a user suspended
    assert not s.review(lambda job_id: [], 1000.0).thaw and s.jobs["j"].suspended == "user"
    assert s.jobs["j"].state is JobState.RUNNING
    # an end clears the suspension
    s.cancel("j", now=90.0)
    assert not s.jobs["j"].suspended and not s.reviewing


def test_the_simulator_freezes_a_job_that_turned_out_heavy_and_every_job_ends_done():
    # `a` (SM 0.5) trains alone; `b`, unknown to the daemon, starts beside it on its prior and
    # turns out heavy (SM 1.0): once the readings price it, the model says `a` runs 2.8x slower
    # under time-slicing, past the limit: `b` is frozen (no progress, memory kept) until `a` ends
    base = Workload("base", 1, 300.0, 8000.0, {"declared": 8192.0}, JobProfile(0.5, 0.3), command="a", program="a")
    heavy = Workload("heavy", 1, 100.0, 8000.0, {"declared": 8192.0}, JobProfile(1.0, 0.9), command="b",
                     program="b")
    trace = [TraceJob("a", 0.0, base), TraceJob("b", 30.0, heavy)]
    sim = Simulation(parse_cluster("1xH100-80GB"), trace, make_policy("auto"),
                     SimConfig(estimator="declared", profiles="unknown", ramp_s=2.0, startup_s=5.0))
    seen = []
    review_once = sim._review

    def watch(now):
        changed = review_once(now)
        run = sim.running.get("b")
        if run is not None and run.frozen:
            seen.append((now, run.work_left, sim.used[0], sim.scheduler.jobs["b"].suspended))
        return changed

    sim._review = watch  # type: ignore[method-assign]
    result = sim.run()
    records = {r.id: r for r in result.records}
    assert all(r.state == "done" for r in records.values())
    assert result.frozen_seconds > 200.0
    assert records["a"].end < 300.0 * 1.1  # a ran (almost) as if alone once b was frozen
    assert records["b"].end >= records["a"].end  # b waited frozen for a's end, then finished
    assert len({round(w, 6) for _, w, _, _ in seen}) == 1  # frozen: no progress
    assert all(used >= 2 * 8000.0 for _, _, used, _ in seen)  # ... and its memory kept
    assert all(by == "trial" for *_, by in seen)
