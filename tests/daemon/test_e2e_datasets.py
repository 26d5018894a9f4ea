"""``submit --dataset``: one producer per dataset, started before its first job, stopped after
its last; bad or conflicting factories refused at submit; a broken factory fails the job only;
a producer slow to start holds up only its own jobs (the daemon answers, places and cancels
meanwhile), and one still starting when the daemon is killed is re-adopted by the next."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import psutil
import pytest
from daemon_harness import job_argv, wait_for

from collocate.common.errors import CollocateError
from collocate.share.lifecycle import probe

HERE = Path(__file__).parent
JOB = [sys.executable, str(HERE / "dataset_job.py"), "20"]
FACTORY = "_dataset_factory:tiny"
SLOW = "_dataset_factory:slow"
WAITING = "waiting for dataset producer slow"


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: an adopted producer is reaped by init, not by the daemon)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_two_jobs_share_one_producer_started_once_and_stopped_after_the_last(daemons):
    d = daemons()
    share_dir = d.state_dir / "share"

    def submit(**kw):
        return d.submit(JOB, mem="1GiB", cwd=str(HERE), **kw)

    with pytest.raises(CollocateError, match="needs a factory"):
        submit(dataset="tiny")
    with pytest.raises(CollocateError, match="not module:factory"):
        submit(dataset="tiny", dataset_factory="no-colon")
    with pytest.raises(CollocateError, match="invalid shared dataset name"):
        submit(dataset="bad name/", dataset_factory=FACTORY)
    with pytest.raises(CollocateError, match="needs --dataset"):
        submit(dataset_factory=FACTORY)
    assert d.client.request("ls", all=True) == []  # nothing stored

    first = submit(dataset="tiny", dataset_factory=FACTORY)
    second = submit(dataset="tiny")  # the factory is remembered per dataset name
    with pytest.raises(CollocateError, match="already served by _dataset_factory:tiny"):
        submit(dataset="tiny", dataset_factory="_dataset_factory:other")
    for job in (first, second):
        detail = d.wait_state(job, ("done", "failed"), timeout=40)
        assert detail["state"] == "done", (detail, d.client.request("logs", id=job, offset=0))
        assert "consumed 20 samples" in d.client.request("logs", id=job, offset=0)["text"]

    log = (d.state_dir / "daemon.log").read_text()
    started = re.findall(r"started producer 'tiny' \(pid (\d+)", log)
    assert len(started) == 1, log  # one producer for both jobs
    pid = int(started[0])
    wait_for(lambda: probe("tiny", share_dir) is None and _gone(pid), 15, "the producer to stop")
    assert "no job of it is left" in (d.state_dir / "daemon.log").read_text()


def test_a_broken_factory_fails_the_job_with_its_log_and_the_daemon_goes_on(daemons):
    d = daemons()
    job = d.submit(JOB, mem="1GiB", cwd=str(HERE), dataset="broken", dataset_factory="_dataset_factory:broken")
    detail = d.wait_state(job, ("done", "failed"), timeout=40)
    assert detail["state"] == "failed"
    log_path = d.state_dir / "share" / "broken.log"
    assert "failed to start" in detail["reason"] and str(log_path) in detail["reason"], detail["reason"]
    assert "refuses to build a loader" in log_path.read_text()
    assert d.client.request("ping")["pid"]
    assert probe("broken", d.state_dir / "share") is None


def test_a_live_producer_is_readopted_after_a_daemon_restart_and_stopped_after_the_job(daemons):
    d = daemons()
    share_dir = d.state_dir / "share"
    job = d.submit([*JOB, "3"], mem="1GiB", cwd=str(HERE), dataset="tiny", dataset_factory=FACTORY)
    d.wait_state(job, "running", timeout=40)
    status = wait_for(lambda: probe("tiny", share_dir), 30, "the producer")
    d.kill(signal.SIGKILL)
    assert probe("tiny", share_dir) is not None  # producers outlive the daemon, as jobs do
    d.start()
    log = (d.state_dir / "daemon.log").read_text()
    assert f"re-adopted producer 'tiny' (pid {status.pid})" in log
    detail = d.wait_state(job, ("done", "failed"), timeout=30)
    assert detail["state"] == "done", detail
    wait_for(lambda: probe("tiny", share_dir) is None and _gone(status.pid), 20, "the producer to stop")
    assert len(re.findall(r"started producer 'tiny'", (d.state_dir / "daemon.log").read_text())) == 1


def _waiting(d, job: str) -> bool:
    return any(r["id"] == job and r["reason"] == WAITING for r in d.client.request("ls"))


def _producer_pid(d, name: str) -> int:
    found = re.findall(rf"started producer '{name}' \(pid (\d+)", (d.state_dir / "daemon.log").read_text())
    assert len(found) == 1, found
    return int(found[0])


def test_a_slow_producer_start_holds_up_only_its_own_job(daemons, tmp_path):
    d = daemons()
    built = tmp_path / "loader-built"  # the factory builds until the test opens this gate
    slow = d.submit(JOB, mem="1GiB", cwd=str(HERE), dataset="slow", dataset_factory=SLOW,
                    env=[f"SLOW_FACTORY_GATE={built}"])
    wait_for(lambda: _waiting(d, slow), 20, "the job to wait for its producer")
    # answered at all while the factory builds: a loop that waited for it would never answer
    assert d.client.request("ping")["pid"]
    assert [r["state"] for r in d.client.request("ls") if r["id"] == slow] == ["running"]
    other = d.submit(job_argv(500, 0.5), mem="1GiB")
    assert d.wait_state(other, ("done", "failed"), timeout=60)["state"] == "done"
    assert d.job(slow)["reason"] == WAITING  # the plain job did not wait for the producer
    built.touch()
    detail = d.wait_state(slow, ("done", "failed"), timeout=60)
    assert detail["state"] == "done", detail
    assert "consumed 20 samples" in d.client.request("logs", id=slow, offset=0)["text"]


def test_a_job_waiting_for_its_producer_is_cancelled_at_once_and_the_producer_stopped(daemons):
    d = daemons()
    job = d.submit(JOB, mem="1GiB", cwd=str(HERE), dataset="slow", dataset_factory=SLOW,
                   env=["SLOW_FACTORY_S=60"])
    wait_for(lambda: _waiting(d, job), 20, "the job to wait for its producer")
    assert d.client.request("cancel", id=job)["state"] == "cancelled"
    detail = d.job(job)
    assert detail["state"] == "cancelled" and detail["attempts"][0]["outcome"] == "cancelled"
    assert WAITING in detail["attempts"][0]["reason"]
    pid = _producer_pid(d, "slow")
    wait_for(lambda: _gone(pid), 15, "the producer to stop")


def test_a_producer_still_starting_is_readopted_after_a_daemon_restart(daemons, tmp_path):
    d = daemons()
    built = tmp_path / "loader-built"  # still starting until the restarted daemon re-adopted it
    job = d.submit(JOB, mem="1GiB", cwd=str(HERE), dataset="slow", dataset_factory=SLOW,
                   env=[f"SLOW_FACTORY_GATE={built}"])
    wait_for(lambda: _waiting(d, job), 20, "the job to wait for its producer")
    pid = _producer_pid(d, "slow")
    d.kill(signal.SIGKILL)
    d.start()
    assert f"re-adopted producer 'slow' (pid {pid}), still starting" in (d.state_dir / "daemon.log").read_text()
    built.touch()
    detail = d.wait_state(job, ("done", "failed"), timeout=60)
    assert detail["state"] == "done", detail
    first, second = detail["attempts"]
    assert first["outcome"] == "lost" and "before it launched the job" in first["reason"]
    assert second["outcome"] == "succeeded"
    assert _producer_pid(d, "slow") == pid  # started once, not twice
    wait_for(lambda: _gone(pid), 20, "the producer to stop")
