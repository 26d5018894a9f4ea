"""SIGKILL of a job's runner while the daemon is up (issue 19, finding 7): the job's real exit is
recorded (the daemon is the jobs' child subreaper), and it never runs a second time."""

from __future__ import annotations

import os
import signal
import time

from daemon_harness import wait_for


def _runs(path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def test_runner_killed_after_the_job_succeeded_but_before_it_recorded(daemons, tmp_path):
    """The job stops its runner and exits 0: the runner is killed while the job is a zombie
    whose status nobody has recorded, the worst moment."""
    d = daemons(gpus="emulated:1xA100-40GB")
    runs = tmp_path / "runs"
    job = d.submit(["/bin/sh", "-c", f"echo $$ >> {runs}; kill -STOP $PPID; exit 0"], mem="1GiB")
    wait_for(lambda: _runs(runs) == 1, 30, "the job to run")
    runner = d.wait_state(job, "running")["attempts"][0]["pid"] or wait_for(
        lambda: d.job(job)["attempts"][0]["pid"], 10, "the runner's pid")
    wait_for(lambda: open(f"/proc/{runner}/stat").read().split()[2] == "T", 10, "the runner to stop")
    os.kill(runner, signal.SIGKILL)
    done = d.wait_state(job, ("done", "failed", "pending"), timeout=30)
    assert done["state"] == "done", done
    time.sleep(1.0)  # long enough for a wrong requeue to have started it again
    assert _runs(runs) == 1 and len(d.job(job)["attempts"]) == 1


def test_runner_killed_while_the_job_runs(daemons, tmp_path):
    d = daemons(gpus="emulated:1xA100-40GB")
    runs, go = tmp_path / "runs", tmp_path / "go"
    job = d.submit(["/bin/sh", "-c", f"echo $$ >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done; exit 3"],
                   mem="1GiB")
    wait_for(lambda: _runs(runs) == 1, 30, "the job to run")
    runner = wait_for(lambda: d.job(job)["attempts"][0]["pid"], 10, "the runner's pid")
    os.kill(runner, signal.SIGKILL)
    time.sleep(0.5)
    assert d.job(job)["state"] == "running"  # the daemon watches the job itself now
    go.touch()
    ended = d.wait_state(job, ("done", "failed"), timeout=30)
    assert ended["state"] == "failed" and "status 3" in ended["reason"], ended
    assert _runs(runs) == 1 and len(ended["attempts"]) == 1
    assert "watches the job" in (d.state_dir / "daemon.log").read_text()
