"""The placed attempts the loop follows, from launch to recorded end.

``Attempts`` owns ``running`` (job id → ``LiveAttempt``) and every change to it: launching a
placement (one part per node, through the ``Fleet``), parking a job whose ``--dataset`` producer is still
starting, reaping runners that ended, classifying each end (``classify_end``), recording it and
telling the scheduler, and cancelling. Nothing here waits on a child process: a job whose
producer is still starting keeps its GPUs in ``running`` with ``waiting`` set, and a later round
launches it once the producer is ready (or fails it with the producer's error), so one slow
loader never holds up the requests, the other jobs or a cancel.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from collocate.core.knowledge import carried_over, learned_here
from collocate.core.model import GpuId, Job, JobState, Placement
from collocate.core.recovery import (
    DEPARTED_WINDOW_S,
    Departure,
    ExitReport,
    Holding,
    Outcome,
    beside_at_crash,
    charged_to,
    job_allowance_mib,
    job_fence_mib,
)
from collocate.daemon.config import Wiring
from collocate.daemon.failures import classify, describe_status, oom_lower_bound_mib
from collocate.daemon.faults import describe_error, is_disk_full
from collocate.daemon.fleet import NodeProducers
from collocate.daemon.plan import Rendezvous, plan_launch
from collocate.daemon.producers import producer_request
from collocate.daemon.store import Attempt
from collocate.gpus.mps import MpsDirs
from collocate.monitor.sinks.base import JobInfo
from collocate.node.api import ExitRecord, NodeUnreachable
from collocate.node.datasets import ProducerStartError
from collocate.node.launcher import LaunchPlan, with_runner_args

log = logging.getLogger("collocate.daemon")


@dataclass(slots=True)
class LiveAttempt:
    """A placed attempt the loop watches until it ends: launched, or still waiting for its
    dataset's producer (``waiting``; it holds its GPUs meanwhile, and has no process yet). One
    frozen before it launched (a preemption or a trial freeze) starts only once thawed, so a job
    recorded frozen never runs."""

    attempt: Attempt
    name: str  # the job's name (for the sinks)
    pids: frozenset[int] = frozenset()  # its processes (the runner's tree), as last read
    launched_here: bool = False  # started by this daemon (False: re-adopted after a restart)
    cancel_at: float | None = None  # when the user asked to cancel it (or its time limit stopped it)
    timeout_s: float | None = None  # set when its time limit (--time) stopped it: not a cancel
    plans: tuple[LaunchPlan, ...] = ()  # what to start, one per part, once its producer is ready
    waiting: str | None = None  # the dataset whose producer it waits for
    deferred: bool = False  # its producer serves, but it was frozen before it started: it starts once thawed

    @property
    def why_waiting(self) -> str | None:
        if self.waiting is None:
            return None
        if self.deferred:
            return f"not started: dataset producer {self.waiting} serves; it starts once thawed"
        return f"waiting for dataset producer {self.waiting}"


def classify_end(record: ExitRecord | None, *, cancelled: bool, adopted: bool, launched: bool,
                 job_started: bool, runner_status: int | None,
                 timeout_s: float | None = None) -> tuple[Outcome, str]:
    """Why an attempt whose runner is gone ended: its exit record when there is one, else what
    is known of how far it got (nothing of a job that never started counts against it)."""
    if record is not None and record.lost:  # e.g. its node stopped answering
        return Outcome.LOST, record.lost
    if timeout_s is not None and (record is None or record.returncode != 0):
        return Outcome.TIMEOUT, timeout_reason(timeout_s)
    if record is not None:
        return classify(record.returncode, record.stderr_tail, cancelled=cancelled)
    if cancelled:
        return Outcome.CANCELLED, "cancelled by the user"
    if adopted and not launched:  # e.g. it was waiting for its dataset's producer
        return Outcome.LOST, "the daemon stopped before it launched the job; requeued"
    if adopted:
        return Outcome.LOST, "the job vanished while the daemon was down; requeued"
    status = describe_status(runner_status or -9)
    if not job_started:  # nothing of the job ran: safe to run it again
        return Outcome.LOST, f"the job's runner was {status} before it started the job; requeued"
    return Outcome.FAILED, f"the job's runner was {status} before it could record the exit"


def cancel_key(job_id: str) -> str:
    return f"cancel:{job_id}"


def timeout_key(job_id: str) -> str:
    return f"timeout:{job_id}"


def timeout_reason(limit_s: float) -> str:
    from collocate.common.units import format_duration

    return f"reached its time limit of {format_duration(limit_s)} (--time); stopped"


class Attempts:
    def __init__(self, wiring: Wiring) -> None:
        self.config, self.layout, self.store = wiring.config, wiring.layout, wiring.store
        self.scheduler, self.specs, self.tracking = wiring.scheduler, wiring.specs, wiring.tracking
        self.watch, self.fleet = wiring.watch, wiring.fleet
        self.running: dict[str, LiveAttempt] = {}
        #: attempts that left a GPU lately, with what they held: a crash seen after its offender
        #: ended is still charged to it (``recovery.beside_at_crash``)
        self.departed: deque[Departure] = deque(maxlen=256)
        #: uid -> the member's storage ledger its runners take log bytes from (``quotas``)
        self.ledger: Callable[[int], Path | None] = lambda uid: None

    @property
    def uuid_of(self) -> dict[GpuId, str]:
        return self.watch.uuid_of

    # -- launching ---------------------------------------------------------------------------
    def launch(self, placement: Placement, now: float) -> None:
        job = self.scheduler.jobs[placement.job_id]
        uuid_of = self.uuid_of
        uuids = tuple(uuid_of[g] for g in placement.gpus)
        adir = self.layout.attempt_dir(job.id, job.attempts)
        attempt = Attempt(job.id, job.attempts, now, tuple(str(g) for g in placement.gpus), uuids,
                          str(adir), mem_mib=placement.mem_mib,
                          host="" if placement.gpus else self._cpu_host())
        self.store.add_attempt(attempt)
        if placement.gpus:  # a CPU job holds nothing the GPU watch follows
            self.watch.place(job, uuids, now, placement.room_mib)
        run = LiveAttempt(attempt, job.name, plans=self._plans(job, placement, attempt))
        dataset = self.specs[job.id].dataset
        if dataset is None:
            self._start(run)
        else:  # it holds its GPUs (in ``running``) while its producer starts
            self.running[job.id] = run
            self._ensure_dataset(dataset, [run])

    def _plans(self, job: Job, placement: Placement, attempt: Attempt) -> tuple[LaunchPlan, ...]:
        """One launch plan per node of the placement, in rank order; a job on several nodes
        gets the rendezvous of its rank 0 (its node's address and a port free there)."""
        spec, uuid_of, adir = self.specs[job.id], self.uuid_of, Path(attempt.dir)
        mps_dirs = MpsDirs.under(self.layout.root)  # used where the mode is MPS (daemon/plan.py)
        by_node: dict[str, list[GpuId]] = {attempt.host: []} if attempt.host else {}
        for g in placement.gpus:
            by_node.setdefault(g.node, []).append(g)
        rendezvous = None
        if len(by_node) > 1:
            first = self.fleet.nodes.node(next(iter(by_node)))
            rendezvous = Rendezvous(len(by_node), 0, first.address(), first.free_port())
        plans = []
        for rank, gpus in enumerate(by_node.values()):
            part = replace(placement, gpus=tuple(gpus))
            plans.append(plan_launch(
                job, spec, part, [uuid_of[g] for g in gpus], attempt=attempt.n, attempt_dir=adir,
                sharing=self.config.sharing, emulated_dir=None, mps_dirs=mps_dirs,
                rendezvous=None if rendezvous is None else replace(rendezvous, rank=rank)))
        ledger = self.ledger(spec.uid)
        if ledger is not None:  # its logs count against its owner's quota as they are written
            plans = [with_runner_args(p, "--quota-file", str(ledger)) for p in plans]
        return tuple(plans)

    def _cpu_host(self) -> str:
        """Where a CPU job runs: of the nodes that answer, the one running the fewest CPU jobs
        (the first seated on a tie; one server: its only node)."""
        nodes, now = self.fleet.nodes, time.time()
        names = [n for n in nodes.names() if nodes.down_for(n, now) == 0] or nodes.names()
        load = {n: 0 for n in names}
        for run in self.running.values():
            if run.attempt.host in load:
                load[run.attempt.host] += 1
        return min(names, key=lambda n: load[n])

    def launch_failed(self, job_id: str, exc: BaseException) -> None:
        """A placement that raised before its runner started: end that attempt (and that job's
        state) with the reason, so nothing stays ``running`` without a process."""
        log.error("job %s: launch failed: %s", job_id, describe_error(exc))
        reason = f"could not launch the job: {describe_error(exc)}"
        outcome = Outcome.LOST if _not_the_jobs_fault(exc) else Outcome.FAILED
        try:
            run = self.running.get(job_id)
            if run is not None:
                self.finish(run, outcome, reason, None, "", time.time())
                return
            job = self.scheduler.jobs.get(job_id)
            if job is not None and job.state is JobState.RUNNING:
                self.scheduler.job_exited(job_id, ExitReport(outcome, None, reason), time.time())
        except Exception as again:  # e.g. the disk is full: a restart settles it
            log.error("job %s: could not record the failed launch: %s", job_id, describe_error(again))

    def start_waiting(self) -> None:
        """Start the jobs whose producer is now ready; fail those whose producer failed."""
        waiting: dict[tuple[str, Any], list[LiveAttempt]] = {}
        for run in self.running.values():
            if run.waiting is not None:
                waiting.setdefault((run.waiting, run.attempt.nodes[0]), []).append(run)
        for (name, _), runs in waiting.items():
            self._ensure_dataset(name, runs)

    def _datasets_of(self, run: LiveAttempt) -> NodeProducers:
        """The producers of the node the attempt runs on."""
        return self.fleet.producers(run.attempt.nodes[0])

    def _ensure_dataset(self, name: str, runs: list[LiveAttempt]) -> None:
        """Ask (never wait) whether dataset ``name``'s producer on ``runs``' machine serves;
        start, fail or park ``runs``."""
        datasets = self._datasets_of(runs[0])
        try:
            ready = datasets.ensure(producer_request(self.specs[runs[0].attempt.job_id]))
        except Exception as exc:  # a producer must never take the loop down
            outcome = Outcome.LOST if isinstance(exc, NodeUnreachable) else Outcome.FAILED
            if not isinstance(exc, (ProducerStartError, NodeUnreachable)):
                log.exception("producer of dataset %r", name)
                exc = ProducerStartError(f"could not start the producer of dataset {name!r}: {exc}")
            for run in runs:
                self.finish(run, outcome, str(exc), None, "", time.time())
            return
        for run in runs:
            if ready and self._frozen(run.attempt.job_id):
                run.waiting = name  # still to start: ``start_waiting`` asks again each round
                if not run.deferred:  # recorded frozen: it starts once thawed, never runs meanwhile
                    run.deferred = True
                    log.info("job %s: its producer serves; its start waits until it is thawed", run.attempt.job_id)
            elif ready:
                run.waiting = None
                self._start(run, extra_env=datasets.job_env(name))
            elif run.waiting is None:
                run.waiting = name
                log.info("job %s: %s", run.attempt.job_id, run.why_waiting)

    def _frozen(self, job_id: str) -> bool:
        """Whether the scheduler records the job as frozen (``Job.suspended``)."""
        job = self.scheduler.jobs.get(job_id)
        return job is not None and bool(job.suspended)

    def _start(self, run: LiveAttempt, extra_env: dict[str, str] | None = None) -> None:
        """Start a placed attempt's runners, one per part; it joins ``running`` (or fails if a
        part cannot start: then none runs)."""
        plans = tuple(replace(p, env={**p.env, **extra_env}) for p in run.plans) if extra_env else run.plans
        try:
            attempt = self.fleet.start(run.attempt, plans)
        except Exception as exc:  # confined to this job (a full disk requeues it: not its fault)
            outcome = Outcome.LOST if _not_the_jobs_fault(exc) else Outcome.FAILED
            self.finish(run, outcome, f"could not start the job: {describe_error(exc)}", None, "",
                        time.time())
            return
        job_id = run.attempt.job_id
        self.store.update_attempt(attempt)
        pids = frozenset(pid or 0 for pid, _ in attempt.runners) if attempt.runners else frozenset({attempt.pid or 0})
        self.running[job_id] = LiveAttempt(attempt, run.name, pids, launched_here=True)
        self.track_start(job_id)

    def track_start(self, job_id: str) -> None:
        """Tell the sinks a job (re)started, with the jobs already on its GPUs."""
        run, spec = self.running[job_id], self.specs[job_id]
        neighbours = sorted((j for j in self.watch.neighbours(job_id) if j in self.running), key=_job_key)
        self.tracking.job_started(JobInfo(
            job_id, run.name, spec.user, tuple(spec.argv), run.attempt.gpus,
            self.config.sharing.value, self.config.policy, tuple(neighbours)))

    # -- suspension ------------------------------------------------------------------------
    def set_frozen(self, job_id: str, frozen: bool, now: float, why: str = "") -> None:
        """Carry out a freeze or thaw the scheduler recorded: the attempt's nodes freeze its
        cgroups (its memory stays), and the world stops learning from it while it is frozen."""
        run = self.running.get(job_id)
        if run is None:
            return
        job = self.scheduler.jobs.get(job_id)
        by = job.suspended if job is not None else ""  # as the scheduler recorded it
        if run.waiting is not None or not run.attempt.pid:  # nothing runs yet: nothing to freeze,
            self.watch.world.freeze(job_id, now, frozen, by)  # and it starts only once thawed
            log.info("job %s: %s (%s) before it started: %s", job_id, "frozen" if frozen else "thawed", why,
                     "its start waits until it is thawed" if frozen else "it starts once its producer serves")
            return
        how = self.fleet.suspend(run.attempt, frozen)
        self.watch.world.freeze(job_id, now, frozen, by)
        log.info("job %s: %s (%s) by %s", job_id, "frozen" if frozen else "thawed", why,
                 ", ".join(dict.fromkeys(how)) or "nothing yet: its node is silent, and is told when it answers")

    # -- ending ------------------------------------------------------------------------------
    def cancel(self, run: LiveAttempt) -> None:
        """Ask a running attempt to stop: SIGTERM now, SIGKILL after the grace period."""
        if run.cancel_at is not None:
            return
        run.cancel_at = time.time()
        # Signalled first, whatever the disk says (a cancel must work on a full disk); then
        # remembered in the store, so that a daemon restarted before the job exits still records
        # the end as a cancel rather than a failure (exit 143). Without that flag the end is
        # still a cancel while this daemon runs (``cancel_at``).
        self.fleet.signal(run.attempt, signal.SIGTERM)
        try:
            self.store.set_flag(cancel_key(run.attempt.job_id), True)
        except Exception as exc:  # noqa: BLE001 - the cancel itself went out
            log.warning("job %s: cancel sent, but not stored (%s)", run.attempt.job_id,
                        describe_error(exc))

    def time_out(self, run: LiveAttempt, limit_s: float) -> None:
        """Stop an attempt whose time limit is up, as a cancel does (SIGTERM, SIGKILL after the
        grace period), remembered in the store so that a restart still records a timeout."""
        if run.timeout_s is not None:
            return
        run.timeout_s = limit_s
        job_id = run.attempt.job_id
        log.info("job %s: %s", job_id, timeout_reason(limit_s))
        if run.waiting is not None:  # no process yet: nothing to signal
            self.finish(run, Outcome.TIMEOUT, timeout_reason(limit_s), None, "", time.time())
            return
        self.store.set_flag(timeout_key(job_id), True)
        if run.cancel_at is None:
            run.cancel_at = time.time()
            self.fleet.signal(run.attempt, signal.SIGTERM)

    def reap(self, now: float) -> None:
        """End the attempts whose runner is gone; kill those past their cancel's grace."""
        for run in list(self.running.values()):
            if run.waiting is not None:
                continue
            alive, status = self.fleet.poll(run.attempt)
            if alive:
                if run.cancel_at is not None and now - run.cancel_at > self.config.cancel_grace_s:
                    self.fleet.signal(run.attempt, signal.SIGKILL)
                continue
            self.ended(run, runner_status=status, adopted=not run.launched_here)
        self.fleet.collect([r.attempt for r in self.running.values() if r.attempt.pid])

    def ended(self, run: LiveAttempt, *, runner_status: int | None, adopted: bool) -> None:
        """Classify an attempt whose runner is gone, record it, and let the scheduler recover."""
        a = run.attempt
        gone = self.fleet.ended(a)
        if gone.adopted:  # the runner died; its job is the node's child now, followed there
            return
        record = gone.record
        if record is not None:
            returncode, tail, end = record.returncode, record.stderr_tail, record.end
        else:
            self.fleet.signal(a, signal.SIGKILL)  # what is left of the job must not run on
            returncode, tail, end = None, gone.stderr_tail, time.time()
        outcome, reason = classify_end(
            record, cancelled=run.cancel_at is not None and run.timeout_s is None, adopted=adopted,
            launched=a.pid is not None, job_started=record is None and not adopted and gone.job_started,
            runner_status=runner_status, timeout_s=run.timeout_s)
        self.finish(run, outcome, reason, returncode, tail, end or time.time())

    def finish(self, run: LiveAttempt, outcome: Outcome, reason: str, returncode: int | None,
               tail: str, end: float) -> None:
        resident = self.watch.remove(run.attempt.job_id, end)
        if resident is not None:
            self._remember_departure(resident, end)
        peak = resident.ramp.peak_mib if resident is not None and resident.ramp.peak_mib > 0 else None
        learned = None if resident is None else learned_here(resident.belief)
        observed = peak
        fence = None if resident is None else job_fence_mib(resident.job, resident.room_mib)
        overrun: list[Holding] = []
        if outcome is Outcome.OOM:
            bound = oom_lower_bound_mib(tail)
            if bound is not None:
                observed = max(peak or 0.0, bound)
            if resident is not None and self._beside_unowned_memory(resident):
                outcome, reason = Outcome.LOST, f"{reason} beside GPU memory held by processes no job owns; requeued"
            elif resident is not None:  # charged to whoever overran (collocate.core.recovery)
                crashed = Holding(run.attempt.job_id, observed or 0.0, job_allowance_mib(resident.job, resident.room_mib))
                beside = beside_at_crash(self._holdings_beside(resident), self.departed,
                                         resident.devices, run.attempt.job_id, end)
                by = set(charged_to(crashed, beside))
                overrun = [h for h in beside if h.job_id in by]
        a = replace(run.attempt, end=end, returncode=returncode, outcome=outcome.value,
                    reason=reason, peak_mib=peak,
                    solo_sm=None if learned is None else learned.profile.sm_activity,
                    solo_dram=None if learned is None else learned.profile.dram_activity)
        self.fleet.release(a)  # nothing of it runs on, on any node; its cgroups are gone
        self.store.update_attempt(a)
        self.store.clear_flag(cancel_key(a.job_id))
        self.store.clear_flag(timeout_key(a.job_id))
        self.running.pop(a.job_id, None)
        spec = self.specs[a.job_id]
        job = self.scheduler.job_exited(a.job_id, ExitReport(
            outcome, observed, reason, fence, tuple(h.job_id for h in overrun)), end)
        for h in overrun:  # the offender's requirement rises from what it held
            raised = self.scheduler.charge_overrun(h.job_id, h.held_mib)
            log.info("job %s held %.0f MiB (allowed %.0f) and made job %s crash out of memory; "
                     "its requirement is now %s MiB", h.job_id, h.held_mib, h.allowed_mib or 0.0,
                     a.job_id, "?" if raised is None or raised.mem_mib is None else f"{raised.mem_mib:.0f}")
        if (known := carried_over(job, learned)) is not None:  # requeued: its next attempt starts known
            job = self.scheduler.update(known)
        if outcome is Outcome.SUCCEEDED and (peak is not None or learned is not None):
            self.store.record_history(spec.keys.identity, peak, learned, spec.keys.family)
        if job.state.is_terminal:  # a requeued job keeps its tracking run for the next attempt
            self.tracking.job_ended(a.job_id, job.state.value)
        solo = ("not observed" if learned is None else
                f"SM {learned.profile.sm_activity:.2f} ± {learned.sm_sd:.2f}, "
                f"DRAM {learned.profile.dram_activity:.2f} ({learned.source})")
        log.info("job %s attempt %d: %s (%s) -> %s; activity %s", a.job_id, a.n, outcome.value,
                 reason, job.state.value, solo)


    def _holdings_beside(self, resident: Any) -> list[Holding]:
        """What each job on the crashed attempt's GPUs held (its peak, as last read) and was
        allowed: what attributing the crash weighs."""
        beside = {o.job.id: o for i in resident.devices for o in self.watch.world.on(i)
                  if o.job.id != resident.job.id}
        return [Holding(o.job.id, o.ramp.peak_mib, job_allowance_mib(o.job, o.room_mib))
                for o in sorted(beside.values(), key=lambda o: _job_key(o.job.id))]

    def _remember_departure(self, resident: Any, end: float) -> None:
        while self.departed and self.departed[0].end < end - 2 * DEPARTED_WINDOW_S:
            self.departed.popleft()
        self.departed.append(Departure(
            Holding(resident.job.id, resident.ramp.peak_mib, job_allowance_mib(resident.job, resident.room_mib)),
            frozenset(resident.devices), end))

    def _beside_unowned_memory(self, resident: Any) -> bool:
        """Whether a GPU of the attempt holds memory of processes that are no job's (then an
        out-of-memory crash is not the job's fault)."""
        return any(self.watch.world.other_mib(i) > 0.0 for i in resident.devices)


def _not_the_jobs_fault(exc: BaseException) -> bool:
    """A launch that failed for the machine's sake (a full disk, an unreachable node): requeued."""
    return is_disk_full(exc) or isinstance(exc, NodeUnreachable)


def _job_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (1 << 62, job_id)
