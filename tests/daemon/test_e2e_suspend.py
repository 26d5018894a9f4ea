"""Start, observe, take back (issue 35) on a real daemon with emulated GPUs and real processes:
a job nobody has seen starts beside a busy-but-not-saturated GPU at once; one that turns out to
slow its neighbour past the limit is frozen by its attempt's cgroup freezer (its step counter
stops, its memory stays) and thawed when room returns; ``collocate suspend``/``resume`` for the
job's owner."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest
from daemon_harness import gated_argv, job_argv, wait_for

from collocate.gpus.emulated_state import is_frozen
from collocate.share.lifecycle import probe

HERE = Path(__file__).parent


def _steps(job: dict) -> float:
    """The last step the job reported (its metrics file), 0 before any."""
    if not job["attempts"]:  # not started yet
        return 0.0
    path = Path(job["attempts"][-1]["dir"]) / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0.0
    return float(json.loads(lines[-1]).get("step") or 0.0) if lines else 0.0


def _pids(job: dict) -> set[int]:
    """The job's processes: its runner's children (the runner itself stays outside the cgroup)."""
    if not job["attempts"]:
        return set()
    folder = Path(job["attempts"][-1]["dir"])
    try:
        runner = psutil.Process(int(json.loads((folder / "runner.json").read_text())["pid"]))
        return {p.pid for p in runner.children(recursive=True) if "/job-" in _where({p.pid})[p.pid]}
    except (OSError, ValueError, KeyError, psutil.Error):
        return set()


def _where(pids: set[int]) -> dict[int, str]:
    out = {}
    for p in pids:
        try:
            out[p] = Path(f"/proc/{p}/cgroup").read_text()
        except OSError as exc:
            out[p] = str(exc)
    return out


def test_sleep_beside_busy_gpus_starts_at_once_and_ends_within_10_s(daemons):
    d = daemons(gpus="emulated:2xH100-80GB")
    # two GPUs at about half their SM, as issue 35's lab trial found them
    busy = [d.submit(job_argv(8000, 120, None, 0.45, "--dram", "0.2", "--job", f"busy{k}"), mem="10GiB")
            for k in range(3)]
    wait_for(lambda: all(d.job(j)["state"] == "running" for j in busy), 30, "the busy jobs to run")
    time.sleep(3.0)  # their activity shows
    submitted = time.time()
    job = d.submit(["sleep", "1"], mem="1GiB")
    ran = d.wait_state(job, "done", timeout=60.0)["attempts"][0]
    # the job's own times, not when this test saw them: a loaded machine is slow to poll
    assert ran["start"] - submitted < 5.0 and ran["end"] - submitted < 10.0, ran


def test_a_job_that_slows_its_neighbour_past_the_limit_is_frozen_then_thawed_and_finishes(daemons):
    d = daemons(gpus="emulated:1xH100-80GB")
    if "jobs confined: cgroup" not in d.read_log():
        pytest.skip("no writable cgroups here: jobs are stopped by SIGSTOP instead")
    # the neighbour: SM 0.5, reporting its steps, alone long enough to show its pace
    old = d.submit(job_argv(8000, 40, None, 0.5, "--dram", "0.3", "--steps-per-s", "20", "--job", "old"),
                   mem="10GiB")
    wait_for(lambda: _steps(d.job(old)) > 40, 30, "the neighbour to report its steps")
    time.sleep(2.0)
    # nobody has seen this one: its prior is a guess, the GPU reads room, it starts on trial;
    # it is heavy (SM 1.0, DRAM 0.9): under time-slicing the neighbour runs about 2.8x slower
    new = d.submit(job_argv(8000, 15, None, 1.0, "--dram", "0.9", "--steps-per-s", "20", "--job", "new"),
                   mem="10GiB")
    d.wait_state(new, "running", timeout=10.0)
    frozen = wait_for(lambda: (j := d.job(new)).get("suspended") and j, 45, "the newcomer to be frozen")
    assert frozen["suspended"] == "trial" and "slowed job" in frozen["suspended_why"], frozen
    assert frozen["state"] == "running"  # it keeps its GPU and memory
    pids = _pids(frozen)
    assert pids and all(is_frozen(p) for p in pids), (pids, _where(pids))  # its freezer reads FROZEN
    before = _steps(frozen)
    time.sleep(2.0)
    assert _steps(d.job(new)) == before  # its step counter stands still
    rows = {r["id"]: r for r in d.client.request("ls")}
    assert rows[new]["suspended"] == "trial" and rows[new]["reason"].startswith("slowed job")
    assert d.client.request("gpus")[0]["frozen"] == 1  # the world holds its room, as the simulator's
    # room returns: the neighbour ends; the newcomer is thawed and finishes, never killed
    d.client.request("cancel", id=old)
    wait_for(lambda: not d.job(new).get("suspended"), 30, "the newcomer to be thawed")
    wait_for(lambda: d.client.request("gpus")[0]["frozen"] == 0, 10, "the thawed job's room to be its own again")
    done = d.wait_state(new, ("done", "failed"), timeout=60.0)
    assert done["state"] == "done", done


def test_the_owner_suspends_and_resumes_a_job_and_its_time_limit_waits(daemons):
    d = daemons(gpus="emulated:1xA100-40GB")
    job = d.submit(job_argv(1000, 30, None, 0.2, "--steps-per-s", "20", "--job", "mine"), mem="2GiB", time=14)
    # --time 14 s: room for a slow start under load before it is frozen
    wait_for(lambda: _steps(d.job(job)) > 10, 30, "the job to report steps")
    assert d.client.request("suspend", id=job)["state"] == "suspended"
    shown = d.job(job)
    assert shown["suspended"] == "user" and shown["state"] == "running"
    assert d.client.request("gpus")[0]["frozen"] == 0  # only `resume` thaws it: it holds no room back
    before = _steps(shown)
    time.sleep(15.0)  # past its --time of 14 s, frozen: its limit does not run
    shown = d.job(job)
    assert shown["state"] == "running" and _steps(shown) == before
    row = next(r for r in d.client.request("ls") if r["id"] == job)  # TIME leaves the freeze out
    assert row["frozen_s"] >= 14.0 and row["elapsed_s"] - row["frozen_s"] < 14.0 + 2.0, row
    # the scheduler never thaws what its owner suspended; resume does
    assert d.client.request("resume_job", id=job)["state"] == "running"
    wait_for(lambda: _steps(d.job(job)) > before, 10, "the job to step again")
    ended = d.wait_state(job, ("timeout", "done"), timeout=30.0)
    assert ended["state"] == "timeout"


def test_a_job_of_higher_priority_freezes_a_lower_one_which_thaws_and_finishes_done(daemons):
    # exclusive: the only GPU is the low job's; the daemon's owner's job of priority 5 freezes
    # it (memory kept: 2 + 2 GiB fit the 40 GB) instead of waiting, runs, ends; the low one thaws
    d = daemons("--policy", "exclusive", gpus="emulated:1xA100-40GB")
    low = d.submit(job_argv(2000, 6, None, 0.5, "--steps-per-s", "20", "--job", "low"), mem="2GiB")
    wait_for(lambda: _steps(d.job(low)) > 5, 30, "the low job to report steps")
    high = d.submit(job_argv(2000, 2, None, 0.5, "--job", "high"), mem="2GiB", priority=5)
    d.wait_state(high, ("running", "done"), timeout=10.0)
    frozen = d.job(low)
    assert frozen["suspended"] == "preempt" and frozen["state"] == "running", frozen
    assert frozen["suspended_why"] == f"for job {high} of higher priority (5 > 0); thaws when it ends"
    if "jobs confined: cgroup" in d.read_log():
        pids = _pids(frozen)
        assert pids and all(is_frozen(p) for p in pids), (pids, _where(pids))
    rows = {r["id"]: r for r in d.client.request("ls")}
    assert rows[low]["suspended"] == "preempt" and rows[low]["reason"].startswith(f"for job {high} ")
    assert d.wait_state(high, ("done", "failed"), timeout=20.0)["state"] == "done"
    before = _steps(d.job(low))
    wait_for(lambda: not d.job(low).get("suspended"), 10, "the low job to be thawed")
    done = d.wait_state(low, ("done", "failed"), timeout=20.0)
    assert done["state"] == "done" and len(done["attempts"]) == 1, done  # never killed or requeued
    assert _steps(done) > before


def test_without_preemption_a_job_of_higher_priority_waits_and_freezes_nothing(daemons, tmp_path):
    d = daemons("--policy", "exclusive", "--no-preemption", gpus="emulated:1xA100-40GB")
    assert "policy exclusive (no preemption)" in d.read_log()
    gate = tmp_path / "gate"
    low = d.submit(gated_argv(gate), mem="2GiB")
    d.wait_state(low, "running", timeout=20.0)
    high = d.submit(job_argv(2000, 0.5, None, 0.5, "--job", "high"), mem="2GiB", priority=5)
    # a round that placed nothing is the round that would have preempted: its wait is recorded
    waiting = wait_for(lambda: (j := d.job(high))["reason"] and j, 20, "the high job's wait to be known")
    assert waiting["state"] == "pending", waiting
    assert not d.job(low)["suspended"]
    gate.touch()
    assert d.wait_state(low, ("done", "failed"), timeout=20.0)["state"] == "done"
    assert d.wait_state(high, ("done", "failed"), timeout=20.0)["state"] == "done"


def test_serve_takes_a_pile_up_back_at_once_when_asked(daemons):
    d = daemons("--freeze-at-once", gpus="emulated:1xA100-40GB")
    assert "policy auto (pile-ups taken back at once)" in d.read_log()  # the scheduler's rules, as run


def test_a_job_frozen_while_it_waits_for_its_dataset_producer_starts_only_once_thawed(daemons, tmp_path):
    # The low job is placed but has no process yet: its producer is slow to build its loader.
    # A job of higher priority freezes it then; the producer comes up while it is frozen: a job
    # recorded frozen must not run, so its start waits for the thaw (issue 35).
    d = daemons("--policy", "exclusive", gpus="emulated:1xA100-40GB")
    built = tmp_path / "loader-built"  # the producer comes up once the low job is frozen
    low = d.submit([sys.executable, str(HERE / "dataset_job.py"), "20"], mem="1GiB", cwd=str(HERE),
                   dataset="slow", dataset_factory="_dataset_factory:slow", env=[f"SLOW_FACTORY_GATE={built}"])
    wait_for(lambda: d.job(low)["reason"] == "waiting for dataset producer slow", 20, "the job to wait for its producer")
    gate = tmp_path / "gate"
    high = d.submit(gated_argv(gate), mem="1GiB", priority=5)
    d.wait_state(high, "running", timeout=30.0)
    frozen = d.job(low)
    assert frozen["suspended"] == "preempt" and frozen["state"] == "running", frozen
    built.touch()
    wait_for(lambda: probe("slow", d.state_dir / "share") is not None, 40, "the producer to serve")
    folder = Path(frozen["attempts"][0]["dir"])
    wait_for(lambda: "its start waits until it is thawed" in (d.state_dir / "daemon.log").read_text()
             or (folder / "runner.json").exists(), 10, "the daemon to see its producer serve")
    assert not (folder / "runner.json").exists()  # no runner, so no process of the job ran
    shown = d.job(low)
    assert shown["suspended"] == "preempt" and shown["reason"].endswith("not started yet: it starts once thawed"), shown
    row = next(r for r in d.client.request("ls") if r["id"] == low)
    assert row["suspended"] == "preempt" and "not started yet" in row["reason"]
    gate.touch()  # the preemptor ends: the low job is thawed, starts, and reads its epoch
    assert d.wait_state(high, ("done", "failed"), timeout=20.0)["state"] == "done"
    done = d.wait_state(low, ("done", "failed"), timeout=60.0)
    assert done["state"] == "done" and len(done["attempts"]) == 1, done
    assert "consumed 20 samples" in d.client.request("logs", id=low, offset=0)["text"]


def test_the_owner_suspends_a_job_still_waiting_for_its_producer_and_it_starts_only_on_resume(daemons, tmp_path):
    d = daemons(gpus="emulated:1xA100-40GB")
    built = tmp_path / "loader-built"  # the producer comes up once the job is suspended
    job = d.submit([sys.executable, str(HERE / "dataset_job.py"), "20"], mem="1GiB", cwd=str(HERE),
                   dataset="slow", dataset_factory="_dataset_factory:slow", env=[f"SLOW_FACTORY_GATE={built}"])
    wait_for(lambda: d.job(job)["reason"] == "waiting for dataset producer slow", 20, "the job to wait for its producer")
    assert d.client.request("suspend", id=job)["state"] == "suspended"
    built.touch()
    folder = Path(d.job(job)["attempts"][0]["dir"])
    wait_for(lambda: probe("slow", d.state_dir / "share") is not None, 40, "the producer to serve")
    wait_for(lambda: "its start waits until it is thawed" in (d.state_dir / "daemon.log").read_text()
             or (folder / "runner.json").exists(), 10, "the daemon to see its producer serve")
    assert not (folder / "runner.json").exists()  # suspended: it never started
    shown = d.job(job)
    assert shown["suspended"] == "user" and shown["reason"].endswith("not started yet: it starts once thawed"), shown
    assert d.client.request("resume_job", id=job)["state"] == "running"
    done = d.wait_state(job, ("done", "failed"), timeout=60.0)
    assert done["state"] == "done" and len(done["attempts"]) == 1, done
    assert done["attempts"][0]["outcome"] == "succeeded"


def test_another_member_sees_a_frozen_job_as_suspended(lab, lab_daemon):
    # squeue shows ST S to everyone: B's ls of A's frozen job says suspended, who froze it and why
    from lab import cli_as, raw_requests, submit_as

    d, work = lab_daemon()
    sock = d.state_dir / "collocate.sock"
    reply = submit_as(lab["A"], sock, cwd=str(work), argv=["sleep", "300"])
    assert reply["ok"], reply
    job = reply["result"]["id"]
    d.wait_state(job, "running", timeout=60)
    frozen = raw_requests(lab["A"], sock, [json.dumps({"op": "suspend", "args": {"id": job}}).encode()])[0]
    assert frozen["ok"] and frozen["result"]["state"] == "suspended", frozen
    seen = raw_requests(lab["B"], sock, [json.dumps({"op": "ls", "args": {}}).encode()])[0]["result"]
    row = next(r for r in seen if r["id"] == job)
    assert row["redacted"] and row["suspended"] == "user" and row["reason"].startswith("suspended by collocate-a")
    listed = cli_as(lab["B"], d.state_dir, "ls")
    assert listed.returncode == 0 and "suspended" in listed.stdout, listed
    d.client.request("cancel", id=job)
