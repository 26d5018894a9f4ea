"""The lab rules of the core, as both worlds run them: fair share among users who wait,
per-user caps, holds, Slurm's ``afterany``/``afternotok`` dependencies and time limits."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core.fairness import Fairness, Usage, UserLimits
from collocate.core.model import ClusterSnapshot, GpuId, GpuView, Job, JobState, WaitKind
from collocate.core.policies import make_policy
from collocate.core.recovery import ExitReport, Outcome
from collocate.core.scheduler import Capacity, Scheduler

HOUR = 3600.0


def cluster(n=2, now=0.0):
    return ClusterSnapshot.from_views([GpuView(GpuId("n0", i), 40_960.0) for i in range(n)], now=now)


def scheduler(n=2, fairness=None, policy="exclusive"):
    return Scheduler(make_policy(policy), Capacity.of(cluster(n)), fairness=fairness)


def placed(s, n=2, now=0.0):
    return [p.job_id for p in s.schedule(cluster(n, now)).placements]


def test_a_flood_does_not_keep_another_users_first_job_waiting():
    """Alice floods a 1-GPU queue; Bob's one job, submitted later, runs as soon as the GPU frees
    up (fair share), where first-come would make him wait for the whole flood."""
    for fair, bob_starts_after in ((True, 1), (False, 5)):
        s = scheduler(1, Fairness(fair_share=fair))
        for i in range(5):
            s.submit(Job(f"a{i}", user="alice", submit_time=float(i)))
        s.submit(Job("b0", user="bob", submit_time=10.0))
        order, now = [], 0.0
        while len(s.queue):
            order += placed(s, 1, now)
            now += HOUR
            s.job_exited(order[-1], ExitReport(Outcome.SUCCEEDED), now)
        assert order.index("b0") == bob_starts_after, (fair, order)


def test_priority_comes_before_fair_share_and_a_users_own_order_stands():
    s = scheduler(1)
    s.submit(Job("busy", user="alice"))
    placed(s, 1, 0.0)  # alice now has usage; bob has none
    s.submit(Job("a-low", user="alice", submit_time=1.0))
    s.submit(Job("a-high", user="alice", submit_time=2.0, priority=5))
    s.submit(Job("b1", user="bob", submit_time=3.0))
    s.submit(Job("b2", user="bob", submit_time=4.0))
    full = ClusterSnapshot.from_views([GpuView(GpuId("n0", 0), 40_960.0, jobs=("busy",))], now=HOUR)
    assert not s.schedule(full).placements  # the GPU is taken: the round only orders the queue
    assert [j.id for j in s.queue] == ["a-high", "b1", "b2", "a-low"]


def test_usage_decays_with_its_half_life_and_counts_running_jobs():
    u = Usage(half_life_s=HOUR)
    u.charge("alice", 100.0, at=0.0)
    assert u.of("alice", HOUR) == pytest.approx(50.0)
    assert u.of("alice", 2 * HOUR) == pytest.approx(25.0)
    u.started("bob", 2, at=10.0)
    assert u.of("bob", 20.0) == pytest.approx(20.0)  # 2 GPUs for 10 s, running
    u.stopped("bob", 2, started=10.0, at=30.0)
    assert u.running("bob") == (0, 0) and u.of("bob", 30.0) == pytest.approx(40.0)
    u.charge("carol", 8.0, at=HOUR)
    u.charge("carol", 8.0, at=0.0)  # an older record (a restart replaying history)
    assert u.of("carol", HOUR) == pytest.approx(12.0)


def test_caps_hold_a_users_further_jobs_and_say_why():
    lab = Fairness(default=UserLimits(max_running_jobs=2), users={"bob": UserLimits(max_gpus=1)})
    s = scheduler(4, lab, policy="declared-memory")
    for i in range(4):
        s.submit(Job(f"a{i}", user="alice", mem_mib=1024.0, submit_time=float(i)))
    s.submit(Job("b-wide", user="bob", gpus=2, mem_mib=1024.0, submit_time=5.0))
    s.submit(Job("b-one", user="bob", mem_mib=1024.0, submit_time=6.0))
    assert sorted(placed(s, 4)) == ["a0", "a1", "b-one"]
    wait = s.why_waiting("a2")
    assert wait.kind is WaitKind.LIMIT and "alice runs 2 job(s)" in wait.detail
    assert "max_gpus" in s.why_waiting("b-wide").detail
    s.job_exited("a0", ExitReport(Outcome.SUCCEEDED), 10.0)
    assert placed(s, 4, 10.0) == ["a2"]


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 3)), min_size=1, max_size=25),
       cap_jobs=st.integers(1, 4), cap_gpus=st.integers(1, 5), gpus=st.integers(3, 8))
def test_no_round_takes_a_user_past_a_cap(jobs, cap_jobs, cap_gpus, gpus):
    s = scheduler(gpus, Fairness(default=UserLimits(cap_jobs, cap_gpus)), policy="declared-memory")
    for i, (user, width) in enumerate(jobs):
        s.submit(Job(str(i), user=user, gpus=min(width, gpus), mem_mib=1024.0, submit_time=float(i)))
    now = 0.0
    for _ in range(3 * len(jobs)):
        s.schedule(cluster(gpus, now))
        running = [j for j in s.jobs.values() if j.state is JobState.RUNNING]
        for user in "abc":
            mine = [j for j in running if j.user == user]
            assert len(mine) <= cap_jobs and sum(j.gpus for j in mine) <= max(cap_gpus, 0)
        if running:
            now += 1.0
            s.job_exited(running[0].id, ExitReport(Outcome.SUCCEEDED), now)
    # every job that fits under its user's caps eventually ran
    assert all(j.state is JobState.DONE or j.gpus > cap_gpus for j in s.jobs.values())


def test_a_held_job_stays_out_of_the_queue_until_released():
    s = scheduler(1)
    s.submit(Job("a"))
    s.hold("a", by="admin")
    assert placed(s) == [] and s.why_waiting("a").kind is WaitKind.HELD
    assert "daemon's owner" in s.why_waiting("a").detail
    s.release("a")
    assert placed(s) == ["a"]
    with pytest.raises(Exception, match="only a pending job"):
        s.hold("a")


@pytest.mark.parametrize("ends, runs_any, runs_notok, runs_ok", [
    (Outcome.SUCCEEDED, True, False, True),
    (Outcome.FAILED, True, True, False),
    (Outcome.TIMEOUT, True, True, False),
])
def test_after_any_and_after_notok_follow_slurm(ends, runs_any, runs_notok, runs_ok):
    s = scheduler(4)
    s.submit(Job("train"))
    s.submit(Job("any", after_any=("train",), submit_time=1.0))
    s.submit(Job("notok", after_notok=("train",), submit_time=2.0))
    s.submit(Job("ok", after=("train",), submit_time=3.0))
    assert placed(s, 4) == ["train"]
    assert s.why_waiting("notok").kind is WaitKind.DEPENDENCY
    s.job_exited("train", ExitReport(ends, reason="x"), 5.0)
    ran = set(placed(s, 4, 5.0))
    assert ("any" in ran, "notok" in ran, "ok" in ran) == (runs_any, runs_notok, runs_ok)
    for job_id, runs in (("notok", runs_notok), ("ok", runs_ok)):
        if not runs:
            assert s.jobs[job_id].state is JobState.CANCELLED and "train" in s.jobs[job_id].reason


def test_after_notok_of_a_job_already_done_is_refused():
    s = scheduler()
    s.submit(Job("a"))
    placed(s)
    s.job_exited("a", ExitReport(Outcome.SUCCEEDED), 1.0)
    assert "ended done" in s.why_not_after(Job("b", after_notok=("a",)))
    assert s.why_not_after(Job("c", after_any=("a",))) is None


def test_a_time_limit_makes_a_job_overdue_and_timeout_is_final():
    s = scheduler(1)
    s.submit(Job("short", time_limit_s=60.0, max_retries=3, retry_failures=True))
    s.schedule(cluster(1, now=100.0))
    assert s.overdue(159.0) == [] and [j.id for j in s.overdue(160.0)] == ["short"]
    job = s.job_exited("short", ExitReport(Outcome.TIMEOUT, reason="reached its time limit"), 160.0)
    assert job.state is JobState.TIMEOUT and job.state.is_terminal
    assert s.overdue(1e9) == []
    assert s.usage.of("", 160.0) == pytest.approx(60.0)  # its GPU time is charged


def test_restore_rebuilds_running_usage_caps_and_deadlines():
    s = scheduler(2, Fairness(default=UserLimits(max_running_jobs=1)))
    s.submit(Job("a", user="alice", time_limit_s=10.0))
    s.submit(Job("b", user="alice", submit_time=1.0))
    s.schedule(cluster(2, now=5.0))
    again = scheduler(2, Fairness(default=UserLimits(max_running_jobs=1)))
    again.restore(s.jobs.values())
    assert again.usage.running("alice") == (1, 1)
    assert [j.id for j in again.overdue(15.0)] == ["a"]
    assert placed(again, 2, 6.0) == [] and again.why_waiting("b").kind is WaitKind.LIMIT
    assert math.isclose(again.usage.of("alice", 7.0), 2.0)
