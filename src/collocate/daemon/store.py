"""The daemon's persistent state: jobs, their attempts, measured history, a few flags.

Embedded SQLite in WAL mode, so a daemon killed mid-write loses at most the transaction in
flight and a restarted daemon finds every job. Only the daemon's loop thread writes (one
connection, one place), which keeps the queue order and the attempt records consistent.

Tables:

* ``jobs``: the scheduler's ``Job`` (JSON), the launch ``JobSpec`` (JSON), submit order;
* ``attempts``: one row per launch: start/end, GPUs, the runner's pid and process start time
  (to re-adopt it after a restart), exit status, outcome, reason, measured peak memory and solo
  activity profile (``collocate.activity``; NULL when the job never ran alone long enough);
* ``history``: per job signature (command, arguments, cwd), the measured peak and solo profile
  of its last successful run, used as the estimate of later jobs with the same signature; and
  the job's program (script and cwd, ``JobSpec.program``), whose other signatures' profiles
  stand in for a new command's;
* ``meta``: the id counter and the drain flag.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from collocate.daemon.faults import disk_full, is_disk_full
from collocate.daemon.spec import JobSpec
from collocate.errors import CollocateError
from collocate.model import UNKNOWN_PROFILE, Job, JobProfile, JobState
from collocate.sqlite import open_wal

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, job TEXT NOT NULL, spec TEXT NOT NULL,
    submitted REAL NOT NULL, ended REAL
);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL, n INTEGER NOT NULL, start REAL NOT NULL, end REAL,
    gpus TEXT NOT NULL, uuids TEXT NOT NULL, mem_mib REAL, dir TEXT NOT NULL,
    pid INTEGER, pid_started REAL, returncode INTEGER, outcome TEXT, reason TEXT,
    peak_mib REAL, sm_activity REAL, solo_sm REAL, solo_dram REAL, PRIMARY KEY (job_id, n)
);
CREATE TABLE IF NOT EXISTS history (
    signature TEXT PRIMARY KEY, peak_mib REAL NOT NULL, sm_activity REAL, runs INTEGER NOT NULL,
    updated REAL NOT NULL, solo_sm REAL, solo_dram REAL, program TEXT
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Columns added after the first release: in the schema above, and added to older files on open.
# The solo profile got new columns instead of reusing ``sm_activity``, which held the mean of
# NVML's per-process utilization (another quantity, biased by warm-up and neighbours); that
# column is no longer read, so a profile from before is not taken for a measured one.
_ADDED_COLUMNS = {
    "jobs": ("submit_key TEXT",),
    "attempts": ("solo_sm REAL", "solo_dram REAL"),
    "history": ("solo_sm REAL", "solo_dram REAL", "program TEXT"),
}
_ATTEMPT_COLUMNS = ("job_id, n, start, gpus, uuids, dir, mem_mib, end, pid, pid_started,"
                    " returncode, outcome, reason, peak_mib, solo_sm, solo_dram")


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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpus"], d["uuids"] = list(self.gpus), list(self.uuids)
        return d


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
    if "after" in d:  # JSON has no tuples
        d["after"] = tuple(d["after"])
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
            self.db.execute("CREATE INDEX IF NOT EXISTS history_program ON history (program)")
            self.db.execute("CREATE UNIQUE INDEX IF NOT EXISTS jobs_submit_key ON jobs (submit_key)")
            self._mark()
        except sqlite3.Error as exc:
            self.db.close()
            raise self._unusable(exc) from None

    @property
    def _marker(self) -> Path:
        """``collocate.sqlite.id``: the store's random id, kept beside it. It outlives a store
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
                hint="restore collocate.sqlite from a backup; or move the state dir aside and start "
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
                hint="put the original collocate.sqlite back, or start on a fresh state dir")
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
                              hint="restore collocate.sqlite from a backup, or move the state dir "
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

    def job(self, job_id: str) -> tuple[Job, JobSpec, float | None] | None:
        row = self.db.execute("SELECT job, spec, ended FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else (job_from_json(row[0]), JobSpec.from_json(row[1]), row[2])

    # -- attempts --------------------------------------------------------------------------
    def add_attempt(self, a: Attempt) -> None:
        self.db.execute(
            "INSERT INTO attempts (job_id, n, start, gpus, uuids, mem_mib, dir)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (a.job_id, a.n, a.start, json.dumps(a.gpus), json.dumps(a.uuids), a.mem_mib, a.dir),
        )

    def update_attempt(self, a: Attempt) -> None:
        self.db.execute(
            "UPDATE attempts SET end = ?, pid = ?, pid_started = ?, returncode = ?, outcome = ?,"
            " reason = ?, peak_mib = ?, solo_sm = ?, solo_dram = ? WHERE job_id = ? AND n = ?",
            (a.end, a.pid, a.pid_started, a.returncode, a.outcome, a.reason, a.peak_mib,
             a.solo_sm, a.solo_dram, a.job_id, a.n),
        )

    def attempts(self, job_id: str) -> list[Attempt]:
        rows = self.db.execute(
            f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY n", (job_id,))
        return [_attempt(r) for r in rows]

    def open_attempts(self) -> list[Attempt]:
        """Attempts with no end: the jobs that were running when the daemon last stopped."""
        rows = self.db.execute(f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE end IS NULL")
        return [_attempt(r) for r in rows]

    # -- history ---------------------------------------------------------------------------
    def record_history(self, signature: str, peak_mib: float, profile: JobProfile | None,
                       program: str | None = None) -> None:
        """The latest successful run's peak; its profile too, unless it never ran alone long
        enough to measure one (then the previous run's profile stays)."""
        sm, dram = (None, None) if profile is None else (profile.sm_activity, profile.dram_activity)
        self.db.execute(
            "INSERT INTO history (signature, peak_mib, runs, updated, solo_sm, solo_dram, program)"
            " VALUES (?, ?, 1, ?, ?, ?, ?) ON CONFLICT (signature) DO UPDATE SET"
            " peak_mib = excluded.peak_mib, runs = runs + 1, updated = excluded.updated,"
            " solo_sm = COALESCE(excluded.solo_sm, solo_sm),"
            " solo_dram = COALESCE(excluded.solo_dram, solo_dram),"
            " program = COALESCE(excluded.program, program)",
            (signature, peak_mib, time.time(), sm, dram, program),
        )

    def program_profiles(self, program: str, limit: int) -> list[JobProfile]:
        """The solo profiles of the program's ``limit`` most recent measured commands
        (``collocate.knowledge.ProfileStore``)."""
        rows = self.db.execute(
            "SELECT solo_sm, solo_dram FROM history WHERE program = ? AND solo_sm IS NOT NULL"
            " ORDER BY updated DESC LIMIT ?", (program, limit),
        ).fetchall()
        return [JobProfile(sm, dram) for sm, dram in rows]

    def command_profile(self, command: str) -> JobProfile | None:
        """The solo profile of the last run of this signature that had one."""
        known = self.history(command)
        return None if known is None else known[1]

    def history(self, signature: str) -> tuple[float, JobProfile | None] | None:
        """The measured peak of the last successful run with this signature, and the solo
        profile measured in the last run that had one."""
        row = self.db.execute(
            "SELECT peak_mib, solo_sm, solo_dram FROM history WHERE signature = ?", (signature,)
        ).fetchone()
        if row is None:
            return None
        return row[0], None if row[1] is None else JobProfile(row[1], row[2])

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


def _attempt(r: tuple) -> Attempt:
    return Attempt(r[0], r[1], r[2], tuple(json.loads(r[3])), tuple(json.loads(r[4])), r[5],
                   *r[6:])


def with_profile(job: Job, profile: JobProfile | None, source: str = "history") -> Job:
    """The job with a measured solo profile, when history has one (``Job.profile_source``)."""
    return job if profile is None else replace(job, profile=profile, profile_source=source)
