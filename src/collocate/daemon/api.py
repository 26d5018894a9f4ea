"""The daemon's request handlers: one ``op_<name>`` per request, run on the loop thread.

API threads never call these directly: ``Service.call`` hands each request to the loop, which
answers it between rounds, so a handler may change the scheduler, the store and the running
attempts without locks. Requests are checked here (``spec.validate_submit``,
``protocol.check_logs_args``, ownership) before anything changes.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

from collocate.daemon import views
from collocate.daemon.attempts import Attempts
from collocate.daemon.datasets import resolve_factory
from collocate.daemon.faults import disk_nearly_full
from collocate.daemon.gpu_watch import GpuWatch
from collocate.daemon.paths import StateLayout
from collocate.daemon.protocol import PAGE_ROWS, check_logs_args, whole_number
from collocate.daemon.quotas import Accounts, queued_of, request_size
from collocate.daemon.server import Peer
from collocate.daemon.spec import JobSpec, submit_key, validate_submit
from collocate.daemon.store import Store, with_profile
from collocate.daemon.tracking import DaemonTracking
from collocate.errors import InputError
from collocate.knowledge import ProfileKnowledge
from collocate.model import Job, JobState, Wait, WaitKind
from collocate.recovery import Outcome
from collocate.scheduler import Scheduler


class Api:
    def __init__(self, *, config: Any, layout: StateLayout, store: Store, scheduler: Scheduler,
                 specs: dict[str, JobSpec], watch: GpuWatch, tracking: DaemonTracking,
                 attempts: Attempts, accounts: Accounts) -> None:
        self.config, self.layout, self.store, self.scheduler = config, layout, store, scheduler
        self.specs, self.watch, self.tracking, self.attempts = specs, watch, tracking, attempts
        self.accounts = accounts  # the members' quotas (daemon/quotas.py)
        self.knowledge = ProfileKnowledge(store)

    def answer(self, op: str, args: dict[str, Any], peer: Peer) -> Any:
        handler = getattr(self, f"op_{op}", None)
        if handler is None:  # the server checks names first; this keeps the loop honest
            raise InputError(f"unknown request {op!r}")
        return handler(args, peer)

    def op_ping(self, args: dict, peer: Peer) -> dict:
        status = self.tracking.status()
        return {"pid": os.getpid(), "state_dir": str(self.layout.root), "policy": self.config.policy,
                "gpus": len(self.watch.devices), "draining": self.store.get_flag("draining"),
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
        self.accounts.check_submit(peer.uid, request_size(args),
                                   queued_of(peer.uid, self.scheduler.jobs.values(), self.specs))
        req = validate_submit(args, uid=peer.uid, gid=peer.gid, user=peer.user)
        if req.spec.dataset is not None:  # remembered per name, so the stored spec is complete
            factory = resolve_factory(req.spec, self.scheduler.jobs.values(), self.specs)
            req = replace(req, spec=replace(req.spec, dataset_factory=factory))
        mem, source, uncertainty = req.mem_mib, req.mem_source, req.mem_uncertainty
        if mem is None:
            source = "unknown"
        measured = self.store.history(req.spec.signature)
        if measured is not None:  # measured history beats a declaration (DESIGN: estimators)
            mem, source, uncertainty = measured[0], "history", 0.05
        profile, profile_source = self.knowledge.known(req.spec.signature, req.spec.program)
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
        """One page (``after``: the last id of the previous one; ``ids``: only these)."""
        ids = args.get("ids")
        if ids is not None and (not isinstance(ids, list) or len(ids) > PAGE_ROWS):
            raise InputError(f"ls ids must be a list of at most {PAGE_ROWS} job ids")
        return views.job_rows(
            self.store, include_done=bool(args.get("all")), running=self.attempts.running,
            waiting=self._why_waiting, after=whole_number(args.get("after", 0), "ls after", low=0),
            limit=whole_number(args.get("limit", PAGE_ROWS), "ls limit", low=1,
                               high=PAGE_ROWS),
            ids=None if ids is None else [str(i) for i in ids])

    def op_show(self, args: dict, peer: Peer) -> dict:
        job_id = self._job_id(args)
        return {**views.job_detail(self.store, job_id, running=self.attempts.running,
                                   waiting=self._why_waiting),
                "summary": self.tracking.summary(job_id)}

    def op_logs(self, args: dict, peer: Peer) -> dict:
        job_id = self._job_id(args)
        self._check_owner(job_id, peer, "read the logs of")
        return views.logs(self.store, job_id, check_logs_args(args), self.attempts.executor.read_log)

    def op_cancel(self, args: dict, peer: Peer) -> dict:
        job_id = self._job_id(args)
        self._check_owner(job_id, peer, "cancel")
        stored = self.store.job(job_id) if job_id not in self.scheduler.jobs else None
        job = self.scheduler.jobs.get(job_id) or (stored[0] if stored else None)
        if job is None:
            raise InputError(f"job {job_id} is not known to this daemon")
        if job.state.is_terminal:
            return {"id": job_id, "state": job.state.value, "ended": True}
        run = self.attempts.running.get(job_id)
        if job.state is JobState.RUNNING and run is not None:
            if run.waiting is not None:  # no process yet: nothing to signal
                self.attempts.finish(run, Outcome.CANCELLED,
                                     f"cancelled by the user while {run.why_waiting}",
                                     None, "", time.time())
                return {"id": job_id, "state": self.scheduler.jobs[job_id].state.value}
            self.attempts.cancel(run)
            return {"id": job_id, "state": "cancelling"}
        job = self.scheduler.cancel(job_id)
        if job.attempts:  # requeued after an attempt: its tracking run is still open
            self.tracking.job_ended(job_id, job.state.value)
        return {"id": job_id, "state": job.state.value}

    def op_gpus(self, args: dict, peer: Peer) -> list[dict]:
        return views.gpu_rows(self.watch, self.attempts.running, time.time())

    def op_drain(self, args: dict, peer: Peer) -> dict:
        self.store.set_flag("draining", True)
        return {"draining": True, "running": len(self.attempts.running),
                "pending": len(self.scheduler.queue)}

    def op_resume(self, args: dict, peer: Peer) -> dict:
        self.store.set_flag("draining", False)
        return {"draining": False}

    def _why_waiting(self, job_id: str) -> Wait | None:
        """Why a pending job waits: the drain or a full disk (the round places nothing then),
        else what the scheduler's last round said."""
        wait = self.scheduler.why_waiting(job_id)
        if wait is None or wait.kind is WaitKind.DEPENDENCY:
            return wait
        if self.store.get_flag("draining"):
            return Wait(WaitKind.DRAIN, "the daemon is draining: `collocate resume` starts jobs again")
        if disk_nearly_full(self.layout.root):
            return Wait(WaitKind.DISK, f"the disk holding {self.layout.root} is (nearly) full: "
                                       "jobs start again once space is freed")
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
