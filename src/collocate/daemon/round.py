"""One scheduling round of the daemon's loop: sample → reap → price → schedule → launch.

Each period (1 s by default) the round reads the GPUs once and each job's process tree once (the
``Fleet``: each node reads ``/proc`` for its parts), and both readings feed both consumers: the ``GpuWatch``
(memory and activity per job, for the scheduler's snapshot) and the usage monitor (per-job
CPU, host memory, energy, for the store, sinks and dashboard). Then it reaps attempts that
ended, starts those whose dataset producer is ready, prices unmeasured pending jobs from their
running siblings, asks the same ``Scheduler`` the simulator uses for a plan, and launches it.
"""

from __future__ import annotations

import time

from collocate.core.interference import InterferenceModel
from collocate.core.knowledge import ProfileKnowledge, price_pending
from collocate.core.model import UNKNOWN_PROFILE
from collocate.core.scheduler import Capacity
from collocate.core.world import observed_residents
from collocate.daemon.attempts import Attempts
from collocate.daemon.config import Wiring
from collocate.daemon.faults import disk_nearly_full
from collocate.daemon.producers import active_factories
from collocate.daemon.quotas import Accounts
from collocate.daemon.views import committed_by_gpu
from collocate.monitor.process_tree import TreeUsage
from collocate.monitor.sampler import UsageJob

QUOTA_RECOUNT_S = 1.0  # how often members' stored bytes are counted again while jobs wait


class SchedulingRound:
    def __init__(self, wiring: Wiring, attempts: Attempts, interference: InterferenceModel,
                 accounts: Accounts | None = None) -> None:
        self.config, self.layout, self.store = wiring.config, wiring.layout, wiring.store
        self.scheduler, self.specs, self.watch = wiring.scheduler, wiring.specs, wiring.watch
        self.tracking, self.fleet, self.attempts = wiring.tracking, wiring.fleet, attempts
        self.interference = interference
        self.knowledge = ProfileKnowledge(wiring.store)
        self._devices = len(wiring.watch.devices)
        self.accounts = accounts  # the members' storage quotas (daemon/quotas.py)
        self._quota_counted = float("-inf")

    def run(self) -> None:
        now = time.time()
        running = self.attempts.running
        samples = self.watch.read()
        if len(self.watch.devices) != self._devices:
            self._devices_joined(now)
        trees = self._read_trees(samples, now)
        self.watch.observe({j: r.pids for j, r in running.items()}, now)
        metrics, paced = self.fleet.read_metrics({j: r.attempt for j, r in running.items() if r.attempt.pid})
        self.watch.progress(paced)
        self.tracking.tick(samples, self._usage_jobs(), trees, metrics,
                           committed_by_gpu(self.watch))
        self.attempts.reap(now)
        for job in self.scheduler.overdue(now):  # --time: stopped, then recorded as a timeout
            if (run := running.get(job.id)) is not None:
                self.attempts.time_out(run, job.time_limit_s or 0.0)
        self._review(now)
        self.attempts.start_waiting()
        self._reconcile_datasets()
        if self.store.get_flag("draining") or not self.scheduler.waiting:
            return
        if disk_nearly_full(self.layout.root):  # a launch could not be recorded: wait for space
            return
        self._price_pending()
        self._stop_over_quota()
        plan = self.scheduler.schedule(self.watch.snapshot(now), lambda idle: self.watch.snapshot(now, idle))
        for f in plan.freeze:  # jobs of lower priority, frozen for a placement (``collocate.core.preemption``)
            self.attempts.set_frozen(f.job_id, True, now, f.why)
        for placement in plan.placements:
            try:
                self.attempts.launch(placement, now)
            except Exception as exc:  # confined to this job: the round goes on with the next
                self.attempts.launch_failed(placement.job_id, exc)

    def _stop_over_quota(self) -> None:
        """Members at their storage quota get no new attempt (``quotas.Accounts.over_quota``):
        their ledgers are counted again, at most once a ``QUOTA_RECOUNT_S``; in between, a member
        whose log keepers drained their ledger since is stopped at once (a job that filled the
        quota and ended must not let the next one start before the count)."""
        if self.accounts is None:
            return
        members = self._members_pending()
        if time.monotonic() - self._quota_counted < QUOTA_RECOUNT_S:
            drained = self.accounts.drained(members)
            if drained:
                self.scheduler.stopped_users = {**self.scheduler.stopped_users, **drained}
            return
        self._quota_counted = time.monotonic()
        self.scheduler.stopped_users = self.accounts.over_quota(members)

    def _members_pending(self) -> dict[int, str]:
        """uid -> user name of the members with jobs pending (a CPU job's output counts too).
        One job per user tells: a user's jobs all carry the uid the name was looked up from, and
        walking a 10,000-job queue for them took a round at 100 nodes about 5 %."""
        members: dict[int, str] = {}
        for jobs in self.scheduler.pending_by_user():
            job = next((j for j in jobs if j.id in self.specs), None)
            if job is not None:
                members[self.specs[job.id].uid] = job.user
        return members

    def _review(self, now: float) -> None:
        """Freeze the jobs on trial that slow a neighbour past the limit and thaw those whose
        room returned, as the core decides (``Scheduler.review``, the rule the simulator runs)."""
        if not self.scheduler.reviewing:
            return
        decided = self.scheduler.review(self.watch.world.neighbourhood, now)
        for f in decided.freeze:
            self.attempts.set_frozen(f.job_id, True, now, f.why)
        for job_id in decided.thaw:
            self.attempts.set_frozen(job_id, False, now, "room returned")

    def _devices_joined(self, now: float) -> None:
        """GPUs joined (a node joined the cluster, or shows more GPUs): admission counts them,
        and the usage monitor measures them, from this round on."""
        self.tracking.add_devices(self.watch.devices[self._devices:])
        self._devices = len(self.watch.devices)
        self.scheduler.capacity = Capacity.of(self.watch.world.snapshot(now))

    def _reconcile_datasets(self) -> None:
        """Stop producers whose last job ended (done, failed, cancelled), on every machine that
        runs some: one dataset's producers (one per node of its jobs) live while any job of it
        is queued or runs."""
        hosts = [d for d in self.fleet.all_producers() if d.producers]
        if hosts:
            wanted = set(active_factories(self.scheduler.jobs.values(), self.specs))
            for datasets in hosts:
                datasets.reconcile(wanted)

    def _read_trees(self, samples: list, now: float) -> dict[str, TreeUsage]:
        """Every launched job's process tree, read once; the watch attributes GPU memory by it
        for each job whose runner still runs (an ended one keeps its last processes)."""
        launched = {j: r for j, r in self.attempts.running.items() if r.attempt.pid}
        gpu_pids = {p.pid for s in samples for p in s.processes}
        trees = self.fleet.read_trees({j: r.attempt for j, r in launched.items()}, now, gpu_pids)
        for job_id, run in launched.items():
            tree = trees.get(job_id)
            if tree is not None and tree.pids:  # an ended job keeps its last processes
                run.pids = tree.pids
        return trees

    def _price_pending(self) -> None:
        """Pending jobs without history take their family's prior over history and the running
        siblings the world has observed (``knowledge.price_pending``, the rule the simulator
        applies too)."""
        live = [(keys.identity, keys.family, belief) for job_id, belief in observed_residents(self.watch.world)
                if job_id in self.specs for keys in (self.specs[job_id].keys,)]
        if not live:
            return
        keys_of = {job.id: self.specs[job.id].keys for job in self.scheduler.queue}
        for job in price_pending(self.scheduler.queue, live,
                                 lambda job_id: (keys_of[job_id].identity, keys_of[job_id].family),
                                 self.knowledge):
            self.scheduler.update(job)

    def _usage_jobs(self) -> dict[str, UsageJob]:
        """Running jobs as the usage sampler sees them: the runner's tree, owner, name (their
        metrics are read on their nodes, each round), and the SM activity each
        is expected to draw beside its neighbours (the interference model's split of a GPU
        reading that per-process counters miss, as under MPS)."""
        launched = {j: run for j, run in self.attempts.running.items() if run.attempt.pid}
        profiles = {j: r.profile if (r := self.watch.resident(j)) is not None else UNKNOWN_PROFILE for j in launched}
        on_gpu: dict[str, list[str]] = {}  # who shares each GPU: one pass, not one per pair of jobs
        for job_id, run in launched.items():
            for uuid in run.attempt.uuids:
                on_gpu.setdefault(uuid, []).append(job_id)
        jobs = {}
        for job_id, run in launched.items():
            neighbours = dict.fromkeys(o for uuid in run.attempt.uuids for o in on_gpu[uuid] if o != job_id)
            others = [profiles[o] for o in neighbours]
            rate = 1.0 / self.interference.slowdown(self.config.sharing, profiles[job_id], others)
            jobs[job_id] = UsageJob(run.attempt.pid or 0, self.specs[job_id].user,
                                    run.name, expected_sm=profiles[job_id].sm_activity * rate)
        return jobs
