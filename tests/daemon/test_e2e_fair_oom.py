"""End to end on emulated GPUs: never worse than a plain queue (issue 35).

Out-of-memory recovery converges under the default sharing, and a crash is charged to whoever
overran: real daemon, real runners, emulated jobs that ramp their memory as real ones do.
"""

from __future__ import annotations

from daemon_harness import job_argv, wait_for

GIB = 1024


def test_under_declared_jobs_converge_under_the_default_sharing(daemons):
    """Four jobs that declare 4 GiB and ramp to 25 GiB, on 2 emulated A100-40GB with `serve`'s
    defaults (MPS among one user's jobs): each attempt's fence capped what the next raise
    learned from (4 -> 8.3 -> 16.1 -> 23.9 GiB, then failed). A crash at one's own fence lifts
    it, and a last attempt runs alone: all four end done."""
    d = daemons("--sharing", "auto")
    assert "sharing mps" in wait_for(d.read_log, 5, "the daemon's start line")
    jobs = [d.submit(job_argv(25 * GIB, 2.5, None, 0.1, "--ramp", "0.8", "--run", f"r{i}"), mem="4GiB")
            for i in range(4)]
    for job in jobs:
        done = d.wait_state(job, ("done", "failed"), timeout=180)
        assert done["state"] == "done", done["reason"]
        first = done["attempts"][0]
        assert first["outcome"] == "oom"
        assert len(done["attempts"]) <= 4
    # the crash at the fence lifted it: the job's later attempts ran unfenced
    assert d.job(jobs[0])["fence"] == "not fenced: lifted after it crashed at its fence" or \
        d.job(jobs[0])["fence"] == "not fenced: runs alone"


def test_the_neighbour_that_overran_pays_not_the_job_within_its_commitment(daemons):
    """Under time-slicing a job declaring 30 GiB that stays within it (20 GiB, then 30 GiB) used
    to crash because a neighbour declaring 4 GiB held 18 GiB, and was charged for it. Now it is
    requeued ahead with its requirement unchanged and no retry used; the neighbour's requirement
    rises from what it held."""
    d = daemons("--policy", "declared-memory", gpus="emulated:1xA100-40GB")
    victim = d.submit(job_argv(20 * GIB, 12.0, 30 * GIB), mem="30GiB")  # 30 GiB from 3.6 s on
    d.wait_state(victim, "running")
    wait_for(lambda: d.client.request("gpus")[0]["used_mib"] >= 20 * GIB, 20, "the victim's memory")
    overrun = d.submit(job_argv(18 * GIB, 6.0), mem="4GiB", no_mem_fence=True)
    assert d.job(overrun)["fence"] == "not fenced: opted out (--no-mem-fence)"
    wait_for(lambda: d.client.request("gpus")[0]["used_mib"] >= 38 * GIB, 20, "the neighbour's overrun")
    crashed = wait_for(lambda: (v := d.job(victim))["victim_crashes"] and v, 40, "the victim's crash")
    assert crashed["mem_mib"] == 30 * GIB and crashed["mem_source"] == "declared"
    raised = d.job(overrun)
    assert raised["mem_source"] == "oom-raised" and raised["mem_mib"] >= 18 * GIB
    done = d.wait_state(victim, "done", timeout=60)
    first, second = done["attempts"]
    assert first["outcome"] == "oom" and second["outcome"] == "succeeded"
    assert done["oom_crashes"] == 0 and done["mem_mib"] == 30 * GIB
    assert "held more than they committed" in first["reason"] or done["victim_crashes"] == 1
    assert d.wait_state(overrun, "done", timeout=60)["oom_crashes"] == 0


def test_a_fenced_job_crashes_at_its_own_fence_not_its_neighbours(daemons):
    """Time-slicing, fence on (the default): the job declaring 4 GiB that reaches 18 GiB stops
    at its fence; the job within its 30 GiB beside it never crashes."""
    d = daemons("--policy", "declared-memory", gpus="emulated:1xA100-40GB")
    steady = d.submit(job_argv(20 * GIB, 5.0, 30 * GIB), mem="30GiB")
    d.wait_state(steady, "running")
    wait_for(lambda: d.client.request("gpus")[0]["used_mib"] >= 20 * GIB, 20, "its memory")
    grower = d.submit(job_argv(2 * GIB, 3.0, 18 * GIB), mem="4GiB")
    assert d.job(grower)["fence"].startswith("fenced at")
    wait_for(lambda: d.job(grower)["oom_crashes"] >= 1, 30, "the grower's crash at its fence")
    done = d.wait_state(steady, "done", timeout=60)
    assert [a["outcome"] for a in done["attempts"]] == ["succeeded"]
    assert d.wait_state(grower, "done", timeout=90)["state"] == "done"
