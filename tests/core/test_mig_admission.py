"""MIG rules in the core, the same for the simulator and the daemon: a snapshot's GPUs whose
``GpuId.mig`` names an instance run no multi-GPU job, and policies score instances by the
snapshot's per-GPU ``speed``, not by a global sharing mode."""

import math

import pytest

from collocate.core.model import ClusterSnapshot, GpuId, GpuView, Job, JobProfile, Placement, Plan, SharingMode
from collocate.core.policies import make_policy
from collocate.core.scheduler import Capacity, PolicyError, Scheduler

GIB = 1024.0


def instance(index, mig, *, total=20 * GIB, speed=3 / 7, jobs=(), committed=0.0):
    return GpuView(GpuId("n0", index, mig), total, None, committed, jobs=tuple(jobs), speed=speed)


def whole(index, *, total=40 * GIB):
    return GpuView(GpuId("n0", index), total)


def snapshot(views, **kw):
    return ClusterSnapshot.from_views(views, **kw)


def test_a_multi_gpu_job_needs_whole_gpus_of_one_node():
    # GPU 0 split into two instances, GPU 1 whole: as emulated:2xA100-40GB:mig0=3g.20gb,4g.20gb
    capacity = Capacity.of(snapshot([instance(0, "1.0"), instance(0, "2.0"), whole(1)]))
    assert "NCCL does not run across MIG instances" in capacity.why_not(Job("pair", gpus=2))
    assert capacity.why_not(Job("one", gpus=1, mem_mib=30 * GIB)) is None  # the whole GPU holds it
    mixed = Capacity.of(snapshot([instance(0, "1.0"), instance(0, "2.0"), whole(1), whole(2)]))
    assert mixed.why_not(Job("pair", gpus=2, mem_mib=30 * GIB)) is None


def test_only_instances_bound_a_job_by_the_largest_instance():
    capacity = Capacity.of(snapshot([instance(0, "1.0"), instance(0, "2.0", total=19.5 * GIB)]))
    assert capacity.why_not(Job("small", mem_mib=10 * GIB)) is None
    assert "largest MIG instance has 20480 MiB" in capacity.why_not(Job("big", mem_mib=30 * GIB))
    assert "NCCL" in capacity.why_not(Job("pair", gpus=2))


def test_whole_gpus_keep_their_rules():
    capacity = Capacity.of(snapshot([whole(0), whole(1)]))
    assert capacity.why_not(Job("pair", gpus=2)) is None
    assert "largest node has 2" in capacity.why_not(Job("four", gpus=4))


class _Spreads:
    name = "spreads"

    def __call__(self, queue, cluster):
        return Plan((Placement(queue[0].id, cluster.ids[:2]),))


def test_the_scheduler_refuses_a_plan_that_spreads_a_job_over_instances():
    cluster = snapshot([instance(0, "1.0"), instance(0, "2.0"), whole(1), whole(2)])
    scheduler = Scheduler(_Spreads(), Capacity.of(cluster))
    scheduler.submit(Job("pair", gpus=2))
    with pytest.raises(PolicyError, match="include a MIG instance"):
        scheduler.schedule(cluster)


@pytest.mark.parametrize("mode", list(SharingMode))
def test_auto_scores_instances_by_their_size_under_every_sharing_mode(mode):
    """An instance is a device shared by the mode in use, as a whole GPU: ``auto`` scores a
    newcomer's activity relative to each instance, so the larger one gains more."""
    heavy = JobProfile(0.4, 0.2)
    views = [instance(0, "1.0", speed=3 / 7, jobs=("r1",), committed=4 * GIB),
             instance(0, "2.0", speed=4 / 7, jobs=("r2",), committed=4 * GIB)]
    from collocate.core.model import RunningJob

    running = {"r1": RunningJob("r1", (views[0].id,), heavy, 4 * GIB),
               "r2": RunningJob("r2", (views[1].id,), heavy, 4 * GIB)}
    queue = [Job("a", mem_mib=2 * GIB, mem_source="declared", profile=JobProfile(0.1, 0.05))]
    plan = make_policy("auto")(queue, snapshot(views, sharing=mode, running=running, now=math.inf))
    assert [str(g) for g in plan.placements[0].gpus] == ["n0:0/2.0"]  # the larger instance gains more


@pytest.mark.parametrize("name", ["exclusive", "shares", "declared-memory", "round-robin", "carma-magm", "auto"])
def test_no_policy_spreads_a_job_over_instances_on_a_mixed_node(name):
    """GPU 0 split into two instances, GPUs 1 and 2 whole, all idle: a 2-GPU job gets the whole
    ones, though the instances come first."""
    cluster = snapshot([instance(0, "1.0"), instance(0, "2.0"), whole(1), whole(2)])
    scheduler = Scheduler(make_policy(name), Capacity.of(cluster))
    scheduler.submit(Job("pair", gpus=2, mem_mib=4 * GIB, mem_source="declared"))
    plan = scheduler.schedule(cluster)
    assert [str(g) for g in plan.placements[0].gpus] == ["n0:1", "n0:2"]
