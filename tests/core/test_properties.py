"""Invariants of the policies and the core, checked on generated clusters and queues."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core.model import ClusterSnapshot, GpuId, GpuView, Job, JobProfile
from collocate.core.policies import make_policy
from collocate.core.scheduler import Capacity, Scheduler

GIB = 1024.0
MEMORY_AWARE = ("declared-memory", "carma-ff", "carma-bf", "carma-magm", "carma-lug", "auto")


@st.composite
def clusters(draw):
    n = draw(st.integers(1, 6))
    views = []
    for i in range(n):
        total = draw(st.sampled_from([16 * GIB, 40 * GIB, 80 * GIB]))
        jobs = draw(st.integers(0, 3))
        committed = draw(st.floats(0, total)) if jobs else 0.0
        views.append(
            GpuView(
                GpuId(f"n{i % 2}", i),
                total,
                total - committed,
                committed,
                jobs=tuple(f"r{i}-{k}" for k in range(jobs)),
                launch_seen_at=-math.inf,
            )
        )
    return ClusterSnapshot.from_views(views)


queues = st.lists(
    st.builds(
        lambda i, g, mem, sm: Job(f"j{i}", gpus=g, mem_mib=mem, mem_source="declared", profile=JobProfile(sm, sm / 2)),
        st.integers(0, 10**6),
        st.integers(1, 2),
        st.one_of(st.none(), st.floats(100, 90 * GIB)),
        st.floats(0.0, 1.0),
    ),
    max_size=12,
    unique_by=lambda j: j.id,
)


@settings(max_examples=150, deadline=None)
@given(clusters(), queues, st.sampled_from(MEMORY_AWARE))
def test_memory_aware_policies_never_overcommit_estimated_memory(cluster, queue, name):
    capacity = Capacity.of(cluster)
    queue = [j for j in queue if capacity.why_not(j) is None]  # the core rejects the rest
    plan = make_policy(name)(queue, cluster)
    by_id = {j.id: j for j in queue}
    index = {g: i for i, g in enumerate(cluster.ids)}
    committed = cluster.committed_mib.copy()
    receiving = set()
    for p in plan.placements:
        job = by_id[p.job_id]
        assert len(set(p.gpus)) == job.gpus
        assert len({cluster.node[index[g]] for g in p.gpus}) == 1, "a job spans one node"
        for g in p.gpus:
            i = index[g]
            receiving.add(i)
            if job.mem_mib is None:
                # an idle GPU, or (auto) one with at least half its memory still uncommitted;
                # it holds whatever room it was given until its peak is stable
                free_share = (cluster.total_mib[i] - committed[i]) / cluster.total_mib[i]
                assert cluster.n_jobs[i] == 0 or (name == "auto" and free_share >= 0.5)
                assert p.mem_mib <= cluster.total_mib[i] - committed[i] + 1e-6
            committed[i] += p.mem_mib if job.mem_mib is None else job.mem_mib
    for i in receiving:
        assert committed[i] <= cluster.total_mib[i] + 1e-6


@settings(max_examples=100, deadline=None)
@given(clusters(), queues)
def test_exclusive_never_shares(cluster, queue):
    plan = make_policy("exclusive")(queue, cluster)
    used = [g for p in plan.placements for g in p.gpus]
    assert len(used) == len(set(used))
    index = {g: i for i, g in enumerate(cluster.ids)}
    assert all(cluster.n_jobs[index[g]] == 0 for g in used)


@settings(max_examples=60, deadline=None)
@given(clusters(), queues, st.sampled_from(("exclusive", "shares", "round-robin", *MEMORY_AWARE)))
def test_scheduler_accepts_every_policy_plan(cluster, queue, name):
    """Plans pass the core's checks: placed jobs are pending, once, with the GPU count they need."""
    scheduler = Scheduler(make_policy(name), Capacity.of(cluster))
    for job in queue:
        scheduler.submit(job)
    plan = scheduler.schedule(cluster)
    for p in plan.placements:
        assert scheduler.jobs[p.job_id].state.value == "running"
