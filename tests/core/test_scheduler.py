"""The scheduling core: admission, queue order, plan checks and recovery rules."""

import pytest

from collocate.common.errors import CollocateError
from collocate.core.model import (
    ClusterSnapshot,
    GpuId,
    GpuView,
    Job,
    JobState,
    Placement,
    Plan,
    Rejection,
)
from collocate.core.policies import make_policy
from collocate.core.recovery import (
    ExitReport,
    Outcome,
    RecoveryRules,
    after_exit,
    raised_requirement,
)
from collocate.core.scheduler import Capacity, PolicyError, Scheduler

GIB = 1024.0


def cluster(n=2, total=40 * GIB):
    return ClusterSnapshot.from_views([GpuView(GpuId("n0", i), total) for i in range(n)])


def test_jobs_no_node_can_run_are_rejected_with_a_reason():
    s = Scheduler(make_policy("exclusive"), Capacity.of(cluster()))
    too_wide = s.submit(Job("a", gpus=3))
    too_big = s.submit(Job("b", mem_mib=50 * GIB))
    assert too_wide.state is JobState.REJECTED and "largest node has 2" in too_wide.reason
    assert too_big.state is JobState.REJECTED and "largest GPU has" in too_big.reason
    assert list(s.queue) == []


def test_oom_requeues_first_with_raised_memory_until_retries_run_out():
    s = Scheduler(make_policy("exclusive"), Capacity.of(cluster(1)))
    s.submit(Job("early", submit_time=0.0))
    s.submit(Job("late", mem_mib=4 * GIB, submit_time=1.0, max_retries=1))
    s.schedule(cluster(1))  # "early" runs
    s.job_exited("early", ExitReport(Outcome.SUCCEEDED))
    plan = s.schedule(cluster(1))
    assert [p.job_id for p in plan.placements] == ["late"]
    s.submit(Job("other", submit_time=2.0))
    job = s.job_exited("late", ExitReport(Outcome.OOM, observed_peak_mib=6 * GIB))
    assert job.state is JobState.PENDING and job.recovered
    assert job.mem_mib == 6 * GIB * 1.25 + 512
    assert [j.id for j in s.queue] == ["late", "other"]  # recovered jobs go first
    s.schedule(cluster(1))
    failed = s.job_exited("late", ExitReport(Outcome.OOM, observed_peak_mib=7 * GIB))
    assert failed.state is JobState.FAILED and "2 attempts" in failed.reason


def test_requirement_is_never_lowered_and_other_failures_are_not_retried():
    assert raised_requirement(10 * GIB, 2 * GIB, RecoveryRules()) == 10 * GIB
    assert raised_requirement(None, None, RecoveryRules()) is None
    running = Job("a", state=JobState.RUNNING, attempts=1)
    assert after_exit(running, ExitReport(Outcome.FAILED, reason="exit 2")).state is JobState.FAILED
    assert after_exit(running, ExitReport(Outcome.FAILED), RecoveryRules(retry_failures=True)).state is JobState.PENDING
    assert after_exit(running, ExitReport(Outcome.LOST)).state is JobState.PENDING


def test_an_interactive_job_ends_with_its_status_and_is_never_requeued():
    """``collocate run``: its member's terminal went with the attempt, so nothing retries it."""
    job = Job("a", state=JobState.RUNNING, attempts=1, interactive=True, retry_failures=True, mem_mib=GIB)
    oom = after_exit(job, ExitReport(Outcome.OOM, observed_peak_mib=2 * GIB, reason="CUDA out of memory"))
    assert oom.state is JobState.FAILED and oom.oom_crashes == 1 and oom.mem_mib == GIB
    for outcome in (Outcome.LOST, Outcome.FAILED):
        assert after_exit(job, ExitReport(outcome)).state is JobState.FAILED
    assert after_exit(job, ExitReport(Outcome.SUCCEEDED)).state is JobState.DONE
    assert after_exit(job, ExitReport(Outcome.CANCELLED)).state is JobState.CANCELLED


def test_a_bad_plan_is_caught_as_a_policy_bug():
    class Broken:
        name = "broken"

        def __call__(self, queue, cluster):
            return Plan((Placement("a", (GpuId("n0", 0), GpuId("n0", 1))),))

    s = Scheduler(Broken(), Capacity.of(cluster()))
    s.submit(Job("a", gpus=1))
    with pytest.raises(PolicyError):
        s.schedule(cluster())


def test_duplicate_ids_and_exits_of_jobs_not_running_are_refused():
    s = Scheduler(make_policy("exclusive"), Capacity.of(cluster()))
    s.submit(Job("a"))
    with pytest.raises(CollocateError):
        s.submit(Job("a"))
    with pytest.raises(CollocateError):
        s.job_exited("a", ExitReport(Outcome.SUCCEEDED))
    assert s.cancel("a").state is JobState.CANCELLED
    assert list(s.queue) == []


def test_an_oom_that_outgrows_every_gpu_fails_instead_of_waiting_forever():
    s = Scheduler(make_policy("exclusive"), Capacity.of(cluster(1, total=16 * GIB)))
    s.submit(Job("a", mem_mib=8 * GIB))
    s.schedule(cluster(1, total=16 * GIB))
    job = s.job_exited("a", ExitReport(Outcome.OOM, observed_peak_mib=17 * GIB, reason="CUDA out of memory"))
    assert job.state is JobState.FAILED
    assert job.reason.startswith("CUDA out of memory; cannot retry: it now needs")
    assert list(s.queue) == []


def test_an_oom_whose_margins_outgrow_every_gpu_but_that_fits_one_runs_alone():
    """It held 15 GiB of a 16 GiB GPU: the raised requirement's margins pass the GPU, what it
    needed does not, so it runs alone on a whole GPU rather than failing."""
    s = Scheduler(make_policy("exclusive"), Capacity.of(cluster(1, total=16 * GIB)))
    s.submit(Job("a", mem_mib=8 * GIB))
    s.schedule(cluster(1, total=16 * GIB))
    job = s.job_exited("a", ExitReport(Outcome.OOM, observed_peak_mib=15 * GIB, reason="CUDA out of memory"))
    assert job.state is JobState.PENDING and job.alone and job.mem_mib == 16 * GIB


def test_retrying_plain_failures_is_per_job_and_lost_attempts_do_not_count():
    s = Scheduler(make_policy("exclusive"), Capacity.of(cluster(2)))
    s.submit(Job("asked", retry_failures=True, max_retries=1))
    s.submit(Job("plain"))
    s.schedule(cluster(2))
    assert s.job_exited("asked", ExitReport(Outcome.FAILED, reason="exit 1")).state is JobState.PENDING
    assert s.job_exited("plain", ExitReport(Outcome.FAILED, reason="exit 1")).state is JobState.FAILED
    for _ in range(3):  # lost attempts (daemon down) never use up retries
        s.schedule(cluster(2))
        job = s.job_exited("asked", ExitReport(Outcome.LOST, reason="vanished"))
        assert job.state is JobState.PENDING and job.reason == "vanished"
    s.schedule(cluster(2))
    assert s.job_exited("asked", ExitReport(Outcome.FAILED, reason="exit 1")).state is JobState.FAILED


def test_a_policy_rejection_is_applied_with_its_reason():
    class Refuses:
        name = "refuses"

        def __call__(self, queue, cluster):
            return Plan(rejections=(Rejection(queue[0].id, "never on Sundays"),))

    s = Scheduler(Refuses(), Capacity.of(cluster()))
    s.submit(Job("a"))
    s.schedule(cluster())
    assert s.jobs["a"].state is JobState.REJECTED and s.jobs["a"].reason == "never on Sundays"


def test_edit_rewires_dependencies_refuses_cycles_and_running_jobs():
    s = Scheduler(make_policy("exclusive"), Capacity.of(cluster(1)))
    a, b, c = (s.submit(Job(id=i, mem_mib=GIB, submit_time=float(i))) for i in ("1", "2", "3"))
    s.edit(c.evolve(after=("2",)))
    assert [j.id for j in s.queue] == ["1", "2"] and s.jobs["3"].reason == "waits for job 2"
    with pytest.raises(CollocateError, match="would wait for itself: job 3 waits for it"):
        s.edit(b.evolve(after=("3",)))
    with pytest.raises(CollocateError, match="depends on itself"):
        s.edit(a.evolve(after_any=("1",)))
    s.edit(s.jobs["3"].evolve(after=()))  # dropped: it joins the queue again
    assert [j.id for j in s.queue] == ["1", "2", "3"]
    s.schedule(cluster(1))
    with pytest.raises(CollocateError, match="only a pending job"):
        s.edit(s.jobs["1"].evolve(name="x"))


def test_a_stopped_user_gets_no_new_attempt_and_their_jobs_say_why():
    """A member at their storage quota (the daemon sets ``stopped_users``): their jobs wait
    with the reason, others' start; once freed, theirs start again (issue 36)."""
    from collocate.core.model import WaitKind

    s = Scheduler(make_policy("exclusive"), Capacity.of(cluster(2)))
    s.submit(Job("a1", user="ann", submit_time=0.0))
    s.submit(Job("b1", user="bob", submit_time=1.0))
    s.stopped_users = {"ann": "ann's jobs hold 8.0 MiB, at the quota"}
    assert [p.job_id for p in s.schedule(cluster(2)).placements] == ["b1"]
    wait = s.why_waiting("a1")
    assert wait is not None and wait.kind is WaitKind.QUOTA and "at the quota" in str(wait)
    s.stopped_users = {}
    assert [p.job_id for p in s.schedule(cluster(2)).placements] == ["a1"]
