"""A job on several nodes (``Job.nodes``): one rule in the core (``policies.base.pick_gang``,
``Capacity``, the scheduler's plan check), so every policy, the simulator and the daemon place
it the same way: ``gpus`` on each of ``nodes`` different nodes, all at once or not at all, and
never starved by smaller jobs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.core import policies
from collocate.core.gputypes import parse_cluster
from collocate.core.model import ClusterSnapshot, GpuId, GpuView, Job
from collocate.core.policies.base import pick_gang
from collocate.core.scheduler import Capacity, Scheduler
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload

POLICIES = ["exclusive", "auto", "carma-magm", "round-robin", "declared-memory", "shares"]


def _cluster(nodes: int = 3, per_node: int = 4, busy: set[str] = frozenset()) -> ClusterSnapshot:
    views = [GpuView(GpuId(f"n{n}", i), 40_000.0, jobs=("x",) if f"n{n}:{i}" in busy else (),
                     committed_mib=39_000.0 if f"n{n}:{i}" in busy else 0.0)
             for n in range(nodes) for i in range(per_node)]
    return ClusterSnapshot.from_views(views, now=10_000.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_places_a_gang_on_distinct_nodes_grouped_by_node(policy: str):
    cluster = _cluster()
    scheduler = Scheduler(policies.make_policy(policy), Capacity.of(cluster))
    scheduler.submit(Job("wide", gpus=2, nodes=3, mem_mib=10_000.0, mem_source="declared"))
    plan = scheduler.schedule(cluster)
    [placement] = plan.placements
    nodes = [g.node for g in placement.gpus]
    assert len(placement.gpus) == 6 and len(set(nodes)) == 3
    assert nodes == sorted(nodes, key=nodes.index)  # grouped: rank 0's GPUs first, and so on


@pytest.mark.parametrize("policy", ["exclusive", "auto", "carma-magm", "declared-memory"])  # memory-aware
def test_a_gang_waits_whole_when_one_node_lacks_room(policy: str):
    cluster = _cluster(nodes=2, busy={"n1:0", "n1:1", "n1:2"})
    scheduler = Scheduler(policies.make_policy(policy), Capacity.of(cluster))
    scheduler.submit(Job("wide", gpus=2, nodes=2, mem_mib=10_000.0, mem_source="declared"))
    assert not scheduler.schedule(cluster).placements  # n1 has one free GPU: none or all


def test_capacity_refuses_a_gang_wider_than_the_cluster():
    capacity = Capacity.of(_cluster(nodes=2, per_node=4))
    assert capacity.why_not(Job("a", gpus=4, nodes=2)) is None
    assert "needs 3 nodes with 4 whole GPU(s) each" in capacity.why_not(Job("b", gpus=4, nodes=3))
    assert "only 0 of the 2 node(s)" in capacity.why_not(Job("c", gpus=8, nodes=2))
    assert "50000 MiB per GPU" in capacity.why_not(Job("d", gpus=1, nodes=2, mem_mib=50_000.0))


def test_a_gang_is_reserved_for_and_not_starved_by_small_jobs():
    """The auto policy reserves a waiting gang's room at once, as for a multi-GPU job: single-GPU
    jobs behind it do not take the GPUs it waits for."""
    cluster = _cluster(nodes=2, per_node=2, busy={"n1:1"})
    scheduler = Scheduler(policies.make_policy("auto"), Capacity.of(cluster))
    scheduler.submit(Job("wide", gpus=2, nodes=2, mem_mib=30_000.0, mem_source="declared", submit_time=1.0))
    for i in range(3):
        scheduler.submit(Job(f"small{i}", mem_mib=30_000.0, mem_source="declared", submit_time=2.0 + i))
    plan = scheduler.schedule(cluster)
    assert plan.placements == ()  # the three free GPUs are kept for the gang
    assert str(plan.waits["small0"]).startswith("reserved")


def test_the_simulator_runs_a_gang_across_nodes_by_the_same_rule():
    wide = Workload("wide", gpus=2, duration_s=100.0, peak_mib=5_000.0, estimates={"peak": 5_000.0}, nodes=2)
    solo = Workload("solo", gpus=1, duration_s=50.0, peak_mib=5_000.0, estimates={"peak": 5_000.0})
    trace = [TraceJob("1", 0.0, wide), TraceJob("2", 0.0, solo), TraceJob("3", 0.0, solo)]
    result = Simulation(parse_cluster("2x(2xA100-40GB)"), trace, policies.make_policy("exclusive"),
                        SimConfig()).run()
    records = {r.id: r for r in result.records}
    assert all(r.state == "done" for r in records.values()), records
    assert records["1"].gpus == 4
    assert {g.split(":")[0] for g in records["1"].last_gpus.split(",")} == {"node0", "node1"}


def _pick_by_hand(candidates: list[int], node: list[int], gpus: int, nodes: int) -> list[int] | None:
    """``pick_gang``'s rule written as plainly as it reads: nodes in the order their first
    candidate appears (MIG instances, -1, never), each with ``gpus`` candidates or more gives
    its first ``gpus``, until ``nodes`` of them did; else None. A one-GPU job takes the first
    candidate, a MIG instance too."""
    if gpus * nodes == 1:
        return candidates[:1] or None
    chosen: list[int] = []
    for n in dict.fromkeys(node[c] for c in candidates):
        members = [c for c in candidates if node[c] == n]
        if n >= 0 and len(members) >= gpus:
            chosen += members[:gpus]
            if len(chosen) == gpus * nodes:
                return chosen
    return None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-1, 5), max_size=40), st.data(), st.integers(1, 4), st.integers(1, 3))
def test_pick_gang_takes_the_first_nodes_with_enough_candidates_in_their_order(node, data, gpus, nodes):
    """The counting ``pick_gang`` (one pass, not one per node) keeps the rule: which nodes, in
    which order, and which of their candidates."""
    candidates = data.draw(st.permutations(range(len(node)))) if node else []
    candidates = candidates[:data.draw(st.integers(0, len(candidates)))]
    job = Job("g", gpus=gpus, nodes=nodes)
    picked = pick_gang(np.array(candidates, dtype=np.int64), np.array(node, dtype=np.int64), job)
    assert picked == _pick_by_hand(candidates, node, gpus, nodes)
    assert picked is None or all(type(i) is int for i in picked)
