"""CPU jobs (``--gpus 0``) in the same queue: the scheduler starts them at once on no GPU, in
every policy, within their user's CPU cap, and a pipeline prepare → train → evaluate runs
through one queue with dependencies; the simulator runs them without a GPU."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core.fairness import Fairness, UserLimits
from collocate.core.gputypes import parse_cluster
from collocate.core.model import ClusterSnapshot, GpuId, GpuView, Job, JobState, WaitKind
from collocate.core.policies import POLICY_NAMES, make_policy
from collocate.core.recovery import ExitReport, Outcome
from collocate.core.scheduler import Capacity, Scheduler
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload


def full_cluster(now=0.0):
    """One GPU, taken whole by a running job."""
    return ClusterSnapshot.from_views([GpuView(GpuId("n0", 0), 40_960.0, committed_mib=40_960.0,
                                               jobs=("busy",))], now=now)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_cpu_job_starts_at_once_on_no_gpu_while_the_gpus_are_full(policy):
    s = Scheduler(make_policy(policy), Capacity.of(full_cluster()))
    s.submit(Job("gpu", mem_mib=30_000.0, mem_source="declared"))
    cpu = s.submit(Job("cpu", gpus=0))
    assert cpu.state is JobState.PENDING
    plan = s.schedule(full_cluster())
    assert (plan.placements[0].job_id, plan.placements[0].gpus) == ("cpu", ())
    assert s.jobs["cpu"].state is JobState.RUNNING
    assert all(p.gpus for p in plan.placements[1:])  # whatever the policy did with the GPU job
    s.job_exited("cpu", ExitReport(Outcome.SUCCEEDED), 5.0)
    assert s.jobs["cpu"].state is JobState.DONE


def test_a_cpu_job_holds_no_gpu_and_counts_against_no_gpu_cap():
    """Usage (GPU-seconds) and the GPU-job caps ignore it; its own cap bounds it."""
    fairness = Fairness(default=UserLimits(max_running_jobs=1, max_gpus=1, max_cpu_jobs=2))
    s = Scheduler(make_policy("exclusive"), Capacity.of(full_cluster()), fairness=fairness)
    for i in range(3):
        s.submit(Job(f"c{i}", gpus=0, user="ann", submit_time=float(i)))
    s.submit(Job("g", user="ann", submit_time=5.0))
    empty = ClusterSnapshot.from_views([GpuView(GpuId("n0", 0), 40_960.0)], now=1.0)
    assert sorted(p.job_id for p in s.schedule(empty).placements) == ["c0", "c1", "g"]
    assert s.usage.running("ann") == (1, 1)  # the GPU job only
    wait = s.why_waiting("c2")
    assert wait is not None and wait.kind is WaitKind.LIMIT and "max_cpu_jobs 2" in wait.detail
    s.job_exited("c0", ExitReport(Outcome.SUCCEEDED), 2.0)
    assert s.usage.of("ann", 2.0) == pytest.approx(1.0)  # 1 GPU x 1 s; the CPU job charged none
    assert [p.job_id for p in s.schedule(full_cluster(2.0)).placements] == ["c2"]


def test_each_users_cpu_cap_is_their_own():
    fairness = Fairness(default=UserLimits(max_cpu_jobs=1), users={"bob": UserLimits(max_cpu_jobs=3)})
    s = Scheduler(make_policy("auto"), Capacity.of(full_cluster()), fairness=fairness)
    for user in ("ann", "bob"):
        for i in range(4):
            s.submit(Job(f"{user}{i}", gpus=0, user=user, submit_time=float(i)))
    started = [p.job_id for p in s.schedule(full_cluster()).placements]
    assert sorted(started) == ["ann0", "bob0", "bob1", "bob2"]


def test_a_pipeline_goes_through_one_queue_with_dependencies():
    s = Scheduler(make_policy("auto"), Capacity.of(ClusterSnapshot.from_views([GpuView(GpuId("n0", 0), 40_960.0)])))
    s.submit(Job("prep", gpus=0))
    s.submit(Job("train", mem_mib=8000.0, mem_source="declared", after=("prep",)))
    s.submit(Job("eval", gpus=0, after=("train",)))
    empty = ClusterSnapshot.from_views([GpuView(GpuId("n0", 0), 40_960.0)])
    assert [p.job_id for p in s.schedule(empty).placements] == ["prep"]
    assert s.why_waiting("eval").kind is WaitKind.DEPENDENCY
    s.job_exited("prep", ExitReport(Outcome.SUCCEEDED), 1.0)
    assert [(p.job_id, len(p.gpus)) for p in s.schedule(empty).placements] == [("train", 1)]
    s.job_exited("train", ExitReport(Outcome.SUCCEEDED), 2.0)
    assert [(p.job_id, p.gpus) for p in s.schedule(empty).placements] == [("eval", ())]


def test_admission_takes_zero_gpus_on_one_node_only():
    cap = Capacity.of(full_cluster())
    assert cap.why_not(Job("a", gpus=0)) is None
    assert "one node" in cap.why_not(Job("b", gpus=0, nodes=2))
    assert cap.why_not(Job("c", gpus=-1)) is not None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.booleans()), min_size=1, max_size=30),
       st.integers(1, 4))
def test_no_round_takes_a_user_past_the_cpu_cap(jobs, cap):
    s = Scheduler(make_policy("exclusive"), Capacity.of(full_cluster()),
                  fairness=Fairness(default=UserLimits(max_cpu_jobs=cap)))
    for i, (user, _) in enumerate(jobs):
        s.submit(Job(f"j{i}", gpus=0, user=user, submit_time=float(i)))
    now, running = 0.0, [None]
    while s.waiting or running:
        s.schedule(full_cluster(now))
        running = [j for j in s.jobs.values() if j.state is JobState.RUNNING]
        for user in "ab":
            assert sum(j.user == user for j in running) <= cap
        now += 1.0
        for i, j in enumerate(running):  # the flagged ones end this round
            if jobs[int(j.id[1:])][1] or i == 0:
                s.job_exited(j.id, ExitReport(Outcome.SUCCEEDED), now)
    assert all(j.state is JobState.DONE for j in s.jobs.values())


def test_the_simulator_runs_cpu_rows_without_a_gpu():
    """A GPU job fills the only GPU; a CPU job submitted beside it starts at once and ends
    after its duration, holding no GPU."""
    trace = [TraceJob("g", 0.0, Workload("train", 1, 100.0, 30_000.0, {"declared": 30_000.0})),
             TraceJob("c", 1.0, Workload("prep", 0, 20.0, 0.0, {})),
             TraceJob("g2", 2.0, Workload("train", 1, 50.0, 30_000.0, {"declared": 30_000.0}))]
    result = Simulation(parse_cluster("1xA100-40GB"), trace, make_policy("auto"), SimConfig()).run()
    rec = {r.id: r for r in result.records}
    assert rec["c"].state == "done" and rec["c"].start == 1.0 and rec["c"].end == pytest.approx(21.0)
    assert rec["c"].last_gpus == "" and rec["c"].gpus == 0
    assert rec["g2"].start >= rec["g"].end  # the GPU job still waited for the GPU
