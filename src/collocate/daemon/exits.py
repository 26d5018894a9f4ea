"""Wake the daemon's loop when one of its children exits, so a job's end frees its room at once.

A job's runner is the daemon's child; the loop learns of its end when a round polls it
(``Attempts.reap``), and rounds come once a period (1 s). A job waiting for that room then waited
up to a period more for nothing (issue 35: a fitted job starts within 5 s). ``ExitWatch`` blocks
in ``waitid(P_ALL, WEXITED | WNOWAIT)`` on a thread of its own: it sees a child's exit without
reaping it (the loop's round still reaps and records it, in one place), asks the loop for a round
(``wake``), and looks again only after the next round. A child still there after that round is
one no round reaps (a helper that died unnoticed, a job's leftover in the daemon's session): it
asked for its round already, so it asks for none again; while it stays, the ``WNOWAIT`` look keeps
answering with it, and other children's ends are learnt at the period's rounds, as without the
watch. No signal handler: nothing runs inside the loop's thread but the loop.
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
        woken = None  # the child whose end asked for a round last
        while not self._stop.is_set():
            if _ended_child(os.WNOHANG) is None:
                woken = None  # none ended and unreaped: whatever ends next is news (even a reused pid)
            pid = _ended_child(0)  # blocks until a child ends; None: no child now
            if pid is not None and pid != woken:
                woken = pid
                self._wake()
            self._round.wait()  # look again only after the next round
            self._round.clear()

    def round_done(self) -> None:
        """A round ran (and reaped what had ended): look for the next exit."""
        self._round.set()

    def stop(self) -> None:
        self._stop.set()
        self._round.set()


def _ended_child(flags: int) -> int | None:
    """The pid of a child that ended and is not reaped yet, left unreaped; None: no child, or
    (with ``WNOHANG``) none ended."""
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT | flags)
    except ChildProcessError:
        return None
    return None if info is None else info.si_pid
