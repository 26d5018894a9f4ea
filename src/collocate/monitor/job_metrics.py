"""Jobs log their own metrics (loss, samples/s) beside the system metrics the daemon samples.

A job calls ``collocate.monitor.log_metric("loss", 0.31, step=100)``. The daemon sets
``COLLOCATE_METRICS_FILE`` in the job's environment to a file in the attempt's directory; each
call appends one JSON line ``{"t": <unix time>, "key": "loss", "value": 0.31, "step": 100}``
there, and the daemon's ``UsageSampler`` picks new lines up on its next tick (``MetricsTail``).

Why a file and not a socket: appending a short line is atomic (``O_APPEND``, well under
``PIPE_BUF``), needs no connection, works for any language (``echo '{"key":...}' >> "$F"``)
and costs the job nothing when the daemon is slow or restarting. Outside the daemon (the
variable unset) ``log_metric`` does nothing, so training scripts run unchanged by hand.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

ENV_METRICS_FILE = "COLLOCATE_METRICS_FILE"
METRICS_FILE_NAME = "metrics.jsonl"
MAX_KEY_LENGTH = 200
MAX_BYTES_PER_TICK = 1 << 20  # a job flooding its file cannot stall the daemon's tick

log = logging.getLogger("collocate.monitor")


@dataclass(frozen=True, slots=True)
class MetricPoint:
    job_id: str
    time: float
    key: str
    value: float
    step: int | None = None


def metrics_env(attempt_dir: Path) -> dict[str, str]:
    """The environment entry the daemon adds to a launch so the job's metrics land in its dir."""
    return {ENV_METRICS_FILE: os.fspath(Path(attempt_dir) / METRICS_FILE_NAME)}


def log_metric(key: str, value: float, step: int | None = None, *, path: str | None = None) -> bool:
    """Record one value of a job's own metric; returns False (and does nothing) outside the daemon.

    ``key`` is any short name (``"loss"``, ``"samples_per_s"``); ``value`` must be a finite
    number. ``path`` overrides ``$COLLOCATE_METRICS_FILE`` (tests, or logging somewhere else).
    """
    target = path or os.environ.get(ENV_METRICS_FILE)
    if not target:
        return False
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"metric key must be 1..{MAX_KEY_LENGTH} characters, got {key!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"metric {key!r} must be a finite number, got {value!r}")
    record = {"t": time.time(), "key": key, "value": number}
    if step is not None:
        record["step"] = int(step)
    line = json.dumps(record, separators=(",", ":")) + "\n"
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return True


def parse_line(job_id: str, line: str) -> MetricPoint | None:
    """One JSON line as a ``MetricPoint``, or None when it is not a valid record."""
    try:
        d = json.loads(line)
        key, value = d["key"], float(d["value"])
        step = d.get("step")
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            return None
        if not math.isfinite(value):
            return None
        return MetricPoint(job_id, float(d.get("t", time.time())), key, value,
                           None if step is None else int(step))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class MetricsTail:
    """Follows the metrics file of each job from where it stopped reading last time.

    Each file stays open while its job runs (one ``read`` per tick instead of open/seek/close).
    A partial last line (the job is mid-write) is kept for the next tick; invalid lines are
    skipped and counted, with one warning per job.
    """

    def __init__(self) -> None:
        self._fds: dict[str, tuple[str, int]] = {}  # job id -> (path, open descriptor)
        self._partial: dict[str, bytes] = {}
        self.bad_lines: dict[str, int] = {}

    def read(self, files: dict[str, Path]) -> list[MetricPoint]:
        points: list[MetricPoint] = []
        for job_id, path in files.items():
            points += self._read_one(job_id, os.fspath(path))
        for job_id in [j for j in self._fds if j not in files]:
            self._forget(job_id)
        return points

    def close(self) -> None:
        for job_id in list(self._fds):
            self._forget(job_id)

    def _forget(self, job_id: str) -> None:
        _, fd = self._fds.pop(job_id)
        os.close(fd)
        self._partial.pop(job_id, None)

    def _read_one(self, job_id: str, path: str) -> list[MetricPoint]:
        if job_id in self._fds and self._fds[job_id][0] != path:  # a new attempt, a new file
            self._forget(job_id)
        if job_id not in self._fds:
            try:
                self._fds[job_id] = (path, os.open(path, os.O_RDONLY))
            except OSError:  # not written yet
                return []
        try:
            data = os.read(self._fds[job_id][1], MAX_BYTES_PER_TICK)
        except OSError:
            return []
        if not data:
            return []
        data = self._partial.pop(job_id, b"") + data
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[job_id] = rest
        out = []
        for raw in lines:
            if not raw.strip():
                continue
            point = parse_line(job_id, raw.decode(errors="replace"))
            if point is None:
                if job_id not in self.bad_lines:
                    log.warning("job %s: skipping invalid metric line(s) in %s, e.g. %r",
                                job_id, path, raw[:80])
                self.bad_lines[job_id] = self.bad_lines.get(job_id, 0) + 1
            else:
                out.append(point)
        return out
