"""Opening the project's SQLite files the one way they all need."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from collocate.errors import CollocateError


def open_wal(path: Path, schema: str, *, what: str) -> sqlite3.Connection:
    """An autocommit connection in WAL mode with the schema applied.

    WAL lets readers (the CLI, the dashboard) run beside the one writer; ``synchronous=NORMAL``
    keeps committed rows across a killed process, which is what restart safety needs.
    ``check_same_thread=False`` because owners serialise access themselves (one loop thread or
    their own lock).
    """
    try:
        db = sqlite3.connect(path, isolation_level=None, timeout=30.0, check_same_thread=False)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.executescript(schema)
    except sqlite3.Error as exc:
        raise CollocateError(
            f"cannot open the {what} {path}: {exc}",
            hint="check the directory is writable and on a local file system",
        ) from exc
    return db
