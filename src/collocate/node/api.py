"""The one door between the head and a machine that runs jobs: the ``Node`` API and its values.

The head (the daemon's loop) decides; a node does what touches its machine: read its GPUs, start
a runner from a ``LaunchPlan``, say whether its runners still run and how they ended, signal
them, read their logs, process trees and metrics, host the ``--dataset`` producers of its jobs.
The head always talks to nodes through this API: in-process for one server (``LocalNode``), or
through a Ray actor proxy for several (``collocate.cluster``). Every argument and answer is a
small frozen value, so a node can be called across processes and a fake one written for tests
and benchmarks.

An attempt of a job has one *part* per node it runs on (one for a job on one node); a part is
named by ``PartRef``: the job, the attempt number, its rank among the attempt's nodes, and,
once started, its runner's pid and process start time. A part's folder on its node is always
``<node root>/jobs/<id>/attempt-<n>``: an attempt's parts are on different nodes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

from collocate.gpus.base import DeviceInfo, DeviceSample
from collocate.monitor.job_metrics import MetricPoint
from collocate.monitor.process_tree import TreeUsage
from collocate.node.datasets import ProducerRequest
from collocate.node.launcher import LaunchPlan


class NodeUnreachable(OSError):
    """The node did not answer (its machine died, its agent is gone, the network is cut): not
    the job's fault, so an attempt that needed it is lost and the job requeued, never failed."""


@dataclass(frozen=True, slots=True)
class PartRef:
    """One part of an attempt: where it is and, once started, which runner it is."""

    job_id: str
    n: int
    rank: int = 0
    pid: int | None = None
    started: float | None = None

    @property
    def rel(self) -> str:
        """The part's folder relative to its node's root."""
        return f"jobs/{self.job_id}/attempt-{self.n}"

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.n)

    @property
    def runner(self) -> tuple[int, float]:
        return (self.pid or 0, self.started or 0.0)


@dataclass(frozen=True, slots=True)
class PartStatus:
    """Whether a part's runner still runs; ``runner_status`` its exit status when the node
    started it as a child and saw it exit (None otherwise)."""

    alive: bool
    runner_status: int | None = None


@dataclass(frozen=True, slots=True)
class ExitRecord:
    """How a part's job ended, as its runner (or whoever stood in for it) recorded it.
    ``lost``: the part was stopped for a reason that is not the job's (its node was cut off)."""

    returncode: int | None
    end: float | None
    stderr_tail: str = ""
    lost: str | None = None

    @classmethod
    def of(cls, record: Mapping[str, object] | None) -> ExitRecord | None:
        if record is None:
            return None
        code, end, lost = record.get("returncode"), record.get("end"), record.get("lost")
        return cls(int(code) if isinstance(code, int) else None,
                   float(end) if isinstance(end, (int, float)) else None,
                   str(record.get("stderr_tail") or ""), str(lost) if lost else None)


@dataclass(frozen=True, slots=True)
class PartEnd:
    """What a node knows of a part whose runner is gone: its exit record, else whether the job
    itself had started and the tail of its stderr. ``adopted``: the runner died but the job is
    the node's child now and still runs (the node follows it; the part is not over)."""

    record: ExitRecord | None
    job_started: bool = False
    stderr_tail: str = ""
    adopted: bool = False


@dataclass(frozen=True, slots=True)
class NodeTick:
    """A round's one call to a node: its GPU readings and the status of the parts asked about."""

    samples: list[DeviceSample]
    status: dict[tuple[str, int], PartStatus] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Producers:
    """A node's dataset producers after a call: ``ready`` (for ``ensure``), why the producer
    failed to start (None when it did not), the environment its jobs get, and every producer
    that runs there (name → pid)."""

    running: dict[str, int]
    ready: bool = False
    error: str | None = None
    job_env: dict[str, str] = field(default_factory=dict)


class Node(Protocol):
    """A machine that runs parts of attempts (see the module docstring). Any method may raise
    ``NodeUnreachable``."""

    name: str

    def devices(self) -> list[DeviceInfo]:
        """The node's schedulable GPUs (a MIG instance is one)."""
        ...

    def address(self) -> str:
        """The address other nodes reach this one at (``MASTER_ADDR`` of a job's rank 0)."""
        ...

    def free_port(self) -> int:
        """A TCP port free on this node now (``MASTER_PORT`` of a job whose rank 0 runs here)."""
        ...

    def tick(self, parts: Sequence[PartRef]) -> NodeTick:
        """The round's readings of this node's GPUs, and whether ``parts``' runners still run."""
        ...

    def status(self, parts: Sequence[PartRef]) -> dict[tuple[str, int], PartStatus]:
        """Whether ``parts``' runners still run (a restarted head asks before its first round)."""
        ...

    def start(self, plan: LaunchPlan, part: PartRef, head_root: str) -> PartRef:
        """Start the part's runner (``plan``'s paths under ``head_root`` are moved to this
        node's root); the part with its runner's pid and start time. Raises on failure."""
        ...

    def started(self, part: PartRef) -> PartRef | None:
        """The part with the pid its runner recorded, or None before it recorded one."""
        ...

    def ended(self, part: PartRef) -> PartEnd:
        """What is known of a part whose runner is no longer alive (see ``PartEnd``)."""
        ...

    def signal(self, part: PartRef, sig: int) -> None:
        """Signal the part's whole job (gone is fine); SIGKILL ends its cgroup."""
        ...

    def suspend(self, part: PartRef, frozen: bool) -> str:
        """Freeze the part's job (its cgroup's freezer: no CPU, no new kernels, its memory
        kept) or thaw it; how it was done (``collocate.core.suspension``)."""
        ...

    def release(self, part: PartRef) -> None:
        """The part has ended: stop anything of it still running and free its cgroup."""
        ...

    def read_log(self, part: PartRef, stream: str, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of the part's ``stdout`` or ``stderr`` from ``offset``."""
        ...

    def drop_logs(self, part: PartRef) -> int:
        """Remove the ended part's stdout and stderr (``collocate purge``); the bytes freed."""
        ...

    def read_trees(self, roots: Mapping[str, int], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        """One reading of each job's process tree here (``job id → runner pid``)."""
        ...

    def read_metrics(self, parts: Mapping[str, PartRef]) -> list[MetricPoint]:
        """The new ``log_metric`` points of these jobs' parts here since the last call, read
        where the jobs run; files of parts no longer asked about are closed."""
        ...

    def collect(self, owned: Collection[PartRef]) -> list[str]:
        """Once per round: reap processes the jobs left behind, and, on a node seen for the first
        time since it was away, stop every runner not in ``owned`` (their attempts were recorded
        lost and requeued meanwhile). The folders of the runners it stopped."""
        ...

    def ensure_producer(self, request: ProducerRequest) -> Producers:
        """Start the dataset's producer here if it does not run; never waits for it."""
        ...

    def reconcile_producers(self, wanted: AbstractSet[str], known: AbstractSet[str]) -> Producers:
        """Stop the producers whose datasets no job needs (after adopting ``known``)."""
        ...

    def adopt_producers(self, names: AbstractSet[str]) -> Producers:
        """Follow the producers an earlier head or agent started here."""
        ...

    def confinement_words(self) -> str:
        """How jobs are confined here (``collocate serve``'s start-up line)."""
        ...

    def close(self) -> None: ...
