"""Jobs that wait for other jobs (``Job.after``): held out of the policy's queue until their
dependencies are done, cancelled when one ends any other way, and rebuilt after a restart."""

from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core.model import ClusterSnapshot, GpuId, GpuView, Job, JobState
from collocate.core.policies import make_policy
from collocate.core.recovery import ExitReport, Outcome
from collocate.core.scheduler import Capacity, Scheduler


def cluster(n=2):
    return ClusterSnapshot.from_views([GpuView(GpuId("n0", i), 40_960.0) for i in range(n)])


def scheduler(n=2, changes=None):
    return Scheduler(make_policy("exclusive"), Capacity.of(cluster(n)), on_change=changes)


def placed(s, n=2):
    return [p.job_id for p in s.schedule(cluster(n)).placements]


def test_a_dependent_job_waits_outside_the_queue_until_its_dependency_is_done():
    s = scheduler()
    s.submit(Job("train"))
    evaluate = s.submit(Job("eval", after=("train",), submit_time=1.0))
    assert evaluate.state is JobState.PENDING and evaluate.reason == "waits for job train"
    assert placed(s) == ["train"]  # a free GPU stays free: eval is not in the queue
    s.job_exited("train", ExitReport(Outcome.SUCCEEDED))
    assert s.jobs["eval"].reason == ""
    assert placed(s) == ["eval"]


def test_a_job_waits_for_all_of_its_dependencies():
    s = scheduler()
    s.submit(Job("a"))
    s.submit(Job("b"))
    s.submit(Job("merge", after=("a", "b")))
    assert s.jobs["merge"].reason == "waits for jobs a, b"
    assert placed(s) == ["a", "b"]
    s.job_exited("b", ExitReport(Outcome.SUCCEEDED))
    assert s.jobs["merge"].reason == "waits for job a" and placed(s) == []
    s.job_exited("a", ExitReport(Outcome.SUCCEEDED))
    assert placed(s) == ["merge"]


def test_a_job_named_by_two_kinds_of_dependency_is_said_once():
    s = scheduler()
    s.submit(Job("a"))
    s.submit(Job("both", after=("a",), after_any=("a",)))
    assert s.jobs["both"].reason == "waits for job a"


def test_a_failed_dependency_cancels_its_dependents_transitively_with_the_reason():
    s = scheduler()
    s.submit(Job("prep"))
    s.submit(Job("train", after=("prep",)))
    s.submit(Job("eval", after=("train",)))
    placed(s)
    s.job_exited("prep", ExitReport(Outcome.FAILED, reason="exit status 1"))
    assert s.jobs["train"].state is JobState.CANCELLED
    assert s.jobs["train"].reason == "job prep it depends on ended failed"
    assert s.jobs["eval"].state is JobState.CANCELLED
    assert s.jobs["eval"].reason == "job train it depends on ended cancelled"
    assert list(s.queue) == []


def test_an_oom_requeue_of_the_dependency_keeps_the_dependent_waiting():
    s = scheduler()
    s.submit(Job("train", mem_mib=4096.0))
    s.submit(Job("eval", after=("train",)))
    placed(s)
    s.job_exited("train", ExitReport(Outcome.OOM, observed_peak_mib=8192.0))
    assert s.jobs["eval"].state is JobState.PENDING and placed(s) == ["train"]
    s.job_exited("train", ExitReport(Outcome.SUCCEEDED))
    assert placed(s) == ["eval"]


def test_cancelling_a_dependency_cancels_the_dependent():
    s = scheduler()
    s.submit(Job("train"))
    s.submit(Job("eval", after=("train",)))
    s.cancel("train")
    assert s.jobs["eval"].state is JobState.CANCELLED


def test_unknown_or_already_failed_dependencies_are_rejected_at_submission():
    s = scheduler()
    assert s.submit(Job("x", after=("nope",))).reason == "depends on job nope, which does not exist"
    s.submit(Job("bad"))
    placed(s)
    s.job_exited("bad", ExitReport(Outcome.FAILED))
    late = s.submit(Job("y", after=("bad",)))
    assert late.state is JobState.REJECTED and late.reason == "depends on job bad, which ended failed"
    done = s.submit(Job("ok"))
    placed(s)
    s.job_exited(done.id, ExitReport(Outcome.SUCCEEDED))
    assert s.submit(Job("z", after=("ok",))).reason == ""  # already done: queued at once
    assert placed(s) == ["z"]


def test_restore_rebuilds_waiting_jobs_and_cancels_those_whose_dependency_ended_badly():
    saved: dict[str, Job] = {}
    s = scheduler(changes=lambda job: saved.__setitem__(job.id, job))
    for job in (Job("a"), Job("b"), Job("after-a", after=("a",)), Job("after-b", after=("b",))):
        s.submit(job)
    placed(s)
    # The daemon dies; while it is down, "a" succeeds and "b" fails (read back from the runner).
    saved["a"] = saved["a"].evolve(state=JobState.DONE)
    saved["b"] = saved["b"].evolve(state=JobState.FAILED)
    changed: list[Job] = []
    restarted = scheduler(changes=changed.append)
    restarted.restore(saved.values())
    assert [j.id for j in restarted.queue] == ["after-a"]
    assert restarted.jobs["after-b"].state is JobState.CANCELLED
    assert [j.id for j in changed] == ["after-b"]  # persisted through the hook


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_no_job_starts_before_its_dependencies_are_done(data):
    """Random dependency DAGs and outcomes: a job only ever runs after all of its dependencies
    succeeded, and every job ends (done, failed or cancelled) exactly once."""
    n = data.draw(st.integers(2, 12))
    s = scheduler(n=3)
    for i in range(n):
        deps = data.draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        s.submit(Job(str(i), after=tuple(str(d) for d in sorted(deps)), submit_time=float(i)))
    running: list[str] = []
    ended: list[str] = []
    for _ in range(4 * n):
        for job_id in placed(s, 3):
            assert all(s.jobs[d].state is JobState.DONE for d in s.jobs[job_id].after)
            running.append(job_id)
        if not running:
            break
        job_id = running.pop(data.draw(st.integers(0, len(running) - 1)))
        outcome = data.draw(st.sampled_from([Outcome.SUCCEEDED, Outcome.SUCCEEDED, Outcome.FAILED]))
        s.job_exited(job_id, ExitReport(outcome))
        ended.append(job_id)
    assert all(job.state.is_terminal for job in s.jobs.values())
    assert sorted(ended) == sorted(j.id for j in s.jobs.values() if j.state is not JobState.CANCELLED)
