"""The shared state of emulated GPUs: one SQLite file that the daemon and emulated jobs all use.

Why SQLite: many processes (the daemon's sampler, every emulated job, ``collocate gpus`` in a
shell) read and change claims at once. SQLite in WAL mode with a busy timeout gives atomic
check-and-claim transactions (``BEGIN IMMEDIATE``) without a lock server, and survives a process
being killed mid-write. The file must live on a local file system (WAL needs shared memory).

Tables (``<state_dir>/emulated.sqlite``):

* ``devices``: one row per schedulable device (a whole GPU, or a MIG instance in its place,
  with its parent's uuid and its profile);
* ``claims``: (pid, process start time, device uuid) → claimed MiB and the claimant's solo SM and
  DRAM activity. A claim whose pid is gone, is a zombie, or now belongs to another process
  (start time differs: the pid was reused) is dead and is ignored and deleted;
* ``energy``: per device, the joules integrated so far, and the power and time of the last sample.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from collocate.common.errors import CollocateError

DB_NAME = "emulated.sqlite"
BUSY_TIMEOUT_S = 30.0
_START_TIME_TOLERANCE_S = 0.05  # psutil start times are jiffies (10 ms) off a fixed boot time

_SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    uuid TEXT PRIMARY KEY, ord INTEGER NOT NULL, node TEXT NOT NULL, idx INTEGER NOT NULL,
    mig TEXT, type_name TEXT NOT NULL, total_mib REAL NOT NULL, sm_count INTEGER NOT NULL,
    sm_fraction REAL NOT NULL, parent_uuid TEXT, mig_profile TEXT,
    idle_watts REAL NOT NULL, max_watts REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS claims (
    pid INTEGER NOT NULL, started REAL NOT NULL, uuid TEXT NOT NULL, mib REAL NOT NULL,
    sm REAL NOT NULL, dram REAL NOT NULL, since REAL NOT NULL,
    rate REAL NOT NULL DEFAULT 1.0,
    PRIMARY KEY (pid, uuid)
);
CREATE TABLE IF NOT EXISTS energy (
    uuid TEXT PRIMARY KEY, joules REAL NOT NULL, watts REAL NOT NULL, at REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """A schedulable emulated device as stored."""

    uuid: str
    ord: int
    node: str
    idx: int
    mig: str | None
    type_name: str
    total_mib: float
    sm_count: int
    sm_fraction: float  # share of the parent GPU's compute (1.0 for a whole GPU)
    parent_uuid: str | None
    mig_profile: str | None
    idle_watts: float
    max_watts: float


@dataclass(frozen=True, slots=True)
class Claim:
    pid: int
    started: float
    uuid: str
    mib: float
    sm: float  # solo activities: what the interference model takes
    dram: float
    rate: float = 1.0  # progress over solo speed: the GPU reads sm * rate (realized activity)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a claim did not fit: the numbers PyTorch puts in its out-of-memory message."""

    uuid: str
    requested_mib: float  # the increase that was asked for
    total_mib: float
    free_mib: float
    own_mib: float  # what this process already holds on the device
    others: tuple[tuple[int, float], ...]  # (pid, MiB) of the other live claimants


def process_start_time(pid: int) -> float | None:
    """Start time of a live, non-zombie process, or None: the second half of a claim's identity."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def claim_is_live(pid: int, started: float) -> bool:
    now_started = process_start_time(pid)
    return now_started is not None and abs(now_started - started) < _START_TIME_TOLERANCE_S


def is_frozen(pid: int) -> bool:
    """Whether a process is frozen (its cgroup's freezer, v1 or v2) or stopped (SIGSTOP): it
    launches no kernels, so an emulated GPU reads no activity of it, as a real one would."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] in "Tt":
            return True
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "freezer":
                state = Path(f"/sys/fs/cgroup/freezer{path}/freezer.state")
                return state.exists() and state.read_text().strip() != "THAWED"
            if controllers == "":
                freeze = Path(f"/sys/fs/cgroup{path}/cgroup.freeze")
                if freeze.exists() and freeze.read_text().strip() == "1":
                    return True
    except (OSError, ValueError, IndexError):
        return False
    return False


class StateStore:
    """Transactions on the shared state file.

    A fresh connection per call, so one store is safe across threads and forks.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / DB_NAME

    @classmethod
    def open_existing(cls, state_dir: Path) -> StateStore:
        """Open state the daemon created; a clear error if there is none (jobs call this)."""
        store = cls(state_dir)
        try:
            store.path.stat()
            usable = os.access(store.path, os.R_OK | os.W_OK)
            exists = True
        except FileNotFoundError:
            exists = False
        except OSError:  # a directory it may not enter: the state is there, but not ours
            exists, usable = True, False
        if exists and not usable:
            raise CollocateError(
                f"emulated GPU state {store.path} is the daemon's, and this process (uid "
                f"{os.getuid()}) may not use it",
                hint="a daemon shared with `collocate serve --group G` lets G's members' jobs use "
                "its emulated GPUs; run the job through that daemon, as a member of G")
        if not exists:
            raise CollocateError(
                f"no emulated GPU state in {state_dir}",
                hint="start the daemon with --gpus emulated:4xA100-40GB (it creates the state), "
                "or pass the same --state-dir / COLLOCATE_EMULATED_DIR the daemon uses",
            )
        return store

    def create(self) -> None:
        """Create the directory and tables if missing; safe to call from several processes."""
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CollocateError(
                f"cannot create emulated GPU state directory {self.state_dir}: {exc}",
                hint="pick a writable local directory with --state-dir",
            ) from exc
        with sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S) as db:
            db.execute("PRAGMA journal_mode = WAL")  # persistent: stored in the database file
        db.close()
        with self.tx() as db:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)
            if "rate" not in {r[1] for r in db.execute("PRAGMA table_info(claims)")}:  # older state
                db.execute("ALTER TABLE claims ADD COLUMN rate REAL NOT NULL DEFAULT 1.0")

    def keep_open(self) -> sqlite3.Connection:
        """A connection held for the daemon's life. While one is open SQLite keeps the -wal and
        -shm files, so they are made once (and shared with a ``--group`` by the daemon) rather
        than re-made by every short connection below: each re-made file is briefly 0600 under
        the daemon's umask, and a member's job opening it then failed with "unable to open
        database file"."""
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        db.execute("SELECT count(*) FROM devices").fetchone()
        return db

    @contextmanager
    def tx(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction; ``write`` takes the write lock up front so check-and-claim is atomic."""
        try:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (sqlite3.Error, OSError) as exc:
            raise CollocateError(
                f"cannot open emulated GPU state {self.path}: {exc}",
                hint="check the directory exists, is writable and is on a local file system",
            ) from exc
        try:
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    # -- devices ---------------------------------------------------------------------------

    def devices(self) -> list[DeviceRow]:
        with self.tx(write=False) as db:
            return read_devices(db)

    # -- claims ----------------------------------------------------------------------------

    def live_claims(
        self, *, collect: bool = False, uuids: Collection[str] | None = None
    ) -> list[Claim]:
        """Claims of live processes (on ``uuids`` only, when given); ``collect`` also deletes
        dead ones (takes the write lock)."""
        with self.tx(write=collect) as db:
            return read_live_claims(db, delete_dead=collect, uuids=uuids)

    def claim(
        self, uuid: str, pid: int, started: float, mib: float, sm: float, dram: float
    ) -> Refusal | None:
        """Set this process's claim on ``uuid`` to ``mib`` if it fits; else change nothing.

        Returns None on success, or a ``Refusal`` with the numbers of the failed allocation.
        """
        with self.tx() as db:
            device = next((d for d in read_devices(db) if d.uuid == uuid), None)
            if device is None:
                raise CollocateError(
                    f"no emulated device {uuid}",
                    hint="CUDA_VISIBLE_DEVICES must name devices listed by the emulated backend",
                )
            claims = read_live_claims(db, delete_dead=True, uuids=(uuid,))
            own = sum(c.mib for c in claims if c.pid == pid)
            others = [(c.pid, c.mib) for c in claims if c.pid != pid]
            used_by_others = sum(m for _, m in others)
            if mib > own and used_by_others + mib > device.total_mib + 1e-6:
                return Refusal(
                    uuid, mib - own, device.total_mib,
                    max(0.0, device.total_mib - used_by_others - own), own, tuple(others),
                )
            db.execute(
                "INSERT INTO claims (pid, started, uuid, mib, sm, dram, since)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (pid, uuid) DO UPDATE SET"
                " started = excluded.started, mib = excluded.mib, sm = excluded.sm,"
                " dram = excluded.dram",
                (pid, started, uuid, mib, sm, dram, time.time()),
            )
            return None

    def set_rate(self, pid: int, rate: float) -> None:
        """Record how fast this process progresses (1 / slowdown), for realized activity."""
        with self.tx() as db:
            db.execute("UPDATE claims SET rate = ? WHERE pid = ?", (rate, pid))

    def release(self, pid: int) -> None:
        """Drop every claim of ``pid`` (a job calls this on each exit path)."""
        with self.tx() as db:
            db.execute("DELETE FROM claims WHERE pid = ?", (pid,))

    # -- energy ----------------------------------------------------------------------------

    def advance_energy(self, watts: dict[str, float], now: float) -> dict[str, float]:
        """Integrate power since the last sample (trapezoid) and store it; returns joules per uuid.

        Concurrent samplers each add only the interval since the last stored time, so the
        counter never double-counts and never goes down (a clock stepping back adds nothing).
        """
        out: dict[str, float] = {}
        with self.tx() as db:
            rows = {
                r[0]: (r[1], r[2], r[3])
                for r in db.execute("SELECT uuid, joules, watts, at FROM energy")
            }
            for uuid, w in watts.items():
                joules, last_w, at = rows.get(uuid, (0.0, w, now))
                dt = max(0.0, now - at)
                joules += 0.5 * (last_w + w) * dt
                db.execute(
                    "INSERT INTO energy (uuid, joules, watts, at) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (uuid) DO UPDATE SET joules = excluded.joules,"
                    " watts = excluded.watts, at = excluded.at",
                    (uuid, joules, w, max(now, at)),
                )
                out[uuid] = joules
        return out


def read_devices(db: sqlite3.Connection) -> list[DeviceRow]:
    rows = db.execute(
        "SELECT uuid, ord, node, idx, mig, type_name, total_mib, sm_count, sm_fraction,"
        " parent_uuid, mig_profile, idle_watts, max_watts FROM devices ORDER BY ord"
    )
    return [DeviceRow(*r) for r in rows]


def read_live_claims(
    db: sqlite3.Connection, *, delete_dead: bool, uuids: Collection[str] | None = None
) -> list[Claim]:
    query, args = "SELECT pid, started, uuid, mib, sm, dram, rate FROM claims", tuple(uuids or ())
    if uuids is not None:
        query += f" WHERE uuid IN ({','.join('?' * len(args)) or 'NULL'})"
    claims = [Claim(*r) for r in db.execute(query, args)]
    liveness: dict[tuple[int, float], bool] = {}
    live: list[Claim] = []
    for c in claims:
        key = (c.pid, c.started)
        if key not in liveness:
            liveness[key] = claim_is_live(c.pid, c.started)
        if liveness[key]:
            live.append(replace(c, sm=0.0, dram=0.0) if is_frozen(c.pid) else c)
        elif delete_dead:
            db.execute("DELETE FROM claims WHERE pid = ? AND started = ?", key)
    return live
