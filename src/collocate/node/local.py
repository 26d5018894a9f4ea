"""``LocalNode``: the ``Node`` API on this machine, the one implementation every head talks to.

It owns what is local to a machine: the GPU backend, the MPS control daemon when MPS runs on
real GPUs, a state root holding the attempt folders (``jobs/<id>/attempt-<n>``) and emulated GPU
state, each attempt's confinement (cgroup, log bounds, fence), the jobs' process trees and
metrics files, and the ``--dataset`` producers of its jobs.

Two ways to start a runner, one per kind of host:

* as a child (``detach=False``, the daemon of one server runs the node in its own process): the
  daemon is its jobs' subreaper, polls each runner's ``Popen`` for its exit status, and adopts
  the job of a runner that was killed (``reaping.adopt_orphan``);
* *double-forked* (``detach=True``, a cluster node's agent: ``cluster/agent.py``): the runner is
  nobody's child and outlives the agent and Ray's raylet; it is followed by pid and process start
  time and its records. With ``fence_after_s`` every runner stops its job once the agent's
  heartbeat (touched whenever the head reaches it) is that old, and a new agent stops, at its
  first ``collect``, every runner the head no longer owns.
"""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from pathlib import Path
from typing import Any

from collocate.core.model import SharingMode
from collocate.gpus.base import DeviceInfo, GpuBackend
from collocate.monitor.job_metrics import METRICS_FILE_NAME, MetricPoint, MetricsTail
from collocate.monitor.process_tree import TreeReader, TreeUsage
from collocate.node.api import ExitRecord, NodeTick, PartEnd, PartRef, PartStatus, Producers
from collocate.node.confine import Confinement, NodeBounds, local_confinement, signal_group
from collocate.node.datasets import Datasets, ProducerRequest, ProducerStartError
from collocate.node.files import attempt_files, disk_size, drop_logs, read_chunk, read_exit, read_json
from collocate.node.launcher import LaunchPlan, localize, process_matches, start, start_detached, with_runner_args
from collocate.node.reaping import OrphanedJob, adopt_orphan, job_started, reap_strays
from collocate.node.runner import read_tail

log = logging.getLogger("collocate.node")
HEARTBEAT = "agent.heartbeat"  # touched whenever the head reaches a fenced node


class LocalNode:
    """This machine as a ``Node`` (see the module docstring)."""

    def __init__(self, name: str, root: Path, *, gpus: str = "auto", backend: GpuBackend | None = None,
                 sharing: SharingMode = SharingMode.TIME_SLICING, bounds: NodeBounds | None = None,
                 detach: bool = False, fence_after_s: float | None = None, keep: Collection[str] = (),
                 address: str = "127.0.0.1") -> None:
        self.name, self.root, self.detach, self._address = name, Path(root), detach, address
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / "jobs").mkdir(mode=0o700, exist_ok=True)
        self.heartbeat = self.root / HEARTBEAT
        self.beat()
        if backend is None:
            from collocate.gpus.registry import open_backend

            backend = open_backend(gpus, state_dir=self.root, node=name)
        self.backend = backend
        live = {f"job-{job_id}.{n}" for job_id, n in (_job_and_n(rel) for rel in self.live_runners())}
        fence = None if fence_after_s is None else (self.heartbeat, fence_after_s)
        self.confinement: Confinement = local_confinement(
            str(self.root), self.backend.devices(), bounds or NodeBounds(), disk_size(self.root),
            keep=live | set(keep), fence=fence)
        self.mps: Any = None
        if sharing is SharingMode.MPS and self.backend.needs_mps_server:
            from collocate.gpus.mps import MpsControl

            self.mps = MpsControl(self.root)
            self.mps.start()
        self._trees = TreeReader()
        self._metrics = MetricsTail()
        self.datasets = Datasets(self.root)
        self._handles: dict[tuple[str, int], Any] = {}  # children: runners, adopted orphans
        self._reconcile = detach  # a new agent: stop what the head no longer owns, once

    # -- GPUs and the heartbeat --------------------------------------------------------------
    def beat(self) -> None:
        """The head reached this node now: fenced runners judge the head by this file's age."""
        self.heartbeat.touch()

    def devices(self) -> list[DeviceInfo]:
        return self.backend.devices()

    def address(self) -> str:
        return self._address

    def free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def tick(self, parts: Sequence[PartRef]) -> NodeTick:
        self.beat()
        return NodeTick(self.backend.sample(), self.status(parts))

    def status(self, parts: Sequence[PartRef]) -> dict[tuple[str, int], PartStatus]:
        return {part.key: self._status(part) for part in parts}

    def _status(self, part: PartRef) -> PartStatus:
        handle = self._handles.get(part.key)
        if handle is not None:
            code = handle.poll()
            return PartStatus(code is None, None if isinstance(handle, OrphanedJob) else code)
        return PartStatus(process_matches(part.pid, part.started))

    # -- runners -----------------------------------------------------------------------------
    def start(self, plan: LaunchPlan, part: PartRef, head_root: str) -> PartRef:
        self.beat()
        uuids = plan.env.get("CUDA_VISIBLE_DEVICES", "").split(",")
        plan = localize(plan, head_root, str(self.root), self.backend.emulated_state_dir)
        plan = with_runner_args(plan, *self.confinement.runner_args(part.job_id, part.n, uuids))
        if self.detach:
            pid, started = start_detached(plan, self.name)
        else:
            proc, started = start(plan)
            pid = proc.pid
            self._handles[part.key] = proc
        return replace(part, pid=pid, started=started)

    def started(self, part: PartRef) -> PartRef | None:
        record = read_json(attempt_files(self._dir(part))["started"])
        if not record:
            return None
        return replace(part, pid=int(record["pid"]), started=float(record["started"]))

    def ended(self, part: PartRef) -> PartEnd:
        folder = self._dir(part)
        record = read_exit(folder)
        if record is None and not self.detach and not isinstance(self._handles.get(part.key), OrphanedJob):
            orphan = adopt_orphan(folder)  # the runner died; its job is this process's child now
            if orphan is not None and orphan.poll() is None:
                self._handles[part.key] = orphan
                log.warning("job %s: its runner is gone; the daemon watches the job (pid %d)",
                            part.job_id, orphan.pid)
                return PartEnd(None, adopted=True)
            record = read_exit(folder)
        if record is not None:
            return PartEnd(ExitRecord.of(record))
        return PartEnd(None, job_started=job_started(folder),
                       stderr_tail=read_tail(attempt_files(folder)["stderr"]))

    def signal(self, part: PartRef, sig: int) -> None:
        self.confinement.signal(part.job_id, part.n, part.pid, sig)

    def suspend(self, part: PartRef, frozen: bool) -> str:
        return self.confinement.freeze(part.job_id, part.n, part.pid, frozen)

    def release(self, part: PartRef) -> None:
        self._handles.pop(part.key, None)
        self.confinement.release(part.job_id, part.n)

    def read_log(self, part: PartRef, stream: str, offset: int, limit: int) -> bytes:
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"no log stream {stream!r}")
        return read_chunk(attempt_files(self._dir(part))[stream], offset, limit)

    def drop_logs(self, part: PartRef) -> int:
        return drop_logs(self._dir(part))

    def read_trees(self, roots: Mapping[str, int], now: float,
                   gpu_pids: AbstractSet[int]) -> dict[str, TreeUsage]:
        return self._trees.read(dict(roots), now, gpu_pids)

    def read_metrics(self, parts: Mapping[str, PartRef]) -> list[MetricPoint]:
        return self._metrics.read({job_id: self._dir(part) / METRICS_FILE_NAME
                                   for job_id, part in parts.items()})

    def collect(self, owned: Collection[PartRef]) -> list[str]:
        keep = ({h.pid for h in self._handles.values()} | {p.pid for p in owned if p.pid}
                | {p.pid for p in self.datasets.producers.values()})
        reap_strays(keep)
        if not self._reconcile:
            return []
        self._reconcile = False
        return self.stop_unowned({p.rel for p in owned})

    def live_runners(self) -> dict[str, tuple[int, float]]:
        """The attempts whose runner still runs here (``rel → (pid, start time)``), from the
        records on this node's disk: ``runner.json`` and no ``exit.json``."""
        live = {}
        for record in self.root.glob("jobs/*/attempt-*/runner.json"):
            folder = record.parent
            if read_exit(folder) is not None:
                continue
            started = read_json(record)
            if not started:
                continue
            pid, at = int(started.get("pid", 0)), float(started.get("started", 0.0))
            if process_matches(pid, at):
                live[str(folder.relative_to(self.root))] = (pid, at)
        return live

    def stop_unowned(self, owned: AbstractSet[str]) -> list[str]:
        """SIGKILL the process group of every live runner the head does not own (its attempt
        was recorded lost and requeued while this node was away): nothing runs twice."""
        stopped = []
        for rel, (pid, _) in sorted(self.live_runners().items()):
            if rel not in owned:
                signal_group(pid, signal.SIGKILL)
                self.confinement.release(*_job_and_n(rel))
                stopped.append(rel)
        return stopped

    # -- shared datasets ---------------------------------------------------------------------
    def ensure_producer(self, request: ProducerRequest) -> Producers:
        try:
            ready, error = self.datasets.ensure(request), None
        except ProducerStartError as exc:  # a message, not an exception, crosses to the head
            ready, error = False, str(exc)
        return Producers(self._producers(), ready, error, self.datasets.job_env(request.dataset))

    def reconcile_producers(self, wanted: AbstractSet[str], known: AbstractSet[str]) -> Producers:
        """After adopting ``known`` (those the head was last told run here) that this node does
        not follow: a new agent stops what an earlier one started once no job needs it."""
        self.datasets.adopt(known)
        self.datasets.reconcile(wanted)
        return Producers(self._producers())

    def adopt_producers(self, names: AbstractSet[str]) -> Producers:
        self.datasets.adopt(names)
        return Producers(self._producers())

    def _producers(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.datasets.producers.items()}

    # -- the rest ----------------------------------------------------------------------------
    def confinement_words(self) -> str:
        return self.confinement.cgroups.describe()

    def close(self) -> None:
        self._metrics.close()
        self.datasets.close()
        self.confinement.cgroups.close()
        if self.mps is not None:
            self.mps.stop()
        self.backend.close()

    def _dir(self, part: PartRef) -> Path:
        path = (self.root / part.rel).resolve()
        if not path.is_relative_to(self.root.resolve() / "jobs"):
            raise ValueError(f"attempt folder {part.rel!r} is outside this node's jobs/")
        return path


def _job_and_n(rel: str) -> tuple[str, int]:
    """``jobs/<id>/attempt-<n>`` → ``(id, n)``."""
    parts = Path(rel).parts
    return parts[1], int(parts[2].removeprefix("attempt-"))
