"""A job's ``--output``/``--error`` files (``submit -o/-e``, as sbatch's), written by a process of
the job's own user.

The runner stays root, and so does the log keeper that fills the state dir's logs
(``node/logkeeper.py``). Neither may open a path a member named: root opens what the member
could not (another member's file, ``/etc/...``), and root's writes pass the file system's
disk quotas and its reserved blocks. So the runner forks a *writer* that drops to the job's
user (their groups, the jobs' umask) before it opens anything; the keeper hands it a copy of
every byte it reads from the job, and the writer writes the copy to the member's files. What
the member's files hold is on the member's disk quota, as if they had written it; it counts
neither against the daemon's ``--log-max`` nor the member's ``--user-max-stored`` (those bound
what the daemon stores for them, which ``collocate logs`` still reads, cut as before).

The writer opens its files before the job starts, so a path the member cannot write fails
the attempt at once, saying why, as sbatch's job fails. A first attempt truncates the file, as
sbatch does; a later attempt (a retry, an out-of-memory requeue) appends under a header line,
so no attempt's output is lost. Only regular files (and ``/dev/null``) are written: a FIFO
would block the job's output on a reader that may never come.
"""

from __future__ import annotations

import os
import signal
import stat

from collocate.node.isolate import JOB_UMASK, become
from collocate.node.logkeeper import pump

OPTIONS = {"stdout": "--output", "stderr": "--error"}  # in errors: the option that named the file


class OutputError(Exception):
    """The writer could not open a file; the message says which and why."""


def start_writer(paths: dict[str, str], *, uid: int | None, gid: int | None, append: bool,
                 header: str) -> tuple[int, dict[str, int]]:
    """Fork the writer for ``paths`` (stream name -> file; two streams may name one file):
    its pid and, per stream, the pipe end the log keeper writes its copy to. Raises
    ``OutputError`` when a file cannot be opened as the job's user (the writer is gone then)."""
    status_r, status_w = os.pipe()
    pipes = {name: os.pipe() for name in paths}
    pid = os.fork()
    if pid == 0:
        try:
            for _, w in pipes.values():
                os.close(w)
            os.close(status_r)
            _writer({name: r for name, (r, _) in pipes.items()}, paths, status_w, uid, gid, append, header)
        finally:
            os._exit(0)
    os.close(status_w)
    for r, _ in pipes.values():
        os.close(r)
    why = b""
    while chunk := os.read(status_r, 4096):
        why += chunk
    os.close(status_r)
    if why:
        for _, w in pipes.values():
            os.close(w)
        os.waitpid(pid, 0)
        raise OutputError(why.decode(errors="replace"))
    return pid, {name: w for name, (_, w) in pipes.items()}


def _writer(reads: dict[str, int], paths: dict[str, str], status: int, uid: int | None,
            gid: int | None, append: bool, header: str) -> None:
    """The writer's life: become the job's user, open the files (saying on ``status`` what
    failed, or closing it empty), then copy each pipe to its file until every pipe is closed."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a cancel's group signal: write to the end
        signal.signal(sig, signal.SIG_IGN)
    _close_all_but({status, *reads.values()})
    files: dict[str, int] = {}
    opened: dict[str, int] = {}
    try:
        os.umask(JOB_UMASK)
        become(uid, gid)
        for name, path in paths.items():
            if path not in opened:
                opened[path] = _open(path, append)
                if append and header:
                    os.write(opened[path], header.encode(errors="replace"))
            files[name] = opened[path]
    except OSError as exc:
        failed = next(n for n in paths if n not in files)
        os.write(status, f"cannot write {OPTIONS[failed]} {paths[failed]}: {exc.strerror}".encode(errors="replace"))
        return
    os.close(status)
    _copy(reads, files)


def _open(path: str, append: bool) -> int:
    """``path`` opened for writing as the job's user (who must be able to create or write it)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(path, flags if append else flags | os.O_TRUNC, 0o644)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) and os.path.realpath(path) != os.devnull:
        os.close(fd)
        raise OSError(0, "not a regular file (a FIFO or a device would block the job)", path)
    os.set_blocking(fd, True)
    return fd


def _copy(reads: dict[str, int], files: dict[str, int]) -> None:
    """Each pipe to its file; a file that fails (its disk full, quota reached) is written no
    more, and its pipe is still read to the end (the job never blocks on it)."""
    out = {reads[name]: files[name] for name in reads}
    broken: set[int] = set()
    for fd, data in pump(out):
        target = out[fd]
        if target in broken:
            continue
        try:
            while data:
                data = data[os.write(target, data):]
        except OSError:
            broken.add(target)


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor of this process but ``keep`` and 0-2, which become /dev/null: the
    writer, once it is the job's user, holds none of the runner's (the state dir's logs)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
