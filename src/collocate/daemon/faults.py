"""Errors the daemon turns into clear messages instead of "internal error": a full disk above all.

A full disk shows up as ``OSError(ENOSPC)`` (or ``EDQUOT``) from file writes and as SQLite's
``SQLITE_FULL`` ("database or disk is full") from the stores. Both mean the same thing to a user
(free space, nothing is wrong with the job), so both are recognised here, through chained causes.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from collocate.common.errors import CollocateError
from collocate.node.files import free_bytes

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_SQLITE_FULL = 13


class DiskFull(CollocateError):
    """The state dir's file system is full: writes fail until space is freed."""


def is_disk_full(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, DiskFull):
            return True
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if isinstance(exc, sqlite3.Error) and (getattr(exc, "sqlite_errorcode", None) == _SQLITE_FULL
                                               or "disk is full" in str(exc)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def disk_full(where: str) -> DiskFull:
    return DiskFull(f"disk full (ENOSPC): cannot write {where}",
                    hint="free space on that file system; the daemon goes on by itself once it can "
                         "write again (jobs that ended are recorded then)")


def describe_error(exc: BaseException) -> str:
    """One line for a reason or a reply: disk full said as such, else the error's own words."""
    if is_disk_full(exc):
        return "disk full (ENOSPC): no space left on the device"
    if isinstance(exc, CollocateError):
        return str(exc.args[0]) if exc.args else type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


#: Below this much free space the daemon places no job: it could not record the launch.
MIN_FREE_BYTES = 256 * 1024


def disk_nearly_full(path: Path) -> bool:
    """Whether the file system holding ``path`` has less than ``MIN_FREE_BYTES`` free."""
    free = free_bytes(path)
    return free is not None and free < MIN_FREE_BYTES
