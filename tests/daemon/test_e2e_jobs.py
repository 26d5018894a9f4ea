"""End to end on emulated GPUs: submit, place, run, logs, history, OOM recovery, retries, cancel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from daemon_harness import job_argv, wait_for


def test_job_runs_to_done_with_logs_attempt_and_history(daemons):
    d = daemons()
    first = d.submit(job_argv(1500, 1.0), mem="2GiB", name="small")
    done = d.wait_state(first, "done")
    (attempt,) = done["attempts"]
    assert attempt["outcome"] == "succeeded" and attempt["returncode"] == 0
    assert attempt["uuids"][0].startswith("GPU-emu-")
    assert attempt["end"] >= attempt["start"]
    assert 1400 <= attempt["peak_mib"] <= 1600  # the monitor saw the job's own claim
    out = d.client.request("logs", id=first, offset=0)
    assert "done in" in out["text"]
    # The same command and cwd again: the measured peak replaces the declared --mem.
    second = d.submit(job_argv(1500, 1.0), mem="20GiB")
    detail = d.job(second)
    assert detail["mem_source"] == "history"
    assert abs(detail["mem_mib"] - attempt["peak_mib"]) < 1e-6


def test_the_daemon_learns_a_jobs_solo_activity_and_remembers_it(daemons):
    d = daemons()
    argv = job_argv(1500, 3.0, sm=0.4)  # its emulated GPU reads SM 0.4, DRAM 0.05 while alone
    first = d.submit(argv, mem="2GiB")
    assert d.job(first)["profile"]["source_kind"] == "assumed"
    live = wait_for(lambda: (p := d.job(first)["profile"])["source_kind"] == "measured" and p,
                    20, "the profile measured while it runs")
    assert live["sm_activity"] == pytest.approx(0.4, abs=0.03)
    assert live["dram_activity"] == pytest.approx(0.05, abs=0.03)
    (attempt,) = d.wait_state(first, "done")["attempts"]
    assert attempt["solo_sm"] == pytest.approx(0.4, abs=0.03)
    again = d.job(d.submit(argv, mem="2GiB"))["profile"]
    assert again["source_kind"] == "history" and again["sm_activity"] == pytest.approx(0.4, abs=0.03)
    assert again["source"] == "learned in earlier runs of the same job"
    # The same script with another number (a sweep's next point) starts from that profile,
    # shrunk half-way toward the prior by the one sibling that measured it.
    sibling = d.job(d.submit(job_argv(1500, 2.0, sm=0.4), mem="2GiB"))
    assert sibling["mem_source"] == "declared"  # memory is never taken from a sibling
    assert sibling["profile"]["source_kind"] == "similar"
    assert sibling["profile"]["sm_activity"] == pytest.approx((0.4 + 0.5) / 2, abs=0.02)


def test_underestimated_job_crashes_oom_and_recovers_with_more_memory(daemons):
    # declared-memory packs by declarations alone: the under-estimate is certain to be collocated
    d = daemons("--policy", "declared-memory", gpus="emulated:1xA100-40GB")
    hog = d.submit(job_argv(37000, 4.0), mem="37000MiB")
    d.wait_state(hog, "running")
    wait_for(lambda: d.client.request("gpus")[0]["used_mib"] >= 37000, 20, "the hog's memory")
    # Declared 1 GiB, so it is collocated next to the hog; it really needs 5000 MiB (3536 are free).
    job = d.submit(job_argv(1000, 1.5, peak_mib=5000), mem="1GiB")
    done = d.wait_state(job, "done", timeout=60)
    first, second = done["attempts"]
    assert first["outcome"] == "oom" and "CUDA out of memory" in first["reason"]
    assert first["returncode"] == 1
    assert second["outcome"] == "succeeded"
    assert second["mem_mib"] >= 5000  # raised above what it really needed, never below the old
    assert done["oom_crashes"] == 1 and done["mem_source"] == "oom-raised"
    assert second["start"] >= d.job(hog)["attempts"][0]["end"] - 0.5  # waited for room


def test_oom_retries_are_capped_and_the_reason_kept(daemons):
    d = daemons()
    oom = [sys.executable, "-c",
           ("import sys; print('RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED', file=sys.stderr);"
           " sys.exit(1)")]
    job = d.submit(oom, mem="1GiB", retries=2)
    failed = d.wait_state(job, "failed", timeout=40)
    assert [a["outcome"] for a in failed["attempts"]] == ["oom", "oom", "oom"]
    assert failed["reason"] == "out of GPU memory on all 3 attempts"
    mems = [a["mem_mib"] for a in failed["attempts"]]
    assert mems[0] < mems[1] < mems[2]  # each retry asks for more


def test_plain_failure_is_not_retried_unless_asked(daemons, tmp_path):
    d = daemons()
    fail = [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]
    once = d.submit(fail, mem="1GiB")
    detail = d.wait_state(once, "failed")
    assert len(detail["attempts"]) == 1
    assert "status 3" in detail["reason"] and "boom" in detail["reason"]
    retried = d.submit(fail, mem="1GiB", retries=2)
    detail = d.wait_state(retried, "failed", timeout=40)
    assert len(detail["attempts"]) == 3


def test_cancel_pending_and_running_jobs(daemons):
    d = daemons("--gpus", "emulated:1xA100-40GB")
    running = d.submit(job_argv(1000, 30.0), mem="39GiB")
    pending = d.submit(job_argv(1000, 30.0), mem="39GiB")
    d.wait_state(running, "running")
    assert d.client.request("cancel", id=pending)["state"] == "cancelled"
    d.client.request("cancel", id=running)
    detail = d.wait_state(running, "cancelled", timeout=20)
    assert detail["attempts"][0]["outcome"] == "cancelled"
    assert d.job(pending)["attempts"] == []


def test_sigkill_of_a_job_fails_it_with_the_signal_and_queue_goes_on(daemons):
    d = daemons()
    victim = d.submit(job_argv(1000, 30.0), mem="2GiB")
    d.wait_state(victim, "running")
    child = wait_for(lambda: _child_pid(d, victim), 20, "the job's process")
    os.kill(child, signal.SIGKILL)
    detail = d.wait_state(victim, "failed")
    assert "SIGKILL" in detail["reason"]
    after = d.submit(job_argv(500, 0.5), mem="1GiB")
    d.wait_state(after, "done")


def test_oom_recovery_does_not_block_the_queue(daemons):
    d = daemons(gpus="emulated:1xA100-40GB")
    hog = d.submit(job_argv(30000, 6.0), mem="30GiB")
    d.wait_state(hog, "running")
    grower = d.submit(job_argv(1000, 1.0, peak_mib=12000), mem="1GiB")
    wait_for(lambda: d.job(grower)["oom_crashes"] == 1, 30, "the OOM crash")
    # The recovered job needs more than is free; a small job behind it still runs now.
    small = d.submit(job_argv(500, 0.5), mem="500MiB")
    d.wait_state(small, "done", timeout=20)
    assert d.job(hog)["state"] == "running"
    assert d.wait_state(grower, "done", timeout=40)["attempts"][-1]["outcome"] == "succeeded"


def test_drain_stops_placing_and_resume_restarts(daemons):
    d = daemons()
    d.client.request("drain")
    job = d.submit(job_argv(500, 0.5), mem="1GiB")
    import time

    time.sleep(1.0)
    assert d.job(job)["state"] == "pending"
    d.client.request("resume")
    d.wait_state(job, "done")


def test_cli_round_trip(daemons, tmp_path):
    d = daemons()
    env = {**os.environ, "COLLOCATE_STATE_DIR": str(d.state_dir)}
    cli = [sys.executable, "-m", "collocate.cli"]
    out = subprocess.run([*cli, "submit", "--mem", "1GiB", "--name", "cli-job", "--env", "A=1", "--",
                          *job_argv(500, 0.5)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    d.wait_state(job_id, "done")
    rows = json.loads(subprocess.run([*cli, "ls", "--all", "--format", "json"], env=env,
                                     capture_output=True, text=True, timeout=60, check=True).stdout)
    assert [r["name"] for r in rows] == ["cli-job"]
    shown = subprocess.run([*cli, "show", job_id], env=env, capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert "succeeded" in shown and "cli-job" in shown
    logs = subprocess.run([*cli, "logs", job_id], env=env, capture_output=True, text=True,
                          timeout=60, check=True).stdout
    assert "done in" in logs
    gpus = subprocess.run([*cli, "gpus"], env=env, capture_output=True, text=True, timeout=60,
                          check=True).stdout
    assert "A100-40GB" in gpus


def _child_pid(d, job_id):
    detail = d.job(job_id)
    if not detail["attempts"]:
        return None
    record = os.path.join(detail["attempts"][-1]["dir"], "child.json")
    try:
        with open(record) as f:
            return json.load(f)["pid"]
    except (OSError, ValueError):
        return None
