"""The daemon's loop: sample GPUs, reap exits, schedule, launch; and the requests it serves.

One thread owns everything that changes (the ``Scheduler``, the SQLite ``Store``, the running
jobs). API threads hand requests to it through a queue and wait for the reply, so there are no
locks around the core and every write comes from one place. Each period (1 s by default) the
loop samples the GPUs, updates the utilization windows, reaps jobs that ended, asks the same
``Scheduler`` the simulator uses for a plan, and launches it. A request wakes the loop at once.
Nothing in a round waits on a child process: a job whose ``--dataset`` producer is still
starting keeps its GPUs in ``running`` with ``waiting`` set, and a later round launches it once
the producer is ready (or fails it with the producer's error), so one slow loader never holds
up the requests, the other jobs or a cancel.

Restart safety: at start the loop reloads every job, then looks at each attempt that has no end:
a live runner with the recorded pid *and* process start time is re-adopted; a runner that ended
while the daemon was down left ``exit.json``, which is read as if the exit happened now; a runner
that vanished without a record is LOST (its process group is killed, the job requeued, the
attempt marked). A job is therefore never run twice and never dropped.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import signal
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collocate.activity import program_prior
from collocate.commitment import stable_s_of
from collocate.daemon import views
from collocate.daemon.datasets import (
    Datasets,
    ProducerStartError,
    active_factories,
    resolve_factory,
)
from collocate.daemon.failures import classify, describe_status, oom_lower_bound_mib
from collocate.daemon.faults import describe_error, disk_full, disk_nearly_full, is_disk_full
from collocate.daemon.launcher import (
    LaunchPlan,
    plan_launch,
    process_matches,
    process_tree,
    start,
)
from collocate.daemon.monitor import Monitor, Tracked
from collocate.daemon.paths import StateLayout, attempt_files
from collocate.daemon.protocol import check_logs_args
from collocate.daemon.reaping import OrphanedJob, adopt_orphan, job_started, reap_strays
from collocate.daemon.runner import read_tail
from collocate.daemon.server import ApiServer, Peer
from collocate.daemon.spec import JobSpec, submit_key, validate_submit
from collocate.daemon.store import Attempt, Store, with_profile
from collocate.daemon.tracking import Tracking, TrackingConfig
from collocate.errors import CollocateError, InputError
from collocate.gpus.base import GpuBackend
from collocate.gpus.mps import MpsDirs
from collocate.interference import default_interference
from collocate.model import Job, JobState, Placement, SharingMode, Wait, WaitKind
from collocate.monitor.job_metrics import METRICS_FILE_NAME
from collocate.monitor.sampler import JobRef
from collocate.monitor.sinks.base import JobInfo
from collocate.policies import make_policy
from collocate.policies.risk import WINDOW_SAMPLES
from collocate.recovery import ExitReport, Outcome, RecoveryRules
from collocate.scheduler import Capacity, Scheduler

log = logging.getLogger("collocate.daemon")
REQUEST_TIMEOUT_S = 60.0


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


@dataclass(slots=True)
class Running:
    """A placed attempt the loop watches until it ends: launched, or still waiting for its
    dataset's producer (``waiting``; it holds its GPUs meanwhile, and has no process yet)."""

    attempt: Attempt
    tracked: Tracked
    proc: Any = None  # subprocess.Popen when this daemon started it; None when re-adopted
    cancel_at: float | None = None  # when the user asked to cancel it
    plan: LaunchPlan | None = None  # what to start once its producer is ready
    waiting: str | None = None  # the dataset whose producer it waits for

    @property
    def why_waiting(self) -> str | None:
        return None if self.waiting is None else f"waiting for dataset producer {self.waiting}"


class Service:
    def __init__(self, config: ServeConfig, *, backend: GpuBackend | None = None) -> None:
        self.config = config
        self.layout = StateLayout(config.state_dir)
        self._backend = backend
        self._requests: queue.Queue[tuple[str, dict, Peer, Future]] = queue.Queue()
        self._stop = threading.Event()
        self.running: dict[str, Running] = {}
        self.specs: dict[str, JobSpec] = {}
        self._placed_seq = 0
        self._lock_fd: int | None = None
        self.mps = None
        self._interference = default_interference()

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Take the state dir, open the store and the GPUs, recover the previous run, listen."""
        self.layout.create(allow_gid=self.config.allow_gid)
        self._take_lock()
        self.store = Store(self.layout.db)
        if self._backend is None:
            from collocate.gpus.registry import open_backend

            self._backend = open_backend(self.config.gpus, state_dir=self.layout.root,
                                         node=socket.gethostname())
        self.backend = self._backend
        sharing = (None if self.config.sharing is SharingMode.MIG  # instances: not inferred
                   else self._interference.modes[self.config.sharing])
        self.monitor = Monitor(self.backend, window=self.config.window, sharing=sharing)
        if not self.monitor.devices:
            raise CollocateError("the GPU backend reports no devices",
                                 hint="check `nvidia-smi`, or use --gpus emulated:4xA100-40GB")
        self.uuid_of = {d.id: d.uuid for d in self.monitor.devices}
        self.tracking = Tracking(self.layout.root, self.monitor.devices, self.config.tracking)
        self.emulated_dir = self.backend.emulated_state_dir
        if self.config.sharing is SharingMode.MPS and self.backend.needs_mps_server:
            from collocate.gpus.mps import MpsControl

            self.mps = MpsControl(self.layout.root)
            self.mps.start()
        policy = make_policy(self.config.policy, **self.config.policy_params)
        snapshot = self.monitor.snapshot([], now=time.time(), sharing=self.config.sharing)
        self.scheduler = Scheduler(policy, Capacity.of(snapshot), rules=self.config.rules,
                                   on_change=self.store.save_job)
        self._stable_s = stable_s_of(policy)
        self.datasets = Datasets(self.layout.root)
        self._restore()
        self.datasets.adopt(s.dataset for s in self.specs.values() if s.dataset)
        self.server = ApiServer(self.layout.socket, self.call, allow_gid=self.config.allow_gid,
                                tcp=self.config.tcp, token=self.config.token)
        self.server.start()
        self.tracking.start_dashboard(self.call)
        self.layout.pid_file.write_text(f"{os.getpid()}\n")
        log.info("serving %d GPU(s) with policy %s from %s", len(self.monitor.devices),
                 self.config.policy, self.layout.root)

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
                    self.tick()
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
        future: Future = Future()
        self._requests.put((op, args, peer, future))
        return future.result(timeout=REQUEST_TIMEOUT_S)

    def _answer(self, op: str, args: dict, peer: Peer, future: Future) -> None:
        try:
            future.set_result(getattr(self, f"op_{op}")(args, peer))
        except Exception as exc:
            if not isinstance(exc, CollocateError):
                log.exception("request %s failed", op)
            future.set_exception(exc)

    def op_ping(self, args: dict, peer: Peer) -> dict:
        status = self.tracking.status()
        return {"pid": os.getpid(), "state_dir": str(self.layout.root), "policy": self.config.policy,
                "gpus": len(self.monitor.devices), "draining": self.store.get_flag("draining"),
                "tracking_degraded": status["degraded"], "tracking": status["tracking"],
                "dashboard": self.tracking.dashboard_url}

    def op_submit(self, args: dict, peer: Peer) -> dict:
        stored = self.store.job_for_key(submit_key(args.get("key")))
        if stored is not None:  # a retry of a submit that was stored
            if stored[1].uid != peer.uid:
                raise InputError("this submit key belongs to another user's job",
                                 hint="send a fresh random key (collocate clients do)")
            job = self.scheduler.jobs.get(stored[0].id, stored[0])
            return {"id": job.id, "state": job.state.value, "mem_mib": job.mem_mib,
                    "mem_source": job.mem_source}
        req = validate_submit(args, uid=peer.uid, gid=peer.gid, user=peer.user)
        if req.spec.dataset is not None:  # remembered per name, so the stored spec is complete
            factory = resolve_factory(req.spec, self.scheduler.jobs.values(), self.specs)
            req = replace(req, spec=replace(req.spec, dataset_factory=factory))
        mem, source, uncertainty, profile = req.mem_mib, req.mem_source, req.mem_uncertainty, None
        if mem is None:
            source = "unknown"
        measured = self.store.history(req.spec.signature)
        if measured is not None:  # measured history beats a declaration (DESIGN: estimators)
            mem, source, uncertainty, profile = measured[0], "history", 0.05, measured[1]
        profile_source = "history"
        if profile is None:  # a new command of a known program: its siblings' activity
            profile, profile_source = self.store.program_profile(req.spec.program), "similar"
        job = Job(id="0", gpus=req.gpus, mem_mib=mem, mem_source=source,
                  mem_uncertainty=uncertainty, submit_time=time.time(), priority=req.priority,
                  name=req.name, max_retries=req.max_retries,
                  retry_failures=req.spec.retry_failures, dataset=req.spec.dataset, after=req.after)
        why = self.scheduler.capacity.why_not(job)
        if why is not None:
            raise InputError(f"this job can never run here: {why}",
                             hint="ask for fewer GPUs or less memory (`collocate gpus` lists them)")
        why = self.scheduler.why_not_after(job)
        if why is not None:
            raise InputError(f"this job could never start: it {why}",
                             hint="check the ids with `collocate ls --all`")
        job = with_profile(replace(job, id=self.store.next_id()), profile, profile_source)
        self.store.add_job(job, req.spec)
        self.specs[job.id] = req.spec
        job = self.scheduler.submit(job)
        return {"id": job.id, "state": job.state.value, "mem_mib": job.mem_mib, "mem_source": source}

    def op_ls(self, args: dict, peer: Peer) -> list[dict]:
        return views.job_rows(self.store, include_done=bool(args.get("all")), running=self.running,
                              waiting=self._why_waiting)

    def op_show(self, args: dict, peer: Peer) -> dict:
        job_id = self._job_id(args)
        return {**views.job_detail(self.store, job_id, running=self.running,
                                   waiting=self._why_waiting),
                "summary": self.tracking.summary(job_id)}

    def op_logs(self, args: dict, peer: Peer) -> dict:
        job_id = self._job_id(args)
        self._check_owner(job_id, peer, "read the logs of")
        return views.logs(self.store, job_id, check_logs_args(args))

    def op_cancel(self, args: dict, peer: Peer) -> dict:
        job_id = self._job_id(args)
        self._check_owner(job_id, peer, "cancel")
        job = self.scheduler.jobs.get(job_id)
        if job is None:
            raise InputError(f"job {job_id} is not known to this daemon")
        if job.state is JobState.RUNNING and job_id in self.running:
            run = self.running[job_id]
            if run.waiting is not None:  # no process yet: nothing to signal
                self._finish(run, Outcome.CANCELLED, f"cancelled by the user while {run.why_waiting}",
                             None, "", time.time())
                return {"id": job_id, "state": self.scheduler.jobs[job_id].state.value}
            if run.cancel_at is None:
                run.cancel_at = time.time()
                # Remembered in the store first, so a daemon restarted before the job exits
                # still records the end as a cancel rather than a failure (exit 143).
                self.store.set_flag(_cancel_key(job_id), True)
                _signal_group(run.attempt.pid, signal.SIGTERM)
            return {"id": job_id, "state": "cancelling"}
        job = self.scheduler.cancel(job_id)
        if job.attempts:  # requeued after an attempt: its tracking run is still open
            self.tracking.job_ended(job_id, job.state.value)
        return {"id": job_id, "state": job.state.value}

    def op_gpus(self, args: dict, peer: Peer) -> list[dict]:
        return views.gpu_rows(self.monitor, self.running, time.time())

    def op_drain(self, args: dict, peer: Peer) -> dict:
        self.store.set_flag("draining", True)
        return {"draining": True, "running": len(self.running),
                "pending": len(self.scheduler.queue)}

    def op_resume(self, args: dict, peer: Peer) -> dict:
        self.store.set_flag("draining", False)
        return {"draining": False}

    def _why_waiting(self, job_id: str) -> Wait | None:
        """Why a pending job waits: the drain, else what the scheduler's last round said."""
        wait = self.scheduler.why_waiting(job_id)
        if wait is not None and wait.kind is not WaitKind.DEPENDENCY and self.store.get_flag("draining"):
            return Wait(WaitKind.DRAIN, "the daemon is draining: `collocate resume` starts jobs again")
        return wait

    def _check_owner(self, job_id: str, peer: Peer, action: str) -> None:
        """On a shared daemon (--group) users may see each other's queue but not touch jobs."""
        owner = self.specs[job_id].uid
        if peer.uid not in (owner, os.getuid(), 0) and owner != -1:
            raise InputError(f"you may not {action} job {job_id}: it belongs to {self.specs[job_id].user}",
                             hint="ask its owner or the daemon's owner")

    def _job_id(self, args: dict) -> str:
        job_id = str(args.get("id", "")).strip()
        if self.store.job(job_id) is None:
            raise InputError(f"no job {job_id!r}", hint="`collocate ls --all` lists every job")
        return job_id

    # -- one scheduling round ----------------------------------------------------------------
    def tick(self) -> None:
        now = time.time()
        for run in self.running.values():
            if run.attempt.pid and (run.proc is None or run.proc.poll() is None):
                run.tracked.pids = frozenset(process_tree(run.attempt.pid))
        self.monitor.refresh([r.tracked for r in self.running.values()], now)
        self.tracking.tick(list(self.monitor.last.values()), self._job_refs())
        self._reap(now)
        self._start_waiting()
        if self.datasets.producers:  # stop producers whose last job ended (done, failed, cancelled)
            self.datasets.reconcile(active_factories(self.scheduler.jobs.values(), self.specs))
        if self.store.get_flag("draining") or not self.scheduler.queue:
            return
        if disk_nearly_full(self.layout.root):  # a launch could not be recorded: wait for space
            return
        self._price_from_siblings()
        snapshot = self.monitor.snapshot([r.tracked for r in self.running.values()], now=now,
                                         sharing=self.config.sharing)
        plan = self.scheduler.schedule(snapshot)
        for placement in plan.placements:
            try:
                self._launch(placement, now)
            except Exception as exc:  # confined to this job: the round goes on with the next
                self._launch_failed(placement.job_id, exc)

    def _price_from_siblings(self) -> None:
        """Pending jobs nobody has measured take the profile their running siblings (the same
        program: a sweep's other points) show now, measured alone or inferred from their GPU's
        readings: their median (``activity.program_prior``), as the simulator does."""
        live: dict[str, list] = {}
        for job_id, run in self.running.items():
            if not run.tracked.assumed or run.tracked.inferred is not None:
                live.setdefault(self.specs[job_id].program, []).append(run.tracked.profile)
        if not live:
            return
        for job in list(self.scheduler.queue):
            if job.profile_source == "assumed" and (prior := program_prior(live.get(self.specs[job.id].program, []))):
                self.scheduler.update(job.evolve(profile=prior, profile_source="similar"))

    def _reap(self, now: float) -> None:
        for job_id, run in list(self.running.items()):
            if run.waiting is not None:
                continue
            if run.proc is not None:
                status = run.proc.poll()
                alive = status is None
            else:
                status = None
                alive = process_matches(run.attempt.pid, run.attempt.pid_started)
            if alive:
                if run.cancel_at is not None and now - run.cancel_at > self.config.cancel_grace_s:
                    _signal_group(run.attempt.pid, signal.SIGKILL)
                continue
            self._ended(run, runner_status=status, adopted=run.proc is None)
        reap_strays({r.proc.pid for r in self.running.values() if r.proc is not None}
                    | {r.attempt.pid for r in self.running.values() if r.attempt.pid}
                    | {p.pid for p in self.datasets.producers.values()})

    def _ended(self, run: Running, *, runner_status: int | None, adopted: bool) -> None:
        """Classify an attempt whose runner is gone, record it, and let the scheduler recover."""
        a = run.attempt
        record = views.read_exit(Path(a.dir))
        if record is None and not isinstance(run.proc, OrphanedJob):
            orphan = adopt_orphan(Path(a.dir))  # the runner died; its job is our child now
            if orphan is not None and orphan.poll() is None:
                self.running[a.job_id] = replace(run, proc=orphan)  # watch the job itself
                log.warning("job %s: its runner is gone; the daemon watches the job (pid %d)",
                            a.job_id, orphan.pid)
                return
            record = views.read_exit(Path(a.dir))
        if record is not None:
            returncode, tail, end = record.get("returncode"), record.get("stderr_tail", ""), record.get("end")
            outcome, reason = classify(returncode, tail, cancelled=run.cancel_at is not None)
        else:
            _signal_group(a.pid, signal.SIGKILL)  # whatever is left of the job must not run on
            returncode, tail, end = None, read_tail(attempt_files(Path(a.dir))["stderr"]), time.time()
            if run.cancel_at is not None:
                outcome, reason = Outcome.CANCELLED, "cancelled by the user"
            elif adopted and a.pid is None:  # e.g. it was waiting for its dataset's producer
                outcome, reason = Outcome.LOST, "the daemon stopped before it launched the job; requeued"
            elif adopted:
                outcome, reason = Outcome.LOST, "the job vanished while the daemon was down; requeued"
            elif not job_started(Path(a.dir)):  # nothing of the job ran: safe to run it again
                outcome = Outcome.LOST
                reason = (f"the job's runner was {describe_status(runner_status or -9)} "
                          "before it started the job; requeued")
            else:
                outcome = Outcome.FAILED
                reason = (f"the job's runner was {describe_status(runner_status or -9)} "
                          "before it could record the exit")
        self._finish(run, outcome, reason, returncode, tail, end or time.time())

    def _finish(self, run: Running, outcome: Outcome, reason: str, returncode: int | None,
                tail: str, end: float) -> None:
        t = run.tracked
        peak = t.peak_mib if t.peak_mib > 0 else None
        observed = peak
        if outcome is Outcome.OOM:
            bound = oom_lower_bound_mib(tail)
            if bound is not None:
                observed = max(peak or 0.0, bound)
        learned = t.learned
        a = replace(run.attempt, end=end, returncode=returncode, outcome=outcome.value,
                    reason=reason, peak_mib=peak,
                    solo_sm=None if learned is None else learned.sm_activity,
                    solo_dram=None if learned is None else learned.dram_activity)
        self.store.update_attempt(a)
        self.store.clear_flag(_cancel_key(a.job_id))
        self.running.pop(a.job_id, None)
        spec = self.specs[a.job_id]
        job = self.scheduler.job_exited(a.job_id, ExitReport(outcome, observed, reason))
        if learned is not None and job.state is JobState.PENDING:  # its next attempt starts known
            job = self.scheduler.update(job.evolve(profile=learned, profile_source="history"))
        if outcome is Outcome.SUCCEEDED and peak is not None:
            self.store.record_history(spec.signature, peak, learned, spec.program)
        if job.state.is_terminal:  # a requeued job keeps its tracking run for the next attempt
            self.tracking.job_ended(a.job_id, job.state.value)
        solo = ("not measured alone" if learned is None else
                f"SM {learned.sm_activity:.2f}, DRAM {learned.dram_activity:.2f} alone")
        log.info("job %s attempt %d: %s (%s) -> %s; activity %s", a.job_id, a.n, outcome.value,
                 reason, job.state.value, solo)

    def _launch(self, placement: Placement, now: float) -> None:
        job = self.scheduler.jobs[placement.job_id]
        spec = self.specs[job.id]
        uuids = tuple(self.uuid_of[g] for g in placement.gpus)
        adir = self.layout.attempt_dir(job.id, job.attempts)
        attempt = Attempt(job.id, job.attempts, now, tuple(str(g) for g in placement.gpus), uuids,
                          str(adir), mem_mib=placement.mem_mib)
        self.store.add_attempt(attempt)
        mps_dirs = None
        if self.config.sharing is SharingMode.MPS:  # emulated GPUs: the same env, no MPS server
            mps_dirs = self.mps.dirs if self.mps is not None else MpsDirs.under(self.layout.root)
        plan = plan_launch(job, spec, placement, uuids, attempt=job.attempts, attempt_dir=adir,
                           sharing=self.config.sharing, emulated_dir=self.emulated_dir,
                           mps_dirs=mps_dirs)
        self._placed_seq += 1
        run = Running(attempt, Tracked(job, uuids, self._placed_seq, self._stable_s), plan=plan)
        if spec.dataset is None:
            self._start(run)
        else:  # it holds its GPUs (in ``running``) while its producer starts
            self.running[job.id] = run
            self._ensure_dataset(spec.dataset, [run])

    def _launch_failed(self, job_id: str, exc: BaseException) -> None:
        """A placement that raised before its runner started: end that attempt (and that job's
        state) with the reason, so nothing stays ``running`` without a process."""
        log.error("job %s: launch failed: %s", job_id, describe_error(exc))
        reason = f"could not launch the job: {describe_error(exc)}"
        outcome = Outcome.LOST if is_disk_full(exc) else Outcome.FAILED
        try:
            run = self.running.get(job_id)
            if run is not None:
                self._finish(run, outcome, reason, None, "", time.time())
                return
            job = self.scheduler.jobs.get(job_id)
            if job is not None and job.state is JobState.RUNNING:
                self.scheduler.job_exited(job_id, ExitReport(outcome, None, reason))
        except Exception as again:  # e.g. the disk is full: a restart settles it (_settle_unlaunched)
            log.error("job %s: could not record the failed launch: %s", job_id, describe_error(again))

    def _start_waiting(self) -> None:
        """Start the jobs whose producer is now ready; fail those whose producer failed."""
        waiting: dict[str, list[Running]] = {}
        for run in self.running.values():
            if run.waiting is not None:
                waiting.setdefault(run.waiting, []).append(run)
        for name, runs in waiting.items():
            self._ensure_dataset(name, runs)

    def _ensure_dataset(self, name: str, runs: list[Running]) -> None:
        """Ask (never wait) whether dataset ``name``'s producer serves; start, fail or park ``runs``."""
        try:
            ready = self.datasets.ensure(self.specs[runs[0].attempt.job_id])
        except Exception as exc:  # a producer must never take the loop down
            if not isinstance(exc, ProducerStartError):
                log.exception("producer of dataset %r", name)
                exc = ProducerStartError(f"could not start the producer of dataset {name!r}: {exc}")
            for run in runs:
                self._finish(run, Outcome.FAILED, str(exc), None, "", time.time())
            return
        for run in runs:
            if ready:
                run.waiting = None
                self._start(run, extra_env=self.datasets.job_env(name))
            elif run.waiting is None:
                run.waiting = name
                log.info("job %s: %s", run.attempt.job_id, run.why_waiting)

    def _start(self, run: Running, extra_env: dict[str, str] | None = None) -> None:
        """Start a placed attempt's runner; it joins ``running`` (or fails if it cannot start)."""
        assert run.plan is not None
        plan = replace(run.plan, env={**run.plan.env, **extra_env}) if extra_env else run.plan
        try:
            proc, started = start(plan)
        except Exception as exc:  # confined to this job (a full disk requeues it: not its fault)
            outcome = Outcome.LOST if is_disk_full(exc) else Outcome.FAILED
            self._finish(run, outcome, f"could not start the job: {describe_error(exc)}", None, "",
                         time.time())
            return
        job_id = run.attempt.job_id
        attempt = replace(run.attempt, pid=proc.pid, pid_started=started)
        self.store.update_attempt(attempt)
        run.tracked.pids = frozenset({proc.pid})
        self.running[job_id] = Running(attempt, run.tracked, proc)
        self._track_start(job_id)

    def _job_refs(self) -> dict[str, JobRef]:
        """Running jobs as the sampler sees them: the runner's tree, owner, name, metrics file,
        and the SM activity each is expected to draw beside its neighbours (the interference
        model's split of a GPU reading that per-process counters miss, as under MPS)."""
        launched = {job_id: run for job_id, run in self.running.items() if run.attempt.pid}
        profiles = {job_id: run.tracked.profile for job_id, run in launched.items()}
        refs = {}
        for job_id, run in launched.items():
            mine = set(run.tracked.uuids)
            others = [profiles[o] for o, r in launched.items() if o != job_id and mine & set(r.tracked.uuids)]
            rate = 1.0 / self._interference.slowdown(self.config.sharing, profiles[job_id], others)
            refs[job_id] = JobRef(run.attempt.pid or 0, self.specs[job_id].user, run.tracked.job.name,
                                  Path(run.attempt.dir) / METRICS_FILE_NAME,
                                  expected_sm=profiles[job_id].sm_activity * rate)
        return refs

    def _track_start(self, job_id: str) -> None:
        """Tell the sinks a job (re)started, with the jobs already on its GPUs."""
        run, spec = self.running[job_id], self.specs[job_id]
        mine = set(run.tracked.uuids)
        neighbours = sorted((j for j, r in self.running.items()
                             if j != job_id and mine & set(r.tracked.uuids)), key=_job_key)
        self.tracking.job_started(JobInfo(
            job_id, run.tracked.job.name, spec.user, tuple(spec.argv), run.attempt.gpus,
            self.config.sharing.value, self.config.policy, tuple(neighbours)))

    # -- restart -----------------------------------------------------------------------------
    def _restore(self) -> None:
        rows = self.store.jobs()
        self.specs = {job.id: spec for job, spec, _ in rows}
        self.scheduler.restore(job for job, _, _ in rows)
        open_attempts = {a.job_id: a for a in self.store.open_attempts()}
        for job_id, a in sorted(open_attempts.items(), key=lambda kv: kv[1].start):
            job = self.scheduler.jobs.get(job_id)
            if job is None or job.state is not JobState.RUNNING:
                self.store.update_attempt(replace(a, end=time.time(), outcome=Outcome.LOST.value,
                                                  reason="closed at restart"))
                continue
            a = self._fill_pid(a)
            self._placed_seq += 1
            tracked = Tracked(job, a.uuids, self._placed_seq, self._stable_s)
            run = Running(a, tracked)
            if self.store.get_flag(_cancel_key(job_id)):
                run.cancel_at = time.time()  # asked before the restart; the grace period restarts
            if process_matches(a.pid, a.pid_started):
                tracked.pids = frozenset(process_tree(a.pid or 0))
                self.running[job_id] = run
                self._track_start(job_id)
                log.info("re-adopted job %s (runner pid %s)", job_id, a.pid)
            else:
                self._ended(run, runner_status=None, adopted=True)
        for job in list(self.scheduler.jobs.values()):
            if job.state is JobState.RUNNING and job.id not in self.running and job.id not in open_attempts:
                self._settle_unlaunched(job)

    def _settle_unlaunched(self, job: Job) -> None:
        """A RUNNING job with no open attempt: the daemon died between two of its writes."""
        attempts = self.store.attempts(job.id)
        last = attempts[-1] if attempts else None
        if last is not None and last.n == job.attempts and last.outcome:
            report = ExitReport(Outcome(last.outcome), last.peak_mib, last.reason or "")
        else:  # placed but never launched: not the job's fault
            report = ExitReport(Outcome.LOST, None, "placed but never launched")
        self.scheduler.job_exited(job.id, report)

    def _fill_pid(self, a: Attempt) -> Attempt:
        """An attempt whose pid was not yet stored: take it from the runner's own record."""
        if a.pid is not None:
            return a
        started = views.read_json(attempt_files(Path(a.dir))["started"])
        if started is None:
            return a
        a = replace(a, pid=int(started["pid"]), pid_started=float(started["started"]))
        self.store.update_attempt(a)
        return a


def _job_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (1 << 62, job_id)


def _signal_group(pid: int | None, sig: int) -> None:
    """Signal a job's process group (its runner's pid is the group id); gone is fine."""
    if not pid:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _cancel_key(job_id: str) -> str:
    return f"cancel:{job_id}"
