"""A sweep's ``sweep_max`` (Slurm's ``--array=0-9%2``): at most that many of its jobs run at
once, in one round or across rounds, GPU and CPU jobs alike, and the rest say why they wait."""

from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core.model import ClusterSnapshot, GpuId, GpuView, Job, JobState, WaitKind
from collocate.core.policies import make_policy
from collocate.core.recovery import ExitReport, Outcome
from collocate.core.scheduler import Capacity, Scheduler


def cluster(n=8):
    return ClusterSnapshot.from_views([GpuView(GpuId("n0", i), 40_960.0) for i in range(n)])


def scheduler(n=8):
    return Scheduler(make_policy("exclusive"), Capacity.of(cluster(n)))


def sweep(s, head="1", count=5, most=2, gpus=1):
    ids = [str(int(head) + i) for i in range(count)]
    for i, job_id in enumerate(ids):
        s.submit(Job(job_id, gpus=gpus, mem_mib=1024.0, submit_time=float(i), sweep=head, sweep_max=most))
    return ids


def placed(s, n=8):
    return [p.job_id for p in s.schedule(cluster(n)).placements]


def test_a_sweep_runs_at_most_its_max_and_the_rest_follow_as_jobs_end():
    s = scheduler()
    ids = sweep(s)
    s.submit(Job("9", mem_mib=1024.0, submit_time=9.0))  # no sweep: never held back by one
    assert placed(s) == ["1", "2", "9"]  # one round places no more than the max
    wait = s.why_waiting("3")
    assert wait.kind is WaitKind.LIMIT and wait.detail == "sweep 1: 2 of its jobs running (--sweep-max 2)"
    assert placed(s) == []  # free GPUs stay free: the sweep is at its max
    s.job_exited("1", ExitReport(Outcome.SUCCEEDED))
    assert placed(s) == ["3"]
    s.job_exited("2", ExitReport(Outcome.FAILED))
    s.job_exited("3", ExitReport(Outcome.SUCCEEDED))
    assert placed(s) == ["4", "5"]
    assert [s.jobs[i].state for i in ids] == [JobState.DONE, JobState.FAILED, JobState.DONE,
                                              JobState.RUNNING, JobState.RUNNING]


def test_sweeps_are_counted_apart_and_a_restart_counts_the_running_ones():
    s = scheduler()
    sweep(s, head="1", count=3, most=1)
    sweep(s, head="4", count=3, most=2)
    assert placed(s) == ["1", "4", "5"]
    restored = scheduler()
    restored.restore(s.jobs.values())
    assert placed(restored) == []
    assert restored.why_waiting("2").detail == "sweep 1: 1 of its jobs running (--sweep-max 1)"
    restored.job_exited("4", ExitReport(Outcome.SUCCEEDED))
    assert placed(restored) == ["6"]


def test_cpu_jobs_of_a_sweep_keep_to_its_max_too():
    s = scheduler()
    sweep(s, count=4, most=3, gpus=0)
    assert placed(s) == ["1", "2", "3"]
    assert s.why_waiting("4").detail == "sweep 1: 3 of its jobs running (--sweep-max 3)"


@settings(max_examples=40, deadline=None)
@given(count=st.integers(1, 12), most=st.integers(1, 4), gpus=st.integers(1, 10),
       ends=st.lists(st.booleans(), max_size=30))
def test_never_more_than_the_max_run_and_every_job_runs_in_the_end(count, most, gpus, ends):
    s = scheduler(gpus)
    ids = sweep(s, count=count, most=most)
    for end_one in [*ends, *[True] * (2 * count)]:
        placed(s, gpus)
        running = [i for i in ids if s.jobs[i].state is JobState.RUNNING]
        assert len(running) <= most
        if end_one and running:
            s.job_exited(running[0], ExitReport(Outcome.SUCCEEDED))
    assert all(s.jobs[i].state is JobState.DONE for i in ids)
