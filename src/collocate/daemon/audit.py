"""The daemon's audit trail: ``<state>/audit.log``, one JSON object per line, rotated by size.

What it records (``docs/security.md``): every refused peer or token (``refused``: a Unix peer
outside the daemon's group, a TCP peer with a missing or wrong token, and its address), every
request the rights table refused (``rights``: who, over which transport, which op), every
connection turned away as busy (``busy``), and every accepted submit (``submit``: user,
transport, job id). Only the daemon writes it; it is created 0600 (the owner's, never the
members', even on a ``--group`` daemon) and never followed through a planted symlink. When it
passes ``AUDIT_MAX_BYTES`` it is renamed ``audit.log.1`` (the older ones shift up to
``audit.log.AUDIT_KEEP``, the oldest dropped), so it never fills the disk.

Writing never fails a request: an audit line that cannot be written (a full disk) is logged
once in ``daemon.log`` and dropped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("collocate.daemon")

AUDIT_FILE = "audit.log"  # under the state dir
AUDIT_MAX_BYTES = 8 * 1024 * 1024  # one file's size before it is rotated
AUDIT_KEEP = 4  # rotated files kept (audit.log.1 .. audit.log.4)


class AuditLog:
    """Append-only JSON lines at ``path`` (None: a log that records nothing)."""

    def __init__(self, path: Path | None, *, max_bytes: int = AUDIT_MAX_BYTES, keep: int = AUDIT_KEEP) -> None:
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self._lock = threading.Lock()
        self._warned = False

    def write(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields},
                          separators=(",", ":"), ensure_ascii=True, default=str) + "\n"
        with self._lock:
            try:
                self._rotate_if_full()
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    log.error("cannot write the audit log %s: %s (audit lines are dropped until it can)",
                              self.path, exc)
                return
            self._warned = False

    def _rotate_if_full(self) -> None:
        assert self.path is not None
        try:
            size = os.lstat(self.path).st_size
        except FileNotFoundError:
            return
        if size < self.max_bytes:
            return
        for n in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
        if self.keep > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()
