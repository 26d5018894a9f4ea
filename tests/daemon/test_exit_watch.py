"""``daemon.exits.ExitWatch`` with real child processes: a child's end asks the loop for one
round, and a child that no round reaps (a helper that died unnoticed, a job's leftover in the
daemon's session) asks for that one round only, not one more after every round."""

from __future__ import annotations

import os
import subprocess
import threading

from collocate.daemon.exits import ExitWatch

QUIET_S = 1.0  # how long a round's aftermath is watched for a wake-up that must not come


class Wakes:
    """Counts the watch's wake-ups; ``next`` waits for the next one (or says none came)."""

    def __init__(self) -> None:
        self.count = 0
        self._came = threading.Semaphore(0)

    def __call__(self) -> None:
        self.count += 1
        self._came.release()

    def next(self, timeout: float) -> bool:
        return self._came.acquire(timeout=timeout)


def _ended_unreaped(argv: list[str]) -> subprocess.Popen:
    """A child that has exited and is still a zombie: waited for without being reaped."""
    child = subprocess.Popen(argv)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    return child


def test_a_child_nobody_reaps_wakes_the_loop_once_not_after_every_round():
    wakes = Wakes()
    watch = ExitWatch(wakes)
    stray = _ended_unreaped(["true"])  # nobody reaps it while the rounds run
    watch.start()
    try:
        assert wakes.next(timeout=30), "an ended child did not wake the loop"
        for _ in range(3):  # rounds that do not reap it: each used to ask for another at once
            watch.round_done()
            assert not wakes.next(timeout=QUIET_S), f"woke {wakes.count} times for one child"
        stray.wait()  # reaped at last: the next child's end is news again
        later = _ended_unreaped(["true"])
        watch.round_done()
        assert wakes.next(timeout=30), "the watch went deaf after a child nobody reaped"
        later.wait()
    finally:
        watch.stop()
