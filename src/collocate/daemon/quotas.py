"""What one member may hold on a shared daemon, and the disk room kept for its records.

Why: one member could stop the service for everyone by filling the state dir's disk (a job's
200 MiB of stdout; 16 submits of a 4 MB environment made a 62 MB store), or by queueing 7,000
jobs (issue 31). The owner sets each bound with a ``collocate serve`` option; the defaults
(``Quotas``) fit a lab server, and those that depend on the disk scale with it:

* ``max_queued``: pending jobs per user (a sweep counts each point);
* ``max_request``: bytes of one submit (command and environment);
* ``max_stored``: bytes a user's jobs hold in the store and in their logs under the state dir;
* ``log_max``: bytes kept of each log stream of one attempt (``collocate.node.logkeeper``);
* ``disk_reserve``: free space kept on the state dir's disk: submits are refused below it (new
  work is turned away *before* the disk is full), logs stop growing at it, and what is left
  is for the records of work already accepted (attempt ends, cancels).

The daemon's own user and root are not held to the per-user bounds (they own the machine).

Stored bytes hold *while jobs run* (issue 36), not only at submit: ``Accounts.refresh`` keeps
each member's ledger (``<state>/quota/<uid>``, the bytes they may still store) from what their
jobs hold, every log keeper of theirs (attempts, retries and ``--notify`` alike) takes what it
writes from that ledger and cuts its stream at zero, and ``over_quota`` names the members at
their quota, whose jobs get no new attempt (a retry is one) until space is freed. A member's
quota is at most half of what the disk reserve leaves (``Quotas.resolved``): one member alone
can never bring the disk to the reserve, where every member's submits are refused.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from collocate.common.errors import InputError
from collocate.core.model import JobState
from collocate.daemon.faults import DiskFull, free_bytes
from collocate.node.confine import default_disk_reserve, default_log_max
from collocate.node.files import attempt_files
from collocate.node.logkeeper import locked, read_ledger, write_ledger

MIB = 2**20
RECOUNT_S = 1.0  # a member's stored bytes are counted again after this; submits add meanwhile


@dataclass(frozen=True, slots=True)
class Quotas:
    """The bounds; ``None`` for a disk-relative one means "derive it from the disk's size"."""

    max_queued: int = 2000
    max_request: int = 1 * MIB
    max_stored: int | None = None  # default: a quarter of the state dir's disk
    log_max: int | None = None  # default: 64 MiB, at most 1/32 of the disk
    disk_reserve: int | None = None  # default: 5 % of the disk, between 1 MiB and 1 GiB

    def resolved(self, disk_bytes: int) -> Quotas:
        """Every bound as a number, for a state dir on a disk of ``disk_bytes``; a member's
        stored bytes at most half of what the reserve leaves (``member_share``)."""
        reserve = self.disk_reserve if self.disk_reserve is not None else default_disk_reserve(disk_bytes)
        stored = self.max_stored if self.max_stored is not None else disk_bytes // 4
        return replace(
            self,
            max_stored=min(stored, member_share(disk_bytes, reserve)),
            log_max=self.log_max if self.log_max is not None else default_log_max(disk_bytes),
            disk_reserve=reserve)

    def describe(self) -> str:
        return (f"quotas per member: {self.max_queued} queued jobs, {_size(self.max_request)} per "
                f"submit, {_size(self.max_stored)} stored; logs cut at {_size(self.log_max)} per "
                f"stream; {_size(self.disk_reserve)} of the disk kept for records")


def member_share(disk_bytes: int, reserve: int) -> int:
    """The most one member may store: half of the disk above the reserve, so one member alone
    never brings the disk to the reserve (where everyone's submits are refused and logs cut)."""
    return max(0, (disk_bytes - reserve) // 2)


class Accounts:
    """Checks a submit against the bounds, from what the store and the state dir hold now."""

    def __init__(self, quotas: Quotas, root: Path, db, *, owner_uid: int) -> None:
        self.quotas, self.root, self.db, self.owner_uid = quotas, root, db, owner_uid
        self._ended_logs: dict[str, int] = {}  # an ended attempt's dir -> its log bytes (final)
        # uid -> (stored bytes, when counted): a sweep's thousands of submits count once a second
        self._stored: dict[int, tuple[int, float]] = {}

    def check_submit(self, uid: int, request_bytes: int, queued: Callable[[], int]) -> None:
        """Raise ``DiskFull`` below the disk reserve, or ``InputError`` naming the bound a
        member's submit would pass and what to do. ``queued()``: how many jobs the member has
        pending, asked only of a member (it walks every job: the owner submitting 10,000 jobs
        spent most of the time counting a queue no bound applies to)."""
        q = self.quotas
        free = free_bytes(self.root)
        if free is not None and q.disk_reserve is not None and free < q.disk_reserve:
            raise DiskFull(
                f"disk full for new jobs: the state dir's disk has {_size(free)} free, under the "
                f"{_size(q.disk_reserve)} kept for the records of running jobs; new jobs are "
                "refused until space is freed",
                hint="the daemon's owner can free space or move the state dir (--disk-reserve)")
        if uid in (self.owner_uid, 0):
            return
        if request_bytes > q.max_request:
            raise InputError(f"this submit is {_size(request_bytes)}, over the {_size(q.max_request)} "
                             "a member may send (its command and environment)",
                             hint="pass fewer or smaller environment variables (--env), or ask the "
                                  "daemon's owner to raise --user-max-request")
        if (n_queued := queued()) >= q.max_queued:
            raise InputError(f"you have {n_queued} jobs queued, the most a member may have",
                             hint="wait for some to start, cancel some, or ask the daemon's owner to "
                                  "raise --user-max-queued")
        counted = self._stored.get(uid)
        if counted is None or time.monotonic() - counted[1] > RECOUNT_S:
            counted = (self.stored_bytes(uid), time.monotonic())
        stored = counted[0]
        if q.max_stored is not None and stored + request_bytes > q.max_stored:
            raise InputError(f"your jobs hold {_size(stored)} in the daemon's state (their specs "
                             f"and logs), the most a member may is {_size(q.max_stored)}",
                             hint="remove ended jobs' logs you no longer need (`collocate purge ID...` "
                                  "or `--before DATE`), cancel queued jobs you do not need, or ask the "
                                  "daemon's owner to raise --user-max-stored")
        self._stored[uid] = (stored + request_bytes, counted[1])  # as if stored: it is, next

    def stored_bytes(self, uid: int) -> int:
        """What ``uid``'s jobs hold: their rows in the store, their attempts' logs and their
        ``--notify`` commands' logs."""
        (rows,) = self.db.execute(
            "SELECT COALESCE(SUM(length(job) + length(spec)), 0) FROM jobs"
            " WHERE json_extract(spec, '$.uid') = ?", (uid,)).fetchone()
        attempts = self.db.execute(
            "SELECT a.dir, a.end IS NOT NULL FROM attempts a JOIN jobs j ON j.id = a.job_id"
            " WHERE json_extract(j.spec, '$.uid') = ?", (uid,))
        notified = self.db.execute(
            "SELECT id FROM jobs WHERE json_extract(spec, '$.uid') = ?"
            " AND json_array_length(json_extract(spec, '$.notify')) > 0", (uid,))
        notify_logs = sum(self._log_bytes(str(self.root / "jobs" / job_id / "notify"),
                                          (self.root / "jobs" / job_id / "notify" / "exit.json").exists())
                          for (job_id,) in notified)
        return int(rows) + sum(self._log_bytes(d, bool(ended)) for d, ended in attempts) + notify_logs

    # -- while jobs run ------------------------------------------------------------------------
    def held_to_quota(self, uid: int) -> bool:
        return self.quotas.max_stored is not None and uid not in (self.owner_uid, 0, -1)

    def ledger(self, uid: int) -> Path | None:
        """The member's ledger (``logkeeper.Ledger``) their runners get (``--quota-file``);
        None for those not held to a quota."""
        return self.root / "quota" / str(uid) if self.held_to_quota(uid) else None

    def ledger_for_launch(self, uid: int) -> Path | None:
        """``ledger``, counted first if it is not there yet (a member's first job)."""
        path = self.ledger(uid)
        if path is not None and not path.exists():
            self.refresh(uid)
        return path

    def refresh(self, uid: int) -> int:
        """Count what ``uid``'s jobs hold now and set their ledger to what is left; their
        stored bytes. Counted under the ledger's lock, so keepers wait, not race."""
        path = self.ledger(uid)
        if path is None:
            return 0
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            with locked(fd):
                stored = self.stored_bytes(uid)
                write_ledger(fd, (self.quotas.max_stored or 0) - stored)
        finally:
            os.close(fd)
        self._stored[uid] = (stored, time.monotonic())
        return stored

    def forget(self, attempt_dirs: Iterable[str]) -> None:
        """Count these ended attempts' logs again (``collocate purge`` removed them)."""
        for attempt_dir in attempt_dirs:
            self._ended_logs.pop(attempt_dir, None)

    def over_quota(self, members: dict[int, str]) -> dict[str, str]:
        """Of ``members`` (uid -> user name, those with jobs waiting or running), those at
        their quota, each with the reason their pending jobs wait."""
        out = {}
        for uid, user in members.items():
            if not self.held_to_quota(uid):
                continue
            stored = self.refresh(uid)
            if stored >= (self.quotas.max_stored or 0):
                out[user] = self._stopped(user, stored)
        return out

    def drained(self, members: dict[int, str]) -> dict[str, str]:
        """``over_quota`` between counts, from the ledgers alone (one small read each): those
        whose log keepers took the last of their ledger since it was set."""
        out = {}
        for uid, user in members.items():
            path = self.ledger(uid)
            if path is None:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                left = read_ledger(fd)
            except ValueError:
                continue
            finally:
                os.close(fd)
            if left <= 0:
                out[user] = self._stopped(user, self.quotas.max_stored or 0)
        return out

    def _stopped(self, user: str, stored: int) -> str:
        return (f"{user or 'this user'}'s jobs hold {_size(stored)} in the daemon's state "
                f"(logs, notifies, specs), at the {_size(self.quotas.max_stored)} a member "
                "may store: no new attempt starts until space is freed (read what you "
                "need with `collocate logs`, then remove old jobs' logs with `collocate "
                "purge ID...` or `--before DATE`, or ask the daemon's owner to raise "
                "--user-max-stored)")

    def _log_bytes(self, attempt_dir: str, ended: bool) -> int:
        if attempt_dir in self._ended_logs:
            return self._ended_logs[attempt_dir]
        files = attempt_files(Path(attempt_dir))
        total = sum(_size_of(files[stream]) for stream in ("stdout", "stderr"))
        if ended:
            self._ended_logs[attempt_dir] = total
        return total


def queued_of(uid: int, jobs: Iterable, specs: dict) -> int:
    """How many of ``uid``'s jobs are pending."""
    return sum(1 for job in jobs if job.state is JobState.PENDING and specs[job.id].uid == uid)


def request_size(args: dict) -> int:
    return len(json.dumps(args, ensure_ascii=False).encode("utf-8", "backslashreplace"))


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _size(n: int | None) -> str:
    if n is None:
        return "no limit"
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / 1024:.0f} KiB"
