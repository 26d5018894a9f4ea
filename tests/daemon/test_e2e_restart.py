"""Restart safety: SIGKILL the daemon while jobs run, start it again, nothing lost or run twice."""

from __future__ import annotations

import os
import signal
import time

from daemon_harness import gated_argv, job_argv, wait_for
from test_e2e_suspend import _pids, _steps

from collocate.gpus.emulated_state import is_frozen


def test_running_jobs_are_readopted_after_sigkill_and_run_once(daemons, tmp_path):
    d = daemons()
    gate = tmp_path / "gate"  # the jobs run until the restarted daemon was seen to re-adopt them
    a = d.submit(gated_argv(gate), mem="2GiB")
    b = d.submit(gated_argv(gate), mem="2GiB")
    d.wait_state(a, "running")
    d.wait_state(b, "running")
    runner_a = d.job(a)["attempts"][0]["pid"]
    d.kill(signal.SIGKILL)
    os.kill(runner_a, 0)  # the job outlived the daemon
    d.start()
    assert d.job(a)["state"] == "running"  # re-adopted, not requeued
    gate.touch()
    for job in (a, b):
        done = d.wait_state(job, "done", timeout=30)
        assert len(done["attempts"]) == 1 and done["attempts"][0]["outcome"] == "succeeded"
    assert d.job(a)["attempts"][0]["pid"] == runner_a


def test_job_that_ended_while_the_daemon_was_down_is_recorded(daemons, tmp_path):
    d = daemons()
    gate = tmp_path / "gate"  # opened once the daemon is down: both jobs end while nobody watches
    ok = d.submit(gated_argv(gate), mem="1GiB")
    oom = d.submit(gated_argv(gate, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
                   mem="1GiB", retries=0)
    d.wait_state(ok, "running")
    d.wait_state(oom, "running")
    d.kill(signal.SIGKILL)
    gate.touch()
    for job in (ok, oom):  # each runner records its job's end in exit.json, daemon or not
        wait_for((d.state_dir / "jobs" / job / "attempt-1" / "exit.json").exists, 30, f"job {job} to end")
    restarted = time.time()
    d.start()
    done = d.wait_state(ok, "done", timeout=20)["attempts"][0]
    assert done["outcome"] == "succeeded" and done["end"] < restarted  # the runner's end time
    failed = d.wait_state(oom, "failed", timeout=20)
    assert failed["attempts"][0]["outcome"] == "oom"
    assert failed["reason"] == "out of GPU memory on all 1 attempts"


def test_vanished_job_is_marked_lost_and_requeued_and_queue_order_kept(daemons, tmp_path):
    d = daemons(gpus="emulated:1xA100-40GB")
    gate = tmp_path / "gate"  # the victim may not end on its own before it is killed
    victim = d.submit(gated_argv(gate), mem="39GiB")
    d.wait_state(victim, "running")
    queued = [d.submit(job_argv(39000, 0.3), mem="39GiB") for _ in range(3)]
    runner = d.job(victim)["attempts"][0]["pid"]
    d.kill(signal.SIGKILL)
    os.killpg(runner, signal.SIGKILL)  # the runner and the job die with no exit record
    wait_for(lambda: not _alive(runner), 10, "the runner to die")
    d.start()
    detail = d.job(victim)
    assert detail["attempts"][0]["outcome"] == "lost"
    gate.touch()  # its second attempt ends at once
    rows = d.client.request("ls", all=True)
    assert [r["id"] for r in rows] == [victim, *queued]
    ends = []
    for job in [victim, *queued]:
        done = d.wait_state(job, "done", timeout=60)
        ends.append(done["attempts"][-1]["start"])
    assert ends[1] < ends[2] < ends[3]  # the queue kept its order across the restart
    assert len(d.job(victim)["attempts"]) == 2


def test_pending_jobs_survive_restart_in_order(daemons):
    d = daemons()
    d.client.request("drain")
    ids = [d.submit(job_argv(300, 0.2), mem="1GiB", priority=p) for p in (0, 5, 0)]
    d.kill(signal.SIGKILL)
    d.start()
    rows = d.client.request("ls")
    assert [r["id"] for r in rows] == ids and all(r["state"] == "pending" for r in rows)
    assert d.client.request("ping")["draining"] is True  # the drain flag is state too
    d.client.request("resume")
    starts = {j: d.wait_state(j, "done", timeout=60)["attempts"][0]["start"] for j in ids}
    assert starts[ids[1]] <= min(starts[ids[0]], starts[ids[2]])  # priority 5 first


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def test_a_cancel_survives_a_daemon_crash_right_after_it(daemons):
    d = daemons()
    job = d.submit(job_argv(1000, 30.0), mem="1GiB")
    d.wait_state(job, "running")
    d.client.request("cancel", id=job)
    d.kill(signal.SIGKILL)  # before the daemon saw the job exit
    d.start()
    cancelled = d.wait_state(job, "cancelled", timeout=30)
    assert cancelled["attempts"][0]["outcome"] == "cancelled"


def test_a_job_frozen_for_a_higher_one_stays_frozen_across_a_restart_and_thaws_by_the_same_rule(daemons):
    d = daemons("--policy", "exclusive", gpus="emulated:1xA100-40GB")
    # its --time (10 s) is shorter than it spends frozen: it may end done only if frozen time
    # stays off its clock across the restart
    low = d.submit(job_argv(1000, 3, None, 0.5, "--steps-per-s", "20", "--job", "low"), mem="2GiB", time=10)
    wait_for(lambda: _steps(d.job(low)) > 5, 30, "the low job to report steps")
    high = d.submit(job_argv(1000, 8, None, 0.5, "--job", "high"), mem="2GiB", priority=5)
    frozen = wait_for(lambda: (j := d.job(low)).get("suspended") and j, 10, "the low job to be frozen")
    pids = _pids(frozen)
    d.kill(signal.SIGKILL)
    d.start()
    again = d.job(low)
    assert again["state"] == "running" and again["suspended"] == "preempt", again
    assert (again["suspended_at"], again["suspended_why"]) == (frozen["suspended_at"], frozen["suspended_why"])
    if "jobs confined: cgroup" in d.read_log():
        assert pids and all(is_frozen(p) for p in pids), pids
    before = _steps(again)
    time.sleep(1.0)
    assert _steps(d.job(low)) == before  # still stopped
    assert d.wait_state(high, ("done", "failed"), timeout=30.0)["state"] == "done"
    done = d.wait_state(low, ("done", "failed", "timeout"), timeout=30.0)
    assert done["state"] == "done" and len(done["attempts"]) == 1, done
    assert done["attempts"][0]["end"] - done["attempts"][0]["start"] > 10.0  # it spent longer frozen
