"""What is known of a job's solo activity, with its confidence, and how GPU readings revise it.

``auto`` prices a collocation with each job's SM and DRAM activity *when it runs alone*. Nobody
declares it, so it is a belief: a mean profile and a variance per metric (``Belief``), starting
from a prior (``UNKNOWN_PROFILE`` with the spread of real jobs, a sibling family's shrunk median,
or the same job's history) and revised by what the GPUs read, whether the job runs alone or not.
A guess is never frozen: every stretch of readings revises it, and a belief is never certain
(``SD_FLOOR``).

Why GPU-level readings: a GPU's SM activity (GPM on Hopper, else NVML's utilization) is the
quantity the interference model is written in, but it cannot be split between processes
(NVML's per-process ``smUtil`` is a time share, and under MPS it is all charged to the server;
docs/gpu-validation.md). A GPU shared by jobs i reads their *realized* activity, ``Σ a_i /
slowdown_i``: on an H100 that matched GPM SM activity within 0.035 on average over 46 shared
scenarios (``interference.toml``). So one reading is one equation in the residents' profiles,
and ``revise`` solves it the way a Kalman filter does: linearise the reading around the current
beliefs, and move each job's mean by its share of the variance. A job alone reads its own
activity exactly and learns fast; jobs that only ever run together learn as far as one
equation per mix allows, and more with every new mix (a job that leaves or joins gives another
equation). Each metric is revised in turn with the other held at its mean.

The noise of a reading (``reading_variance``) has two parts: the jitter of one GPM sample, which
averaging over a segment's samples shrinks, and the reading model's own error on a shared GPU,
which it does not: averaging a minute of one mix is no surer than averaging ten seconds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from collocate.core.interference import ModeParams, shared_slowdown
from collocate.core.model import UNKNOWN_PROFILE, JobProfile

#: The spread of real jobs' solo activity around ``UNKNOWN_PROFILE`` (0.5 SM / 0.2 DRAM): on an
#: H100, 14 single-GPU training jobs of common families read SM 0.16-0.82 alone (gpu-facts.md),
#: the bench's six workloads 0.29-0.91.
PRIOR_SM_SD = 0.25
PRIOR_DRAM_SD = 0.15
#: No belief is surer than this: a job's activity drifts (phases, a neighbour's data loader).
SD_FLOOR = 0.02
#: A history entry is at most this sure when a new run starts (another day, another host: the
#: same MLP ran 25-30% faster on another day's host, gpu-facts.md).
HISTORY_SD_FLOOR = 0.05
#: Jitter of one SM reading of a steady job (GPM), averaged away over a segment's samples.
SAMPLE_SD = 0.03
#: The reading model's own error on a shared GPU (absolute plus relative): realized activity
#: matched GPM within 0.035 on average over 46 shared H100 scenarios.
MODEL_SD = 0.03
MODEL_REL_SD = 0.1
#: How many prior draws a family's measured siblings are weighed against: one sibling moves a
#: new job's prior half-way from ``UNKNOWN_PROFILE`` to it, four agreeing siblings 80% of the way.
FAMILY_PRIOR_WEIGHT = 1.0

_LOW, _HIGH = 0.005, 1.0  # a job on a GPU does use it; activity is a fraction


@dataclass(frozen=True, slots=True)
class Belief:
    """A job's solo profile as known now: ``profile`` is the mean, ``sm_var``/``dram_var`` the
    variances, ``source`` where it comes from (``Job.profile_source``): ``assumed`` (the prior
    alone), ``similar`` (its family's), ``history`` (its own earlier runs), ``trace`` (a
    simulation told it), ``measured`` (read alone on a GPU in this run) or ``inferred`` (read
    only while shared)."""

    profile: JobProfile
    sm_var: float
    dram_var: float
    source: str

    @property
    def sm_sd(self) -> float:
        return math.sqrt(self.sm_var)

    @property
    def observed(self) -> bool:
        """Whether readings of this run or an earlier one back it (not a prior alone)."""
        return self.source in ("measured", "inferred", "history", "trace")


UNKNOWN = Belief(UNKNOWN_PROFILE, PRIOR_SM_SD ** 2, PRIOR_DRAM_SD ** 2, "assumed")


def exact(profile: JobProfile, source: str = "trace") -> Belief:
    """A belief with nothing left to learn (a simulation that tells policies the trace)."""
    return Belief(profile, 0.0, 0.0, source)


def from_history(profile: JobProfile, sm_sd: float, dram_sd: float) -> Belief:
    """A job's own earlier runs, no surer than ``HISTORY_SD_FLOOR``."""
    return Belief(profile, max(sm_sd, HISTORY_SD_FLOOR) ** 2, max(dram_sd, HISTORY_SD_FLOOR) ** 2,
                  "history")


def as_history(belief: Belief) -> Belief:
    """What a run's belief tells the next run of the same job."""
    return from_history(belief.profile, belief.sm_sd, math.sqrt(belief.dram_var))


def family_prior(siblings: Sequence[Belief]) -> Belief | None:
    """A new job's prior from its family's measured beliefs: their median, shrunk toward
    ``UNKNOWN_PROFILE`` by how many there are and how far they disagree. None without siblings."""
    if not siblings:
        return None
    k, w = len(siblings), FAMILY_PRIOR_WEIGHT

    def shrink(values: list[float], prior: float, prior_var: float, own_var: float) -> tuple[float, float]:
        middle = statistics.median(values)
        spread = statistics.pvariance(values) if k > 1 else 0.0
        mean = (k * middle + w * prior) / (k + w)
        return mean, prior_var * w / (k + w) + (spread + own_var) / k

    sm, sm_var = shrink([s.profile.sm_activity for s in siblings], UNKNOWN_PROFILE.sm_activity,
                        UNKNOWN.sm_var, statistics.fmean(s.sm_var for s in siblings))
    dram, dram_var = shrink([s.profile.dram_activity for s in siblings], UNKNOWN_PROFILE.dram_activity,
                            UNKNOWN.dram_var, statistics.fmean(s.dram_var for s in siblings))
    return Belief(JobProfile(sm, dram), min(sm_var, UNKNOWN.sm_var), min(dram_var, UNKNOWN.dram_var),
                  "similar")


def realized(params: ModeParams, profiles: Sequence[JobProfile], metric: int) -> float:
    """What a GPU shared by jobs of these solo profiles reads (``metric`` 0: SM, 1: DRAM):
    each job's activity at its progress rate, summed."""
    if len(profiles) == 1:
        return profiles[0].sm_activity if metric == 0 else profiles[0].dram_activity
    sm_total = sum(p.sm_activity for p in profiles)
    dram_total = sum(p.dram_activity for p in profiles)
    out = 0.0
    for p in profiles:
        slow = shared_slowdown(params, p.sm_activity, p.dram_activity,
                               sm_total - p.sm_activity, dram_total - p.dram_activity)
        out += (p.sm_activity if metric == 0 else p.dram_activity) / slow
    return out


def reading_variance(reading: float, samples: float, shared: bool) -> float:
    """The variance of a segment's mean reading taken over ``samples`` readings."""
    jitter = SAMPLE_SD ** 2 / max(1.0, samples)
    return jitter + ((MODEL_SD + MODEL_REL_SD * reading) ** 2 if shared else 0.0)


def revise(beliefs: Sequence[Belief], params: ModeParams, sm: float, dram: float | None,
           samples: float) -> list[Belief]:
    """The beliefs of independent jobs a GPU hosts after it read ``sm`` (and ``dram``) on
    average over ``samples`` readings (``Joint.revised`` for jobs known together)."""
    ids = [str(k) for k in range(len(beliefs))]
    joint = Joint.of(dict(zip(ids, beliefs, strict=True))).revised(ids, params, sm, dram, samples)
    return [joint.belief(k) for k in ids]


class Joint:
    """What is known of the activities of the jobs one GPU hosts, together: means and the full
    covariance of their SM and DRAM activity (``mean[m]``, ``cov[m]``; m = 0 SM, 1 DRAM).

    Why jointly: a GPU shared by two jobs tells their sum well and each of them poorly; told
    apart, a third job joining them would take the blame for what the sum already explains
    (two light jobs of 0.1 each, read together at 0.2, were priced 0.008 each once a third
    joined, the third 0.3). The covariance keeps what a reading taught about the sum, so the
    next reading attributes its news to the newcomer. Jobs that never shared a GPU stay
    independent."""

    def __init__(self, ids: list[str], sources: list[str], mean: np.ndarray, cov: np.ndarray) -> None:
        self.ids, self.sources, self.mean, self.cov = ids, sources, mean, cov

    @classmethod
    def of(cls, beliefs: Mapping[str, Belief]) -> Joint:
        joint = cls([], [], np.zeros((2, 0)), np.zeros((2, 0, 0)))
        for job_id, belief in beliefs.items():
            joint.add(job_id, belief)
        return joint

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.ids

    def add(self, job_id: str, belief: Belief) -> None:
        """A job joins, independent of the others."""
        n = len(self.ids)
        self.ids.append(job_id)
        self.sources.append(belief.source)
        p = belief.profile
        self.mean = np.concatenate([self.mean, [[p.sm_activity], [p.dram_activity]]], axis=1)
        cov = np.zeros((2, n + 1, n + 1))
        cov[:, :n, :n] = self.cov
        cov[0, n, n], cov[1, n, n] = belief.sm_var, belief.dram_var
        self.cov = cov

    def drop(self, job_id: str) -> None:
        """A job leaves: what is known of the others stays (a Gaussian's marginal)."""
        k = self.ids.index(job_id)
        keep = [i for i in range(len(self.ids)) if i != k]
        del self.ids[k], self.sources[k]
        self.mean = self.mean[:, keep]
        self.cov = self.cov[:, keep][:, :, keep]

    def belief(self, job_id: str) -> Belief:
        k = self.ids.index(job_id)
        return Belief(JobProfile(float(self.mean[0, k]), float(self.mean[1, k])),
                      float(self.cov[0, k, k]), float(self.cov[1, k, k]), self.sources[k])

    def copy(self) -> Joint:
        return Joint(list(self.ids), list(self.sources), self.mean.copy(), self.cov.copy())

    def updated_by(self, revised: Joint) -> Joint:
        """This joint with what ``revised`` (a revision of it made earlier) teaches of the jobs
        both hold; jobs that joined since stay independent, jobs that left are gone."""
        out = self.copy()
        here = [k for k, j in enumerate(out.ids) if j in revised]
        there = [revised.ids.index(out.ids[k]) for k in here]
        for m in (0, 1):
            out.mean[m, here] = revised.mean[m, there]
            out.cov[m][np.ix_(here, here)] = revised.cov[m][np.ix_(there, there)]
            others = [k for k in range(len(out.ids)) if k not in here]
            out.cov[m][np.ix_(here, others)] = 0.0
            out.cov[m][np.ix_(others, here)] = 0.0
        for k, t in zip(here, there, strict=True):
            out.sources[k] = revised.sources[t]
        return out

    def revised(self, members: Sequence[str], params: ModeParams, sm: float, dram: float | None,
                samples: float) -> Joint:
        """This joint after a GPU whose active jobs are ``members`` read ``sm`` (and ``dram``)
        on average over ``samples`` readings: one equation per metric, solved as a Kalman filter
        does (linearised around the means, iterated twice since the reading is not linear in
        the profiles: a heavier job slows its neighbours). Jobs with no variance left
        (``exact``) stay as they are; the others move by their share of it."""
        out = self.copy()
        idx = [self.ids.index(j) for j in members]
        shared = len(idx) > 1
        out._revise_metric(idx, params, sm, 0, reading_variance(sm, samples, shared))
        if dram is not None:
            out._revise_metric(idx, params, dram, 1, reading_variance(dram, samples, shared))
        for k in idx:
            if out.cov[0, k, k] > 0.0 or out.cov[1, k, k] > 0.0:
                out.sources[k] = "measured" if not shared or self.sources[k] == "measured" else "inferred"
        return out

    def _revise_metric(self, idx: list[int], params: ModeParams, reading: float, metric: int,
                       noise: float) -> None:
        prior = self.mean[metric].copy()
        p = self.cov[metric]
        if not any(p[k, k] > 0.0 for k in idx):
            return
        x = prior.copy()
        other = self.mean[1 - metric]
        gradient = np.zeros(len(prior))
        for _ in range(2):
            def reads(values: np.ndarray) -> float:
                return realized(params, [JobProfile(values[k], other[k]) if metric == 0 else
                                         JobProfile(other[k], values[k]) for k in idx], metric)
            at = reads(x)
            gradient[:] = 0.0
            for k in idx:
                h = 1e-4 if x[k] < 0.5 else -1e-4
                moved = x.copy()
                moved[k] += h
                gradient[k] = (reads(moved) - at) / h
            pg = p @ gradient
            s = float(gradient @ pg) + noise
            if s <= 0.0:
                return
            # the iterated filter: linearised at the new means, innovation taken against the prior
            innovation = reading - (at + float(gradient @ (prior - x)))
            x = np.clip(prior + pg * (innovation / s), _LOW, _HIGH)
        exact_rows = np.diag(p) <= 0.0
        x[exact_rows] = prior[exact_rows]
        cov = p - np.outer(pg, pg) / s
        cov = (cov + cov.T) / 2.0
        diag = np.diag(cov).copy()
        floor = np.where(exact_rows, 0.0, SD_FLOOR ** 2)
        np.fill_diagonal(cov, np.maximum(diag, floor))
        self.mean[metric] = x
        self.cov[metric] = cov
