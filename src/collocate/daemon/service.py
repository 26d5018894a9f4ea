"""The daemon: the composition root that wires its parts and runs the loop.

One thread owns everything that changes (the ``Scheduler``, the SQLite ``Store``, the running
attempts). API threads hand requests to it through a queue and wait for the reply (``call``), so
there are no locks around the core and every write comes from one place. The parts:

- ``api.Api``: the request handlers (``op_*``), answered on the loop thread between rounds;
- ``round.SchedulingRound``: one period's sample → reap → price → schedule → launch;
- ``attempts.Attempts``: the placed attempts from launch to recorded end (exit classification);
- ``fleet.Fleet``: the door to the nodes (``collocate.node``) that start, poll, signal and
  inspect the jobs' processes: a ``LocalNode`` in this process for one server, Ray agents for
  several (``collocate.cluster``, imported only then);
- ``restart.restore``: at start, re-adopt, end or settle what the previous daemon left.

A request wakes the loop at once; a round runs whenever one is due (requests never starve it), and
a request that may let a job start (``WAKE_OPS``: a submission, a cancel) makes one due at once,
and so does a child's exit (``exits.ExitWatch``: a job ended, its room is free) while jobs wait.
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
from dataclasses import replace
from typing import Any

from collocate.common.errors import CollocateError
from collocate.core.interference import default_interference
from collocate.core.policies import make_policy
from collocate.core.scheduler import Capacity, Scheduler
from collocate.core.suspension import SuspendRules
from collocate.daemon.api import Api
from collocate.daemon.attempts import Attempts
from collocate.daemon.audit import AUDIT_FILE, AuditLog
from collocate.daemon.config import ServeConfig, Wiring, job_bounds
from collocate.daemon.exits import ExitWatch
from collocate.daemon.faults import disk_full, is_disk_full
from collocate.daemon.fleet import Fleet, InProcessNodes, Nodes
from collocate.daemon.gpu_claims import GpuClaims
from collocate.daemon.gpu_watch import GpuWatch
from collocate.daemon.notify import Notifier
from collocate.daemon.quotas import Accounts
from collocate.daemon.restart import restore
from collocate.daemon.round import SchedulingRound
from collocate.daemon.server import ApiServer, Peer
from collocate.daemon.store import Store
from collocate.daemon.tracking import DaemonTracking
from collocate.daemon.warm_estimator import start_warm_estimator, stop_process
from collocate.node.confine import UNLIMITED, Confinement
from collocate.node.files import disk_size
from collocate.node.local import LocalNode
from collocate.wire.paths import StateLayout, share_with_group
from collocate.wire.spec import JobSpec

__all__ = ["ServeConfig", "Service"]

log = logging.getLogger("collocate.daemon")
REQUEST_TIMEOUT_S = 60.0
#: Requests answered on the caller's thread: they read only the monitoring store (its own
#: connection and lock), and a day of history may take a while to bucket.
OFF_LOOP = frozenset({"history"})
#: Requests that may let a job start (a new or released job, room freed, the queue resumed): a
#: round is due at once after one, not at the next period, so a job that fits starts within
#: a round's time of its submission instead of up to a period later (issue 35: a short job's
#: completion time carried up to a period of waiting for the round). At most one such early
#: round per ``EARLY_ROUND_GAP_S``: a burst of submissions is placed together, not one round each.
WAKE_OPS = frozenset({"submit", "release", "cancel", "resume", "resume_job", "priority"})
EARLY_ROUND_GAP_S = 0.2
#: What ``ExitWatch`` puts in the request queue when a child exits: no request, a wake-up
#: (no peer, no future: the loop takes it before answering anything).
CHILD_EXITED = "child exited"
_WAKE_UP: Any = (CHILD_EXITED, {}, None, None)


def _quota_args(accounts: Accounts, uid: int) -> list[str]:
    """A ``--notify``'s runner: its logs count in the member's quota (their ledger, counted now)."""
    ledger = accounts.ledger(uid)
    if ledger is None:
        return []
    accounts.refresh(uid)
    return ["--quota-file", str(ledger)]


class Service:
    def __init__(self, config: ServeConfig, *, nodes: Nodes | None = None) -> None:
        """``nodes``: where jobs run (made in ``open`` if not given: this machine, or with
        ``config.ray`` the Ray cluster's nodes)."""
        self.config = config
        self.layout = StateLayout(config.state_dir)
        self._nodes = nodes
        self._requests: queue.Queue[tuple[str, dict, Peer, Future]] = queue.Queue()
        self._stop = threading.Event()
        self.specs: dict[str, JobSpec] = {}
        self._lock_fd: int | None = None
        self.claims = GpuClaims(self.layout.root)
        self._interference = default_interference()

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Take the state dir, open the store and the GPUs, recover the previous run, listen."""
        self.layout.create(allow_gid=self.config.allow_gid)
        self._take_lock()
        self.audit = AuditLog(self.layout.root / AUDIT_FILE)
        self.server = ApiServer(self.layout.socket, self.call, allow_gid=self.config.allow_gid,
                                tcp=self.config.tcp, token=self.config.token, tls=self._tls(),
                                user_tokens=self.config.user_tokens, per_token=self.config.tcp_max_per_token,
                                audit=self.audit)
        self.server.bind()  # every listener bound before any is served: a taken port fails now
        self.store = Store(self.layout.db)
        self.quotas = self.config.quotas.resolved(disk_size(self.layout.root))
        if self._nodes is None:
            self._nodes = self._open_nodes()
        self.fleet = self.backend = Fleet(self._nodes, self.layout.root, grace_s=self.config.node_grace_s)
        self.watch = GpuWatch(self.fleet, sharing=self.config.sharing,
                              params=self._interference.modes.get(self.config.sharing),
                              window=self.config.window, period_s=self.config.period_s)
        if not self.watch.devices:
            raise CollocateError("the GPU backend reports no devices",
                                 hint="check `nvidia-smi`, or use --gpus emulated:4xA100-40GB")
        if self.config.ray is None:  # one daemon per GPU (a Ray head's GPUs are its nodes')
            self.claims.claim(d.parent_uuid or d.uuid for d in self.watch.devices)
        self.tracking = DaemonTracking(self.layout.root, self.watch.devices, self.config.tracking)
        self.tracking.bind_dashboard()
        policy = make_policy(self.config.policy, **self.config.policy_params)
        self.notifier = Notifier(self.layout, self.specs, self.store, self._local_confinement())
        self.scheduler = Scheduler(policy, Capacity.of(self.watch.snapshot(time.time())), rules=self.config.rules,
                                   on_change=self._job_changed, fairness=self.store.fairness(),
                                   suspend=SuspendRules(preempt=self.config.preemption,
                                                        at_once=self.config.take_back_at_once))
        self.scheduler.cpu_jobs_default = os.cpu_count() or 1  # CPU jobs (--gpus 0): per user
        wiring = Wiring(self.config, self.layout, self.store, self.scheduler, self.specs,
                        self.tracking, self.watch, self.fleet)
        accounts = Accounts(self.quotas, self.layout.root, self.store.db, owner_uid=os.getuid())
        self.attempts = Attempts(wiring)
        self.attempts.ledger = accounts.ledger_for_launch  # logs count in their owner's quota as written
        self.notifier.extra_args = lambda spec: _quota_args(accounts, spec.uid)
        self.round = SchedulingRound(wiring, self.attempts, self._interference, accounts)
        self.api = Api(wiring, self.attempts, accounts)
        restore(self.store, self.scheduler, self.attempts, self.fleet)
        names = {s.dataset for s in self.specs.values() if s.dataset}
        if names:  # producers a previous run started (on the jobs' nodes)
            for producers in self.fleet.all_producers():
                producers.adopt(names)
        self.server.start()
        self.estimator = start_warm_estimator(self.layout, self.config)
        self.tracking.start_dashboard(self.call, avoid={t for t in (self.config.token, *self.config.user_tokens) if t})
        self.layout.pid_file.write_text(f"{os.getpid()}\n")
        log.info("serving %d GPU(s) with policy %s from %s", len(self.watch.devices),
                 self.config.policy, self.layout.root)

    def _tls(self) -> Any:
        """The TLS context of the TCP API (None: no TCP; TCP is TLS only, the daemon's own
        self-signed certificate unless one is given); sets ``self.tls_fingerprint`` for the
        start-up line."""
        from collocate.common import tls

        self.tls_fingerprint: str | None = None
        if self.config.tcp is None:
            return None
        if self.config.tls_cert is not None and self.config.tls_key is not None:
            cert, key = self.config.tls_cert, self.config.tls_key
        else:
            cert, key = tls.self_signed(self.layout.root / "tls", self.config.tcp[0])
        self.tls_fingerprint = tls.cert_fingerprint(cert)
        return tls.server_context(cert, key)

    def _open_nodes(self) -> Nodes:
        """This machine as the daemon's one node, or with ``--ray`` the Ray cluster's nodes
        (the only door to Ray, imported only then)."""
        if self.config.ray is not None:
            from collocate.cluster.ray_head import open_ray_nodes

            return open_ray_nodes(self.config, job_bounds(self.config))
        node = LocalNode(socket.gethostname(), self.layout.root, gpus=self.config.gpus,
                         sharing=self.config.sharing, bounds=job_bounds(self.config),
                         keep={f"job-{a.job_id}.{a.n}" for a in self.store.open_attempts()})
        emulated = node.backend.emulated_state_dir
        if emulated is not None and self.config.allow_gid is not None and emulated.is_relative_to(self.layout.root):
            share_with_group(emulated, self.config.allow_gid)  # members' emulated jobs claim there
        return InProcessNodes([node])

    def _local_confinement(self) -> Confinement:
        """What this machine bounds the parts it starts itself by (a job's ``--notify``): the
        local node's confinement, or on a cluster's head the log bounds alone."""
        if isinstance(self._nodes, InProcessNodes):
            for node in self._nodes.nodes.values():
                if isinstance(node, LocalNode):
                    return node.confinement
        return Confinement(log_max=self.quotas.log_max or UNLIMITED,
                           disk_reserve=self.quotas.disk_reserve or 0)

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
        stop_process(getattr(self, "estimator", None))
        if hasattr(self, "store"):
            self.store.close()
        if self._nodes is not None:
            try:
                self._nodes.close()
            except CollocateError as exc:  # e.g. the MPS control daemon would not stop
                log.warning("%s", exc)
        self.claims.release()
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
            if future is None:  # a wake-up (CHILD_EXITED), nobody waits on it
                continue
            future.set_exception(CollocateError("the daemon is shutting down",
                                                hint="retry in a moment (a restart re-adopts every job)"))

    def serve_forever(self) -> None:
        """Answer requests as they come; run a round whenever one is due (requests never starve it)."""
        next_tick = last_round = time.monotonic()
        exits = ExitWatch(lambda: self._requests.put(_WAKE_UP))
        exits.start()
        try:
            self._serve(exits, next_tick, last_round)
        finally:
            exits.stop()

    def _serve(self, exits: ExitWatch, next_tick: float, last_round: float) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_tick:
                last_round = now
                try:
                    self.round.run()
                except Exception as exc:
                    if is_disk_full(exc):  # retried next round, once there is space
                        log.error("scheduling round stopped: %s", disk_full(str(self.layout.root)))
                    else:
                        log.exception("scheduling round failed")
                exits.round_done()
                next_tick = max(min(next_tick, now) + self.config.period_s, time.monotonic())
                continue
            try:
                item = self._requests.get(timeout=min(next_tick - now, 0.5))
            except queue.Empty:
                continue
            if item[0] == CHILD_EXITED:  # a job may have ended: its room, for those waiting
                if self.scheduler.waiting:
                    next_tick = min(next_tick, last_round + EARLY_ROUND_GAP_S)
                continue
            self._answer(*item)
            if item[0] in WAKE_OPS:  # a job may start: a round now (WAKE_OPS)
                next_tick = min(next_tick, last_round + EARLY_ROUND_GAP_S)

    # -- requests --------------------------------------------------------------------------
    def call(self, op: str, args: dict[str, Any], peer: Peer) -> Any:
        """Run a request on the loop thread and wait for its answer (API threads call this)."""
        if self._stop.is_set():
            raise CollocateError("the daemon is shutting down",
                                 hint="retry in a moment (a restart re-adopts every job)")
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
