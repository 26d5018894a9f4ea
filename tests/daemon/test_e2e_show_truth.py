"""End to end: `collocate show` says what is measured and what is not, never both at once
(issue 37), on a real daemon over emulated GPUs.

* a running job's attempt shows its peak so far, beside the summary's peak (not `-` beside
  2,048 MiB);
* once it ended, its activity is the solo activity its attempt measured, not the prior it
  started with, and no assumption is printed beside the measured mean;
* a job whose processes held no GPU memory says why its GPU figures are missing instead of
  printing 0 MiB, 0 GPU-hours and 0 Wh;
* a job submitted without --mem says its memory was not given, never "unknown" beside the
  peak measured for it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from daemon_harness import job_argv, wait_for


def show(d, job: str) -> str:
    env = {**os.environ, "COLLOCATE_STATE_DIR": str(d.state_dir), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "collocate.daemon", "show", job], env=env,
                          capture_output=True, text=True, timeout=60, check=True).stdout


def test_show_says_what_is_measured_and_what_is_not(daemons):
    d = daemons()
    job = d.submit(job_argv(1500, 6.0, None, 0.4), mem="2GiB", name="emulated")
    idle = d.submit(["/bin/sleep", "1"], mem="1GiB", name="holds-nothing")

    def live_peak() -> dict | None:
        detail = d.job(job)
        attempt = (detail.get("attempts") or [{}])[-1]
        ok = (detail["state"] == "running" and attempt.get("peak_so_far")
              and (detail.get("summary") or {}).get("peak_mib", 0) > 0)
        return detail if ok else None

    detail = wait_for(live_peak, 20, "a running attempt's peak so far")
    assert 1400 <= detail["attempts"][-1]["peak_mib"] <= 1600
    assert detail["attempts"][-1]["peak_mib"] <= detail["summary"]["peak_mib"] + 1
    running = show(d, job)
    assert "so far" in running and "(any attempt)" in running

    done = d.wait_state(job, "done", timeout=30)
    assert done["profile"]["source_kind"] == "measured", done["profile"]
    assert abs(done["profile"]["sm_activity"] - 0.4) < 0.05  # what it read alone, not a prior
    ended = show(d, job)
    assert "assumed" not in ended and "so far" not in ended
    assert "measured on its GPU in attempt 1" in ended and "mean SM activity" in ended

    d.wait_state(idle, "done", timeout=30)
    nothing = show(d, idle)
    assert "not measured: no process of the job held GPU memory" in nothing
    assert "0.00 Wh" not in nothing and "GPU-hours" not in nothing and "0 MiB (any" not in nothing

    undeclared = d.submit(job_argv(800, 1.0), name="no-mem")  # charged what it holds
    d.wait_state(undeclared, "done", timeout=60)
    measured = show(d, undeclared)
    assert "peak GPU memory" in measured and "unknown" not in measured, measured
    assert "memory not given (it is charged what it holds)" in measured
    assert "fenced at the room its GPU had when it started (no memory was given)" in measured
