"""Re-deriving a job's exit when its runner was killed: the daemon as the jobs' child subreaper.

The runner writes ``exit.json`` before it reaps the job (``runner.wait_status`` peeks with
``WNOWAIT``), so the job's status exists either in that record or in the job's zombie. The daemon
marks itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): when a runner dies, its job (alive
or already a zombie) becomes the daemon's child instead of init's, and ``adopt_orphan`` gets the
job's real status from it (``OrphanedJob``, which writes the record the runner could not). So
killing a runner never turns a job that succeeded into a failed or lost one that runs again.

Only when the runner *and* the daemon are gone (both killed) is a job's status beyond reach;
then the daemon falls back to ``lost`` (requeued), as after a reboot.

Being a subreaper also makes the daemon the parent of any process a job left behind;
``reap_strays`` collects those once they exit, so none stays a zombie.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import psutil

from collocate.node.files import attempt_files, read_json
from collocate.node.runner import read_tail, write_json_atomic

_PR_SET_CHILD_SUBREAPER = 36
CHILD_RECORD = "child.json"  # the runner's record of the job's own pid and start time


def become_subreaper() -> bool:
    """Make orphaned descendants (a killed runner's job) children of this process. Linux only."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _child_record(attempt_dir: Path) -> tuple[int, float | None] | None:
    record = read_json(attempt_dir / CHILD_RECORD)
    if not record or not record.get("pid"):
        return None
    started = record.get("started")
    return int(record["pid"]), None if started is None else float(started)


def job_started(attempt_dir: Path) -> bool:
    """Whether the runner had started the job itself (so its fate is the job's, not a launch's)."""
    return _child_record(attempt_dir) is not None


class OrphanedJob:
    """A job whose runner died, now this daemon's child; ``poll`` like ``Popen.poll``. When it
    ends, the exit record is written here, as the runner would have."""

    def __init__(self, pid: int, attempt_dir: Path) -> None:
        self.pid, self.dir = pid, attempt_dir
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None  # cannot happen for an adopted child; never report a made-up exit
            if pid == 0:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
            stderr = attempt_files(self.dir)["stderr"]
            write_json_atomic(attempt_files(self.dir)["exit"],
                              {"returncode": self.returncode, "end": time.time(),
                               "stderr_tail": read_tail(stderr), "recorded_by": "daemon"})
        return self.returncode


def adopt_orphan(attempt_dir: Path) -> OrphanedJob | None:
    """The attempt's job when it is this daemon's child (its runner died while the daemon was
    up), else None: never started, or not ours (the daemon restarted since), so unknowable."""
    record = _child_record(attempt_dir)
    if record is None:
        return None
    pid, started = record
    try:
        p = psutil.Process(pid)
        if p.ppid() != os.getpid() or (started is not None and abs(p.create_time() - started) > 0.05):
            return None
    except psutil.Error:
        return None
    orphan = OrphanedJob(pid, attempt_dir)
    orphan.poll()
    return orphan


def reap_strays(known: set[int]) -> None:
    """Reap exited children this daemon did not start (processes its jobs left behind).

    A child started by this daemon is either in ``known`` (runners, producers, orphaned jobs:
    their owners reap them) or a short-lived helper of another thread, which shares the
    daemon's session. A zombie in the session of a known runner is left alone too: it may be
    a job whose runner was killed a moment ago, which ``adopt_orphan`` reaps for its status."""
    me, my_session = os.getpid(), os.getsid(0)
    try:
        children = psutil.Process(me).children()
    except psutil.Error:
        return
    for child in children:
        if child.pid in known:
            continue
        try:
            if child.status() != psutil.STATUS_ZOMBIE or os.getsid(child.pid) in (my_session, *known):
                continue
            os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, OSError):
            continue
