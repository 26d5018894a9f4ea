"""CPU, host memory and I/O of each job's whole process tree, read from ``/proc``.

Why a tree and not a pid: a training job is a launcher (the daemon's runner), a Python process,
its DataLoader workers and whatever they spawn; the GPU work and most of the CPU work happen in
descendants of the root. One scan of ``/proc/*/stat`` (``scan``) gives every process's parent,
CPU time, start time and resident memory at once; it runs every ``FULL_SCAN_EVERY`` readings,
for a new job, and whenever a GPU reports a pid no known tree holds. In between only the known
trees' own ``stat`` files are read, so the cost follows the jobs, not the machine. A non-GPU
child spawned in between is found by the next full scan (its CPU is not lost: a process seen
for the first time contributes all its CPU so far). psutil replaces ``/proc`` elsewhere.

CPU is reported as the CPU seconds consumed since the previous reading (user + system of every
live process of the tree, each process compared with its own previous value; a process seen for
the first time contributes all its CPU so far) and as percent of one core. Processes that exit
between two readings lose the CPU they used after the last reading;
``children_user``/``children_system`` are ignored on purpose, because they jump when a parent
reaps a child whose time was already counted. I/O counters are cumulative bytes of the live tree,
refreshed every ``IO_EVERY`` readings (``/proc/<pid>/io`` costs several times a ``stat`` read)
and for every new process; they need the same user or root, and an unreadable one makes the
job's I/O missing (None), not zero.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import psutil

_PROC = "/proc"
_HAVE_PROC = os.path.isdir(_PROC)
IO_EVERY = 5  # read /proc/<pid>/io every this many readings (slow to read; a cumulative counter)
FULL_SCAN_EVERY = 10  # scan all of /proc every this many readings (or when a GPU pid is unknown)
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True, slots=True)
class TreeUsage:
    """One reading of one job's process tree."""

    pids: frozenset[int]
    cpu_s: float  # CPU seconds used since the previous reading of this job
    cpu_percent: float  # cpu_s / wall seconds x 100 (100 = one core); 0 on the first reading
    rss_mib: float  # resident memory summed over the tree (shared pages counted per process)
    read_bytes: int | None  # cumulative, live processes only; None when unreadable
    write_bytes: int | None


EMPTY = TreeUsage(frozenset(), 0.0, 0.0, 0.0, None, None)


@dataclass(frozen=True, slots=True)
class ProcStat:
    ppid: int
    cpu_s: float  # user + system
    started: float  # start time in clock ticks since boot (or epoch seconds from psutil)
    rss_bytes: float


def scan() -> dict[int, ProcStat]:
    """Every live, non-zombie process on the machine, from ``/proc`` (psutil elsewhere)."""
    if not _HAVE_PROC:
        return _scan_psutil()
    out: dict[int, ProcStat] = {}
    for name in os.listdir(_PROC):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                out[int(name)] = stat
    return out


def read_stat(pid: int) -> ProcStat | None:
    """Parse ``/proc/<pid>/stat`` (fields after the parenthesised command name); None if gone."""
    data = _read(f"{_PROC}/{pid}/stat")
    if data is None:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):  # zombie or dead: its resources are already released
        return None
    return ProcStat(int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLK_TCK,
                    float(fields[19]), float(fields[21]) * _PAGE)


def read_io(pid: int) -> tuple[int, int] | None:
    """Cumulative (read_bytes, write_bytes) of a process; None when not readable."""
    if not _HAVE_PROC:
        try:
            c = psutil.Process(pid).io_counters()
            return c.read_bytes, c.write_bytes
        except (psutil.Error, AttributeError):
            return None
    text = _read(f"{_PROC}/{pid}/io")  # None: another user's process, or gone
    if text is None:
        return None
    values = dict(line.split(b": ") for line in text.splitlines() if b": " in line)
    return int(values[b"read_bytes"]), int(values[b"write_bytes"])


def _read(path: str) -> bytes | None:
    """A small /proc file in one read (os-level: half the cost of ``open().read()``)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _scan_psutil() -> dict[int, ProcStat]:
    out: dict[int, ProcStat] = {}
    for p in psutil.process_iter(["ppid", "cpu_times", "create_time", "memory_info", "status"]):
        info = p.info
        if info.get("status") == psutil.STATUS_ZOMBIE or info.get("cpu_times") is None:
            continue
        times, mem = info["cpu_times"], info["memory_info"]
        out[p.pid] = ProcStat(info["ppid"] or 0, times.user + times.system,
                              info["create_time"] or 0.0, float(mem.rss) if mem else 0.0)
    return out


def descendants(root: int, children: Mapping[int, list[int]]) -> set[int]:
    """``root`` and every descendant in ``children`` (cycles from pid reuse are cut)."""
    out, stack = {root}, [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


class TreeReader:
    """Reads job trees tick after tick, remembering each process's CPU time for the deltas.

    Processes are keyed by (pid, start time), so a reused pid never inherits another process's
    counters. Not thread-safe: the daemon's loop thread owns it.
    """

    def __init__(self, *, io_every: int = IO_EVERY, full_scan_every: int = FULL_SCAN_EVERY
                 ) -> None:
        self._cpu: dict[tuple[int, float], float] = {}
        self._io: dict[tuple[int, float], tuple[int, int] | None] = {}
        self._last_time: dict[str, float] = {}
        self._io_every = max(1, io_every)
        self._full_every = max(1, full_scan_every)
        self._readings = 0
        self._known: dict[str, set[int]] = {}  # job id -> pids of its tree at the last reading

    def read(self, roots: Mapping[str, int], now: float,
             gpu_pids: AbstractSet[int] = frozenset()) -> dict[str, TreeUsage]:
        """One reading of every job in ``{job_id: root pid}``; a gone root gives ``EMPTY``.

        ``gpu_pids`` are the processes the GPUs report: one that no known tree holds (a worker
        just spawned) triggers a full scan at once, so GPU attribution never waits for one.
        """
        trees = self._trees(roots, gpu_pids)
        new_cpu: dict[tuple[int, float], float] = {}
        new_io: dict[tuple[int, float], tuple[int, int] | None] = {}
        fresh_io = self._readings % self._io_every == 0
        self._readings += 1
        out: dict[str, TreeUsage] = {}
        for job_id in roots:
            found = trees.get(job_id)
            if not found:
                out[job_id] = EMPTY
                continue
            pids = set(found)
            cpu_s, rss, rd, wr, io_ok = 0.0, 0.0, 0, 0, True
            for pid, st in found.items():
                key = (pid, st.started)
                cpu_s += max(0.0, st.cpu_s - self._cpu.get(key, 0.0))
                new_cpu[key] = st.cpu_s
                rss += st.rss_bytes
                io = read_io(pid) if fresh_io or key not in self._io else self._io[key]
                new_io[key] = io
                if io is None:
                    io_ok = False
                else:
                    rd, wr = rd + io[0], wr + io[1]
            wall = now - self._last_time.get(job_id, now)
            self._last_time[job_id] = now
            out[job_id] = TreeUsage(
                frozenset(pids), cpu_s, 100.0 * cpu_s / wall if wall > 0 else 0.0,
                rss / 2**20, rd if io_ok else None, wr if io_ok else None,
            )
        self._cpu, self._io = new_cpu, new_io
        self._known = {j: set(t) for j, t in trees.items() if t}
        for job_id in [j for j in self._last_time if j not in roots]:
            del self._last_time[job_id]
        return out

    def _trees(self, roots: Mapping[str, int], gpu_pids: AbstractSet[int]
               ) -> dict[str, dict[int, ProcStat]]:
        """Each job's live processes with their stats: from a full scan when one is due, else
        by re-reading only the processes of the trees found last time."""
        known = set().union(*self._known.values()) if self._known else set()
        full = (self._readings % self._full_every == 0
                or any(j not in self._known for j in roots)
                or bool(set(gpu_pids) - known))
        if full:
            stats = scan() if roots else {}
            children: dict[int, list[int]] = {}
            for pid, st in stats.items():
                children.setdefault(st.ppid, []).append(pid)
            return {j: {p: stats[p] for p in descendants(root, children)} if root in stats
                    else {} for j, root in roots.items()}
        out: dict[str, dict[int, ProcStat]] = {}
        for job_id, root in roots.items():
            alive = {p: stat for p in self._known[job_id] if (stat := read_stat(p)) is not None}
            out[job_id] = alive if root in alive else {}
        return out
