"""Wake the daemon's loop when one of its children exits, so a job's end frees its room at once.

A job's runner is the daemon's child; the loop learns of its end when a round polls it
(``Attempts.reap``), and rounds come once a period (1 s). A job waiting for that room then waited
up to a period more for nothing (issue 35: a fitted job starts within 5 s). ``ExitWatch`` blocks
in ``waitid(P_ALL, WEXITED | WNOWAIT)`` on a thread of its own: it sees a child's exit without
reaping it (the loop's round still reaps and records it, in one place), asks the loop for a round
(``wake``), and looks again only after the next round, so a child nobody reaps yet costs at most
one early round per round. No signal handler: nothing runs inside the loop's thread but the loop.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


class ExitWatch(threading.Thread):
    def __init__(self, wake: Callable[[], None]) -> None:
        """``wake``: asks the loop for a round (called on this thread)."""
        super().__init__(name="collocate-exit-watch", daemon=True)
        self._wake = wake
        self._round = threading.Event()
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:  # no child now: look again after the next round
                pass
            else:
                self._wake()
            self._round.wait()
            self._round.clear()

    def round_done(self) -> None:
        """A round ran (and reaped what had ended): look for the next exit."""
        self._round.set()

    def stop(self) -> None:
        self._stop.set()
        self._round.set()
