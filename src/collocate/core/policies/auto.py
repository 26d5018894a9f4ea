"""``auto``: collocate by predicted interference, without head-of-line blocking.

Where the CARMA family asks "does it fit and is the GPU not saturated?", ``auto`` asks "which
placement adds the most total training progress?" and answers with the interference model
(``collocate.core.interference``):

* An idle GPU gives a job full speed and slows nobody (a gain of exactly 1), but spending one on
  a small job can leave a large job waiting. So a job shares a busy GPU instead when that
  placement gains almost as much (at least ``1 - pack_tolerance``), keeping idle GPUs for jobs
  that need them; otherwise it takes an idle GPU, and only when none fits does it share at any
  gain of at least ``min_gain``.
* Otherwise each GPU that fits the job's memory is scored by the change in the summed progress
  rates of every job on it: the newcomer's rate ``1 / slowdown`` plus the rate its neighbours
  lose. A placement must gain at least ``min_gain`` and keep every job on the GPU under
  ``max_slowdown``; among those the best gain wins. The gain gate is what the model says about
  throughput; ``max_slowdown`` is only a backstop against its extrapolation (at 2 it vetoed
  time-sliced placements the gain gate accepts, such as a light job beside a heavy one, and
  cost makespan and mean JCT on synthetic traces; docs/simulator.md).
* A multi-GPU resident (a gang, ``ClusterSnapshot.gangs``) advances at its slowest GPU's pace on
  all its GPUs, so the score charges slowing it where it is the slowest on each of its GPUs, and
  nothing where another of its GPUs is slower still. Scored as a one-GPU job, a 576-min 4-GPU job
  took co-runners on all four GPUs and ran 688 min, its trace 13% behind ``carma-ff``; judged
  under model error over 88 traces, time-sliced makespans lost to the best CARMA policy by over
  1% on 16 traces instead of 25 (docs/simulator.md).
* Memory must fit both what is measured free and what is committed: ``min(free, total -
  committed - other) - reserve >= estimate * (1 + uncertainty) + headroom``, so jobs that have
  not allocated yet and processes that are no job's are counted, and uncertain estimates get a
  wider margin. A known requirement is committed the moment the job is placed
  (``collocate.core.commitment``: an estimate only until the job's own lower peak holds still, a job
  that outgrows its requirement what it holds plus a margin), so a GPU takes its next job in the
  same round, and no GPU is ever closed to newcomers while memory settles.
* A job of unknown memory takes an idle GPU if there is one; otherwise it may share a GPU with
  at least ``unknown_room`` of its memory free, which it then holds whole until its own memory
  has held still for ``collocate.core.commitment.QUIET_S``, and then only its peak plus a margin.
* **Start-ups are free, prices are observed.** A job nobody has measured (its profile a prior:
  ``Job.profile_source`` "assumed" or "similar") is priced at the prior, which is a guess; the
  GPU's readings price it within seconds of its first steps (``collocate.core.world``). Meanwhile its
  start-up (4-10 s of interpreter, imports and model construction with no GPU use on an H100)
  costs its neighbours nothing. So such a job may join a GPU the gain gate turns it away from
  while fewer than ``startup_slots`` of that GPU's jobs are still starting, as long as the model
  predicts nobody there slower than ``startup_max_slowdown`` with it at its prior: a GPU then
  always has the next job starting while the others train, and once the newcomer shows its
  activity the gate decides on what the GPU reads. The slowdown bound keeps a GPU from filling
  up with unpriced jobs; a job whose profile is known gains nothing by being observed and
  passes the gate or waits.
* **Start, observe, take back.** Such a job also starts past the gate, whatever the model predicts
  at its prior, on a GPU that reads less than ``observe_below_sm`` SM activity with a start-up
  slot open (fewer than ``observe_slots`` of its jobs starting): the prior is a guess and the
  GPU's reading says there is room. One slot, because the reading does not show a starting job
  yet: with none, a burst of jobs all landed on a GPU that still read idle (the first run's p95
  over ``exclusive`` 0.93 to 2.47 in the simulator, ``benchmarks/startup_trade.py``). It starts *on
  trial* (``Placement.trial``), and so does every job placed beside others on a prior: once it is seen
  working, the scheduler freezes it if a neighbour is seen slowed past the limit, and thaws it
  when room returns (``collocate.core.suspension``). Waiting on the prior left ``sleep 1`` pending
  for minutes beside two H100s reading 48% SM (issue 35). A job across nodes or an interactive
  job, which are never frozen, is never started on trial past the slowdown bound. A job priced by
  a prior goes on trial wherever it joins others, so the gain gate too places it only where the
  model predicts nobody at ``startup_max_slowdown`` or past it: placed at a predicted 2x, it was
  frozen at the first reading past 2x (CARMA's worst job, frozen 12 times, docs/policies.md).
  With ``observe_known`` (on), the load the gate reads is at least what is known to be there:
  the summed solo SM of the GPU's working jobs whose activity was observed (measured, inferred,
  history; never a prior: ``ClusterSnapshot.sm_known``). Under time-slicing a GPU reads about
  the mean of its jobs' solo activities, not the sum (each is slowed to about 1/n; measured on
  an H100, docs/gpu-validation.md): three jobs at 0.4 SM and 0.2 DRAM, each already slowed
  2.1x by the time-slicing model, read 0.57 and took a fourth past the gate, which only the
  freeze rule took back 30 s or more later; known, they carry 1.2.
  With ``frozen_room``, a GPU holding a job the scheduler froze (``ClusterSnapshot.n_frozen``)
  offers no start past the gate: the frozen job draws nothing, so its GPU reads idle, but the
  room is the frozen job's to take back when it thaws; a newcomer the model prices within the
  gate still joins.
* **Measured slowdowns check the model** (rule 9). Where a job reports its progress (a step
  counter in ``log_metric``), the world measures its slowdown: its fastest step rate over its
  rate now (``ClusterSnapshot.slowed``, each GPU's largest). A GPU whose jobs are measured
  slower than the model predicts for them is scored with the model's prediction scaled by that
  ratio, so ``max_slowdown`` (and ``startup_max_slowdown``) hold for what the jobs show, not only
  for what the model thinks; a model more pessimistic than the measurement is kept.
* A job not placed gets a reason (``Plan.waits``): the first test that left it no GPU.
* The queue is scanned up to ``backfill_depth`` jobs, so a blocked head does not stop smaller
  jobs behind it. Once the first blocked job has waited ``reserve_after_s``, room is reserved
  for it on the GPUs where it would fit soonest (fewest jobs, most room, one node): other jobs
  may still share those GPUs, but only while the room it needs stays free, so they fill up no
  further. Reserving whole GPUs instead made the makespan of an overloaded synthetic trace
  28-32% longer (reserved GPUs drained half empty).
* A multi-GPU job (a gang) is reserved for as soon as it is the first blocked job, without
  waiting ``reserve_after_s``: it needs its GPUs' room free at the same time, which backfill
  onto them would postpone without bound (EASY backfilling reserves for the head at once for
  the same reason). Its GPUs keep its room, and it starts as soon as that room is free, gates
  or not, so it cannot starve; among GPUs with room free now it takes those where the model
  predicts the least interference. Waiting ``reserve_after_s`` first made mix-90's 2-GPU
  jobs start up to 40 min later than under carma-bf (docs/simulator.md).
* Jobs recovered from an out-of-memory crash come first in the queue and are placed like any
  other job with their raised memory requirement; they never stop the rest of the queue.
* A MIG instance is a GPU of its own, shared by the sharing mode in use as a whole GPU is; jobs
  sharing one are scored with their activity relative to its size (``interference.on_device``
  with the snapshot's per-GPU ``speed``), the formula of ``interference.device_slowdown`` over
  arrays, so the simulator and the daemon score instances alike. (Sending each job to the idle
  instance where it would run fastest made simulated makespans 4-6% longer on carma-heavy-60,
  so idle instances are taken in order, as whole GPUs are.)
* Jobs that read one shared dataset (``collocate submit --dataset``) are drawn together: a
  shared GPU hosting such jobs gets a small gain bonus, and idle GPUs on their node come first,
  since one ``collocate share`` producer serves them through node-local memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from collocate.core.interference import (
    InterferenceModel,
    ModeParams,
    default_interference,
    on_device,
    shared_slowdown,
)
from collocate.core.model import ClusterSnapshot, Job, Plan, SharingMode, Wait, WaitKind
from collocate.core.policies.base import Ledger, fits_alone, gpus_wait, memory_wait, pick_gang
from collocate.core.policies.risk import RiskLimits, too_busy


@dataclass(frozen=True)
class Auto:
    name: ClassVar[str] = "auto"
    reserve_mib: float = 512.0  # CUDA context and fragmentation slack, as CARMA's reserve
    headroom_mib: float = 1024.0  # below CARMA's 2048: committed memory is counted too
    uncertainty_margin: float = 1.0  # add this many relative uncertainties to each estimate
    unknown_room: float = 0.5  # a job of unknown memory shares only a GPU with this share free
    max_slowdown: float = 4.0  # backstop: no job on a shared GPU predicted slower than this
    min_gain: float = 0.1  # summed progress-rate gain a collocation must bring
    pack_tolerance: float = 0.1  # share a busy GPU instead of taking an idle one if gain >= 1 - this
    backfill_depth: int = 32  # jobs scanned per round beyond a blocked head
    reserve_after_s: float = 1800.0  # a blocked single-GPU job gets room reserved after this long
    dataset_affinity: float = 0.05  # gain bonus for sharing a GPU with jobs reading the same dataset
    startup_slots: int = 1  # jobs per GPU that may be starting when an unpriced job joins past the gate
    startup_max_slowdown: float = 2.0  # ... if nobody there is predicted slower than this
    observe_below_sm: float = 0.6  # ... or, whatever the prediction, if the GPU reads less SM than this
    observe_slots: int = 1  # ... with fewer than this many jobs still starting there
    frozen_room: bool = False  # a GPU holding a job the scheduler froze takes no unpriced start
    observe_known: bool = True  # ... reading its load as at least the solo SM known of its jobs
    limits: RiskLimits = field(default_factory=RiskLimits)  # measured saturation still vetoes
    interference: InterferenceModel = field(default_factory=default_interference)

    def __call__(self, queue: Sequence[Job], cluster: ClusterSnapshot) -> Plan:
        ledger = Ledger(cluster)
        busy = too_busy(cluster.util_sm, cluster.util_occ, cluster.util_dram, self.limits)
        keep = np.zeros(len(cluster))  # MiB each GPU must keep free for a starving job
        for position, job in enumerate(queue):
            if position >= self.backfill_depth:
                break
            gpus, why = self._choose(job, ledger, ~busy, keep)
            if gpus is not None:
                # on trial: started past the gate, or beside others on a prior (a guess)
                trial = why is _TRIAL or (job.profile_source in _PRIORS and bool((ledger.n_jobs[gpus] > 0).any()))
                ledger.place(job, gpus, trial=trial)
                continue
            reserve_after = self.reserve_after_s if job.width == 1 else 0.0  # a gang: at once
            if not keep.any():
                ledger.recheck(job.submit_time + reserve_after)
            if not keep.any() and cluster.now - job.submit_time >= reserve_after:
                reserved = self._reserve_for(job, ledger, keep)
                if reserved is not None:  # its room is free: it starts now, gates or not
                    ledger.place(job, reserved)
                    continue
            ledger.wait(job, why)
        return ledger.plan()

    def _choose(
        self, job: Job, ledger: Ledger, usable: np.ndarray, keep: np.ndarray
    ) -> tuple[list[int] | None, Wait]:
        """The GPUs for ``job``, or None and why it waits."""
        cluster = ledger.cluster
        mask = usable & (ledger.n_jobs == 0)
        if job.mem_mib is not None:
            mask &= fits_alone(job, cluster)
        if keep.any():
            mem = cluster.total_mib if job.mem_mib is None else job.mem_mib
            mask &= cluster.total_mib - mem >= keep
        idle = np.flatnonzero(mask)
        readers = cluster.datasets.get(job.dataset) if job.dataset else None
        if readers:  # its producer's node first: batches are node-local
            same_node = np.isin(cluster.node[idle], cluster.node[list(readers)])
            idle = np.concatenate([idle[same_node], idle[~same_node]])
        alone = pick_gang(idle, cluster.gang_node, job)
        if alone is not None and job.mem_mib is None:
            return alone, _PLACED  # unknown memory: an idle GPU while there is one
        min_gain = 1.0 - self.pack_tolerance if alone else self.min_gain
        shared, why = self._best_shared(job, ledger, usable, keep, min_gain, explain=alone is None)
        if shared is None and alone is not None:
            return alone, _PLACED
        return shared, why

    def _need(self, job: Job, total_mib: np.ndarray) -> np.ndarray | float:
        """Memory a placement must find free for ``job`` beyond reserve and headroom: its
        estimate widened by its uncertainty, or (memory unknown) ``unknown_room`` of the GPU."""
        if job.mem_mib is None:
            return self.unknown_room * total_mib
        return job.mem_mib * (1.0 + self.uncertainty_margin * job.mem_uncertainty)

    def _best_shared(
        self, job: Job, ledger: Ledger, usable: np.ndarray, keep: np.ndarray, min_gain: float,
        *, explain: bool = True,
    ) -> tuple[list[int] | None, Wait]:
        """The busy GPUs where ``job`` adds the most progress, if that is at least ``min_gain``
        (or, for a job nobody has measured, where it may start past the gate: the class
        docstring); else None and the first test that left no GPU (memory, risk, slowdown).
        ``explain=False`` (an idle GPU awaits the job anyway) leaves the reason unsaid: saying
        it may score every GPU passed over, for a reason nobody reads."""
        cluster = ledger.cluster
        params = self._params(cluster.sharing)
        candidates = np.flatnonzero((ledger.n_jobs > 0) & ledger.shareable(job))
        need = self._need(job, cluster.total_mib[candidates])
        room = ledger.room()[candidates] - (self.reserve_mib + need + self.headroom_mib)
        candidates = candidates[room >= keep[candidates]]
        if candidates.size == 0:
            if keep.any() and (ledger.room() - self.reserve_mib - self.headroom_mib >= self._need(job, cluster.total_mib)).any():
                return None, Wait(WaitKind.RESERVED, "the room it needs is kept for a job waiting longer")
            return None, memory_wait(job, ledger, float(np.max(np.atleast_1d(self._need(job, cluster.total_mib))))
                                     + self.reserve_mib + self.headroom_mib) if explain else _UNSAID
        by_model, on_room = self._may_start_unpriced(job, ledger, candidates, min_gain)
        startable = by_model | on_room
        kept = usable[candidates] | startable  # a start-up uses nothing of a saturated GPU yet
        candidates, startable, by_model, on_room = candidates[kept], startable[kept], by_model[kept], on_room[kept]
        if candidates.size == 0:
            return None, Wait(WaitKind.BUSY, "every GPU with room is saturated (SM and occupancy or DRAM)")
        # The newcomer alone gains at most 1 / (its slowdown below saturation): drop the GPUs
        # where even that misses the bar first (unless it may start there unpriced), then score.
        if min_gain > 0.0:
            pressure = params.per_sm * ledger.sm_sum[candidates]
            if params.per_dram:
                pressure += params.per_dram * ledger.dram_sum[candidates]
            if cluster.has_mig_instances:  # activity counts relative to each instance's SMs
                pressure = on_device(pressure, cluster.speed[candidates])
            kept = (pressure <= 1.0 / min_gain - 1.0 - params.base) | startable
            missed, candidates = candidates[~kept], candidates[kept]
            by_model, on_room = by_model[kept], on_room[kept]
        else:
            missed = candidates[:0]
        if candidates.size:
            gain, ok, worst = self._score(job, ledger, candidates)
            readers = cluster.datasets.get(job.dataset) if job.dataset else None
            if readers:
                gain = gain + self.dataset_affinity * np.isin(candidates, readers)
            passes = ok & (gain >= min_gain) & usable[candidates]
            if job.profile_source in _PRIORS:  # it goes on trial: never where its own freeze is predicted
                passes &= worst < self.startup_max_slowdown
            placed = _PLACED
            if not passes.any():  # past the gate only where it may start unpriced, on trial
                passes = (by_model & (worst < self.startup_max_slowdown)) | on_room
                placed = _TRIAL
            if passes.any():
                chosen, gain = candidates[passes], gain[passes]
                if job.width == 1:
                    return [int(chosen[np.argmax(gain)])], placed
                return pick_gang(chosen[np.argsort(-gain, kind="stable")], cluster.gang_node, job), \
                    gpus_wait(job, "with room") if placed is _PLACED else placed
            return None, self._slowdown_wait(job, ledger, candidates, gain, worst, min_gain) if explain else _UNSAID
        return None, self._slowdown_wait(job, ledger, missed, None, None, min_gain) if explain else _UNSAID

    def _may_start_unpriced(self, job: Job, ledger: Ledger, candidates: np.ndarray,
                            min_gain: float) -> tuple[np.ndarray, np.ndarray]:
        """Where ``job``, priced only by a prior, may start past the gain gate (only when no
        idle GPU is on offer): by the model, GPUs with fewer than ``startup_slots`` jobs still
        starting (and, the caller checks, nobody predicted slower than ``startup_max_slowdown``);
        on measured room, whatever the model predicts, GPUs reading less than
        ``observe_below_sm`` SM lately with fewer than ``observe_slots`` jobs still starting,
        for a job that can be taken back (never one across nodes or an interactive one). With
        ``observe_known``, a GPU's load is at least the summed solo SM of its working jobs whose
        activity was observed (``ClusterSnapshot.sm_known``; a prior never counts). With
        ``frozen_room``, neither on a GPU holding a job the scheduler froze (its room is the frozen
        job's)."""
        cluster = ledger.cluster
        if (self.startup_slots <= 0 or job.profile_source not in ("assumed", "similar")
                or min_gain != self.min_gain):
            none = np.zeros(candidates.size, dtype=bool)
            return none, none
        starting = ledger.n_starting[candidates]
        by_model = starting < self.startup_slots
        load = (cluster.util_sm if cluster.sm_recent is None else cluster.sm_recent)[candidates]
        if self.observe_known and cluster.sm_known is not None:  # what is known to be there
            known = cluster.sm_known[candidates]
            load = np.maximum(load, on_device(known, cluster.speed[candidates])
                              if cluster.has_mig_instances else known)
        on_room = ((load < self.observe_below_sm) & (starting < self.observe_slots)
                   & (job.nodes == 1 and not job.interactive))
        if self.frozen_room and cluster.n_frozen is not None:
            open_ = cluster.n_frozen[candidates] == 0
            by_model, on_room = by_model & open_, on_room & open_
        closed = ~(by_model | on_room)
        if closed.any() and ledger.placed_on.intersection(candidates[closed].tolist()):
            ledger.recheck(cluster.now)  # a job placed now may be training at once
        return by_model, on_room

    def _slowdown_wait(self, job: Job, ledger: Ledger, candidates: np.ndarray,
                       gain: np.ndarray | None, worst: np.ndarray | None, min_gain: float) -> Wait:
        """Why ``job`` found no GPU worth sharing, in numbers: on the GPU where it would gain
        most, what it would gain and how slow its neighbours would get."""
        cluster = ledger.cluster
        if candidates.size == 0:
            return Wait(WaitKind.SLOWDOWN, f"sharing any GPU with room would gain less than {min_gain:.2f}")
        if gain is None or worst is None:
            gain, _, worst = self._score(job, ledger, candidates)
        best = int(np.argmax(gain))
        gpu = int(candidates[best])
        before = self._resident_slowdown(ledger, gpu)
        who = _jobs_on(cluster, gpu)
        if cluster.slowed is not None and cluster.slowed[gpu] > 0:
            who += f" (measured {float(cluster.slowed[gpu]):.1f}x)"

        if worst[best] > self.max_slowdown:
            return Wait(WaitKind.SLOWDOWN, f"on {cluster.ids[gpu]} it would slow {who} from {before:.1f}x "
                                           f"to {worst[best]:.1f}x (limit {self.max_slowdown:g}x)")
        if job.profile_source in _PRIORS and worst[best] >= self.startup_max_slowdown:
            return Wait(WaitKind.SLOWDOWN, f"on {cluster.ids[gpu]} it would slow {who} from {before:.1f}x to "
                                           f"{worst[best]:.1f}x (limit {self.startup_max_slowdown:g}x for a job "
                                           f"not yet seen, which starts on trial)")
        return Wait(WaitKind.SLOWDOWN, f"on {cluster.ids[gpu]} it would slow {who} from {before:.1f}x to "
                                       f"{worst[best]:.1f}x for a gain of {gain[best]:.2f} (needs {min_gain:.2f})")

    def _resident_slowdown(self, ledger: Ledger, gpu: int) -> float:
        """The slowdown of a GPU's jobs now, as ``_score`` models them (their mean profile)."""
        n = float(ledger.n_jobs[gpu])
        if n <= 1:
            return 1.0
        sm, dram = float(ledger.sm_sum[gpu]), float(ledger.dram_sum[gpu])
        if ledger.cluster.has_mig_instances:
            f = float(ledger.cluster.speed[gpu])
            sm, dram = on_device(sm, f), on_device(dram, f)
        return float(shared_slowdown(self._params(ledger.cluster.sharing), sm / n, dram / n,
                                     sm - sm / n, dram - dram / n))

    def _score(self, job: Job, ledger: Ledger, gpus: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Progress-rate gain of adding ``job`` to each of these busy GPUs, whether the
        placement is allowed, and the worst slowdown it predicts there.

        Residents are represented by their mean profile, which keeps the score one vector
        expression per GPU set.
        """
        params = self._params(ledger.cluster.sharing)
        a, d = job.profile.sm_activity, job.profile.dram_activity
        n = ledger.n_jobs[gpus].astype(float)  # >= 1: only busy GPUs are scored
        sm, dram = ledger.sm_sum[gpus], ledger.dram_sum[gpus]
        if ledger.cluster.has_mig_instances:  # activity relative to an instance (f = 1 on whole GPUs)
            f = ledger.cluster.speed[gpus]
            a, d = np.minimum(1.0, on_device(a, f)), np.minimum(1.0, on_device(d, f))
            sm, dram = on_device(sm, f), on_device(dram, f)
        mean_sm, mean_dram = sm / n, dram / n
        newcomer = shared_slowdown(params, a, d, sm, dram)
        resident_after = shared_slowdown(params, mean_sm, mean_dram, sm - mean_sm + a, dram - mean_dram + d)
        resident_before = np.where(
            n > 1, shared_slowdown(params, mean_sm, mean_dram, sm - mean_sm, dram - mean_dram), 1.0
        )
        gain = 1.0 / newcomer + n * (1.0 / resident_after - 1.0 / resident_before)
        if ledger.gangs is not None:
            gain = gain - self._gang_losses(job, ledger, gpus, resident_before, resident_after)
        worst = np.maximum(newcomer, resident_after)
        seen = ledger.cluster.slowed
        if seen is not None:  # the model checked against what the jobs there report
            worst = np.maximum(worst, resident_after * seen[gpus] / resident_before)
        return gain, worst <= self.max_slowdown, worst

    def _gang_losses(self, job: Job, ledger: Ledger, gpus: np.ndarray, before: np.ndarray,
                     after: np.ndarray) -> np.ndarray | float:
        """What ``_score``'s per-GPU sum misses about multi-GPU residents: one advances at its
        slowest GPU's pace on all its GPUs, so slowing it where it is the slowest costs that on
        each of them, and slowing it where another GPU is slower still costs nothing. Per GPU,
        that loss less the one-GPU loss the sum counted (``before``/``after``: the residents'
        slowdowns the sum used). Counting the width alone, without the pace, priced gangs
        already slowed elsewhere as if each placement slowed them again, and made ``auto``
        worse (docs/simulator.md)."""
        table = ledger.gangs
        if table is None or not table.hosts[gpus].any():
            return 0.0
        params = self._params(ledger.cluster.sharing)
        gang, gpu = table.member_gang, table.member_gpu
        sm, dram = table.sm[gang], table.dram[gang]
        other_sm, other_dram = ledger.sm_sum[gpu] - sm, ledger.dram_sum[gpu] - dram
        slow = np.where(ledger.n_jobs[gpu] > 1, shared_slowdown(params, sm, dram, other_sm, other_dram), 1.0)
        # per gang its slowest GPU and the next slowest: its pace if any one GPU were not there
        # (the next slowest is the slowest again where two GPUs share the top)
        starts = np.cumsum(table.width) - table.width
        slowest = np.maximum.reduceat(slow, starts)
        is_top = slow == slowest[gang]
        tops = np.add.reduceat(is_top, starts)
        below = np.maximum.reduceat(np.where(is_top, 0.0, slow), starts)
        position = np.full(len(ledger.n_jobs), -1)
        position[gpus] = np.arange(len(gpus))
        on = np.flatnonzero(position[gpu] >= 0)
        at, g = position[gpu[on]], gang[on]
        here = slow[on]
        rest = np.where(is_top[on] & (tops[g] == 1), below[g], slowest[g])
        here_after = shared_slowdown(params, sm[on], dram[on], other_sm[on] + job.profile.sm_activity,
                                     other_dram[on] + job.profile.dram_activity)
        paced = table.width[g] * (1.0 / np.maximum(here, rest) - 1.0 / np.maximum(here_after, rest))
        # per candidate GPU, summed in membership order (as ``np.add.at``, faster)
        return np.bincount(at, weights=paced - (1.0 / before[at] - 1.0 / after[at]), minlength=len(gpus))

    def _params(self, mode: SharingMode) -> ModeParams:
        return self.interference.modes[mode]

    def _reserve_for(self, job: Job, ledger: Ledger, keep: np.ndarray) -> list[int] | None:
        """Keep room for ``job`` on the GPUs it would fit soonest: others may still share them,
        but only while the room it needs stays free, so the GPUs fill up no further for it.

        A job of several GPUs (a gang) is where the gates starve: it needs all its GPUs to pass
        them at once while backfill keeps them busy (8-GPU jobs waited 32x longer than under
        carma-lug on a synthetic trace). So once a gang's room is free it starts there, whatever
        the gain and slowdown gates say: those GPUs are returned. Gates or not, the model still
        says where: among GPUs with room free now, the least interference first (taking the
        fewest jobs instead put a 326-min 2-GPU job beside heavy ones at the end of a synthetic
        trace and made it 25% longer than carma-ff). Like a single job's, a gang's GPUs keep
        only its room: draining them whole left a single 8-GPU node taking no job for up to
        three hours while one big resident finished (docs/simulator.md).
        A single-GPU job keeps only its room and the gates: an idle GPU always passes them, and
        forcing it beside heavy jobs made time-sliced CARMA traces' makespans 17-21% longer."""
        cluster = ledger.cluster
        room = ledger.room()
        need: np.ndarray | float
        if job.mem_mib is None:
            need = cluster.total_mib
            free_now = ledger.n_jobs == 0
        else:
            need = job.mem_mib * (1.0 + self.uncertainty_margin * job.mem_uncertainty) + self.headroom_mib + self.reserve_mib
            free_now = room >= need
        keys = [-room, ledger.n_jobs]  # free now first, then fewest jobs, most room
        if job.width > 1:  # a gang may start now: least interference first among those free now
            gain = np.ones(len(cluster))  # an idle GPU
            busy = np.flatnonzero(free_now & (ledger.n_jobs > 0))
            if busy.size:
                gain[busy] = self._score(job, ledger, busy)[0]
            keys.append(-gain)
        order = np.lexsort((*keys, ~free_now))
        if job.mem_mib is not None:
            order = order[(cluster.total_mib >= job.mem_mib)[order]]
        gpus = pick_gang(order, cluster.gang_node, job)
        if gpus is None:
            return None
        if job.width > 1 and free_now[gpus].all():  # a gang whose room is free starts now
            return gpus
        keep[gpus] = need if job.mem_mib is not None else cluster.total_mib[gpus]
        return None


_PLACED = Wait(WaitKind.QUEUE)  # the reason slot of a successful choice: never recorded
_PRIORS = ("assumed", "similar")  # profile sources that are guesses
_TRIAL = Wait(WaitKind.QUEUE, "on trial")  # ... of a start past the gate (``Placement.trial``)
_UNSAID = Wait(WaitKind.QUEUE, "not asked")  # the reason slot of a test nobody reads (``explain``)


def _jobs_on(cluster: ClusterSnapshot, gpu: int) -> str:
    """``job 3`` or ``jobs 3, 5`` for a GPU's residents, or ``its jobs`` when unnamed."""
    names = list(cluster.residents[gpu]) if len(cluster.residents) > gpu else []
    if not names:
        return "its jobs"
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"job{'s' if len(names) > 1 else ''} {shown}"
