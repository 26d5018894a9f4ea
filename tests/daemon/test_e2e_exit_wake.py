"""A job's end wakes the daemon's loop (``daemon.exits.ExitWatch``), with real processes on an
emulated GPU: the job waiting for its room starts at once, not at the next period."""

from __future__ import annotations

import time


def test_a_jobs_end_starts_the_next_job_at_once_not_at_the_next_period(daemons):
    d = daemons("--policy", "exclusive", "--period", "30", gpus="emulated:1xA100-40GB")
    time.sleep(1.0)  # the start-up round is over: the next tick is ~29 s away
    first = d.submit(["sleep", "1"], mem="1GiB", name="first")
    d.wait_state(first, "running", timeout=15)  # placed by the round its submission asked for
    second = d.submit(["sleep", "0.1"], mem="1GiB", name="second")  # waits: one job per GPU
    shown = d.wait_state(second, ("running", "done"), timeout=20)  # the next tick: ~28 s away
    ended = d.job(first)["attempts"][0]["end"]
    assert shown["attempts"][0]["start"] - ended < 5.0, (d.job(first), shown)
