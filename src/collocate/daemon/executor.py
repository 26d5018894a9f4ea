"""Where attempts run: the one seam between the daemon's loop and the processes of its jobs.

The loop decides (place, cancel, classify an exit); an ``Executor`` does what touches the jobs'
machine: start a runner from a ``LaunchPlan``, tell whether it still runs, signal its process
group, read its records and logs, find its processes, collect strays, and say where a job's
``--dataset`` producer runs (its machine's). ``LocalExecutor`` does
all of it on this machine. An executor for other machines (an agent per node) implements the same
protocol; nothing else in the daemon starts, signals or inspects a job's process.

Every call about one attempt takes its ``Attempt`` row (``daemon/store.py``): its folder, its
runner's pid and process start time, and its GPUs (whose node says where it runs). A *handle* is
what ``start`` returns to poll the runner by (a ``Popen`` here); a re-adopted attempt has none,
and is followed by its recorded pid and process start time instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol

from collocate.daemon import views
from collocate.daemon.cgroups import Cgroups
from collocate.daemon.confine import Confinement
from collocate.daemon.launcher import LaunchPlan, process_matches, start, with_runner_args
from collocate.daemon.paths import attempt_files
from collocate.daemon.reaping import OrphanedJob, adopt_orphan, job_started, reap_strays
from collocate.daemon.runner import read_tail
from collocate.daemon.store import Attempt
from collocate.gpus.base import DeviceInfo
from collocate.monitor.job_metrics import METRICS_FILE_NAME, MetricPoint, MetricsTail
from collocate.monitor.process_tree import TreeReader, TreeUsage


class MachineUnreachable(OSError):
    """The machine that should run an attempt did not answer (``start`` raises it): not the
    job's fault, so the attempt is lost and the job requeued, never failed."""


class Executor(Protocol):
    """What the daemon's loop needs from the machine its jobs run on (see the module docstring)."""

    def start(self, plan: LaunchPlan, attempt: Attempt) -> tuple[Any, int, float]:
        """Start the attempt's runner: ``(handle, pid, process start time)``; raises on failure."""
        ...

    def poll(self, handle: Any, attempt: Attempt) -> tuple[bool, int | None]:
        """``(alive, runner exit status)``; the status is known only with a handle."""
        ...

    def matches(self, attempt: Attempt) -> bool:
        """Whether the attempt's recorded runner (pid and process start time) still runs."""
        ...

    def signal(self, attempt: Attempt, sig: int) -> None:
        """Signal the job's whole process tree (gone is fine)."""
        ...

    def release(self, attempt: Attempt) -> None:
        """The attempt has ended: stop anything of it still running and free its cgroup."""
        ...

    def exit_record(self, attempt: Attempt) -> dict[str, Any] | None: ...

    def started_record(self, attempt: Attempt) -> dict[str, Any] | None: ...

    def stderr_tail(self, attempt: Attempt) -> str: ...

    def job_started(self, attempt: Attempt) -> bool: ...

    def read_log(self, attempt: Attempt, stream: str, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of the attempt's ``stdout`` or ``stderr`` from ``offset``."""
        ...

    def adopt_orphan(self, attempt: Attempt) -> Any | None:
        """A handle on the job itself when its runner died and it is ours now, else None."""
        ...

    def is_orphan(self, handle: Any) -> bool: ...

    def read_trees(self, roots: Mapping[str, Attempt], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        """One reading of each launched job's process tree (``{job_id: attempt}``), once per tick."""
        ...

    def read_metrics(self, attempts: Mapping[str, Attempt]) -> list[MetricPoint]:
        """The launched jobs' new ``log_metric`` points (``{job_id: attempt}``) since the last
        call, once per tick, read where the jobs run; files of jobs no longer asked about are
        closed."""
        ...

    def collect(self, keep: set[int]) -> None:
        """Collect exited processes the jobs left behind, except ``keep``."""
        ...

    def datasets_of(self, attempt: Attempt) -> Any | None:
        """Where the attempt's ``--dataset`` producer runs when that is another machine: an
        object with the methods of ``daemon.datasets.Datasets`` that forwards them there;
        None for this machine (the daemon's own ``Datasets``)."""
        ...

    def remote_datasets(self) -> list[Any]:
        """Those objects for every other machine (the loop reconciles them, a restart adopts)."""
        ...

    def confinement_words(self) -> str:
        """How jobs are confined where they run (``collocate serve``'s start-up line)."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """Runs attempts on this machine: runners in their own sessions, each job in its cgroup
    (``confinement``), ``/proc`` for the trees."""

    def __init__(self, confinement: Confinement | None = None) -> None:
        self._trees = TreeReader()
        self._metrics = MetricsTail()  # where each job's metrics file was read up to
        self.confinement = confinement or Confinement()

    def start(self, plan: LaunchPlan, attempt: Attempt) -> tuple[Any, int, float]:
        bounds = self.confinement.runner_args(attempt.job_id, attempt.n, attempt.uuids)
        proc, started = start(with_runner_args(plan, *bounds))
        return proc, proc.pid, started

    def poll(self, handle: Any, attempt: Attempt) -> tuple[bool, int | None]:
        if handle is not None:
            status = handle.poll()
            return status is None, status
        return process_matches(attempt.pid, attempt.pid_started), None

    def matches(self, attempt: Attempt) -> bool:
        return process_matches(attempt.pid, attempt.pid_started)

    def signal(self, attempt: Attempt, sig: int) -> None:
        self.confinement.signal(attempt.job_id, attempt.n, attempt.pid, sig)

    def release(self, attempt: Attempt) -> None:
        self.confinement.release(attempt.job_id, attempt.n)

    def exit_record(self, attempt: Attempt) -> dict[str, Any] | None:
        return views.read_exit(Path(attempt.dir))

    def started_record(self, attempt: Attempt) -> dict[str, Any] | None:
        return views.read_json(attempt_files(Path(attempt.dir))["started"])

    def stderr_tail(self, attempt: Attempt) -> str:
        return read_tail(attempt_files(Path(attempt.dir))["stderr"])

    def job_started(self, attempt: Attempt) -> bool:
        return job_started(Path(attempt.dir))

    def read_log(self, attempt: Attempt, stream: str, offset: int, limit: int) -> bytes:
        return read_chunk(attempt_files(Path(attempt.dir))[stream], offset, limit)

    def adopt_orphan(self, attempt: Attempt) -> Any | None:
        return adopt_orphan(Path(attempt.dir))

    def is_orphan(self, handle: Any) -> bool:
        return isinstance(handle, OrphanedJob)

    def read_trees(self, roots: Mapping[str, Attempt], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        return self._trees.read({j: a.pid or 0 for j, a in roots.items()}, now, gpu_pids)

    def read_metrics(self, attempts: Mapping[str, Attempt]) -> list[MetricPoint]:
        return self._metrics.read({j: Path(a.dir) / METRICS_FILE_NAME for j, a in attempts.items()})

    def collect(self, keep: set[int]) -> None:
        reap_strays(keep)

    def datasets_of(self, attempt: Attempt) -> Any | None:
        return None

    def remote_datasets(self) -> list[Any]:
        return []

    def confinement_words(self) -> str:
        return self.confinement.cgroups.describe()

    def close(self) -> None:
        self._metrics.close()
        self.confinement.cgroups.close()


def local_confinement(key: str, devices: Sequence[DeviceInfo], *, max_pids: int | None,
                      max_memory: int | None, log_max: int, disk_reserve: int, keep: set[str],
                      fence: tuple[Path, float] | None = None) -> Confinement:
    """This machine's bounds on every attempt (``daemon/confine.py``): cgroups prepared for the
    daemon or agent ``key`` names (its state root), those an earlier run left empty removed
    (except ``keep``: open attempts, ``job-<id>.<n>``), the owner's log bounds, the GPUs'
    device numbers, and on a cluster node the fence."""
    cgroups = Cgroups.detect(key, max_pids=max_pids, max_memory=max_memory)
    cgroups.sweep(keep=keep)
    return Confinement(cgroups, log_max=log_max, disk_reserve=disk_reserve,
                       minors={d.uuid: d.minor for d in devices}, fence=fence)


def read_chunk(path: Path, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``path`` from ``offset``; nothing when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, offset))
            return f.read(limit)
    except OSError:
        return b""
