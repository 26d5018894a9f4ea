"""The process that writes a job's logs: the job writes to pipes, this process to the files.

Why a process between the job and its log files: a job writing to a file it holds can fill the
state dir's disk (200 MiB of stdout filled a 64 MiB disk, and then every submit and even the
job's own ``cancel`` failed, issue 31). Polling the file's size would be too late (a job writes
a gigabyte a second), and ``RLIMIT_FSIZE`` would also cap the job's checkpoints. So the runner
gives the job pipes, and ``keep`` copies them to ``stdout.log``/``stderr.log`` while each stays
under ``max_bytes`` and the disk keeps ``reserve_bytes`` free. Past either bound a stream is cut:
a line in the log says so at that point, its last ``TAIL_KEPT`` bytes are kept in memory and
written at the end with how much was cut (an out-of-memory message at the end of stderr is what
classifies the attempt, so the tail matters most).

A member's logs also count against their storage quota *as they are written* (issue 36): a root
daemon gives the runner the member's ledger (``--quota-file``, ``Ledger``: the bytes the member
may still store, kept by the daemon from what their jobs hold), every keeper of that member's
jobs and notifies takes what it writes from it, and past zero the stream is cut the same way.

It is a process of its own, not the runner: a runner killed by a fault (the daemon then watches
the job) must not take the job's output with it, which would make the job's next write fail.
It ignores the signals a cancel sends to the job's process group and ends when every writer has
closed its end (the job's whole process tree is gone; the runner makes sure of that).
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
from collections.abc import Iterable, Iterator

from collocate.node.files import free_bytes

TAIL_KEPT = 64 * 1024  # the end of a cut stream, written when it closes
_CHUNK = 1 << 16


LEDGER_WIDTH = 24  # the ledger is one number, space-padded to this width (rewritten in place)
QUOTA_CUT = ("its owner's jobs and notifies passed their storage quota (collocate serve "
             "--user-max-stored); their jobs get no new attempts until space is freed "
             "(collocate purge removes ended jobs' logs)")


class Ledger:
    """A member's remaining storage, in bytes: one number in a root-owned file that the daemon
    sets from what the member's jobs hold (``collocate.daemon.quotas``) and every log keeper of
    theirs takes from as it writes, under an ``flock`` (several jobs at once share it). No file
    (no quota: the daemon's owner, root, a cluster node without the head's ledger) takes nothing."""

    def __init__(self, path: str | None) -> None:
        self.fd: int | None = None
        if path:
            try:
                self.fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            except OSError:
                self.fd = None

    def take(self, n: int) -> int:
        """How many of ``n`` bytes may be written (taken from the ledger)."""
        if self.fd is None or n <= 0:
            return n
        try:
            with locked(self.fd):
                left = read_ledger(self.fd)
                got = max(0, min(n, left))
                write_ledger(self.fd, left - got)
            return got
        except (OSError, ValueError):
            return n  # an unreadable ledger never loses the job's output

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


class locked:
    """``with locked(fd):`` an exclusive ``flock`` on the ledger."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def read_ledger(fd: int) -> int:
    return int(os.pread(fd, LEDGER_WIDTH, 0).decode().strip() or 0)


def write_ledger(fd: int, left: int) -> None:
    os.pwrite(fd, str(left).ljust(LEDGER_WIDTH).encode(), 0)


class _Stream:
    def __init__(self, name: str, out: int, max_bytes: int, copy: int | None = None) -> None:
        self.name, self.out, self.max_bytes = name, out, max_bytes
        self.copy = copy  # the pipe to the member's --output writer (``node/outfiles.py``)
        try:
            self.written = os.fstat(out).st_size
        except OSError:
            self.written = 0
        self.cut = 0
        self.why: str | None = None
        self.tail = bytearray()

    def take(self, data: bytes, free: int | None, reserve: int, ledger: Ledger | None = None) -> None:
        self._copy(data)  # all of it, cut or not: the member's own file, on their own disk quota
        if self.why is None:
            room = self.max_bytes - self.written
            if free is not None and free - len(data) < reserve:
                self._start_cut("the state dir's disk is nearly full")
            elif len(data) > room:
                self._write(data[:max(0, room)])
                data = data[max(0, room):]
                self._start_cut(f"the log passed its limit of {_size(self.max_bytes)} (--log-max)")
            elif ledger is not None and (allowed := ledger.take(len(data))) < len(data):
                self._write(data[:allowed])
                data = data[allowed:]
                self._start_cut(QUOTA_CUT)
            else:
                self._write(data)
                return
        self.cut += len(data)
        self.tail += data
        del self.tail[:-TAIL_KEPT]

    def close(self) -> None:
        if self.why is not None:
            self._write(f"\n[collocate: {self.cut} bytes of {self.name} were cut here ({self.why}); "
                        f"its last {len(self.tail)} bytes follow]\n".encode() + bytes(self.tail), force=True)
        os.close(self.out)
        if self.copy is not None:
            os.close(self.copy)

    def _copy(self, data: bytes) -> None:
        copy = self.copy
        if copy is None:
            return
        try:
            while data:
                data = data[os.write(copy, data):]
        except OSError:  # the writer is gone (its user killed it): the logs go on
            os.close(copy)
            self.copy = None

    def _start_cut(self, why: str) -> None:
        self.why = why
        self._write(f"\n[collocate: {self.name} is cut from here: {why}; its last "
                    f"{TAIL_KEPT // 1024} KiB are added when the job ends]\n".encode(), force=True)

    def _write(self, data: bytes, *, force: bool = False) -> None:
        while data:
            try:
                n = os.write(self.out, data)
            except OSError:  # a full disk: nothing more of this stream fits
                if self.why is None:
                    self.why = "the disk is full"
                if not force:
                    self.cut += len(data)
                return
            self.written += n
            data = data[n:]


def keep(streams: dict[str, tuple[int, int]], *, max_bytes: int, reserve_bytes: int,
         disk: str, quota_file: str | None = None, copies: dict[str, int] | None = None) -> None:
    """Copy each stream (``name -> (pipe read end, log file fd)``) until every pipe is closed;
    ``quota_file``: the owner's ``Ledger``; ``copies``: per stream, a pipe that gets all of it
    (to the member's ``--output`` file, ``node/outfiles.py``), cut or not."""
    ledger = Ledger(quota_file)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    copies = copies or {}
    by_fd = {r: _Stream(name, out, max_bytes, copies.get(name)) for name, (r, out) in streams.items()}
    for fd, data in pump(by_fd):
        if data:
            by_fd[fd].take(data, free_bytes(disk), reserve_bytes, ledger)
        else:
            by_fd[fd].close()
    ledger.close()


def pump(fds: Iterable[int]) -> Iterator[tuple[int, bytes]]:
    """What arrives on each pipe, as it arrives, until every one is closed: ``(fd, chunk)``,
    then ``(fd, b"")`` once its writers are gone (the read end closed here)."""
    open_fds = set(fds)
    poller = select.poll()
    for fd in open_fds:
        poller.register(fd, select.POLLIN)
    while open_fds:
        for fd, _ in poller.poll():
            if fd not in open_fds:
                continue
            try:
                data = os.read(fd, _CHUNK)
            except InterruptedError:
                continue
            except OSError:
                data = b""
            if not data:
                poller.unregister(fd)
                os.close(fd)
                open_fds.discard(fd)
            yield fd, data


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"
