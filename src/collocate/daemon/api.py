"""The daemon's request handlers: one ``op_<name>`` per request, run on the loop thread.

API threads never call these directly: ``Service.call`` hands each request to the loop, which
answers it between rounds, so a handler may change the scheduler, the store and the running
attempts without locks. Requests are checked here (``spec.validate_submit``,
``protocol.check_logs_args``, and who may ask, by the one table in ``rights.py``) before
anything changes; what a member sees of others' jobs is redacted there too.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from collocate.common.errors import InputError
from collocate.core.fairness import Fairness, UserLimits
from collocate.core.knowledge import ProfileKnowledge, with_belief
from collocate.core.model import Job, JobState, Wait, WaitKind
from collocate.core.recovery import Outcome
from collocate.daemon import views
from collocate.daemon.attempts import Attempts
from collocate.daemon.config import Wiring
from collocate.daemon.faults import disk_nearly_full
from collocate.daemon.fleet import InProcessNodes
from collocate.daemon.producers import resolve_factory
from collocate.daemon.quotas import Accounts, queued_of, request_size
from collocate.daemon.server import Peer
from collocate.node.ptyjob import SOCKET_NAME
from collocate.wire import rights
from collocate.wire.protocol import PAGE_ROWS, check_logs_args, whole_number
from collocate.wire.spec import SubmitRequest, submit_key, validate_submit


class Api:
    def __init__(self, wiring: Wiring, attempts: Attempts, accounts: Accounts) -> None:
        self.config, self.layout, self.store = wiring.config, wiring.layout, wiring.store
        self.scheduler, self.specs, self.watch = wiring.scheduler, wiring.specs, wiring.watch
        self.tracking, self.fleet, self.attempts = wiring.tracking, wiring.fleet, attempts
        self.accounts = accounts  # the members' quotas (daemon/quotas.py)
        self.knowledge = ProfileKnowledge(wiring.store)

    def answer(self, op: str, args: dict[str, Any], peer: Peer) -> Any:
        handler = getattr(self, f"op_{op}", None)
        if handler is None or op not in rights.RIGHTS:  # the server checks names first
            raise InputError(f"unknown request {op!r}")
        rights.check_admin(op, peer.uid)
        return handler(args, peer)

    def op_ping(self, args: dict, peer: Peer) -> dict:
        status = self.tracking.status()
        return {"pid": os.getpid(), "state_dir": str(self.layout.root), "policy": self.config.policy,
                "gpus": len(self.watch.devices), "draining": self.store.get_flag("draining"),
                "tracking_degraded": status["degraded"], "tracking": status["tracking"],
                "dashboard": self.tracking.dashboard_url, "host": views.host_usage()}

    def op_submit(self, args: dict, peer: Peer) -> dict:
        stored = self.store.job_for_key(submit_key(args.get("key")))
        if stored is not None:  # a retry of a submit that was stored
            if stored[1].uid != peer.uid:
                raise InputError("this submit key belongs to another user's job",
                                 hint="send a fresh random key (collocate clients do)")
            job = self.scheduler.jobs.get(stored[0].id, stored[0])
            return {"id": job.id, "name": job.name, "state": job.state.value, "mem_mib": job.mem_mib,
                    "mem_source": job.mem_source}
        self.accounts.check_submit(peer.uid, request_size(args),
                                   lambda: queued_of(peer.uid, self.scheduler.jobs.values(), self.specs))
        req = validate_submit(args, uid=peer.uid, gid=peer.gid, user=peer.user)
        if req.priority > 0 and not rights.is_admin(peer.uid):
            raise InputError(f"only the daemon's owner may raise a job's priority (asked {req.priority})",
                             hint="lower your own job's with --nice N; ask the daemon's owner to raise one")
        if req.spec.dataset is not None:  # remembered per name, so the stored spec is complete
            factory = resolve_factory(req.spec, self.scheduler.jobs.values(), self.specs)
            req = replace(req, spec=replace(req.spec, dataset_factory=factory))
        mem, source, uncertainty = req.mem_mib, req.mem_source, req.mem_uncertainty
        if mem is None:
            source = "unknown"
        keys = req.spec.keys
        measured = self.store.history_peak(keys.identity)
        if measured is not None:  # measured history beats a declaration (DESIGN: estimators)
            mem, source, uncertainty = measured, "history", 0.05
        job = Job(id="0", gpus=req.gpus, nodes=req.nodes, mem_mib=mem, mem_source=source,
                  mem_uncertainty=uncertainty, submit_time=time.time(), priority=req.priority,
                  name=req.name, max_retries=req.max_retries,
                  retry_failures=req.spec.retry_failures, dataset=req.spec.dataset, after=req.after,
                  after_any=req.after_any, after_notok=req.after_notok, user=peer.user,
                  time_limit_s=req.time_limit_s, held="user" if req.hold else "",
                  mem_fence=not req.spec.no_mem_fence,
                  interactive=_interactive(args, req.nodes), **self._sweep(req, peer))
        why = self.scheduler.capacity.why_not(job)
        if why is not None:
            raise InputError(f"this job can never run here: {why}",
                             hint="ask for fewer GPUs, nodes or less memory (`collocate gpus` lists them)")
        why = self.scheduler.why_not_after(job)
        if why is not None:
            raise InputError(f"this job could never start: it {why}",
                             hint="check the ids with `collocate ls --all`")
        job = replace(job, id=self.store.next_id())
        if job.sweep == "new":  # a sweep is named by its first job
            job = replace(job, sweep=job.id)
        job = with_belief(job, self.knowledge.known(keys.identity, keys.family))
        self.store.add_job(job, req.spec)
        self.specs[job.id] = req.spec
        job = self.scheduler.submit(job)
        return {"id": job.id, "name": job.name, "state": job.state.value, "mem_mib": job.mem_mib,
                "mem_source": source}

    def op_ls(self, args: dict, peer: Peer) -> list[dict]:
        """One page (``after``: the last id of the previous one; ``ids``: only these), each row as
        the asker may see it."""
        ids = args.get("ids")
        if ids is not None and (not isinstance(ids, list) or len(ids) > PAGE_ROWS):
            raise InputError(f"ls ids must be a list of at most {PAGE_ROWS} job ids")
        rows = views.job_rows(
            self.store, include_done=bool(args.get("all")), running=self.attempts.running,
            waiting=self._why_waiting, order=[j.id for j in self.scheduler.queue],
            after=whole_number(args.get("after", 0), "ls after", low=0),
            limit=whole_number(args.get("limit", PAGE_ROWS), "ls limit", low=1, high=PAGE_ROWS),
            ids=None if ids is None else [str(i) for i in ids])
        return [r if self._sees(r["id"], peer) else rights.redact(r) for r in rows]

    def op_show(self, args: dict, peer: Peer) -> dict:
        job_id = self._job_id(args)
        detail = {**views.job_detail(self.store, job_id, running=self.attempts.running,
                                     waiting=self._why_waiting, resident=self.watch.resident),
                  "summary": self.tracking.summary(job_id)}
        if args.get("series"):  # the dashboard's charts of one job
            detail.update(self.tracking.job_series(job_id))
        return detail if self._sees(job_id, peer) else rights.redact(detail)

    def op_logs(self, args: dict, peer: Peer) -> dict:
        job_id = self._job_id(args)
        if not self.specs[job_id].public:
            self._check_owner(job_id, peer, "read the logs of")
        if args.get("notify"):  # its --notify command's output (daemon/notify.py)
            from collocate.daemon.notify import notify_dir

            checked = check_logs_args(args)
            return views.notify_logs(notify_dir(self.layout.root, job_id), str(args.get("stream")),
                                     checked.get("offset", 0))
        return views.logs(self.store, job_id, check_logs_args(args), self.fleet.read_log,
                          self._why_waiting)

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

    def op_purge(self, args: dict, peer: Peer) -> dict:
        """Remove ended jobs' stored logs (``collocate purge``): one job (``id``, with cancel's
        rights), or the asker's own that ended before ``before``. Their records stay (``ls
        --all``, ``show``); the owner's quota ledger is counted again at once, so a member at
        their quota frees it without the daemon's owner."""
        from collocate.daemon.notify import drop_notify_logs

        if ("id" in args) == ("before" in args):
            raise InputError("purge takes one job id or a time to purge before",
                             hint="collocate purge ID... or collocate purge --before 2026-01-31")
        if "id" in args:
            job_id = self._job_id(args)
            self._check_owner(job_id, peer, "purge the logs of")
            job = self.scheduler.jobs.get(job_id) or self.store.job(job_id)[0]  # type: ignore[index]
            if not job.state.is_terminal:
                raise InputError(f"job {job_id} is {job.state.value}: only an ended job's logs are purged",
                                 hint=f"read them with `collocate logs {job_id}`; `collocate cancel "
                                      f"{job_id}` ends it first")
            ids = [job_id]
        else:
            ids = self.store.ended_before(peer.uid, float(args["before"]))
        freed, owners = 0, set()
        for job_id in ids:
            attempts = self.store.attempts(job_id)
            freed += sum(self.fleet.drop_logs(a) for a in attempts)
            freed += drop_notify_logs(self.layout.root, job_id)
            self.accounts.forget(a.dir for a in attempts)
            self.store.set_flag(views.purged_key(job_id), True)  # `logs` says so rather than print nothing
            owners.add(self.specs[job_id].uid)
        for uid in owners:
            self.accounts.refresh(uid)
        return {"purged": ids, "freed": freed}

    def op_attach(self, args: dict, peer: Peer) -> dict:
        """Where an interactive job's terminal is served (``node/ptyjob.py``), for the server to
        relay this connection to: ``{"state": "pending"}`` while it waits. The path never
        reaches the client (``server.py`` takes it out of the reply)."""
        job_id = self._job_id(args)
        self._check_owner(job_id, peer, "attach to")
        job = self.scheduler.jobs.get(job_id) or self.store.job(job_id)[0]  # type: ignore[index]
        if not job.interactive:
            raise InputError(f"job {job_id} is not interactive: it has no terminal to attach to",
                             hint=f"`collocate logs -f {job_id}` follows its output")
        if job.state is JobState.PENDING:
            return {"state": "pending"}
        run = self.attempts.running.get(job_id)
        if job.state.is_terminal or run is None:
            raise InputError(f"job {job_id} has ended ({job.state.value})",
                             hint=f"`collocate show {job_id}` says how")
        if not isinstance(self.fleet.nodes, InProcessNodes):
            raise InputError("interactive jobs run on a one-server daemon for now",
                             hint="submit it as a batch job (`collocate submit`)")
        if run.waiting is not None:
            return {"state": "starting"}
        return {"state": "running", "socket": str(Path(run.attempt.dir) / SOCKET_NAME),
                "node": socket.gethostname()}

    def op_hold(self, args: dict, peer: Peer) -> dict:
        job = self._pending_job(args, peer, "hold")
        by = "admin" if rights.is_admin(peer.uid) and self.specs[job.id].uid != peer.uid else "user"
        if job.held:
            return {"id": job.id, "state": job.state.value, "held": job.held}
        return {"id": job.id, "state": job.state.value, "held": self.scheduler.hold(job.id, by).held}

    def op_release(self, args: dict, peer: Peer) -> dict:
        job = self._pending_job(args, peer, "release")
        if job.held == "admin" and not rights.is_admin(peer.uid):
            raise InputError(f"job {job.id} was held by the daemon's owner; only they may release it",
                             hint="ask the daemon's owner")
        return {"id": job.id, "state": job.state.value, "held": self.scheduler.release(job.id).held}

    def op_suspend(self, args: dict, peer: Peer) -> dict:
        """Freeze a running job (``collocate suspend``): memory and GPUs kept, --time stopped,
        until ``collocate resume ID``."""
        job, run = self._running_job(args, peer, "suspend")
        if job.nodes > 1 or job.interactive:
            why = ("runs across nodes: a frozen rank stalls the others' collectives into their timeouts"
                   if job.nodes > 1 else "is interactive: someone waits at its terminal")
            raise InputError(f"job {job.id} {why}; it is never suspended", hint=f"`collocate cancel {job.id}` stops it")
        if job.suspended != "user":
            now = time.time()
            why = f"suspended by {peer.user}"
            self.scheduler.suspend(job.id, "user", now, why=why)
            self.attempts.set_frozen(job.id, True, now, why)
        return {"id": job.id, "state": "suspended"}

    def op_resume_job(self, args: dict, peer: Peer) -> dict:
        """Thaw a job its owner suspended (``collocate resume ID``); one the scheduler froze
        thaws when room returns, or when the daemon's owner says so."""
        job, run = self._running_job(args, peer, "resume")
        if job.suspended == "trial" and not rights.is_admin(peer.uid):
            raise InputError(f"job {job.id} was frozen by the scheduler: it {job.suspended_why}",
                             hint="it thaws by itself when room returns; the daemon's owner may thaw it now")
        if job.suspended == "preempt" and not rights.is_admin(peer.uid):
            raise InputError(f"job {job.id} was frozen {job.suspended_why}",
                             hint="the daemon's owner may thaw it now")
        if job.suspended:
            now = time.time()
            self.scheduler.resume(job.id, now)
            self.attempts.set_frozen(job.id, False, now, f"resumed by {peer.user}")
        return {"id": job.id, "state": "running"}

    def _running_job(self, args: dict, peer: Peer, action: str) -> tuple[Job, Any]:
        """A job placed and running, or one still waiting for its dataset's producer (frozen,
        it starts only once thawed: ``Attempts.set_frozen``); else an error that says what it is."""
        job_id = self._job_id(args)
        self._check_owner(job_id, peer, action)
        job = self.scheduler.jobs[job_id]
        run = self.attempts.running.get(job_id)
        if job.state is not JobState.RUNNING or run is None or (run.waiting is None and not run.attempt.pid):
            state = job.state.value if job.state is not JobState.RUNNING else "starting"
            raise InputError(f"job {job_id} is {state}: only a running job can be {action}d",
                             hint="`collocate ls` shows which jobs run")
        return job, run

    def op_priority(self, args: dict, peer: Peer) -> dict:
        from collocate.core.model import PRIORITY_MAX

        job = self._pending_job(args, peer, "change the priority of")
        value = args.get("priority")
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > PRIORITY_MAX:
            raise InputError(f"priority must be a whole number within +/-{PRIORITY_MAX:,}, got {value!r}")
        if value > job.priority and not rights.is_admin(peer.uid):
            raise InputError(f"only the daemon's owner may raise a job's priority ({job.priority} to {value})",
                             hint="you may lower your own job's priority; ask the daemon's owner to raise it")
        job = self.scheduler.update(job.evolve(priority=value))
        return {"id": job.id, "state": job.state.value, "priority": job.priority}

    def op_update(self, args: dict, peer: Peer) -> dict:
        """Change a pending job (Slurm's ``scontrol update``): its memory, time limit, name,
        dependencies or priority, with ``priority``'s rights (only the daemon's owner raises)."""
        from collocate.common.errors import CollocateError
        from collocate.wire.spec import validate_update

        job = self._pending_job(args, peer, "update")
        changes = validate_update(args)
        value = changes.get("priority", job.priority)
        if value > job.priority and not rights.is_admin(peer.uid):
            raise InputError(f"only the daemon's owner may raise a job's priority ({job.priority} to {value})",
                             hint="you may lower your own job's priority (--nice N); ask the daemon's owner to raise it")
        try:
            job = self.scheduler.edit(job.evolve(**changes))
        except CollocateError as exc:
            raise InputError(str(exc.args[0]), hint="`collocate ls --all` lists the jobs and their states") from None
        return {"id": job.id, "state": job.state.value, "changed": sorted(changes),
                "name": job.name, "mem_mib": job.mem_mib, "time_limit_s": job.time_limit_s,
                "priority": job.priority, "after": list(job.after), "after_any": list(job.after_any),
                "after_notok": list(job.after_notok), "reason": job.reason}

    def op_limits(self, args: dict, peer: Peer) -> dict:
        f = self.scheduler.fairness
        running: dict[str, tuple[int, int]] = {}
        for job in self.scheduler.jobs.values():
            if job.state is JobState.RUNNING:
                jobs, gpus = running.get(job.user, (0, 0))
                running[job.user] = (jobs + 1, gpus + job.width)
        now = time.time()
        return {"fair_share": f.fair_share, "half_life_s": f.half_life_s,
                "cpu_jobs_default": self.scheduler.cpu_jobs_default,
                "default": _limits_dict(f.default),
                "users": {u: _limits_dict(lim) for u, lim in sorted(f.users.items())},
                "usage": {u: {"running_jobs": n, "running_gpus": g,
                              "running_cpu_jobs": self.scheduler.cpu_running(u),
                              "gpu_hours": self.scheduler.usage.of(u, now) / 3600}
                          for u, (n, g) in sorted(running.items())}}

    def op_set_limits(self, args: dict, peer: Peer) -> dict:
        """Set the default caps (no ``user``) or one user's (``clear``: drop them); a cap the
        request leaves out keeps its value."""
        f = self.scheduler.fairness
        user = args.get("user")
        if user is not None and (not isinstance(user, str) or not user.strip()):
            raise InputError(f"--user takes a user name, got {user!r}")
        now = f.default if user is None else f.users.get(user, UserLimits())
        limits = UserLimits(_cap(args.get("max_jobs", now.max_running_jobs), "--max-jobs"),
                            _cap(args.get("max_gpus", now.max_gpus), "--max-gpus"),
                            _cap(args.get("max_cpu_jobs", now.max_cpu_jobs), "--max-cpu-jobs"))
        users = dict(f.users)
        if user is None:
            f = Fairness(f.fair_share, f.half_life_s, limits, users)
        elif args.get("clear"):
            users.pop(user, None)
            f = Fairness(f.fair_share, f.half_life_s, f.default, users)
        else:
            users[user] = limits
            f = Fairness(f.fair_share, f.half_life_s, f.default, users)
        if isinstance(args.get("fair_share"), bool):
            f = Fairness(args["fair_share"], f.half_life_s, f.default, f.users)
        self.store.set_fairness(f)
        self.scheduler.set_fairness(f)
        return self.op_limits({}, peer)

    def op_history(self, args: dict, peer: Peer) -> dict:
        since = args.get("since_s", 600)
        if isinstance(since, bool) or not isinstance(since, int | float) or not 0 < since <= 30 * 86400:
            raise InputError(f"since_s must be seconds in (0, 30 days], got {since!r}")
        return self.tracking.history(time.time() - float(since), points=args.get("points") or 120)

    def op_gpus(self, args: dict, peer: Peer) -> list[dict]:
        return views.gpu_rows(self.watch, self.attempts.running, time.time(), self.fleet.events)

    def op_drain(self, args: dict, peer: Peer) -> dict:
        self.store.set_flag("draining", True)
        return {"draining": True, "running": len(self.attempts.running),
                "pending": len(self.scheduler.queue) + len(self.scheduler.cpu_queue)}

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
        """On a shared daemon (--group) members act on their own jobs only (``rights``)."""
        spec = self.specs[job_id]
        rights.check_owner(action, job_id, peer.uid, spec.uid, spec.user)

    def _sees(self, job_id: str, peer: Peer) -> bool:
        """Whether ``peer`` sees the job in full (its owner, the daemon's owner, or --public)."""
        spec = self.specs.get(job_id)
        return spec is None or spec.public or rights.owns(peer.uid, spec.uid)

    def _pending_job(self, args: dict, peer: Peer, action: str) -> Job:
        job_id = self._job_id(args)
        self._check_owner(job_id, peer, action)
        job = self.scheduler.jobs[job_id]
        if job.state is not JobState.PENDING:
            what = {"hold": "be held", "release": "be released",
                    "update": "be changed"}.get(action, "have its priority changed")
            hint = ("`collocate ls` shows which jobs are pending" if action != "update" else
                    "memory, time limit, name, dependencies and priority change only while it waits; "
                    "cancel it and submit it again to change them now")
            raise InputError(f"job {job_id} is {job.state.value}: only a pending job can {what}", hint=hint)
        return job

    def _sweep(self, req: SubmitRequest, peer: Peer) -> dict[str, Any]:
        """The ``Job`` fields of a sweep's job: a later job joins its first job's sweep (the
        same user's), and its bound."""
        if req.sweep in ("", "new"):
            return {"sweep": req.sweep, "sweep_max": req.sweep_max}
        stored = self.store.job(req.sweep)
        if stored is None or stored[0].sweep != req.sweep or stored[1].uid != peer.uid:
            raise InputError(f"job {req.sweep} is not the first job of a sweep of yours",
                             hint="collocate submit --sweep sends this; submit the sweep again")
        return {"sweep": req.sweep, "sweep_max": stored[0].sweep_max}

    def _job_id(self, args: dict) -> str:
        job_id = str(args.get("id", "")).strip()
        if self.store.job(job_id) is None:
            raise InputError(f"no job {job_id!r}", hint="`collocate ls --all` lists every job")
        return job_id


def _interactive(args: dict, nodes: int) -> bool:
    """``collocate run``'s jobs: on one node (the terminal is served there)."""
    if not args.get("interactive"):
        return False
    if nodes != 1:
        raise InputError("an interactive job runs on one node", hint="drop --nodes")
    return True


def _limits_dict(lim: UserLimits) -> dict[str, int | None]:
    return {"max_jobs": lim.max_running_jobs, "max_gpus": lim.max_gpus, "max_cpu_jobs": lim.max_cpu_jobs}


def _cap(value: Any, option: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{option} takes a whole number of 0 or more, got {value!r}",
                         hint="or leave it out for no cap")
    return value
