"""The daemon's persistent state: jobs, their attempts, measured history, a few flags.

Embedded SQLite in WAL mode, so a daemon killed mid-write loses at most the transaction in
flight and a restarted daemon finds every job. Only the daemon's loop thread writes (one
connection, one place), which keeps the queue order and the attempt records consistent.

Tables:

* ``jobs``: the scheduler's ``Job`` (JSON), the launch ``JobSpec`` (JSON), submit order;
* ``attempts``: one row per launch: start/end, GPUs, the runner's pid and process start time
  (to re-adopt it after a restart), exit status, outcome, reason, measured peak memory and solo
  activity profile (``collocate.activity``; NULL when the job never ran alone long enough);
* ``job_history``: per job identity (``collocate.core.identity``: the same command up to seeds,
  output paths and run names), the measured peak of its last successful run (the memory of
  later runs of the same job) and what its runs taught of its activity, with the variance
  (``collocate.core.belief``), learned alone or shared; and its family (a sweep's points), whose
  other identities' beliefs give a new job its prior. (Files from before keep an unused
  ``history`` table keyed by the exact command.)
* ``meta``: the id counter, the drain flag and the per-user caps (``limits``, JSON).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from collocate.common.errors import CollocateError
from collocate.common.sqlite import open_wal
from collocate.core.belief import Belief, from_history
from collocate.core.fairness import Fairness, UserLimits
from collocate.core.model import UNKNOWN_PROFILE, GpuId, Job, JobProfile, JobState
from collocate.daemon.faults import disk_full, is_disk_full
from collocate.wire.spec import JobSpec

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, job TEXT NOT NULL, spec TEXT NOT NULL,
    submitted REAL NOT NULL, ended REAL
);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL, n INTEGER NOT NULL, start REAL NOT NULL, end REAL,
    gpus TEXT NOT NULL, uuids TEXT NOT NULL, mem_mib REAL, dir TEXT NOT NULL,
    pid INTEGER, pid_started REAL, returncode INTEGER, outcome TEXT, reason TEXT,
    peak_mib REAL, sm_activity REAL, solo_sm REAL, solo_dram REAL, parts TEXT, host TEXT,
    PRIMARY KEY (job_id, n)
);
CREATE TABLE IF NOT EXISTS job_history (
    identity TEXT PRIMARY KEY, family TEXT, peak_mib REAL, sm REAL, dram REAL, sm_var REAL,
    dram_var REAL, source TEXT, runs INTEGER NOT NULL, updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS job_history_family ON job_history (family);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Columns added after the first release: in the schema above, and added to older files on open.
# The solo profile got new columns instead of reusing ``sm_activity``, which held the mean of
# NVML's per-process utilization (another quantity, biased by warm-up and neighbours); that
# column is no longer read, so a profile from before is not taken for a measured one.
_ADDED_COLUMNS = {
    "jobs": ("submit_key TEXT",),
    "attempts": ("solo_sm REAL", "solo_dram REAL", "parts TEXT", "host TEXT"),
}
_ATTEMPT_COLUMNS = ("job_id, n, start, gpus, uuids, dir, mem_mib, end, pid, pid_started,"
                    " returncode, outcome, reason, peak_mib, solo_sm, solo_dram, parts, host")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One launch of a job, as ``collocate show`` lists it."""

    job_id: str
    n: int
    start: float
    gpus: tuple[str, ...]
    uuids: tuple[str, ...]
    dir: str
    mem_mib: float | None = None
    end: float | None = None
    pid: int | None = None
    pid_started: float | None = None
    returncode: int | None = None
    outcome: str | None = None
    reason: str | None = None
    peak_mib: float | None = None
    solo_sm: float | None = None  # the solo profile measured in this attempt (collocate.activity)
    solo_dram: float | None = None
    #: Per part (one per node, in rank order) its runner's (pid, process start time), for a job
    #: on several nodes; empty for a job on one node, whose runner is ``pid``/``pid_started``.
    runners: tuple[tuple[int | None, float | None], ...] = ()
    #: The node a CPU job (no GPUs, so no node in ``gpus``) runs on; "" for a GPU job.
    host: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpus"], d["uuids"] = list(self.gpus), list(self.uuids)
        d["runners"] = [list(r) for r in self.runners]
        d["nodes"] = list(self.nodes)
        return d

    @property
    def nodes(self) -> tuple[str, ...]:
        """The attempt's nodes in rank order (the order of its GPUs; a CPU job's ``host``)."""
        if not self.gpus:
            return (self.host,) if self.host else ()
        return tuple(dict.fromkeys(GpuId.parse(g).node for g in self.gpus))


def job_to_json(job: Job) -> str:
    d = {f.name: getattr(job, f.name) for f in fields(Job)}
    d["profile"] = asdict(job.profile)
    d["state"] = job.state.value
    return json.dumps(d)


def job_from_json(text: str) -> Job:
    d = json.loads(text)
    d["profile"] = JobProfile(**d["profile"])
    if "profile_source" not in d and d["profile"] != UNKNOWN_PROFILE:  # stored before it existed
        d["profile_source"] = "history"
    d["state"] = JobState(d["state"])
    for key in ("after", "after_any", "after_notok", "suspended_beside"):  # JSON has no tuples
        if key in d:
            d[key] = tuple(d[key])
    if d.get("profile_var") is not None:
        d["profile_var"] = tuple(d["profile_var"])
    return Job(**d)


class Store:
    """All reads and writes of the daemon's SQLite file (one connection, the loop's thread)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._refuse_lost_store()
        try:
            self.db = open_wal(self.path, _SCHEMA, what="job store")
        except CollocateError as exc:
            if isinstance(exc.__cause__, sqlite3.Error):
                raise self._unusable(exc.__cause__) from None
            raise
        try:
            check = self.db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(check[0] if check else "quick_check gave nothing")
            for table, columns in _ADDED_COLUMNS.items():
                have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
                for column in columns:
                    if column.split()[0] not in have:
                        self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
            self.db.execute("CREATE UNIQUE INDEX IF NOT EXISTS jobs_submit_key ON jobs (submit_key)")
            self._mark()
        except sqlite3.Error as exc:
            self.db.close()
            raise self._unusable(exc) from None

    @classmethod
    def read_only(cls, path: Path) -> Store:
        """The store opened for reading only (``collocate report`` beside a running daemon):
        no schema change, no id check, no write."""
        store = object.__new__(cls)
        store.path = Path(path)
        try:
            store.db = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True, timeout=30.0)
            store.db.execute("SELECT 1 FROM jobs LIMIT 1")
        except sqlite3.Error as exc:
            raise CollocateError(f"cannot read the job store {store.path}: {exc}",
                                 hint="run this as the daemon's owner, on its --state-dir") from None
        return store

    @property
    def _marker(self) -> Path:
        """``collocate.common.sqlite.id``: the store's random id, kept beside it. It outlives a store
        that is deleted or emptied, which is how such a loss is told from a first start."""
        return self.path.with_name(self.path.name + ".id")

    def _refuse_lost_store(self) -> None:
        """A missing or empty store where jobs existed would reuse job id 1 (and show the old
        job 1's logs for the new one): refuse, and say so."""
        if self.path.exists() and self.path.stat().st_size > 0:
            return
        jobs = self.path.parent / "jobs"
        had_jobs = self._marker.exists() or (jobs.is_dir() and any(jobs.iterdir()))
        if had_jobs:
            state = "empty" if self.path.exists() else "missing"
            raise CollocateError(
                f"the job store {self.path} is {state}, but this state dir had jobs "
                f"({self._marker.name} or {jobs} say so)",
                hint="restore collocate.common.sqlite from a backup; or move the state dir aside and start "
                     "on a fresh one (starting here would reuse job ids and mix old and new logs)")

    def _mark(self) -> None:
        """Give the store an id (once) and check the marker beside it names the same one; the
        write doubles as the check that the file is writable (a read-only store is refused)."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
        store_id = row[0] if row else uuid.uuid4().hex
        try:
            marked = self._marker.read_text().strip()
        except FileNotFoundError:
            marked = None
        if marked is not None and marked != store_id:
            raise CollocateError(
                f"the job store {self.path} is not the one this state dir used "
                f"(id {store_id}, {self._marker.name} says {marked})",
                hint="put the original collocate.common.sqlite back, or start on a fresh state dir")
        self.db.execute("INSERT INTO meta VALUES ('store_id', ?) ON CONFLICT (key) DO UPDATE SET"
                        " value = excluded.value", (store_id,))
        if marked is None:
            fd = os.open(self._marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(store_id + "\n")

    def _unusable(self, exc: sqlite3.Error) -> CollocateError:
        text = str(exc)
        writable = all(os.access(p, os.W_OK) for p in (self.path, self.path.parent) if p.exists())
        if "readonly" in text or not writable:
            return CollocateError(f"the job store {self.path} is read-only: {text}",
                                  hint="make it (and its directory) writable by the daemon's user")
        if is_disk_full(exc):
            return disk_full(str(self.path))
        damaged = any(w in text for w in ("malformed", "not a database", "corrupt", "quick_check", "***"))
        return CollocateError(f"the job store {self.path} is {'corrupt' if damaged else 'unusable'}: {text}",
                              hint="restore collocate.common.sqlite from a backup, or move the state dir "
                                   "aside and start on a fresh one")

    def close(self) -> None:
        self.db.close()

    # -- jobs ------------------------------------------------------------------------------
    def next_id(self) -> str:
        """A new job id (1, 2, 3...), never reused even after jobs are removed."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()
            n = int(row[0]) if row else 1
            self.db.execute(
                "INSERT INTO meta VALUES ('next_id', ?) ON CONFLICT (key) DO UPDATE SET"
                " value = excluded.value", (str(n + 1),))
        return str(n)

    def add_job(self, job: Job, spec: JobSpec) -> None:
        """Store a submitted job, with its submit key in the same row (one atomic write)."""
        self.db.execute(
            "INSERT INTO jobs (id, seq, job, spec, submitted, ended, submit_key)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job.id, int(job.id), job_to_json(job), spec.to_json(), job.submit_time,
             time.time() if job.state.is_terminal else None, spec.submit_key),
        )

    def job_for_key(self, key: str | None) -> tuple[Job, JobSpec, float | None] | None:
        """The job a submit with this idempotency key already stored, if any."""
        if not key:
            return None
        row = self.db.execute("SELECT job, spec, ended FROM jobs WHERE submit_key = ?", (key,)).fetchone()
        return None if row is None else (job_from_json(row[0]), JobSpec.from_json(row[1]), row[2])

    def save_job(self, job: Job) -> None:
        """Persist a changed job (the scheduler's ``on_change`` hook lands here). An ended job's
        environment is dropped: it was kept only to launch the job again, and it is what makes
        a job big (and may hold secrets)."""
        self.db.execute(
            "UPDATE jobs SET job = ?, ended = CASE WHEN ? THEN COALESCE(ended, ?) ELSE NULL END,"
            " spec = CASE WHEN ? THEN json_set(spec, '$.env', json('{}')) ELSE spec END WHERE id = ?",
            (job_to_json(job), job.state.is_terminal, time.time(), job.state.is_terminal, job.id),
        )

    def jobs(self) -> list[tuple[Job, JobSpec, float | None]]:
        """Every job in submit order, with its spec and end time."""
        rows = self.db.execute("SELECT job, spec, ended FROM jobs ORDER BY seq")
        return [(job_from_json(j), JobSpec.from_json(s), e) for j, s, e in rows]

    def jobs_page(self, *, after: int, limit: int, active: bool,
                  ids: list[str] | None = None) -> list[tuple[Job, JobSpec, float | None]]:
        """At most ``limit`` jobs submitted after job ``after``, in submit order: only those not
        ended with ``active``, only ``ids`` when given (one page of ``ls``)."""
        where = ["seq > ?"] + (["ended IS NULL"] if active else [])
        params: list[Any] = [after]
        if ids is not None:
            where.append("id IN (SELECT value FROM json_each(?))")
            params.append(json.dumps(ids))
        rows = self.db.execute(f"SELECT job, spec, ended FROM jobs WHERE {' AND '.join(where)}"
                               " ORDER BY seq LIMIT ?", (*params, limit))
        return [(job_from_json(j), JobSpec.from_json(s), e) for j, s, e in rows]

    def ended_before(self, uid: int, before: float) -> list[str]:
        """The ids of ``uid``'s jobs that ended before ``before`` (``collocate purge --before``)."""
        rows = self.db.execute("SELECT id FROM jobs WHERE ended IS NOT NULL AND ended < ?"
                               " AND json_extract(spec, '$.uid') = ? ORDER BY seq", (before, uid))
        return [job_id for (job_id,) in rows]

    def job(self, job_id: str) -> tuple[Job, JobSpec, float | None] | None:
        row = self.db.execute("SELECT job, spec, ended FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else (job_from_json(row[0]), JobSpec.from_json(row[1]), row[2])

    # -- attempts --------------------------------------------------------------------------
    def add_attempt(self, a: Attempt) -> None:
        self.db.execute(
            "INSERT INTO attempts (job_id, n, start, gpus, uuids, mem_mib, dir, host)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (a.job_id, a.n, a.start, json.dumps(a.gpus), json.dumps(a.uuids), a.mem_mib, a.dir,
             a.host or None),
        )

    def update_attempt(self, a: Attempt) -> None:
        self.db.execute(
            "UPDATE attempts SET end = ?, pid = ?, pid_started = ?, returncode = ?, outcome = ?,"
            " reason = ?, peak_mib = ?, solo_sm = ?, solo_dram = ?, parts = ?"
            " WHERE job_id = ? AND n = ?",
            (a.end, a.pid, a.pid_started, a.returncode, a.outcome, a.reason, a.peak_mib,
             a.solo_sm, a.solo_dram, json.dumps(a.runners) if a.runners else None, a.job_id, a.n),
        )

    def attempts(self, job_id: str) -> list[Attempt]:
        rows = self.db.execute(
            f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY n", (job_id,))
        return [_attempt(r) for r in rows]

    def open_attempts(self) -> list[Attempt]:
        """Attempts with no end: the jobs that were running when the daemon last stopped."""
        rows = self.db.execute(f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE end IS NULL")
        return [_attempt(r) for r in rows]

    def gpu_time(self, since: float) -> list[tuple[str, float, float]]:
        """(user, GPU-seconds, end) of every attempt that ended after ``since``: a restarted
        daemon's fair-share usage (``fairness.Usage``) is rebuilt from them."""
        rows = self.db.execute(
            "SELECT json_extract(j.spec, '$.user'), a.start, a.end, json_array_length(a.gpus)"
            " FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.end IS NOT NULL AND a.end > ?",
            (since,))
        return [(user or "", n * max(0.0, end - start), end) for user, start, end, n in rows]

    # -- history ---------------------------------------------------------------------------
    def record_history(self, identity: str, peak_mib: float | None, belief: Belief | None,
                       family: str | None = None) -> None:
        """A successful run of a job: its peak (when measured) and what it taught of its
        activity (when readings did), each replacing the last run's."""
        sm = dram = sm_var = dram_var = None
        source = None
        if belief is not None:
            sm, dram = belief.profile.sm_activity, belief.profile.dram_activity
            sm_var, dram_var, source = belief.sm_var, belief.dram_var, belief.source
        self.db.execute(
            "INSERT INTO job_history (identity, family, peak_mib, sm, dram, sm_var, dram_var, source,"
            " runs, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?) ON CONFLICT (identity) DO UPDATE SET"
            " family = COALESCE(excluded.family, family), peak_mib = COALESCE(excluded.peak_mib, peak_mib),"
            " sm = COALESCE(excluded.sm, sm), dram = COALESCE(excluded.dram, dram),"
            " sm_var = COALESCE(excluded.sm_var, sm_var), dram_var = COALESCE(excluded.dram_var, dram_var),"
            " source = COALESCE(excluded.source, source), runs = runs + 1, updated = excluded.updated",
            (identity, family, peak_mib, sm, dram, sm_var, dram_var, source, time.time()),
        )

    def history_peak(self, identity: str) -> float | None:
        """The measured peak of the last successful run of this job, if any."""
        row = self.db.execute("SELECT peak_mib FROM job_history WHERE identity = ?", (identity,)).fetchone()
        return None if row is None else row[0]

    def identity_belief(self, identity: str) -> Belief | None:
        """What earlier runs of this job taught of its activity (``knowledge.ProfileStore``)."""
        row = self.db.execute("SELECT sm, dram, sm_var, dram_var FROM job_history WHERE identity = ?"
                              " AND sm IS NOT NULL", (identity,)).fetchone()
        return None if row is None else _history_belief(*row)

    def family_beliefs(self, family: str, limit: int) -> dict[str, Belief]:
        """The beliefs of the family's ``limit`` most recently measured identities."""
        rows = self.db.execute(
            "SELECT identity, sm, dram, sm_var, dram_var FROM job_history WHERE family = ?"
            " AND sm IS NOT NULL ORDER BY updated DESC LIMIT ?", (family, limit)).fetchall()
        return {identity: _history_belief(*rest) for identity, *rest in rows}

    # -- flags -----------------------------------------------------------------------------
    def get_flag(self, key: str) -> bool:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return bool(row and row[0] == "1")

    def set_flag(self, key: str, value: bool) -> None:
        self.db.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, "1" if value else "0"),
        )

    def clear_flag(self, key: str) -> None:
        self.db.execute("DELETE FROM meta WHERE key = ?", (key,))

    # -- limits ----------------------------------------------------------------------------
    def fairness(self) -> Fairness:
        """The per-user caps and fair-share setting the daemon's owner set (``collocate limits``)."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'limits'").fetchone()
        if row is None:
            return Fairness()
        d = json.loads(row[0])
        return Fairness(fair_share=d.get("fair_share", True),
                        default=UserLimits(**d.get("default", {})),
                        users={u: UserLimits(**lim) for u, lim in d.get("users", {}).items()})

    def set_fairness(self, fairness: Fairness) -> None:
        value = json.dumps({"fair_share": fairness.fair_share, "default": asdict(fairness.default),
                            "users": {u: asdict(lim) for u, lim in fairness.users.items()}})
        self.db.execute("INSERT INTO meta VALUES ('limits', ?) ON CONFLICT (key) DO UPDATE SET"
                        " value = excluded.value", (value,))


def _attempt(r: tuple) -> Attempt:
    runners = tuple((pid, started) for pid, started in json.loads(r[16])) if r[16] else ()
    return Attempt(r[0], r[1], r[2], tuple(json.loads(r[3])), tuple(json.loads(r[4])), r[5],
                   mem_mib=r[6], end=r[7], pid=r[8], pid_started=r[9], returncode=r[10], outcome=r[11],
                   reason=r[12], peak_mib=r[13], solo_sm=r[14], solo_dram=r[15], runners=runners,
                   host=r[17] or "")


def _history_belief(sm: float, dram: float, sm_var: float | None, dram_var: float | None) -> Belief:
    return from_history(JobProfile(sm, dram), math.sqrt(sm_var or 0.0), math.sqrt(dram_var or 0.0))
