"""Never worse than a plain queue (issue 35): the pure rules of recovery and attribution, and
the simulator following them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collocate.core.commitment import LIMIT_MARGIN_MIB, at_fence
from collocate.core.gputypes import parse_cluster
from collocate.core.model import ClusterSnapshot, GpuId, GpuView, Job, JobProfile, JobState, SharingMode
from collocate.core.policies import POLICY_NAMES, make_policy
from collocate.core.recovery import (
    DEPARTED_WINDOW_S,
    Departure,
    ExitReport,
    Holding,
    Outcome,
    after_exit,
    beside_at_crash,
    charged_to,
    job_allowance_mib,
    job_fence_mib,
    why_unfenced,
)
from collocate.core.scheduler import Capacity, Scheduler
from collocate.node.fence import ENV_MEM_FENCE, site_dir, with_fence_path
from collocate.sim.engine import SimConfig, Simulation
from collocate.sim.trace import TraceJob, Workload

GIB = 1024.0


def cluster(n=2, committed=None, jobs=None):
    committed = committed or (0.0,) * n
    jobs = jobs or ((),) * n
    return ClusterSnapshot.from_views([GpuView(GpuId("n0", i), 40_960.0, committed_mib=committed[i], jobs=jobs[i])
                                       for i in range(n)])


def running(job: Job) -> Job:
    return job.evolve(state=JobState.RUNNING, attempts=job.attempts + 1)


# -- a crash at one's own fence ------------------------------------------------------------------


def test_a_crash_at_its_own_fence_lifts_the_fence_for_later_attempts():
    job = running(Job("a", mem_mib=4 * GIB, mem_source="declared"))
    fence = job_fence_mib(job, None)
    assert fence is not None and fence > 4 * GIB
    after = after_exit(job, ExitReport(Outcome.OOM, 6.25 * GIB, "CUDA out of memory", fence))
    assert after.state is JobState.PENDING and after.fence_lifted and not after.alone
    assert job_fence_mib(after, None) is None
    assert why_unfenced(after) == "lifted after it crashed at its fence"


def test_a_crash_well_below_its_fence_keeps_the_fence():
    job = running(Job("a", mem_mib=20 * GIB, mem_source="declared"))
    fence = job_fence_mib(job, None)
    after = after_exit(job, ExitReport(Outcome.OOM, 8 * GIB, "CUDA out of memory", fence))
    assert not after.fence_lifted and job_fence_mib(after, None) is not None


@given(st.floats(1.0, 80_000.0), st.floats(0.0, 80_000.0))
def test_at_fence_means_within_a_margin_of_it(fence, observed):
    near = max(LIMIT_MARGIN_MIB, 0.05 * fence)
    assert at_fence(observed, fence) == (observed >= fence - near)
    assert not at_fence(observed, None) and not at_fence(None, fence)


@given(st.integers(0, 6))
def test_the_attempt_that_would_be_the_last_runs_alone_and_unfenced(max_retries):
    job = Job("a", mem_mib=4 * GIB, mem_source="declared", max_retries=max_retries)
    for n in range(max_retries):
        job = after_exit(running(job), ExitReport(Outcome.OOM, 1.0 * GIB + n, "CUDA out of memory"))
        assert job.state is JobState.PENDING
        assert job.alone == (n == max_retries - 1)
    if max_retries:
        assert job_fence_mib(job, None) is None and why_unfenced(job) == "runs alone"
    final = after_exit(running(job), ExitReport(Outcome.OOM, 2 * GIB, "CUDA out of memory"))
    assert final.state is JobState.FAILED


@given(st.integers(0, 4))
def test_a_crash_at_its_fence_uses_no_retry_so_even_retries_0_gets_an_unfenced_attempt(max_retries):
    job = running(Job("a", mem_mib=4 * GIB, mem_source="declared", max_retries=max_retries))
    fence = job_fence_mib(job, None)
    assert fence is not None
    job = after_exit(job, ExitReport(Outcome.OOM, fence, "CUDA out of memory", fence))
    assert job.state is JobState.PENDING and job.fence_lifted and job.lost_attempts == 1
    assert job.alone == (max_retries == 0)  # no retries: the free attempt is its last, alone
    assert job_fence_mib(job, None) is None
    for _ in range(max_retries):  # every retry is still there, the last one alone
        job = after_exit(running(job), ExitReport(Outcome.OOM, 30 * GIB, "CUDA out of memory"))
        assert job.state is JobState.PENDING
    assert job.alone
    final = after_exit(running(job), ExitReport(Outcome.OOM, 35 * GIB, "CUDA out of memory"))
    assert final.state is JobState.FAILED and final.reason == f"out of GPU memory on all {max_retries + 1} attempts"


def test_a_job_that_runs_alone_is_placed_only_on_an_empty_gpu_by_every_policy():
    alone = Job("alone", mem_mib=4 * GIB, mem_source="oom-raised", alone=True, oom_crashes=3)
    placed = 0
    for name in POLICY_NAMES:
        s = Scheduler(make_policy(name), Capacity.of(cluster(2)))
        s.submit(alone)
        busy = cluster(2, committed=(8 * GIB, 0.0), jobs=(("x",), ()))
        plan = s.schedule(busy)
        gpus = [p.gpus for p in plan.placements if p.job_id == "alone"]
        assert gpus in ([], [(busy.ids[1],)]), (name, gpus)
        placed += bool(gpus)
    assert placed >= len(POLICY_NAMES) // 2  # most place it now, on the empty GPU


# -- who pays for an overrun -----------------------------------------------------------------------


def test_a_crash_within_ones_commitment_beside_an_overrun_is_charged_to_the_overrun():
    victim = running(Job("v", mem_mib=30 * GIB, mem_source="declared"))
    offender = running(Job("o", mem_mib=4 * GIB, mem_source="declared"))
    crashed = Holding("v", 30 * GIB, job_allowance_mib(victim, None))
    beside = [Holding("o", 18 * GIB, job_allowance_mib(offender, None))]
    by = charged_to(crashed, beside)
    assert by == ("o",)
    after = after_exit(victim, ExitReport(Outcome.OOM, 30 * GIB, "CUDA out of memory", None, by))
    assert after.state is JobState.PENDING and after.recovered
    assert after.mem_mib == 30 * GIB and after.mem_source == "declared"
    assert after.attempts - after.lost_attempts == 0 and after.oom_crashes == 0 and after.victim_crashes == 1


@given(st.floats(-3 * DEPARTED_WINDOW_S, 3 * DEPARTED_WINDOW_S), st.booleans(), st.booleans())
def test_an_offender_that_left_just_before_the_crash_was_seen_still_pays(left_before, same_gpu, itself):
    """The daemon may see a crash after the job that filled the GPU has ended and been reaped:
    a neighbour that left the crashed job's GPUs within the window before counts as beside it
    (never the job's own earlier attempt, never a job on other GPUs)."""
    at = 1000.0
    offender = Holding("v" if itself else "o", 18 * GIB, 4 * GIB)
    gone = Departure(offender, frozenset({0} if same_gpu else {1}), at - left_before)
    present = [Holding("p", 2 * GIB, 8 * GIB)]
    beside = beside_at_crash(present, [gone, gone], [0], "v", at)
    counted = same_gpu and not itself and abs(left_before) <= DEPARTED_WINDOW_S
    assert beside == present + ([offender] if counted else [])
    by = charged_to(Holding("v", 30 * GIB, 30 * GIB), beside)
    assert by == (("o",) if counted else ())


@given(st.floats(0.0, 60_000.0), st.floats(0.0, 60_000.0))
def test_a_crash_is_charged_to_a_neighbour_only_when_the_job_kept_within_and_the_neighbour_did_not(own, other):
    allowed = 10_000.0
    by = charged_to(Holding("a", own, allowed), [Holding("b", other, allowed)])
    assert (by == ("b",)) == (own <= allowed < other)


def test_the_overrunning_neighbour_s_requirement_rises_from_what_it_held():
    s = Scheduler(make_policy("declared-memory"), Capacity.of(cluster(1)))
    s.submit(Job("o", mem_mib=4 * GIB, mem_source="declared"))
    s.schedule(cluster(1))
    raised = s.charge_overrun("o", 18 * GIB)
    assert raised is not None and raised.mem_mib >= 18 * GIB and raised.mem_source == "oom-raised"
    assert raised.state is JobState.RUNNING


# -- the simulator follows the same rules -----------------------------------------------------------


def trace_job(job_id: str, declared: float, peak: float, duration: float = 600.0) -> TraceJob:
    w = Workload(job_id, 1, duration, peak, {"peak": peak, "declared": declared}, JobProfile(0.3, 0.1))
    return TraceJob(job_id, 0.0, w)


@pytest.mark.parametrize("sharing", [SharingMode.MPS, SharingMode.TIME_SLICING])
def test_the_simulator_converges_on_finding_1s_trace(sharing):
    trace = [trace_job(f"j{i}", 4 * GIB, 25 * GIB) for i in range(4)]
    sim = Simulation(parse_cluster("2xA100-40GB"), trace, make_policy("auto"),
                     SimConfig(sharing=sharing, estimator="declared"))
    result = sim.run()
    assert {r.id: r.state for r in result.records} == {f"j{i}": "done" for i in range(4)}
    assert all(r.attempts <= 4 for r in result.records)


def test_exclusive_runs_every_attempt_unfenced_as_a_plain_queue_does():
    """``exclusive`` never puts a job beside another, so a fence would only crash an
    under-declared job a plain queue runs: its attempts are alone, in both worlds."""
    s = Scheduler(make_policy("exclusive"), Capacity.of(cluster(1)))
    s.submit(Job("a", mem_mib=4 * GIB, mem_source="declared"))
    (placement,) = s.schedule(cluster(1)).placements
    assert placement.alone
    job = s.jobs["a"]
    assert job.placed_alone and not job.alone  # unfenced, charged as any job (a preemptor may join it)
    assert job_fence_mib(job, placement.room_mib) is None and "exclusive" in why_unfenced(job)
    trace = [trace_job(f"j{i}", 3 * GIB, 30 * GIB) for i in range(3)]
    config = SimConfig(sharing=SharingMode.TIME_SLICING, estimator="declared")
    result = Simulation(parse_cluster("2xA100-40GB"), trace, make_policy("exclusive"), config).run()
    assert [(r.state, r.attempts) for r in result.records] == [("done", 1)] * 3  # no crash at a fence


def test_the_simulator_finishes_fifty_mixed_jobs_of_which_a_third_overrun():
    trace = [trace_job(f"j{i}", (2 + i % 3) * GIB, (2 + i % 3) * GIB * (10 if i % 3 == 0 else 0.9),
                       duration=300.0 + 37 * i) for i in range(51)]
    for sharing in (SharingMode.MPS, SharingMode.TIME_SLICING):
        sim = Simulation(parse_cluster("2xA100-40GB"), trace, make_policy("auto"),
                         SimConfig(sharing=sharing, estimator="declared"))
        records = sim.run().records
        assert all(r.state == "done" for r in records), [(r.id, r.reason) for r in records if r.state != "done"]
        within = [r for r in records if int(r.id[1:]) % 3]
        assert sum(r.oom_crashes for r in within) == 0
        # nor crashed for a neighbour's overrun (a victim's crash is not counted in oom_crashes)
        assert all(r.attempts == 1 for r in within), [(r.id, r.spans) for r in within if r.attempts > 1]


# -- the fence of a PyTorch job ---------------------------------------------------------------------


def test_the_runner_puts_the_fence_first_on_the_path_only_for_a_fenced_job():
    assert "PYTHONPATH" not in with_fence_path({"PATH": "/bin"})
    env = with_fence_path({ENV_MEM_FENCE: "4096", "PYTHONPATH": "mine"})
    assert env["PYTHONPATH"] == f"{site_dir()}{os.pathsep}mine"


def _python(code: str, env: dict[str, str], cwd) -> str:
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_sitecustomize_caps_torch_only_at_cudas_lazy_init_and_chains_the_jobs_own(tmp_path):
    pytest.importorskip("torch")
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.JOBS_OWN_SITE = True\n")
    env = with_fence_path({ENV_MEM_FENCE: "10240", "PYTHONPATH": str(own)})
    code = (
        "import sys, builtins\n"
        "assert 'torch' not in sys.modules\n"
        "print(getattr(builtins, 'JOBS_OWN_SITE', False))\n"
        "import torch\n"
        "print(torch.cuda.is_initialized())\n"
        "fences = [c for c, _ in torch.cuda._queued_calls if hasattr(c, 'collocate_fence_mib')]\n"
        "print(len(fences), fences[0].collocate_fence_mib)\n"
        # what the queued call does when CUDA starts: one cap per device, a fraction of its total
        "class P: total_memory = 40 * 1024**3\n"
        "got = []\n"
        "torch.cuda.device_count = lambda: 2\n"
        "torch.cuda.get_device_properties = lambda i: P\n"
        "torch.cuda.set_per_process_memory_fraction = lambda f, i: got.append((round(f, 3), i))\n"
        "fences[0]()\n"
        "print(got)\n"
    )
    lines = _python(code, env, tmp_path).splitlines()
    assert lines == ["True", "False", "1 10240.0", "[(0.25, 0), (0.25, 1)]"]
    # without the variable nothing is queued
    plain = _python("import torch; print(sum(hasattr(c, 'collocate_fence_mib') for c, _ in "
                    "torch.cuda._queued_calls))", {"PYTHONPATH": str(site_dir())}, tmp_path)
    assert plain == "0"
