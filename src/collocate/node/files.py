"""The files of an attempt on its node, and the disk they live on: one place for their names and
for reading them, shared by the node that writes them and the head that asks about them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def attempt_files(directory: Path) -> dict[str, Path]:
    """The files of one attempt: logs, the runner's start record and its exit record."""
    return {
        "stdout": directory / "stdout.log",
        "stderr": directory / "stderr.log",
        "started": directory / "runner.json",
        "exit": directory / "exit.json",
    }


def drop_logs(directory: Path) -> int:
    """Remove the stdout and stderr logs in ``directory`` (``collocate purge``: an ended job's,
    never one still written); the bytes freed. The records (start, exit) stay: they are small,
    and what ``show`` says of the attempt comes from them and the store."""
    freed = 0
    for stream in ("stdout", "stderr"):
        path = attempt_files(directory)[stream]
        try:
            size = os.lstat(path).st_size
            path.unlink()
        except OSError:  # never written, or already removed
            continue
        freed += size
    return freed


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_exit(attempt_dir: Path) -> dict[str, Any] | None:
    """The runner's exit record of an attempt, or None while it runs (or if it never wrote one)."""
    return read_json(attempt_files(attempt_dir)["exit"])


def read_chunk(path: Path, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``path`` from ``offset``; nothing when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, offset))
            return f.read(limit)
    except OSError:
        return b""


def free_bytes(path: Path | str) -> int | None:
    """Free space on the file system holding ``path`` for unprivileged writers (root's reserved
    blocks are not counted on); None when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_size(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize
