"""``collocate logs``: ``-f`` follows a job through every attempt (an OOM requeue, a retried
failure) to its end, saying on stderr why each new attempt started; Ctrl-C ends it quietly;
without ``-f`` it says which attempt it prints and how to get the others."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap

from daemon_harness import wait_for

from collocate.client.follow import banner

# Attempt 1 prints, waits for the test's go (so a follower is surely attached), then dies the way
# PyTorch does out of memory (or with a plain error); later attempts print and succeed.
FLAKY = textwrap.dedent("""
    import os, sys, time
    n = int(os.environ["COLLOCATE_ATTEMPT"])
    print(f"attempt {n} starts", flush=True)
    if n == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(sys.argv[2])
    print(f"attempt {n} finished", flush=True)
""")
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def run(d, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collocate.daemon", *args, "--state-dir",
                           str(d.state_dir)], capture_output=True, text=True, timeout=60, check=False)


def follow(d, job: str, go) -> tuple[int, str, str]:
    """``logs -f JOB``: once attempt 1's first line has arrived, touch ``go``; then to the end."""
    proc = subprocess.Popen([sys.executable, "-m", "collocate.daemon", "logs", "-f", job,
                             "--state-dir", str(d.state_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        go.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, first + out, err


def test_follow_goes_through_an_oom_requeue_to_the_end_of_the_job(daemons, tmp_path):
    d = daemons()
    go = tmp_path / "go"
    job = d.submit([sys.executable, "-c", FLAKY, str(go), OOM], mem="1GiB")
    code, out, err = follow(d, job, go)
    assert code == 0, err
    assert out == "attempt 1 starts\nattempt 2 starts\nattempt 2 finished\n"
    assert re.search(r"^--- attempt 2 \(after out-of-memory on attempt 1: requeued with "
                     r"\d+\.\d\d GiB\) ---$", err, re.MULTILINE), err
    assert err.rstrip().endswith(f"--- job {job} done ---"), err
    assert "Traceback" not in err

    plain = run(d, "logs", job)  # the latest attempt, and a word on the others
    assert plain.returncode == 0 and plain.stdout == "attempt 2 starts\nattempt 2 finished\n"
    assert "--- attempt 2 of 2 (after out-of-memory" in plain.stderr
    assert f"`collocate logs {job} --attempt N` prints another" in plain.stderr
    first = run(d, "logs", job, "--attempt", "1", "--stderr")
    assert "CUDA out of memory" in first.stdout and "attempt 1 of 2" in first.stderr
    pinned = run(d, "logs", job, "-f", "--attempt", "1")  # follows that attempt alone
    assert pinned.returncode == 0 and pinned.stdout == "attempt 1 starts\n"


def test_follow_goes_through_a_retried_failure_and_ends_with_the_failure(daemons, tmp_path):
    d = daemons()
    go = tmp_path / "go"
    job = d.submit([sys.executable, "-c", FLAKY, str(go), "boom"], mem="1GiB", retries=1)
    code, out, err = follow(d, job, go)
    assert code == 0 and out == "attempt 1 starts\nattempt 2 starts\nattempt 2 finished\n", err
    assert "--- attempt 2 (after attempt 1 failed (exited with status 1: boom): retried) ---" in err

    never = d.submit([sys.executable, "-c", "import sys; print('once'); sys.exit(4)"], mem="1GiB")
    d.wait_state(never, "failed")
    done = run(d, "logs", never, "-f")
    assert done.returncode == 0 and done.stdout == "once\n"
    ended = f"--- job {never} failed: exited with status 4; its stderr: `collocate logs {never} --stderr` ---"
    assert ended in done.stderr
    plain = run(d, "logs", never)  # without -f too: where the cause usually is
    assert plain.stdout == "once\n" and ended in plain.stderr


def test_logs_of_a_pending_job_says_why_it_waits(daemons):
    d = daemons()
    d.client.request("drain")
    job = d.submit([sys.executable, "-c", "pass"], mem="1GiB")
    out = run(d, "logs", job)
    assert out.returncode == 0 and out.stdout == ""
    assert out.stderr.strip() == (f"--- job {job} is pending: drain: the daemon is draining: "
                                  "`collocate resume` starts jobs again ---")


def test_ctrl_c_ends_a_follow_quietly(daemons):
    d = daemons()
    ticker = [sys.executable, "-c", "import time\nwhile True:\n print('tick', flush=True); time.sleep(0.2)"]
    job = d.submit(ticker, mem="1GiB")
    # as from a terminal: a suite started in the background (`pytest &`) ignores SIGINT, and a
    # child would inherit that and never see the Ctrl-C
    proc = subprocess.Popen([sys.executable, "-m", "collocate.daemon", "logs", "-f", job,
                             "--state-dir", str(d.state_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline() == "tick\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err == "", err
    d.client.request("cancel", id=job)
    wait_for(lambda: d.job(job)["state"] == "cancelled", 20, "the cancel")


def test_banner_says_why_each_attempt_started():
    oom = {"n": 1, "outcome": "oom", "reason": "out of GPU memory", "mem_mib": 1024.0}
    lost = {"n": 2, "outcome": "lost", "reason": "the job vanished while the daemon was down; requeued",
            "mem_mib": 12800.0}
    third = {"n": 3, "outcome": None, "reason": None, "mem_mib": 12800.0}
    attempts = [oom, lost, third]
    assert banner("7", attempts[:1], 1, others=True) is None  # the only attempt: nothing to say
    assert banner("7", attempts, 2, others=False) == (
        "--- attempt 2 (after out-of-memory on attempt 1: requeued with 12.50 GiB) ---")
    assert banner("7", attempts, 3, others=False) == (
        "--- attempt 3 (after attempt 2 was lost (the job vanished while the daemon was down; "
        "requeued)) ---")
    assert banner("7", attempts, 1, others=True) == (
        "--- attempt 1 of 3; `collocate logs 7 --attempt N` prints another ---")
