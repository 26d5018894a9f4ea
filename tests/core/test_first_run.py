"""First-run admission in the core (issue 16): the one commitment rule, wait reasons as data, and
pricing unmeasured jobs by their GPU's reading."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collocate.activity import infer_assumed
from collocate.commitment import MemoryRamp, mps_limit_mib, upper_bound_mib
from collocate.interference import default_interference
from collocate.model import ClusterSnapshot, GpuId, GpuView, Job, JobProfile, SharingMode, WaitKind
from collocate.policies import POLICY_NAMES, make_policy

GIB = 1024.0


def test_a_known_requirement_is_committed_at_once_and_raised_when_outgrown():
    ramp = MemoryRamp(4000.0, stable_s=30.0)
    assert ramp.committed(40960.0, now=0.0) == 4000.0 and ramp.grew_at == -math.inf
    ramp.observe(3900.0, now=5.0)  # below its requirement: nothing settles
    assert ramp.committed(40960.0, now=5.0) == 4000.0 and ramp.grew_at == -math.inf
    ramp.observe(4030.0, now=6.0)  # within the tolerance: noise, not growth
    assert ramp.grew_at == -math.inf
    ramp.observe(9000.0, now=7.0)  # outgrew it: commits what it holds, and its GPU settles
    assert ramp.committed(40960.0, now=7.0) == 9000.0 and ramp.grew_at == 7.0


def test_unknown_memory_holds_the_gpu_until_its_peak_is_stable():
    ramp = MemoryRamp(None, stable_s=30.0)
    assert ramp.grew_at == math.inf and ramp.committed(40960.0, now=0.0) == 40960.0
    ramp.observe(2000.0, now=3.0)
    ramp.observe(5000.0, now=10.0)
    assert ramp.committed(40960.0, now=39.0) == 40960.0  # 29 s since it last grew
    assert ramp.committed(40960.0, now=40.0) == pytest.approx(5000.0 * 1.1 + 512.0)
    ramp.observe(8000.0, now=50.0)  # grew again: whole GPU until stable again
    assert ramp.committed(40960.0, now=60.0) == 40960.0


def test_an_estimate_gives_way_to_the_peak_once_that_holds_still():
    ramp = MemoryRamp.of(30000.0, "static-trace", stable_s=30.0)  # an estimator's 30,000 MiB
    ramp.observe(2000.0, now=5.0)
    assert ramp.committed(40960.0, now=34.0) == 30000.0  # 29 s since its peak grew
    assert ramp.committed(40960.0, now=35.0) == pytest.approx(2000.0 * 1.1 + 512.0)
    assert ramp.grew_at == -math.inf  # below what it committed: its GPU never settled
    ramp.observe(2600.0, now=40.0)  # within its margin: still given way, from 30 s after this
    assert ramp.grew_at == -math.inf and ramp.committed(40960.0, now=41.0) == 30000.0
    assert ramp.committed(40960.0, now=70.0) == pytest.approx(2600.0 * 1.1 + 512.0)
    ramp.observe(9000.0, now=80.0)  # beyond what it committed then: its GPU settles ...
    assert ramp.grew_at == 80.0
    assert ramp.committed(40960.0, now=81.0) == 30000.0  # ... and it commits its estimate again
    assert ramp.committed(40960.0, now=110.0) == pytest.approx(9000.0 * 1.1 + 512.0)
    ramp.observe(35000.0, now=120.0)  # beyond the estimate: what it holds, as any job
    assert ramp.committed(40960.0, now=121.0) == 35000.0 and ramp.grew_at == 120.0


@pytest.mark.parametrize("source", ["declared", "history", "measured", "oom-raised"])
def test_a_declared_or_measured_requirement_is_kept(source):
    ramp = MemoryRamp.of(30000.0, source, stable_s=30.0)
    ramp.observe(2000.0, now=5.0)
    assert ramp.committed(40960.0, now=500.0) == 30000.0


def test_mps_limits_leave_room_above_an_estimate():
    assert upper_bound_mib(6000.0, 0.0, "static-trace") == pytest.approx(6900.0)
    assert upper_bound_mib(6000.0, 0.3, "declared") == pytest.approx(7800.0)
    assert upper_bound_mib(6000.0, 0.05, "history") == pytest.approx(6300.0)
    assert mps_limit_mib(None, 30000.0, 0.0, "unknown") == 30000.0


def _gpu(jobs: int = 0, committed: float = 0.0, sm: float = 0.0, seen: float = -math.inf,
         settling: float = -math.inf, total: float = 40 * GIB) -> GpuView:
    return GpuView(GpuId("n", 0), total, committed_mib=committed,
                   jobs=tuple(f"r{k}" for k in range(jobs)), launch_seen_at=seen, mem_settling_at=settling)


def test_auto_packs_declared_jobs_in_one_round_without_a_settle_wait():
    cluster = ClusterSnapshot.from_views([_gpu()], now=100.0)
    light = JobProfile(0.1, 0.05)
    queue = [Job(f"j{k}", mem_mib=4 * GIB, mem_source="declared", profile=light) for k in range(3)]
    plan = make_policy("auto")(queue, cluster)
    assert [p.job_id for p in plan.placements] == ["j0", "j1", "j2"]


@pytest.mark.parametrize(("gpu", "kind"), [
    (_gpu(jobs=1, committed=38 * GIB), WaitKind.MEMORY),
    (_gpu(jobs=1, committed=4 * GIB, settling=95.0), WaitKind.IN_FLIGHT),
    (_gpu(jobs=3, committed=12 * GIB, sm=0.0), WaitKind.SLOWDOWN),
])
def test_auto_says_why_a_job_waits(gpu, kind):
    heavy = JobProfile(0.9, 0.5)
    cluster = ClusterSnapshot.from_views([gpu], now=100.0)
    if kind is WaitKind.SLOWDOWN:  # three heavy residents: a fourth would slow them past 2x
        cluster = ClusterSnapshot(**{**{f: getattr(cluster, f) for f in cluster.__dataclass_fields__},
                                     "sm_sum": cluster.sm_sum + 2.7, "dram_sum": cluster.dram_sum + 1.5})
    job = Job("new", mem_mib=4 * GIB, mem_source="declared", profile=heavy)
    plan = make_policy("auto")([job], cluster)
    assert not plan.placements and plan.waits["new"].kind is kind, plan.waits


def test_a_job_of_unknown_memory_shares_only_a_roomy_gpu():
    roomy = ClusterSnapshot.from_views([_gpu(jobs=1, committed=8 * GIB)], now=100.0)
    cramped = ClusterSnapshot.from_views([_gpu(jobs=1, committed=24 * GIB)], now=100.0)
    job = Job("u", profile=JobProfile(0.1, 0.05))
    plan = make_policy("auto")([job], roomy)
    assert plan.placements and plan.placements[0].mem_mib == pytest.approx(32 * GIB)  # its room
    plan = make_policy("auto")([job], cramped)
    assert not plan.placements and plan.waits["u"].kind is WaitKind.MEMORY


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(POLICY_NAMES), st.integers(1, 6), st.floats(1 * GIB, 60 * GIB))
def test_every_policy_gives_every_unplaced_job_it_looked_at_a_reason(name, n, mem):
    cluster = ClusterSnapshot.from_views([_gpu(jobs=1, committed=30 * GIB, seen=99.0)], now=100.0)
    queue = [Job(f"j{k}", mem_mib=mem, mem_source="declared", submit_time=k) for k in range(n)]
    plan = make_policy(name)(queue, cluster)
    placed = {p.job_id for p in plan.placements}
    assert not placed & set(plan.waits)
    if len(placed) < n:
        assert plan.waits, "a blocked queue says why"
        assert all(w.detail for w in plan.waits.values())


def test_a_gpus_reading_prices_its_unmeasured_jobs():
    ts = default_interference().modes[SharingMode.TIME_SLICING]
    light = infer_assumed([], 2, 0.19, 0.09, ts)  # two jobs of SM 0.1 read about 0.19
    assert light.sm_activity == pytest.approx(0.095, abs=0.01)
    beside_known = infer_assumed([JobProfile(0.1, 0.05)], 1, 0.19, 0.09, ts)
    assert beside_known.sm_activity == pytest.approx(0.09, abs=0.01)
    saturated = infer_assumed([], 3, 0.99, 0.5, ts)  # a saturated reading: read as fully loaded
    assert saturated.sm_activity == 1.0
    assert infer_assumed([], 0, 0.5, 0.2, ts) is None


def _sim(trace, policy="auto", **config):
    from collocate.gputypes import parse_cluster
    from collocate.sim.engine import SimConfig, Simulation

    result = Simulation(parse_cluster("1xA100-40GB"), trace, make_policy(policy),
                        SimConfig(**config)).run()
    return {r.id: r for r in result.records}, result


def test_the_simulator_prices_unmeasured_jobs_by_their_gpus_reading_as_the_daemon_does():
    from collocate.activity import INFER_AFTER_S, MIN_SOLO_SAMPLES
    from collocate.sim.trace import TraceJob, Workload

    light = JobProfile(0.1, 0.05)  # as the daemon's e2e test: three light jobs, 4 GiB declared
    w = Workload("light", 1, 60.0, 3000.0, {"declared": 4096.0}, light, command="c", program="p")
    trace = [TraceJob(f"j{k}", 0.0, w) for k in range(3)]
    records, result = _sim(trace, estimator="declared", profiles="unknown", ramp_s=0.0)
    assert records["j0"].start == records["j1"].start == 0.0  # committed at once: no settle wait
    # The third waits (priced at the assumed 0.5), until the GPU's reading prices the two.
    assert records["j2"].start == pytest.approx(INFER_AFTER_S + MIN_SOLO_SAMPLES)
    assert result.waits["slowdown"] >= 1
    blind, _ = _sim(trace, estimator="declared", profiles="blind", ramp_s=0.0)
    assert blind["j2"].start >= blind["j0"].end  # told nothing ever: it waits for a job to end


def test_the_simulator_commits_an_unknown_jobs_stable_peak_as_the_daemon_does():
    from collocate.sim.trace import TraceJob, Workload

    light = JobProfile(0.1, 0.05)
    known = Workload("known", 1, 100.0, 3000.0, {"declared": 4096.0}, light)
    unknown = Workload("unknown", 1, 100.0, 3000.0, {}, light)  # no estimate, no declaration
    trace = [TraceJob("a", 0.0, known), TraceJob("b", 1.0, unknown), TraceJob("c", 2.0, known)]
    records, _ = _sim(trace, estimator="declared", ramp_s=5.0)
    assert records["b"].start == 1.0  # shares a roomy GPU rather than waiting for it to empty
    # c waits while b's memory settles (ramp at 6 s, stable 30 s later), then fits beside both
    assert records["c"].start == pytest.approx(1.0 + 5.0 + 30.0)


@settings(max_examples=200, deadline=None)
@given(
    requirement=st.one_of(st.none(), st.floats(100.0, 40000.0)),
    source=st.sampled_from(["static-trace", "gpumemnet", "declared", "history", "oom-raised"]),
    readings=st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 40000.0)), max_size=12),
    later=st.floats(0.0, 100.0),
)
def test_a_job_never_commits_less_than_it_holds_nor_more_than_its_gpu(requirement, source, readings, later):
    # whatever its memory does, what a job commits covers its peak so far; a known requirement
    # is never exceeded unless the job outgrew it, and only an estimate is ever given up
    ramp = MemoryRamp.of(requirement, source, stable_s=30.0)
    now = 0.0
    for step, held in readings:
        now += step
        ramp.observe(held, now)
    at = now + later
    committed = ramp.committed(40960.0, at)
    assert committed >= (min(ramp.peak_mib, 40960.0) if requirement is None else ramp.peak_mib)
    if requirement is not None:
        assert committed <= max(requirement, ramp.peak_mib)
        if not ramp.estimated:
            assert committed == max(requirement, ramp.peak_mib)
