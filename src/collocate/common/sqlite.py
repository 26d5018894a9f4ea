"""Opening the project's SQLite files the one way they all need."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from collocate.common.errors import CollocateError

#: Pages (4 KiB) a WAL may hold before it is checkpointed, and its size after (1 MiB).
WAL_PAGES = 256


def open_wal(path: Path, schema: str, *, what: str) -> sqlite3.Connection:
    """An autocommit connection in WAL mode with the schema applied.

    WAL lets readers (the CLI, the dashboard) run beside the one writer; ``synchronous=NORMAL``
    keeps committed rows across a killed process, which is what restart safety needs. The WAL is
    checkpointed every ``WAL_PAGES`` pages and cut back to that size after each checkpoint: with
    SQLite's default (1,000 pages, never cut back) the monitor's WAL alone held 4 MiB of a
    daemon sampling every 0.1 s: half the disk-full test's 8 MiB state disk, which one CI run
    found full before the test filled it. ``check_same_thread=False`` because owners serialise access themselves
    (one loop thread or their own lock).
    """
    try:
        db = sqlite3.connect(path, isolation_level=None, timeout=30.0, check_same_thread=False)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute(f"PRAGMA wal_autocheckpoint = {WAL_PAGES}")
        db.execute(f"PRAGMA journal_size_limit = {WAL_PAGES * 4096}")
        db.executescript(schema)
    except sqlite3.Error as exc:
        raise CollocateError(
            f"cannot open the {what} {path}: {exc}",
            hint="check the directory is writable and on a local file system",
        ) from exc
    return db
