"""Each policy on hand-made snapshots: what it places, where, and what it refuses."""

import math

import numpy as np
import pytest

from collocate.common.errors import InputError, UnknownNameError
from collocate.core.model import (
    ClusterSnapshot,
    GpuId,
    GpuView,
    Job,
    JobProfile,
    RunningJob,
    SharingMode,
    Utilization,
    WaitKind,
)
from collocate.core.policies import POLICY_NAMES, make_policy

GIB = 1024.0


IDLE = Utilization()


def gpu(i, *, node="n0", total=40 * GIB, free=None, committed=0.0, jobs=(), util=IDLE, seen=-math.inf):
    return GpuView(GpuId(node, i), total, free, committed, util, tuple(jobs), seen)


def placed(plan):
    return {p.job_id: [str(g) for g in p.gpus] for p in plan.placements}


def job(id, mem=None, gpus=1, **kw):
    return Job(id, gpus=gpus, mem_mib=mem, mem_source="declared" if mem else "unknown", **kw)


def test_exclusive_uses_idle_gpus_only_and_blocks_in_fifo_order():
    cluster = ClusterSnapshot.from_views([gpu(0, jobs=["x"], committed=GIB), gpu(1), gpu(2)])
    plan = make_policy("exclusive")([job("a"), job("b", gpus=2), job("c")], cluster)
    assert placed(plan) == {"a": ["n0:1"]}  # b needs 2 idle GPUs, only one is left; c waits behind b


def test_multi_gpu_jobs_stay_on_one_node():
    cluster = ClusterSnapshot.from_views([gpu(0, node="n0"), gpu(0, node="n1"), gpu(1, node="n1")])
    plan = make_policy("exclusive")([job("a", gpus=2)], cluster)
    assert placed(plan) == {"a": ["n1:0", "n1:1"]}


def test_shares_caps_jobs_per_gpu_without_memory_check():
    cluster = ClusterSnapshot.from_views([gpu(0), gpu(1)])
    queue = [job(c, mem=30 * GIB) for c in "abcde"]
    plan = make_policy("shares", slots_per_gpu=2)(queue, cluster)
    assert len(plan.placements) == 4  # 4 x 30 GiB on 2 x 40 GiB: over-committed by design
    with pytest.raises(InputError):
        make_policy("shares", slots_per_gpu=0)


def test_declared_memory_packs_first_fit_by_declaration():
    cluster = ClusterSnapshot.from_views([gpu(0, committed=30 * GIB, jobs=["x"]), gpu(1)])
    plan = make_policy("declared-memory")([job("a", mem=8 * GIB), job("b", mem=20 * GIB), job("c", mem=21 * GIB)], cluster)
    assert placed(plan) == {"a": ["n0:0"], "b": ["n0:1"]}  # c: 21 GiB fits on neither GPU


def test_round_robin_rotates_and_respects_in_flight():
    busy = [gpu(i, jobs=[f"x{i}"], committed=GIB) for i in range(3)]
    cluster = ClusterSnapshot.from_views(busy, placements_made=1)
    plan = make_policy("round-robin")([job("a"), job("b")], cluster)
    # the ring starts at GPU 1; a GPU that just got a job is in flight and is skipped
    assert placed(plan) == {"a": ["n0:1"], "b": ["n0:2"]}


def test_carma_exclusive_first_then_collocates_by_ordering():
    views = [
        gpu(0, free=20 * GIB, committed=18 * GIB, jobs=["x"], util=Utilization(0.5, 0.3, 0.2)),
        gpu(1, free=30 * GIB, committed=8 * GIB, jobs=["y"], util=Utilization(0.3, 0.2, 0.1)),
    ]
    cluster = ClusterSnapshot.from_views(views)
    queue = [job("a", mem=10 * GIB)]
    assert placed(make_policy("carma-ff")(queue, cluster)) == {"a": ["n0:0"]}
    assert placed(make_policy("carma-bf")(queue, cluster)) == {"a": ["n0:0"]}
    assert placed(make_policy("carma-magm")(queue, cluster)) == {"a": ["n0:1"]}
    assert placed(make_policy("carma-lug")(queue, cluster)) == {"a": ["n0:1"]}
    # memory gate: free - 512 >= estimate + 2048
    assert placed(make_policy("carma-ff")([job("big", mem=28 * GIB)], cluster)) == {}
    idle = ClusterSnapshot.from_views([*views, gpu(2)])
    assert placed(make_policy("carma-magm")(queue, idle)) == {"a": ["n0:2"]}


def test_carma_risk_filter_and_in_flight_guard():
    hot = Utilization(0.85, 0.50, 0.10)  # SM >= 0.8 and occupancy >= 0.45
    views = [gpu(0, free=30 * GIB, jobs=["x"], util=hot), gpu(1, free=30 * GIB, jobs=["y"], seen=95.0)]
    plan = make_policy("carma-ff")([job("a", mem=GIB)], ClusterSnapshot.from_views(views, now=100.0))
    assert placed(plan) == {}  # GPU 0 too busy, GPU 1 seen 5 s ago (< 30 s settle)
    later = ClusterSnapshot.from_views(views, now=126.0)
    assert placed(make_policy("carma-ff")([job("a", mem=GIB)], later)) == {"a": ["n0:1"]}


def test_carma_blocks_collocation_while_a_recovered_job_waits():
    views = [gpu(0, free=30 * GIB, jobs=["x"]), gpu(1, free=30 * GIB, jobs=["y"])]
    cluster = ClusterSnapshot.from_views(views)
    recovered = job("r", mem=GIB, oom_crashes=1)
    plan = make_policy("carma-ff")([recovered, job("a", mem=GIB)], cluster)
    assert placed(plan) == {}
    assert placed(make_policy("auto")([recovered, job("a", mem=GIB)], cluster)) == {"r": ["n0:0"], "a": ["n0:1"]}


def test_auto_prefers_the_placement_with_least_interference():
    heavy, light = JobProfile(0.8, 0.4), JobProfile(0.1, 0.05)
    running = {
        "h": RunningJob("h", (GpuId("n0", 0),), heavy, 4 * GIB),
        "l": RunningJob("l", (GpuId("n0", 1),), light, 4 * GIB),
    }
    views = [gpu(0, free=30 * GIB, committed=4 * GIB, jobs=["h"]), gpu(1, free=30 * GIB, committed=4 * GIB, jobs=["l"])]
    cluster = ClusterSnapshot.from_views(views, running=running)
    plan = make_policy("auto")([job("new", mem=4 * GIB, profile=JobProfile(0.7, 0.3))], cluster)
    assert placed(plan) == {"new": ["n0:1"]}


def gang_beside_single(gang_profile, single_profile, *, heavy_beside_gang=None, sharing="time-slicing"):
    """A 2-GPU job G on n0:0 and n0:1 (with H beside it on n0:1 if given), a job S on n0:2."""
    running = {"G": RunningJob("G", (GpuId("n0", 0), GpuId("n0", 1)), gang_profile, 4 * GIB),
               "S": RunningJob("S", (GpuId("n0", 2),), single_profile, 4 * GIB)}
    beside = []
    if heavy_beside_gang is not None:
        running["H"] = RunningJob("H", (GpuId("n0", 1),), heavy_beside_gang, 4 * GIB)
        beside = ["H"]
    views = [gpu(0, free=30 * GIB, committed=4 * GIB, jobs=["G"]),
             gpu(1, free=30 * GIB, committed=4 * GIB * (1 + len(beside)), jobs=["G", *beside]),
             gpu(2, free=30 * GIB, committed=4 * GIB, jobs=["S"])]
    return ClusterSnapshot.from_views(views, running=running, sharing=SharingMode(sharing))


@pytest.mark.parametrize("sharing", ["time-slicing", "mps"])
def test_auto_spares_a_gang_where_it_sets_the_gangs_pace(sharing):
    # G advances at its slowest GPU's pace on both its GPUs: slowing it on n0:0 costs two GPUs'
    # progress. Scored as a one-GPU resident, the lighter G looked the better neighbour.
    cluster = gang_beside_single(JobProfile(0.3, 0.15), JobProfile(0.35, 0.17), sharing=sharing)
    gangs = cluster.gangs  # the snapshot knows G is one job on two GPUs
    assert gangs is not None and gangs.width.tolist() == [2] and gangs.member_gpu.tolist() == [0, 1]
    assert gangs.sm.tolist() == [0.3] and gangs.hosts.tolist() == [True, True, False]
    newcomer = job("X", mem=2 * GIB, profile=JobProfile(0.2, 0.1))
    assert placed(make_policy("auto")([newcomer], cluster)) == {"X": ["n0:2"]}


@pytest.mark.parametrize("sharing", ["time-slicing", "mps"])
def test_auto_may_join_a_gang_on_a_gpu_that_does_not_set_its_pace(sharing):
    # H on n0:1 already sets G's pace: joining G on n0:0 slows G no further, so that GPU beats
    # n0:2, where a lone S (lighter than G) would lose its progress.
    cluster = gang_beside_single(JobProfile(0.3, 0.15), JobProfile(0.25, 0.12),
                                 heavy_beside_gang=JobProfile(0.6, 0.3), sharing=sharing)
    newcomer = job("X", mem=2 * GIB, profile=JobProfile(0.2, 0.1))
    assert placed(make_policy("auto")([newcomer], cluster)) == {"X": ["n0:0"]}


def test_a_gang_with_a_gpu_left_out_of_the_snapshot_is_not_listed():
    # A gang whose other GPU is on a node that stopped answering (the daemon leaves that node's
    # GPUs out): its pace there is unknown, so the snapshot lists no gang rather than half of one.
    profile = JobProfile(0.3, 0.15)
    running = {"G": RunningJob("G", (GpuId("n0", 0), GpuId("n1", 0)), profile, 4 * GIB),
               "H": RunningJob("H", (GpuId("n0", 1), GpuId("n0", 2)), profile, 4 * GIB)}
    views = [gpu(0, jobs=["G"], committed=4 * GIB), gpu(1, jobs=["H"], committed=4 * GIB),
             gpu(2, jobs=["H"], committed=4 * GIB)]
    gangs = ClusterSnapshot.from_views(views, running=running).gangs
    assert gangs is not None and gangs.member_gpu.tolist() == [1, 2] and gangs.hosts.tolist() == [False, True, True]
    assert ClusterSnapshot.from_views(views[:1], running={"G": running["G"]}).gangs is None


def test_auto_counts_a_gang_placed_in_the_same_round():
    # The gang takes the two idle GPUs; the next job then spares it as it would a running one.
    running = {"S": RunningJob("S", (GpuId("n0", 2),), JobProfile(0.35, 0.17), 4 * GIB)}
    views = [gpu(0), gpu(1), gpu(2, free=30 * GIB, committed=4 * GIB, jobs=["S"])]
    cluster = ClusterSnapshot.from_views(views, running=running)
    queue = [job("G", mem=4 * GIB, gpus=2, profile=JobProfile(0.3, 0.15)),
             job("X", mem=2 * GIB, profile=JobProfile(0.2, 0.1))]
    assert placed(make_policy("auto")(queue, cluster)) == {"G": ["n0:0", "n0:1"], "X": ["n0:2"]}


def test_auto_refuses_collocation_that_slows_jobs_too_much():
    heavy = JobProfile(0.9, 0.5)
    running = {"h": RunningJob("h", (GpuId("n0", 0),), heavy, 4 * GIB)}
    cluster = ClusterSnapshot.from_views([gpu(0, free=30 * GIB, committed=4 * GIB, jobs=["h"])], running=running)
    cluster = cluster.evolve(util_sm=np.array([0.9]))  # it reads busy: no room to start on trial
    assert placed(make_policy("auto")([job("new", mem=GIB, profile=heavy)], cluster)) == {}


def test_auto_stops_adding_to_a_gpu_whose_jobs_are_measured_slower_than_the_model_says():
    # Two light jobs: the model admits a third (its slowdowns stay small); measured, the
    # residents already run 3.8x slower than alone (the model missed something), so the limit
    # holds for what they show and the GPU takes nobody, and the reason says so.
    light = JobProfile(0.3, 0.1)
    running = {j: RunningJob(j, (GpuId("n0", 0),), light, 4 * GIB) for j in ("a", "b")}
    views = [gpu(0, free=30 * GIB, committed=8 * GIB, jobs=["a", "b"])]
    newcomer = job("new", mem=2 * GIB, profile=light, profile_source="history")
    assert placed(make_policy("auto")([newcomer], ClusterSnapshot.from_views(views, running=running))) == {
        "new": ["n0:0"]}
    slowed = [GpuView(**{**{f: getattr(views[0], f) for f in GpuView.__slots__}, "slowed": 3.8})]
    plan = make_policy("auto")([newcomer], ClusterSnapshot.from_views(slowed, running=running))
    assert placed(plan) == {} and "measured 3.8x" in str(plan.waits["new"])
    told = [GpuView(**{**{f: getattr(views[0], f) for f in GpuView.__slots__}, "slowed": 1.0})]
    assert placed(make_policy("auto")([newcomer], ClusterSnapshot.from_views(told, running=running))) == {
        "new": ["n0:0"]}  # a measurement kinder than the model changes nothing


def test_auto_counts_committed_memory_not_only_measured_free():
    # 30 GiB measured free, but a job committed 25 GiB has not allocated yet
    cluster = ClusterSnapshot.from_views([gpu(0, free=30 * GIB, committed=35 * GIB, jobs=["x"])])
    assert placed(make_policy("auto")([job("a", mem=4 * GIB, profile=JobProfile(0.1, 0.1))], cluster)) == {}


def test_auto_backfills_past_a_blocked_head():
    cluster = ClusterSnapshot.from_views([gpu(0, free=20 * GIB, committed=20 * GIB, jobs=["x"])])
    queue = [job("big", mem=30 * GIB), job("small", mem=2 * GIB, profile=JobProfile(0.1, 0.1))]
    assert placed(make_policy("auto")(queue, cluster)) == {"small": ["n0:0"]}
    assert placed(make_policy("carma-ff")(queue, cluster)) == {}  # head-of-line blocking


def test_auto_reserves_gpus_for_a_job_that_waited_long():
    views = [gpu(0, free=20 * GIB, committed=20 * GIB, jobs=["x"])]
    cluster = ClusterSnapshot.from_views(views, now=7200.0)
    queue = [job("big", mem=30 * GIB, submit_time=0.0), job("small", mem=2 * GIB, submit_time=10.0)]
    assert placed(make_policy("auto")(queue, cluster)) == {}  # GPU 0 is kept draining for "big"


def test_unknown_policy_and_parameter_list_the_valid_ones():
    with pytest.raises(UnknownNameError) as err:
        make_policy("magic")
    assert "carma-magm" in str(err.value)
    with pytest.raises(InputError) as err:
        make_policy("carma-ff", headroom=1)
    assert "headroom_mib" in str(err.value)
    assert set(POLICY_NAMES) >= {"exclusive", "shares", "declared-memory", "round-robin", "auto"}


def test_auto_puts_jobs_of_one_shared_dataset_together():
    light = JobProfile(0.1, 0.05)
    running = {
        "a": RunningJob("a", (GpuId("n0", 0),), light, 2 * GIB),
        "b": RunningJob("b", (GpuId("n1", 0),), light, 2 * GIB, dataset="imagenet"),
    }
    views = [
        gpu(0, node="n0", free=30 * GIB, committed=2 * GIB, jobs=["a"]),
        gpu(0, node="n1", free=30 * GIB, committed=2 * GIB, jobs=["b"]),
        gpu(1, node="n0"),
        gpu(1, node="n1"),
    ]
    cluster = ClusterSnapshot.from_views(views, running=running)
    assert cluster.datasets == {"imagenet": (1,)}
    reader = job("r", mem=2 * GIB, profile=light, dataset="imagenet")
    assert placed(make_policy("auto")([reader], cluster)) == {"r": ["n1:0"]}
    # A job without the dataset that would slow the residents down gets no pull to their GPU
    other = job("o", mem=2 * GIB, profile=JobProfile(0.6, 0.3))
    assert placed(make_policy("auto")([other], cluster)) == {"o": ["n0:1"]}  # an idle GPU
    big = job("big", mem=30 * GIB, profile=JobProfile(0.9, 0.4), dataset="imagenet")
    assert placed(make_policy("auto")([big], cluster)) == {"big": ["n1:1"]}  # idle GPU on its node


def test_a_blocked_multi_gpu_job_starts_once_its_room_is_free_gates_or_not():
    heavy = JobProfile(0.9, 0.5)
    running = {f"h{i}": RunningJob(f"h{i}", (GpuId("n0", i),), heavy, 4 * GIB) for i in range(2)}
    views = [gpu(i, free=30 * GIB, committed=4 * GIB, jobs=[f"h{i}"]) for i in range(2)]
    gang = job("gang", mem=4 * GIB, gpus=2, profile=heavy, submit_time=0.0)
    single = job("single", mem=4 * GIB, profile=heavy, submit_time=0.0)
    young = ClusterSnapshot.from_views(views, running=running, now=600.0)
    young = young.evolve(util_sm=np.full(2, 0.9))  # they read busy: no room to start on trial
    # beside heavy residents the gates refuse a young single-GPU job...
    assert placed(make_policy("auto")([single], young)) == {}
    # ...but a gang is reserved for at once (backfill would keep its GPUs from freeing together)
    assert placed(make_policy("auto")([gang], young)) == {"gang": ["n0:0", "n0:1"]}
    # A single-GPU job keeps the gates even once it waited reserve_after_s (only its room is
    # reserved): an idle GPU always passes them
    old = ClusterSnapshot.from_views(views, running=running, now=1800.0).evolve(util_sm=np.full(2, 0.9))
    assert placed(make_policy("auto")([single], old)) == {}


def test_backfill_keeps_a_blocked_gangs_room_free():
    # The gang needs 30 GiB on two GPUs of one node: n0:0 has a 20 GiB resident, n0:1 is idle.
    # It is reserved for at once. Jobs behind it may still use its GPUs, but only while the room
    # it needs stays free there: the 2 GiB job may take n0:1, the 12 GiB job may not (it goes
    # to the other node). Draining the gang's GPUs whole instead left an 8-GPU node taking no
    # job for hours while one big resident finished.
    views = [gpu(0, free=20 * GIB, committed=20 * GIB, jobs=["x"]), gpu(1), gpu(0, node="n1")]
    cluster = ClusterSnapshot.from_views(views, now=60.0)
    queue = [job("gang", mem=30 * GIB, gpus=2, submit_time=0.0),
             job("small", mem=2 * GIB, profile=JobProfile(0.1, 0.1), submit_time=10.0),
             job("big", mem=12 * GIB, profile=JobProfile(0.1, 0.1), submit_time=20.0)]
    assert placed(make_policy("auto")(queue, cluster)) == {"small": ["n0:1"], "big": ["n1:0"]}
    # with no other node, the big job waits for the gang, and says so
    plan = make_policy("auto")(queue, ClusterSnapshot.from_views(views[:2], now=60.0))
    assert placed(plan) == {"small": ["n0:1"]}
    assert plan.waits["big"].kind is WaitKind.RESERVED


def test_a_gang_started_past_the_gates_goes_where_it_interferes_least():
    # Both nodes have room for the gang; neither passes the (raised) gain gate. The gang starts
    # at once anyway, beside the light residents, not on the node with more room.
    heavy, light = JobProfile(0.9, 0.5), JobProfile(0.1, 0.05)
    running = {f"{kind}{i}": RunningJob(f"{kind}{i}", (GpuId(node, i),), profile, 4 * GIB)
               for kind, node, profile in (("h", "n0", heavy), ("l", "n1", light)) for i in range(2)}
    views = [gpu(i, node="n0", free=30 * GIB, committed=4 * GIB, jobs=[f"h{i}"]) for i in range(2)]
    views += [gpu(i, node="n1", free=29 * GIB, committed=4 * GIB, jobs=[f"l{i}"]) for i in range(2)]
    cluster = ClusterSnapshot.from_views(views, running=running, now=60.0)
    gang = job("gang", mem=4 * GIB, gpus=2, profile=heavy, submit_time=0.0)
    assert placed(make_policy("auto", min_gain=0.5)([gang], cluster)) == {"gang": ["n1:0", "n1:1"]}
