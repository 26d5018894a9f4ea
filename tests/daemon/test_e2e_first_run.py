"""First-run admission on emulated GPUs (issue 16): jobs with no history of their own share GPUs
from their first run, and every pending job says why it waits."""

from __future__ import annotations

from daemon_harness import job_argv, wait_for

GPU_MIB = 40960.0  # one emulated A100-40GB


def _running(d, *jobs: str) -> bool:
    return all(d.job(j)["state"] == "running" for j in jobs)


def _gpu(d) -> dict:
    (row,) = d.client.request("gpus")
    return row


def test_declared_jobs_are_packed_at_once_and_priced_by_what_their_gpu_reads(daemons):
    d = daemons(gpus="emulated:1xA100-40GB")  # auto, settle_s 30 s by default
    jobs = [d.submit(job_argv(3000, 40.0, sm=0.1), mem="4GiB") for _ in range(3)]
    # Before, each placement waited 30 s after the last job was seen; now the requirement is
    # committed at once, so two share the GPU within a few rounds ...
    wait_for(lambda: _running(d, *jobs[:2]), 8, "two declared jobs running together")
    assert _gpu(d)["committed_mib"] == 2 * 4096
    # ... while the third is priced at the assumed SM 0.5 each: a third would slow them too much.
    wait_for(lambda: d.job(jobs[2])["wait"] == "slowdown", 5, "the third job's reason")
    # Once the GPU's readings (SM 0.2 for both) have settled, they price the two at 0.1 each,
    # and the third joins them.
    wait_for(lambda: _running(d, *jobs), 40, "the third job, priced by the GPU's readings")
    profile = d.job(jobs[0])["profile"]
    assert profile["source"].startswith("inferred") and 0.08 <= profile["sm_activity"] <= 0.12


def test_an_under_declared_newcomer_commits_what_it_holds_and_its_gpu_settles(daemons):
    d = daemons("--param", "settle_s=4", gpus="emulated:1xA100-40GB")
    # Declares 2 GiB, holds 2,000 MiB, then 12,000 MiB from 30 % of its 12 s.
    greedy = d.submit(job_argv(2000, 12.0, peak_mib=12000), mem="2GiB")
    wait_for(lambda: _gpu(d)["committed_mib"] >= 12000, 15, "the commitment to rise to what it holds")
    late = d.submit(job_argv(1000, 1.0), mem="2GiB")
    row = wait_for(lambda: (r := next(x for x in d.client.request("ls") if x["id"] == late))["wait"]
                   == "in-flight" and r, 3, "the newcomer to wait for the GPU to settle")
    assert row["state"] == "pending" and "stable" in row["reason"]
    # Once the greedy job's memory has held still for settle_s, the GPU takes the next job.
    wait_for(lambda: d.job(late)["state"] in ("running", "done"), 15, "the newcomer to start")
    assert d.job(greedy)["state"] == "running"  # beside it, not after it


def test_a_job_without_mem_shares_a_roomy_gpu_and_then_commits_only_its_peak(daemons):
    d = daemons("--param", "settle_s=4", gpus="emulated:1xA100-40GB")
    first = d.submit(job_argv(3000, 30.0), mem="4GiB")
    # Measured alone first, so the jobs after it (same program) are priced by its activity
    # and only memory decides here.
    wait_for(lambda: d.job(first)["profile"]["source"].endswith("this attempt"), 10, "its profile")
    unknown = d.submit(job_argv(3000, 30.0))  # no --mem, no estimate, no history
    wait_for(lambda: _running(d, unknown), 10, "the job without --mem to share the GPU")
    # While its memory settles it holds the whole GPU, so nothing is packed beside it ...
    wait_for(lambda: _gpu(d)["committed_mib"] >= GPU_MIB, 5, "the whole GPU to be committed")
    third = d.submit(job_argv(3000, 3.0), mem="4GiB")
    # ... then it commits its peak (3,000 MiB) x 1.1 + 512 MiB, and the third job fits beside both.
    wait_for(lambda: d.job(third)["state"] in ("running", "done"), 20, "the third job to start")
    assert _running(d, first, unknown)
    committed = _gpu(d)["committed_mib"]
    assert committed <= 4096 + 3000 * 1.1 + 512 + 4096 + 1e-6


def test_a_job_shares_beside_an_overestimated_one_once_its_memory_holds_still(daemons):
    d = daemons("--param", "settle_s=8", gpus="emulated:1xA100-40GB")
    over = d.submit(job_argv(3000, 60.0), mem="30GiB", mem_source="static-trace")  # an estimate
    wait_for(lambda: _running(d, over), 10, "the overestimated job")
    big = d.submit(job_argv(1000, 3.0), mem="20GiB")
    # While the first job's memory ramps its estimate stands: 30 + 20 GiB do not fit 40 GiB ...
    wait_for(lambda: d.job(big)["wait"] == "memory", 5, "the newcomer to wait for memory")
    # ... then it commits the 3,000 MiB it holds x 1.1 + 512 MiB, and the newcomer fits beside it.
    wait_for(lambda: d.job(big)["state"] in ("running", "done"), 30, "the newcomer to start")
    assert _running(d, over)
    assert d.job(over)["mem_source"] == "static-trace"


def test_pending_jobs_say_why_they_wait(daemons):
    d = daemons(gpus="emulated:1xA100-40GB")
    big = d.submit(job_argv(1000, 20.0), mem="30GiB")
    wait_for(lambda: _running(d, big), 10, "the big job")
    short = d.submit(job_argv(1000, 1.0), mem="20GiB")
    after = d.submit(job_argv(1000, 1.0), mem="1GiB", after=[short])
    # a job no round has looked at yet waits in the queue; the next round says why
    rows = wait_for(lambda: (r := {x["id"]: x for x in d.client.request("ls")}) and
                    r[short]["wait"] == "memory" and r, 5, "the memory reason")
    assert "its 20.00 GiB" in rows[short]["reason"]
    assert rows[after]["wait"] == "dependency" and short in rows[after]["reason"]
    assert d.job(short)["wait"] == "memory"  # `show` and JSON carry it too
    d.client.request("drain")
    wait_for(lambda: d.job(short)["wait"] == "drain", 5, "the drain to be the reason")


def test_under_mps_the_pinned_limit_enforces_the_requirement_and_the_job_recovers(daemons):
    d = daemons("--sharing", "mps", gpus="emulated:1xA100-40GB")
    # Declares 2 GiB: its limit is 2,048 x 1.15 + 512 MiB. It grows to 4,000 MiB at 30 % of its run,
    # which MPS refuses (time-slicing would let it through and raise its commitment instead).
    job = d.submit(job_argv(1500, 2.0, peak_mib=4000), mem="2GiB")
    done = d.wait_state(job, ("done", "failed"), timeout=60)
    first, *rest = done["attempts"]
    assert first["outcome"] == "oom"
    assert done["state"] == "done" and rest and rest[-1]["outcome"] == "succeeded"
