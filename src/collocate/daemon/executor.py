"""Where attempts run: the one seam between the daemon's loop and the processes of its jobs.

The loop decides (place, cancel, classify an exit); an ``Executor`` does what touches the jobs'
machine: start a runner from a ``LaunchPlan``, tell whether it still runs, signal its process
group, read its records and logs, find its processes, and collect strays. ``LocalExecutor`` does
all of it on this machine. An executor for other machines (an agent per node) implements the same
protocol; nothing else in the daemon starts, signals or inspects a job's process.

A *handle* is what ``start`` returns to poll the runner by (a ``Popen`` here); a re-adopted
attempt has none, and is followed by its recorded pid and process start time instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol

from collocate.daemon import views
from collocate.daemon.launcher import LaunchPlan, process_matches, start
from collocate.daemon.paths import attempt_files
from collocate.daemon.reaping import OrphanedJob, adopt_orphan, job_started, reap_strays
from collocate.daemon.runner import read_tail
from collocate.monitor.process_tree import TreeReader, TreeUsage


class Executor(Protocol):
    """What the daemon's loop needs from the machine its jobs run on (see the module docstring)."""

    def start(self, plan: LaunchPlan) -> tuple[Any, int, float]:
        """Start the attempt's runner: ``(handle, pid, process start time)``; raises on failure."""
        ...

    def poll(self, handle: Any, pid: int | None, started: float | None) -> tuple[bool, int | None]:
        """``(alive, runner exit status)``; the status is known only with a handle."""
        ...

    def matches(self, pid: int | None, started: float | None) -> bool:
        """Whether the runner recorded as ``pid`` started at ``started`` still runs."""
        ...

    def signal(self, pid: int | None, sig: int) -> None:
        """Signal the job's whole process group (gone is fine)."""
        ...

    def exit_record(self, attempt_dir: Path) -> dict[str, Any] | None: ...

    def started_record(self, attempt_dir: Path) -> dict[str, Any] | None: ...

    def stderr_tail(self, attempt_dir: Path) -> str: ...

    def job_started(self, attempt_dir: Path) -> bool: ...

    def adopt_orphan(self, attempt_dir: Path) -> Any | None:
        """A handle on the job itself when its runner died and it is ours now, else None."""
        ...

    def is_orphan(self, handle: Any) -> bool: ...

    def read_trees(self, roots: Mapping[str, int], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        """One reading of each job's process tree (``{job_id: runner pid}``), once per tick."""
        ...

    def collect(self, keep: set[int]) -> None:
        """Collect exited processes the jobs left behind, except ``keep``."""
        ...


class LocalExecutor:
    """Runs attempts on this machine: runners in their own sessions, ``/proc`` for the trees."""

    def __init__(self) -> None:
        self._trees = TreeReader()

    def start(self, plan: LaunchPlan) -> tuple[Any, int, float]:
        proc, started = start(plan)
        return proc, proc.pid, started

    def poll(self, handle: Any, pid: int | None, started: float | None) -> tuple[bool, int | None]:
        if handle is not None:
            status = handle.poll()
            return status is None, status
        return process_matches(pid, started), None

    def matches(self, pid: int | None, started: float | None) -> bool:
        return process_matches(pid, started)

    def signal(self, pid: int | None, sig: int) -> None:
        if not pid:  # the runner's pid is its process group's id
            return
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def exit_record(self, attempt_dir: Path) -> dict[str, Any] | None:
        return views.read_exit(attempt_dir)

    def started_record(self, attempt_dir: Path) -> dict[str, Any] | None:
        return views.read_json(attempt_files(attempt_dir)["started"])

    def stderr_tail(self, attempt_dir: Path) -> str:
        return read_tail(attempt_files(attempt_dir)["stderr"])

    def job_started(self, attempt_dir: Path) -> bool:
        return job_started(attempt_dir)

    def adopt_orphan(self, attempt_dir: Path) -> Any | None:
        return adopt_orphan(attempt_dir)

    def is_orphan(self, handle: Any) -> bool:
        return isinstance(handle, OrphanedJob)

    def read_trees(self, roots: Mapping[str, int], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        return self._trees.read(roots, now, gpu_pids)

    def collect(self, keep: set[int]) -> None:
        reap_strays(keep)
