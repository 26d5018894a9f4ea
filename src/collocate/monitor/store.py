"""Monitoring samples and per-job totals in SQLite, with retention limits.

The daemon gives a file path (``monitor_db_path(state_dir)``: a sibling of its job store, so
the monitor's write volume and pruning never lock the job tables). WAL mode, one connection
guarded by a lock so the loop thread writes while the dashboard thread reads.

Two kinds of tables, on purpose:

* time series (``mon_gpu``, ``mon_job``, ``mon_metric``): one row per device / job / logged
  value per tick, pruned by ``Retention`` (age and row count);
* totals (``mon_job_gpu_total``, ``mon_job_total``, ``mon_gpu_total``): one row per job x
  device, per job, per device, updated every tick and never pruned, so ``collocate show`` gives
  a job's peak memory, mean SM activity, GPU-hours and energy even after its samples expired.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collocate.common.sqlite import open_wal
from collocate.monitor.sampler import Tick

MONITOR_DB_NAME = "monitor.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mon_gpu (
    t REAL NOT NULL, uuid TEXT NOT NULL, gpu TEXT NOT NULL, used_mib REAL, total_mib REAL,
    gpu_util REAL, sm REAL, occ REAL, dram REAL, power_w REAL, energy_j REAL, jobs TEXT NOT NULL,
    committed_mib REAL
);
CREATE INDEX IF NOT EXISTS mon_gpu_t ON mon_gpu (t);
CREATE TABLE IF NOT EXISTS mon_job (
    t REAL NOT NULL, job_id TEXT NOT NULL, cpu_pct REAL, rss_mib REAL, read_b INTEGER,
    write_b INTEGER, nprocs INTEGER, gpu_mib REAL, sm REAL, energy_j REAL, gpu_time_s REAL,
    occupancy_s REAL, cpu_s REAL, gpus TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS mon_job_jt ON mon_job (job_id, t);
CREATE INDEX IF NOT EXISTS mon_job_t ON mon_job (t);
CREATE TABLE IF NOT EXISTS mon_metric (
    t REAL NOT NULL, job_id TEXT NOT NULL, key TEXT NOT NULL, value REAL NOT NULL, step INTEGER
);
CREATE INDEX IF NOT EXISTS mon_metric_jt ON mon_metric (job_id, t);
CREATE INDEX IF NOT EXISTS mon_metric_t ON mon_metric (t);
CREATE TABLE IF NOT EXISTS mon_job_gpu_total (
    job_id TEXT NOT NULL, uuid TEXT NOT NULL, energy_j REAL NOT NULL, gpu_time_s REAL NOT NULL,
    occupancy_s REAL NOT NULL, sm_time REAL NOT NULL, peak_mib REAL NOT NULL,
    PRIMARY KEY (job_id, uuid)
);
CREATE TABLE IF NOT EXISTS mon_job_total (
    job_id TEXT PRIMARY KEY, user TEXT NOT NULL, name TEXT NOT NULL, cpu_s REAL NOT NULL,
    peak_rss_mib REAL NOT NULL, first REAL NOT NULL, last REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS mon_gpu_total (
    uuid TEXT PRIMARY KEY, gpu TEXT NOT NULL, energy_j REAL NOT NULL, idle_energy_j REAL NOT NULL,
    other_energy_j REAL NOT NULL, seconds REAL NOT NULL, first REAL NOT NULL, last REAL NOT NULL
);
"""

_SERIES = ("mon_gpu", "mon_job", "mon_metric")


def monitor_db_path(state_dir: Path) -> Path:
    """Where a daemon with state dir ``state_dir`` keeps its monitoring data."""
    return Path(state_dir) / MONITOR_DB_NAME


@dataclass(frozen=True, slots=True)
class Retention:
    """How much time series to keep. Totals are never pruned (one row per job and device).

    The defaults hold a week of 1 s samples for 8 GPUs and ~30 concurrent jobs within a few
    hundred MB; ``prune_every_s`` keeps the DELETE off most ticks.
    """

    max_age_s: float = 7 * 24 * 3600.0
    max_rows: int = 2_000_000  # per time-series table
    prune_every_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_age_s <= 0 or self.max_rows < 1 or self.prune_every_s < 0:
            raise ValueError("Retention needs max_age_s > 0, max_rows >= 1, prune_every_s >= 0")


@dataclass(frozen=True, slots=True)
class JobSummary:
    """What ``collocate show`` and the report print for a job."""

    job_id: str
    user: str
    name: str
    first: float
    last: float
    peak_mib: float
    mean_sm: float | None  # occupancy-weighted mean SM activity over its devices
    gpu_hours: float  # its share of device time (see ``attribution``)
    occupancy_hours: float  # wall time x devices it held memory on
    energy_wh: float
    cpu_hours: float
    peak_rss_mib: float
    gpus: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__}
        d["gpus"] = list(self.gpus)
        return d


class MonitorStore:
    """All reads and writes of the monitoring tables (thread-safe through one lock)."""

    def __init__(self, path: Path, *, retention: Retention | None = None) -> None:
        self.path = Path(path)
        self.retention = retention or Retention()
        self._lock = threading.Lock()
        self._reader_lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        self._last_prune = float("-inf")
        self.db = open_wal(self.path, _SCHEMA, what="monitoring store")
        if "committed_mib" not in {r[1] for r in self.db.execute("PRAGMA table_info(mon_gpu)")}:
            self.db.execute("ALTER TABLE mon_gpu ADD COLUMN committed_mib REAL")  # a store of before

    def close(self) -> None:
        with self._lock:
            self.db.close()
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """A connection of its own for long reads (a day of history), so they never hold the
        writer's lock: WAL lets them read beside the daemon's writes."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
            yield self._reader

    # -- writes ----------------------------------------------------------------------------
    def write(self, tick: Tick) -> None:
        """Store one tick (series rows and totals) in one transaction; prune when due."""
        with self._lock:
            self.db.execute("BEGIN")
            try:
                self._write(tick)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            if tick.time - self._last_prune >= self.retention.prune_every_s:
                self._prune(tick.time)
                self._last_prune = tick.time

    def _write(self, tick: Tick) -> None:
        db = self.db
        db.executemany(
            "INSERT INTO mon_gpu (t, uuid, gpu, used_mib, total_mib, gpu_util, sm, occ, dram, power_w,"
            " energy_j, jobs, committed_mib) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", [
                (g.sample.time, g.uuid, g.gpu, g.sample.used_mib, g.total_mib, g.sample.gpu_util,
                 g.sample.sm_activity, g.sample.sm_occupancy, g.sample.dram_activity,
                 g.sample.power_watts, g.energy_j, json.dumps(g.jobs), tick.committed.get(g.uuid))
                for g in tick.gpus])
        db.executemany(
            "INSERT INTO mon_gpu_total VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (uuid) DO UPDATE SET"
            " energy_j = energy_j + excluded.energy_j,"
            " idle_energy_j = idle_energy_j + excluded.idle_energy_j,"
            " other_energy_j = other_energy_j + excluded.other_energy_j,"
            " seconds = seconds + excluded.seconds, last = excluded.last",
            [(g.uuid, g.gpu, g.energy_j or 0.0, g.idle_energy_j, g.other_energy_j, g.interval_s,
              g.sample.time, g.sample.time) for g in tick.gpus])
        db.executemany("INSERT INTO mon_job VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", [
            (j.time, j.job_id, j.cpu_percent, j.rss_mib, j.read_bytes, j.write_bytes, j.nprocs,
             j.gpu_mem_mib, j.sm_activity, j.energy_j, j.gpu_time_s, j.occupancy_s, j.cpu_s,
             json.dumps([g.uuid for g in j.gpus])) for j in tick.jobs])
        db.executemany(
            "INSERT INTO mon_job_total VALUES (?,?,?,?,?,?,?) ON CONFLICT (job_id) DO UPDATE SET"
            " user = CASE WHEN excluded.user != '' THEN excluded.user ELSE user END,"
            " name = CASE WHEN excluded.name != '' THEN excluded.name ELSE name END,"
            " cpu_s = cpu_s + excluded.cpu_s,"
            " peak_rss_mib = MAX(peak_rss_mib, excluded.peak_rss_mib), last = excluded.last",
            [(j.job_id, j.user, j.name, j.cpu_s, j.rss_mib, j.time, j.time) for j in tick.jobs])
        db.executemany(
            "INSERT INTO mon_job_gpu_total VALUES (?,?,?,?,?,?,?) ON CONFLICT (job_id, uuid)"
            " DO UPDATE SET energy_j = energy_j + excluded.energy_j,"
            " gpu_time_s = gpu_time_s + excluded.gpu_time_s,"
            " occupancy_s = occupancy_s + excluded.occupancy_s,"
            " sm_time = sm_time + excluded.sm_time, peak_mib = MAX(peak_mib, excluded.peak_mib)",
            [(j.job_id, g.uuid, g.energy_j or 0.0, g.gpu_time_s, g.occupancy_s,
              g.sm_activity * g.occupancy_s, g.mem_mib) for j in tick.jobs for g in j.gpus])
        db.executemany("INSERT INTO mon_metric VALUES (?,?,?,?,?)", [
            (m.time, m.job_id, m.key, m.value, m.step) for m in tick.metrics])

    def prune(self, now: float) -> dict[str, int]:
        """Apply the retention limits now; returns rows deleted per table."""
        with self._lock:
            return self._prune(now)

    def _prune(self, now: float) -> dict[str, int]:
        deleted = {}
        cutoff = now - self.retention.max_age_s
        for table in _SERIES:
            n = self.db.execute(f"DELETE FROM {table} WHERE t < ?", (cutoff,)).rowcount
            # rows are only ever appended and removed from the oldest end, so the rowids of the
            # kept rows are contiguous: the newest max_rows are those above max(rowid) - max_rows
            # (no COUNT(*) scan of millions of rows once a minute)
            top = self.db.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0]
            if top is not None:
                n += self.db.execute(f"DELETE FROM {table} WHERE rowid <= ?",
                                     (top - self.retention.max_rows,)).rowcount
            deleted[table] = n
        return deleted

    # -- reads -----------------------------------------------------------------------------
    def row_counts(self) -> dict[str, int]:
        with self._lock:
            return {t: self.db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in _SERIES}

    def job_summary(self, job_id: str) -> JobSummary | None:
        """Totals of one job over its whole life (never pruned), or None if never sampled."""
        found = self.job_summaries(job_ids=[job_id])
        return found[0] if found else None

    def job_summaries(self, *, since: float | None = None,
                      job_ids: list[str] | None = None) -> list[JobSummary]:
        """Every job's totals; with ``since``, computed from the retained samples after it."""
        with self._lock:
            if since is None:
                rows = self.db.execute(
                    "SELECT t.job_id, t.user, t.name, t.first, t.last,"
                    " COALESCE(MAX(g.peak_mib), 0), SUM(g.sm_time), SUM(g.occupancy_s),"
                    " COALESCE(SUM(g.gpu_time_s), 0), COALESCE(SUM(g.energy_j), 0), t.cpu_s,"
                    " t.peak_rss_mib, GROUP_CONCAT(g.uuid)"
                    " FROM mon_job_total t LEFT JOIN mon_job_gpu_total g USING (job_id)"
                    " GROUP BY t.job_id ORDER BY t.first").fetchall()
            else:
                rows = self._window(since)
        out = [_summary(r) for r in rows]
        if job_ids is not None:
            out = [s for s in out if s.job_id in set(job_ids)]
        return out

    def _window(self, since: float) -> list[tuple]:
        """Per-job sums over the retained samples since ``since``."""
        rows = self.db.execute(
            "SELECT j.job_id, COALESCE(t.user, ''), COALESCE(t.name, ''), MIN(j.t), MAX(j.t),"
            " COALESCE(MAX(j.gpu_mib), 0), SUM(j.sm * j.occupancy_s), SUM(j.occupancy_s),"
            " COALESCE(SUM(j.gpu_time_s), 0), COALESCE(SUM(j.energy_j), 0), SUM(j.cpu_s),"
            " COALESCE(MAX(j.rss_mib), 0), NULL"
            " FROM mon_job j LEFT JOIN mon_job_total t USING (job_id) WHERE j.t >= ?"
            " GROUP BY j.job_id ORDER BY MIN(j.t)", (since,)).fetchall()
        gpus: dict[str, set[str]] = {}
        for job_id, text in self.db.execute(
                "SELECT job_id, gpus FROM mon_job WHERE t >= ?", (since,)):
            gpus.setdefault(job_id, set()).update(json.loads(text))
        return [(*r[:12], ",".join(sorted(gpus.get(r[0], ())))) for r in rows]

    def gpu_totals(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self.db.execute(
                "SELECT uuid, gpu, energy_j, idle_energy_j, other_energy_j, seconds, first, last"
                " FROM mon_gpu_total ORDER BY gpu").fetchall()
        keys = ("uuid", "gpu", "energy_j", "idle_energy_j", "other_energy_j", "seconds", "first",
                "last")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def gpu_series(self, *, since: float = 0.0, uuid: str | None = None,
                   limit: int = 100_000) -> list[dict[str, Any]]:
        sql = ("SELECT t, uuid, gpu, used_mib, total_mib, gpu_util, sm, occ, dram, power_w,"
               " energy_j, jobs FROM mon_gpu WHERE t >= ?")
        args: list[Any] = [since]
        if uuid is not None:
            sql, args = sql + " AND uuid = ?", [*args, uuid]
        keys = ("t", "uuid", "gpu", "used_mib", "total_mib", "gpu_util", "sm", "occ", "dram",
                "power_w", "energy_j", "jobs")
        with self._lock:
            rows = self.db.execute(sql + " ORDER BY t LIMIT ?", (*args, limit)).fetchall()
        out = [dict(zip(keys, r, strict=True)) for r in rows]
        for d in out:
            d["jobs"] = json.loads(d["jobs"])
        return out

    def history(self, since: float, until: float, points: int = 120) -> dict[str, Any]:
        """GPUs and users over ``[since, until]`` in at most ``points`` buckets, for the dashboard:
        per GPU the mean utilisation, used and committed memory, and energy; per user the mean
        GPUs held (GPU-seconds / bucket), GPU memory held, SM activity and energy. Bucketed in
        SQL, so an hour of 1 s samples costs no more to draw than two minutes.

        Every bucket of the range has a point, so gaps are drawn as gaps: a bucket without a
        sample (the daemon was down) has None values; a user who held nothing in a bucket the
        daemon sampled has zeros there (not a line drawn across from her last job to her next).
        How far back it reaches is ``Retention.max_age_s`` (7 days by default)."""
        step = max(1.0, (until - since) / max(1, points))
        with self._reading() as db:
            gpu_rows = db.execute(
                "SELECT uuid, gpu, CAST((t - ?) / ? AS INTEGER) AS b, AVG(COALESCE(sm, gpu_util)),"
                " AVG(used_mib), AVG(committed_mib), SUM(energy_j), MAX(total_mib)"
                " FROM mon_gpu WHERE t >= ? AND t <= ? GROUP BY uuid, b ORDER BY uuid, b",
                (since, step, since, until)).fetchall()
            user_rows = db.execute(
                "SELECT COALESCE(u.user, ''), CAST((j.t - ?) / ? AS INTEGER) AS b,"
                " SUM(j.gpu_time_s), SUM(j.gpu_mib), COUNT(DISTINCT j.t),"
                " SUM(j.sm * j.occupancy_s), SUM(j.occupancy_s), SUM(j.energy_j)"
                " FROM mon_job j LEFT JOIN mon_job_total u USING (job_id) WHERE j.t >= ? AND j.t <= ?"
                " GROUP BY 1, b ORDER BY 1, b", (since, step, since, until)).fetchall()
        n = int((until - since) // step) + 1  # the last bucket holds `until` itself
        mid = [since + (b + 0.5) * step for b in range(n)]
        sampled = {r[2] for r in gpu_rows} | {r[1] for r in user_rows}  # buckets the daemon saw
        gpus: dict[str, dict[str, Any]] = {}
        for uuid, gpu, b, util, used, committed, energy, total in gpu_rows:
            g = gpus.setdefault(uuid, {"uuid": uuid, "gpu": gpu, "total_mib": total, "points": [
                {"t": t, "util": None, "used_mib": None, "committed_mib": None, "energy_wh": None}
                for t in mid]})
            if 0 <= b < n:
                g["points"][b].update({"util": util, "used_mib": used, "committed_mib": committed,
                                       "energy_wh": (energy or 0.0) / 3600})
        users: dict[str, dict[str, Any]] = {}
        for user, b, gpu_s, mib, ticks, sm_time, occ, energy in user_rows:
            u = users.setdefault(user, {"user": user, "points": [  # held nothing while sampled
                {"t": t, "gpus": 0.0 if i in sampled else None,
                 "mem_mib": 0.0 if i in sampled else None, "sm": None,
                 "energy_wh": 0.0 if i in sampled else None} for i, t in enumerate(mid)]})
            if 0 <= b < n:
                u["points"][b].update({"gpus": (gpu_s or 0.0) / step,
                                       "mem_mib": (mib or 0.0) / max(1, ticks),
                                       "sm": (sm_time / occ) if occ else None,
                                       "energy_wh": (energy or 0.0) / 3600})
        return {"since": since, "until": until, "step_s": step,
                "gpus": list(gpus.values()), "users": list(users.values())}

    def job_series(self, job_id: str, *, since: float = 0.0,
                   limit: int = 10_000) -> list[dict[str, Any]]:
        keys = ("t", "cpu_pct", "rss_mib", "read_b", "write_b", "nprocs", "gpu_mib", "sm",
                "energy_j", "gpu_time_s")
        with self._lock:
            rows = self.db.execute(
                f"SELECT {', '.join(keys)} FROM (SELECT * FROM mon_job WHERE job_id = ? AND"
                " t >= ? ORDER BY t DESC LIMIT ?) ORDER BY t", (job_id, since, limit)).fetchall()
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def metrics(self, job_id: str, *, since: float = 0.0,
                limit: int = 10_000) -> list[dict[str, Any]]:
        with self._lock:
            rows = self.db.execute(
                "SELECT t, key, value, step FROM (SELECT * FROM mon_metric WHERE job_id = ? AND"
                " t >= ? ORDER BY t DESC LIMIT ?) ORDER BY t", (job_id, since, limit)).fetchall()
        return [{"t": t, "key": k, "value": v, "step": s} for t, k, v, s in rows]


def _summary(r: tuple) -> JobSummary:
    (job_id, user, name, first, last, peak, sm_time, occ, gpu_time, energy, cpu_s, rss,
     gpus) = r
    return JobSummary(
        job_id=job_id, user=user or "", name=name or "", first=first, last=last,
        peak_mib=float(peak or 0.0),
        mean_sm=(sm_time / occ) if occ else None,
        gpu_hours=float(gpu_time or 0.0) / 3600.0,
        occupancy_hours=float(occ or 0.0) / 3600.0,
        energy_wh=float(energy or 0.0) / 3600.0,
        cpu_hours=float(cpu_s or 0.0) / 3600.0,
        peak_rss_mib=float(rss or 0.0),
        gpus=tuple(sorted(set(filter(None, (gpus or "").split(","))))),
    )
