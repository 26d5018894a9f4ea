"""The daemon: the composition root that wires its parts and runs the loop.

One thread owns everything that changes (the ``Scheduler``, the SQLite ``Store``, the running
attempts). API threads hand requests to it through a queue and wait for the reply (``call``), so
there are no locks around the core and every write comes from one place. The parts:

- ``api.Api``: the request handlers (``op_*``), answered on the loop thread between rounds;
- ``round.SchedulingRound``: one period's sample → reap → price → schedule → launch;
- ``attempts.Attempts``: the placed attempts from launch to recorded end (exit classification);
- ``executor.LocalExecutor``: starts, polls, signals and inspects the jobs' processes;
- ``restart.restore``: at start, re-adopt, end or settle what the previous daemon left.

A request wakes the loop at once; a round runs whenever one is due (requests never starve it).
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collocate.daemon.api import Api
from collocate.daemon.attempts import Attempts
from collocate.daemon.cgroups import DEFAULT_MAX_PIDS
from collocate.daemon.datasets import Datasets
from collocate.daemon.executor import Executor, LocalExecutor, local_confinement
from collocate.daemon.faults import disk_full, is_disk_full
from collocate.daemon.gpu_watch import GpuWatch
from collocate.daemon.notify import Notifier
from collocate.daemon.paths import StateLayout, share_with_group
from collocate.daemon.quotas import Accounts, Quotas, disk_size
from collocate.daemon.restart import restore
from collocate.daemon.round import SchedulingRound
from collocate.daemon.server import ApiServer, Peer
from collocate.daemon.spec import JobSpec
from collocate.daemon.store import Store
from collocate.daemon.tracking import DaemonTracking, TrackingConfig
from collocate.errors import CollocateError
from collocate.gpus.base import GpuBackend
from collocate.interference import default_interference
from collocate.model import SharingMode
from collocate.policies import make_policy
from collocate.policies.risk import WINDOW_SAMPLES
from collocate.recovery import RecoveryRules
from collocate.scheduler import Capacity, Scheduler

log = logging.getLogger("collocate.daemon")
REQUEST_TIMEOUT_S = 60.0
#: Requests answered on the caller's thread: they read only the monitoring store (its own
#: connection and lock), and a day of history may take a while to bucket.
OFF_LOOP = frozenset({"history"})


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``collocate serve`` takes; validated by the CLI before the daemon starts."""

    state_dir: Path
    gpus: str = "auto"
    policy: str = "auto"
    policy_params: dict[str, Any] = field(default_factory=dict)
    sharing: SharingMode = SharingMode.TIME_SLICING
    period_s: float = 1.0
    window: int = WINDOW_SAMPLES
    allow_gid: int | None = None
    tcp: tuple[str, int] | None = None
    token: str | None = None
    cancel_grace_s: float = 10.0
    rules: RecoveryRules = field(default_factory=RecoveryRules)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    ray: str | None = None  # a Ray cluster's address: run as its head (docs/multi-node.md)
    node_grace_s: float = 60.0  # with ``ray``: how long a silent node's jobs stay unconfirmed
    quotas: Quotas = field(default_factory=Quotas)  # what one member may hold (daemon/quotas.py)
    job_max_pids: int | None = DEFAULT_MAX_PIDS  # per attempt, in its cgroup
    job_max_memory: int | None = None  # host memory per attempt (bytes); accounted either way


def job_bounds(config: ServeConfig, quotas: Quotas) -> dict[str, Any]:
    """What every attempt's runner enforces, wherever it runs (``executor.local_confinement``)."""
    return dict(max_pids=config.job_max_pids, max_memory=config.job_max_memory,
                log_max=quotas.log_max, disk_reserve=quotas.disk_reserve)


class Service:
    def __init__(self, config: ServeConfig, *, backend: GpuBackend | None = None,
                 executor: Executor | None = None) -> None:
        self.config = config
        self.layout = StateLayout(config.state_dir)
        self._backend = backend
        self._executor = executor  # where jobs run: the one seam (made in ``open`` if not given)
        self._requests: queue.Queue[tuple[str, dict, Peer, Future]] = queue.Queue()
        self._stop = threading.Event()
        self.specs: dict[str, JobSpec] = {}
        self._lock_fd: int | None = None
        self.mps: Any = None
        self._interference = default_interference()

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Take the state dir, open the store and the GPUs, recover the previous run, listen."""
        self.layout.create(allow_gid=self.config.allow_gid)
        self._take_lock()
        self.store = Store(self.layout.db)
        self.quotas = self.config.quotas.resolved(disk_size(self.layout.root))
        if self._backend is None and self.config.ray is not None:  # the only door to Ray
            from collocate.cluster.ray_head import open_cluster

            self._backend, self._executor = open_cluster(self.config)
        if self._backend is None:
            from collocate.gpus.registry import open_backend

            self._backend = open_backend(self.config.gpus, state_dir=self.layout.root,
                                         node=socket.gethostname())
        self.backend = self._backend
        emulated = self.backend.emulated_state_dir
        if emulated is not None and self.config.allow_gid is not None and emulated.is_relative_to(self.layout.root):
            share_with_group(emulated, self.config.allow_gid)  # members' emulated jobs claim there
        self.watch = GpuWatch(self.backend, sharing=self.config.sharing,
                              params=self._interference.modes.get(self.config.sharing),
                              window=self.config.window, period_s=self.config.period_s)
        if not self.watch.devices:
            raise CollocateError("the GPU backend reports no devices",
                                 hint="check `nvidia-smi`, or use --gpus emulated:4xA100-40GB")
        self.executor: Executor = self._executor or LocalExecutor(local_confinement(
            str(self.layout.root), self.watch.devices, **job_bounds(self.config, self.quotas),
            keep={f"job-{a.job_id}.{a.n}" for a in self.store.open_attempts()}))
        self.tracking = DaemonTracking(self.layout.root, self.watch.devices, self.config.tracking)
        if self.config.sharing is SharingMode.MPS and self.backend.needs_mps_server:
            from collocate.gpus.mps import MpsControl

            self.mps = MpsControl(self.layout.root)
            self.mps.start()
        policy = make_policy(self.config.policy, **self.config.policy_params)
        self.notifier = Notifier(self.layout, self.specs, self.store)
        self.scheduler = Scheduler(policy, Capacity.of(self.watch.snapshot(time.time())), rules=self.config.rules,
                                   on_change=self._job_changed, fairness=self.store.fairness())
        self.datasets = Datasets(self.layout.root)
        parts: dict[str, Any] = dict(config=self.config, layout=self.layout, store=self.store,
                     scheduler=self.scheduler, specs=self.specs, tracking=self.tracking)
        accounts = Accounts(self.quotas, self.layout.root, self.store.db, owner_uid=os.getuid())
        self.attempts = Attempts(**parts, executor=self.executor, datasets=self.datasets,
                                 uuid_of={d.id: d.uuid for d in self.watch.devices},
                                 emulated_dir=self.backend.emulated_state_dir, mps=self.mps,
                                 watch=self.watch)
        self.round = SchedulingRound(**parts, watch=self.watch, attempts=self.attempts,
                                     executor=self.executor, datasets=self.datasets,
                                     interference=self._interference)
        self.api = Api(**parts, watch=self.watch, attempts=self.attempts, accounts=accounts)
        restore(self.store, self.scheduler, self.attempts, self.executor)
        names = {s.dataset for s in self.specs.values() if s.dataset}
        if names:  # producers a previous run started (on this machine or the jobs' nodes)
            for datasets in (self.datasets, *self.executor.remote_datasets()):
                datasets.adopt(names)
        self.server = ApiServer(self.layout.socket, self.call, allow_gid=self.config.allow_gid,
                                tcp=self.config.tcp, token=self.config.token)
        self.server.start()
        self.tracking.start_dashboard(self.call)
        self.layout.pid_file.write_text(f"{os.getpid()}\n")
        log.info("serving %d GPU(s) with policy %s from %s", len(self.watch.devices),
                 self.config.policy, self.layout.root)

    def _job_changed(self, job: Any) -> None:
        """Persist a job the scheduler changed; an ended one's environment is dropped (as the
        store drops it), so memory holds the environments of pending and running jobs only."""
        self.store.save_job(job)
        self.notifier.changed(job)
        spec = self.specs.get(job.id)
        if job.state.is_terminal and spec is not None and spec.env:
            self.specs[job.id] = replace(spec, env={})

    def _take_lock(self) -> None:
        fd = os.open(self.layout.root / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CollocateError(
                f"a collocate daemon already runs on {self.layout.root}",
                hint="stop it first, or start another one with a different --state-dir",
            ) from None
        self._lock_fd = fd  # held until the process exits, even by SIGKILL

    def close(self) -> None:
        """Stop serving; running jobs keep running and are re-adopted by the next start."""
        self._stop.set()
        self._refuse_waiting()
        if hasattr(self, "tracking"):
            self.tracking.close()  # the dashboard first: it asks the loop, which is stopping
        if hasattr(self, "server"):
            self.server.stop()
        if self.mps is not None:
            try:
                self.mps.stop()
            except CollocateError as exc:
                log.warning("%s", exc)
        if hasattr(self, "datasets"):
            self.datasets.close()
        if hasattr(self, "executor"):
            self.executor.close()
        if hasattr(self, "store"):
            self.store.close()
        if self._backend is not None:
            self._backend.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

    def stop(self) -> None:
        self._stop.set()

    def _refuse_waiting(self) -> None:
        """Answer requests still queued at shutdown now, so no API or dashboard thread waits
        ``REQUEST_TIMEOUT_S`` for a loop that has stopped."""
        while True:
            try:
                *_, future = self._requests.get_nowait()
            except queue.Empty:
                return
            future.set_exception(CollocateError("the daemon is shutting down",
                                                hint="start it again with `collocate serve`"))

    def serve_forever(self) -> None:
        """Answer requests as they come; run a round whenever one is due (requests never starve it)."""
        next_tick = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_tick:
                try:
                    self.round.run()
                except Exception as exc:
                    if is_disk_full(exc):  # retried next round, once there is space
                        log.error("scheduling round stopped: %s", disk_full(str(self.layout.root)))
                    else:
                        log.exception("scheduling round failed")
                next_tick = max(next_tick + self.config.period_s, time.monotonic())
                continue
            try:
                item = self._requests.get(timeout=min(next_tick - now, 0.5))
            except queue.Empty:
                continue
            self._answer(*item)

    # -- requests --------------------------------------------------------------------------
    def call(self, op: str, args: dict[str, Any], peer: Peer) -> Any:
        """Run a request on the loop thread and wait for its answer (API threads call this)."""
        if self._stop.is_set():
            raise CollocateError("the daemon is shutting down", hint="start it again with `collocate serve`")
        if op in OFF_LOOP:  # reads of the monitoring store alone: never hold up a round
            return self.api.answer(op, args, peer)
        future: Future = Future()
        self._requests.put((op, args, peer, future))
        return future.result(timeout=REQUEST_TIMEOUT_S)

    def _answer(self, op: str, args: dict, peer: Peer, future: Future) -> None:
        try:
            future.set_result(self.api.answer(op, args, peer))
        except Exception as exc:
            if not isinstance(exc, CollocateError):
                log.exception("request %s failed", op)
            future.set_exception(exc)
